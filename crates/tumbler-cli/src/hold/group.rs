//! The command `hold` runs: leader of its own process group, its children
//! reaped by a thread (`hold` is their subreaper, so the group's orphans
//! are collected too), and the terminal handed to it while it runs.

use std::io::IsTerminal as _;
use std::os::fd::AsFd as _;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::sync::oneshot;

use crate::signals::killed_by;

/// The command, leader of its own process group.
pub(super) struct Group {
    pub(super) pgid: Pid,
    /// The direct child's exit code (128 + N when killed by signal N).
    pub(super) exit: oneshot::Receiver<u8>,
}

impl Group {
    pub(super) fn spawn(
        program: &str,
        args: &[String],
        environment: &[(&str, String)],
    ) -> std::io::Result<Group> {
        use std::os::unix::process::CommandExt as _;
        // Orphaned descendants become our children, so the reaper below
        // collects them: a zombie would otherwise keep the group alive
        // wherever PID 1 does not reap.
        let _ = nix::sys::prctl::set_child_subreaper(true);
        let parent = nix::unistd::getpid();
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .envs(environment.iter().map(|(k, v)| (*k, v)))
            .process_group(0);
        // SAFETY: only async-signal-safe calls (prctl, getppid, kill)
        // between fork and exec. The parent-death signal follows the
        // thread that forks: this runs on the main thread (the CLI's
        // future is `block_on`'s, never a spawned task), which lives as
        // long as the process.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
                if nix::unistd::getppid() != parent {
                    // The parent died before the line above.
                    let _ = nix::sys::signal::raise(Signal::SIGKILL);
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let pid = Pid::from_raw(child.id() as i32);
        let (sender, exit) = oneshot::channel();
        std::thread::Builder::new()
            .name("hold-reaper".into())
            .spawn(move || reap(pid, sender))?;
        Ok(Group { pgid: pid, exit })
    }

    pub(super) fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }

    /// No process of the group is left (zombies count until reaped).
    pub(super) fn gone(&self) -> bool {
        matches!(killpg(self.pgid, None), Err(Errno::ESRCH))
    }
}

/// Waits for every child of this process (the command, and the orphans it
/// leaves to us as subreaper), reporting the command's status.
fn reap(child: Pid, sender: oneshot::Sender<u8>) {
    let mut sender = Some(sender);
    loop {
        let code = match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == child => code.clamp(0, 255) as u8,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == child => killed_by(signal),
            Ok(_) | Err(Errno::EINTR) => continue,
            // No child at the moment: an orphan may still come.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if let Some(sender) = sender.take() {
            let _ = sender.send(code);
        }
    }
}

/// The terminal, handed to the command's group while it runs, so that an
/// interactive command can read it (a background group reading its
/// terminal is stopped) and Ctrl-C reaches the command directly. Only
/// when `hold` is in the foreground with stdin and stdout on the
/// terminal: in a pipeline (`hold … | less`) the terminal stays with the
/// pipeline's other commands.
pub(super) struct Terminal {
    ours: Pid,
}

impl Terminal {
    pub(super) fn hand_to(group: Pid) -> Option<Terminal> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() || !std::io::stdout().is_terminal() {
            return None;
        }
        let ours = nix::unistd::tcgetpgrp(stdin.as_fd()).ok()?;
        if ours != nix::unistd::getpgrp() {
            return None;
        }
        nix::unistd::tcsetpgrp(stdin.as_fd(), group).ok()?;
        // Stopped if it read the terminal before it was its own.
        let _ = killpg(group, Signal::SIGCONT);
        Some(Terminal { ours })
    }

    /// Takes the terminal back; from a background group that needs
    /// SIGTTOU blocked (or the kernel stops us).
    pub(super) fn restore(self) {
        let mut ttou = SigSet::empty();
        ttou.add(Signal::SIGTTOU);
        let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), None);
        let _ = nix::unistd::tcsetpgrp(std::io::stdin().as_fd(), self.ours);
        let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&ttou), None);
    }
}
