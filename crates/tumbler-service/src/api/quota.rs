//! Per-tenant quotas on what callers hold open on this replica: Session
//! streams, Watch streams and waiting Acquires, counted per token (by its
//! name, so a reload of the tokens file keeps the count) and, for watches,
//! per namespace. A tenant at its quota gets RESOURCE_EXHAUSTED while the
//! replica-wide pools (`--max-sessions`, `--max-watchers`,
//! `--max-waiters`) still have room for everyone else.
//!
//! With authentication off every caller is the same tenant, so only the
//! per-namespace quotas apply.
//!
//! Why a std `Mutex`: held only to bump a counter, never across an
//! `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tonic::Status;

use crate::auth::{Access, TokenQuotas};

/// What a quota counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Sessions,
    Watchers,
    Waiters,
}

impl Held {
    fn noun(self) -> &'static str {
        match self {
            Held::Sessions => "open Session streams",
            Held::Watchers => "open Watch streams",
            Held::Waiters => "waiting acquires",
        }
    }

    fn of_token(self, quotas: &TokenQuotas) -> Option<usize> {
        match self {
            Held::Sessions => quotas.sessions,
            Held::Watchers => quotas.watchers,
            Held::Waiters => quotas.waiters,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Holder {
    Token(String),
    Namespace(String),
}

/// The quotas of one kind of held thing, and what each tenant holds now.
pub struct Quotas {
    held: Held,
    /// Default per token (a token's file entry may set its own).
    per_token: usize,
    /// Per namespace; None: not counted per namespace.
    per_namespace: Option<usize>,
    counts: Mutex<HashMap<Holder, usize>>,
}

/// One held thing; gives its place back when dropped.
pub struct QuotaSlot {
    quotas: Arc<Quotas>,
    holders: Vec<Holder>,
}

impl Quotas {
    pub fn new(held: Held, per_token: usize, per_namespace: Option<usize>) -> Arc<Self> {
        Arc::new(Quotas {
            held,
            per_token,
            per_namespace,
            counts: Mutex::default(),
        })
    }

    /// A place for the caller (in `namespace`, when counted per
    /// namespace), or RESOURCE_EXHAUSTED naming the quota that is full.
    pub fn take(
        self: &Arc<Self>,
        access: &Access,
        namespace: Option<&str>,
    ) -> Result<QuotaSlot, Status> {
        let mut wanted = Vec::with_capacity(2);
        if let Some(token) = access.token() {
            let most = self.held.of_token(&token.quotas).unwrap_or(self.per_token);
            wanted.push((Holder::Token(token.name.clone()), most));
        }
        if let (Some(namespace), Some(most)) = (namespace, self.per_namespace) {
            wanted.push((Holder::Namespace(namespace.to_owned()), most));
        }
        let mut counts = self.counts.lock().unwrap();
        for (holder, most) in &wanted {
            if counts.get(holder).copied().unwrap_or(0) >= *most {
                let whose = match holder {
                    Holder::Token(_) => "this token".to_owned(),
                    Holder::Namespace(ns) => format!("namespace {ns}"),
                };
                return Err(Status::resource_exhausted(format!(
                    "{whose} already has {most} {} on this replica (its quota); end some or retry later",
                    self.held.noun()
                )));
            }
        }
        for (holder, _) in &wanted {
            *counts.entry(holder.clone()).or_default() += 1;
        }
        Ok(QuotaSlot {
            quotas: self.clone(),
            holders: wanted.into_iter().map(|(holder, _)| holder).collect(),
        })
    }
}

impl Drop for QuotaSlot {
    fn drop(&mut self) {
        let mut counts = self.quotas.counts.lock().unwrap();
        for holder in &self.holders {
            if let Some(n) = counts.get_mut(holder) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(holder);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_access_counts_only_per_namespace_and_slots_come_back() {
        let quotas = Quotas::new(Held::Watchers, 1, Some(2));
        let a = quotas.take(&Access::Open, Some("a")).unwrap();
        let b = quotas.take(&Access::Open, Some("a")).unwrap();
        let full = quotas.take(&Access::Open, Some("a")).err().unwrap();
        assert_eq!(full.code(), tonic::Code::ResourceExhausted);
        assert!(full.message().contains("namespace a"), "{}", full.message());
        assert!(quotas.take(&Access::Open, Some("b")).is_ok());
        drop(a);
        assert!(quotas.take(&Access::Open, Some("a")).is_ok());
        drop(b);
        assert!(quotas.counts.lock().unwrap().is_empty());
    }
}
