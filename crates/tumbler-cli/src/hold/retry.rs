//! Riding out a restart of the server: which errors send the same request
//! to the next endpoint, how long to keep trying, and the backoff between
//! tries.

use std::time::Duration;

/// How long an acquire keeps retrying UNAVAILABLE past its wait (a try-once
/// `hold`, or a wait that ends while the servers restart).
pub(super) const RETRY_BUDGET: Duration = Duration::from_secs(10);
/// How long an open or resume may take on one endpoint.
pub(super) const OPEN_WITHIN: Duration = Duration::from_secs(5);

/// Errors after which the same request goes to the next endpoint: the
/// server is draining or restarting, or the connection broke.
pub(super) fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
    )
}

/// One try after another on `tumbler-client`'s schedule: 50 ms doubling to
/// 1 s, full jitter, so that the clients of a restarted replica do not all
/// come back in the same instant.
pub(super) struct Backoff {
    schedule: tumbler_client::Backoff,
    attempt: u32,
}

impl Backoff {
    pub(super) fn new() -> Backoff {
        Backoff {
            schedule: tumbler_client::Backoff::default(),
            attempt: 0,
        }
    }

    /// The pause before the next try.
    pub(super) fn next(&mut self) -> Duration {
        let pause = self.schedule.delay(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        pause
    }
}
