//! A rate per caller for one kind of costly request (the dashboard's
//! changelog reads): each token has a budget of its own, whatever its
//! `requests_per_second` (which counts every request), and with
//! authentication off each client address has one. The same limiter as a
//! token's request rate (governor's GCRA), keyed.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tonic::Status;

use super::Access;

/// Callers' budgets are tidied (those back to full dropped) once per this
/// many charges, so addresses seen once do not pile up.
const TIDY_EVERY: u64 = 1024;

/// `per_second` requests per second per caller, in bursts of as many.
pub struct CallerRate {
    per_second: NonZeroU32,
    limiter: DefaultKeyedRateLimiter<Caller>,
    charges: AtomicU64,
}

/// Whose budget a request uses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Caller {
    Token(String),
    Address(Option<IpAddr>),
}

impl CallerRate {
    pub fn per_second(per_second: NonZeroU32) -> Self {
        CallerRate {
            per_second,
            limiter: RateLimiter::keyed(Quota::per_second(per_second)),
            charges: AtomicU64::new(0),
        }
    }

    /// Charges one request of the caller (its token, or with auth off its
    /// address): RESOURCE_EXHAUSTED (HTTP 429) past its rate. `what` names
    /// the requests in the refusal.
    pub fn charge(&self, access: &Access, peer: Option<IpAddr>, what: &str) -> Result<(), Status> {
        let caller = match access {
            Access::Token(token) => Caller::Token(token.name.clone()),
            Access::Open => Caller::Address(peer),
        };
        if self.charges.fetch_add(1, Ordering::Relaxed) % TIDY_EVERY == TIDY_EVERY - 1 {
            self.limiter.retain_recent();
        }
        self.limiter.check_key(&caller).map_err(|_| {
            Status::resource_exhausted(format!(
                "{what}: at most {} per second per caller; retry later",
                self.per_second
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_caller_has_its_own_budget() {
        let rate = CallerRate::per_second(NonZeroU32::new(2).unwrap());
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        assert!(rate.charge(&Access::Open, Some(a), "reads").is_ok());
        assert!(rate.charge(&Access::Open, Some(a), "reads").is_ok());
        let refused = rate.charge(&Access::Open, Some(a), "reads").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().starts_with("reads: at most 2 per second"));
        assert!(rate.charge(&Access::Open, Some(b), "reads").is_ok());
    }
}
