//! `tumbler watch`: lock events as they happen, until interrupted.

use std::time::Duration;

use clap::Args;

use super::connect::{Conn, Target};
use super::output::{display_name, lock_mode, rfc3339, status_line};
use super::signals::{Signals, killed_by};
use super::{Failure, Globals};
use tumbler_proto as proto;

#[derive(Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    pub target: Target,
    /// One lock to watch (default: every lock of the namespace, or those
    /// that --prefix selects).
    #[arg(conflicts_with = "prefix")]
    pub name: Option<String>,
    /// Watch every lock whose name starts with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Start with the current holders and waiters (`held`, `waiting`
    /// events, then `synced`), then follow the changes.
    #[arg(long)]
    pub initial_state: bool,
}

/// Prints events until a signal (exit 128 + its number: 130 for Ctrl-C),
/// the reader closes stdout (exit 0), or no server can be reached.
/// A stream the server ends (it shuts down) is opened again, on the next
/// --addr when there are several; events in between are missed.
pub async fn run(args: WatchArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut signals = Signals::catch().map_err(Failure::Write)?;
    let mut conn = Conn::new(&args.target)?;
    let request = proto::WatchRequest {
        namespace: globals.namespace()?,
        name: args.name.clone().unwrap_or_default(),
        prefix: args.prefix.clone(),
        initial_state: args.initial_state,
    };
    let what = match &args.name {
        Some(name) => display_name(&request.namespace, name),
        None => format!("{}*", display_name(&request.namespace, &request.prefix)),
    };
    let out = globals.output();
    loop {
        let mut events = tokio::select! {
            opened = call!(conn, watch, request) => opened?,
            signal = signals.recv() => return Ok(killed_by(signal)),
        };
        status_line(&format!("WATCHING {what} on {}", conn.endpoint()));
        let ended = loop {
            let event = tokio::select! {
                event = events.message() => event,
                signal = signals.recv() => return Ok(killed_by(signal)),
            };
            match event {
                Ok(Some(event)) => {
                    let written = out.item(&event, || event_line(&event));
                    match written {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
                        Err(e) => return Err(Failure::Write(e)),
                    }
                }
                Ok(None) => break "the server ended the stream".to_owned(),
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    break status.message().to_owned();
                }
                Err(status) => return Err(status.into()),
            }
        };
        status_line(&format!("watch interrupted ({ended}); opening it again"));
        conn.skip();
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            signal = signals.recv() => return Ok(killed_by(signal)),
        }
    }
}

/// `2026-11-22T00:40:17.537Z acquired reports holder=worker-1 token=17953…`
/// (a read/write lock's events also `mode=read` or `mode=write`; its
/// writer's downgrade is `downgraded … mode=read`).
fn event_line(event: &proto::LockEvent) -> String {
    let mut line = format!(
        "{} {} {}",
        rfc3339(event.at_ms),
        event.event,
        display_name(&event.namespace, &event.name)
    );
    if !event.holder.is_empty() {
        line += &format!(" holder={}", event.holder);
    }
    if event.fencing_token > 0 {
        line += &format!(" token={}", event.fencing_token);
    }
    if event.slot > 0 {
        line += &format!(" slot={}", event.slot);
    }
    if let Some(mode) = lock_mode(event.mode()) {
        line += &format!(" mode={mode}");
    }
    if event.hold_ms > 0 {
        line += &format!(" held={}ms", event.hold_ms);
    }
    if !event.actor.is_empty() {
        line += &format!(" by={}", event.actor);
    }
    line + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str, mode: proto::LockMode) -> proto::LockEvent {
        proto::LockEvent {
            namespace: "default".into(),
            name: "doc".into(),
            event: name.into(),
            holder: "w".into(),
            fencing_token: 7,
            at_ms: 1_000,
            slot: 1,
            actor: "holder".into(),
            mode: mode as i32,
            ..Default::default()
        }
    }

    #[test]
    fn a_read_write_locks_events_say_their_mode_and_a_plain_ones_none() {
        let line = event_line(&event("downgraded", proto::LockMode::Read));
        assert!(
            line.contains(" downgraded doc holder=w token=7 slot=1 mode=read by=holder"),
            "{line}"
        );
        let line = event_line(&event("acquired", proto::LockMode::Write));
        assert!(line.contains(" mode=write "), "{line}");
        let line = event_line(&event("acquired", proto::LockMode::Unspecified));
        assert!(!line.contains("mode="), "{line}");
    }
}
