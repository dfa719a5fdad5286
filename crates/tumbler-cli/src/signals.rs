//! The signals that end `hold` and `watch`: SIGTERM, SIGINT and SIGHUP.

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Catches the three from now on (their default action, death, no
    /// longer applies to this process).
    pub fn catch() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next one that arrives.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// The shell's exit code for death by `signal`: 128 + its number.
pub fn killed_by(signal: Signal) -> u8 {
    128u8.saturating_add(signal as i32 as u8)
}
