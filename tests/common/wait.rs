//! Waiting for a condition with a deadline, the one way tests wait: poll
//! every 20 ms, fail the test naming what never came. A blocking form for
//! set-up code outside the runtime (clusters, sentinels) and an async form
//! for checks that call the server.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is checked again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it holds, for at most `within`; blocks the thread.
pub fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(POLL);
    }
}

/// [`wait_until`] for an async `check`, sleeping on the runtime.
pub async fn wait_until_async<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `probe` until it gives a value, for at most `within`, sleeping on
/// the runtime; returns the value.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}
