//! A private `redis-server` child on a free loopback port, in its own temp
//! directory, keeping nothing on disk. `tumbler dev` runs the service
//! against one; the tests start, kill and restart their own with it.
//!
//! The child is stopped (by its pid, never by name) when the handle is
//! dropped, and is also told by the kernel to stop if the thread that
//! started it dies (`PR_SET_PDEATHSIG`), so a killed `tumbler dev` leaves
//! no redis-server behind.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How to install Redis when `redis-server` is missing.
pub const INSTALL_HINT: &str = "redis-server was not found. Install it with `sudo apt-get install -y redis-server` (Debian/Ubuntu), `sudo dnf install redis` (Fedora) or `brew install redis` (macOS), or pass --redis-server /path/to/redis-server";

/// A running redis-server child.
pub struct RedisServer {
    binary: String,
    port: u16,
    dir: tempfile::TempDir,
    /// Arguments added on every start (persistence settings, say).
    extra_args: Vec<String>,
    child: Option<Child>,
}

/// A port the kernel had free a moment ago on 127.0.0.1.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

impl RedisServer {
    /// Starts `binary` on a free port (a few tries, in case another process
    /// takes the port between the probe and the start).
    pub fn start(binary: &str) -> anyhow::Result<Self> {
        Self::start_with_args(binary, &[])
    }

    /// [`Self::start`] with extra `redis-server` arguments, kept for
    /// restarts (e.g. `--appendonly yes --appendfsync always`, so a restart
    /// keeps what was acknowledged).
    pub fn start_with_args(binary: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let mut last_error = None;
        for _ in 0..5 {
            let mut server = RedisServer {
                binary: binary.to_owned(),
                port: free_port()?,
                dir: tempfile::Builder::new()
                    .prefix("tumbler-redis-")
                    .tempdir()?,
                extra_args: extra.iter().map(|a| a.to_string()).collect(),
                child: None,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(err) if err.downcast_ref::<std::io::Error>().is_some() => return Err(err),
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("redis-server did not start")))
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let mut command = Command::new(&self.binary);
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only an async-signal-safe prctl call between fork and exec.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
        let child = command.spawn().map_err(|err| {
            if err.kind() == std::io::ErrorKind::NotFound {
                anyhow::Error::new(err).context(INSTALL_HINT)
            } else {
                anyhow::Error::new(err).context(format!("starting {}", self.binary))
            }
        })?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until the child answers PING, or fails with its log.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "redis-server exited with {status} on port {}: {}",
                    self.port,
                    self.log_tail()
                );
            }
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        bail!(
            "redis-server did not answer on port {} within 10 s",
            self.port
        )
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the child at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the child politely (SIGTERM), then by force after 5 s.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_child(child);
        }
    }

    /// Starts a stopped or killed server again on the same port and data
    /// directory (empty unless started with persistence arguments).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
            .with_context(|| format!("restarting redis-server on port {}", self.port))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops a child process politely (SIGTERM), then by force after 5 s, and
/// reaps it.
pub fn stop_child(mut child: Child) {
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// True when something on `port` answers a Redis PING.
pub fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// The default gRPC address of `tumbler dev`.
pub const DEV_LISTEN: &str = "127.0.0.1:50051";

/// Who listens on TCP `port` on this machine, as "pid 1234 (tumbler)", when
/// /proc tells (Linux; a process of another user shows as "another user's
/// process"); `None` when nothing is found.
pub fn who_listens(port: u16) -> Option<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if fields.len() < 10 || fields[3] != "0A" {
                continue;
            }
            let local_port = fields[1]
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            if local_port == Some(port) && fields[9] != "0" {
                inodes.push(format!("socket:[{}]", fields[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && inodes.iter().any(|i| target.as_os_str() == i.as_str())
            {
                let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
                return Some(format!("pid {pid} ({})", comm.trim()));
            }
        }
    }
    Some("another user's process".to_owned())
}

/// How the hints `tumbler dev` prints call tumbler: the running binary's
/// path (so a hint runs as printed after `cargo run -- dev`, with nothing on
/// `PATH`), and an `export PATH=…` line that puts its directory first.
/// `tumbler` and no line when that is what `PATH` already finds.
pub fn hint_command() -> (String, Option<String>) {
    let Ok(exe) = std::env::current_exe() else {
        return ("tumbler".to_owned(), None);
    };
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("tumbler"))
            .find(|candidate| candidate.is_file())
            .and_then(|found| found.canonicalize().ok())
            == exe.canonicalize().ok()
    });
    if on_path || exe.file_name().is_none_or(|name| name != "tumbler") {
        return ("tumbler".to_owned(), None);
    }
    let dir = exe
        .parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    (
        shell_quote(&exe.display().to_string()),
        Some(format!("export PATH={}:\"$PATH\"", shell_quote(&dir))),
    )
}

/// `s` as one POSIX shell word.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@%".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn shell_quote_keeps_plain_paths_and_quotes_the_rest() {
        assert_eq!(
            super::shell_quote("/a/b-c/target/debug"),
            "/a/b-c/target/debug"
        );
        assert_eq!(super::shell_quote("/my dir/it's"), r"'/my dir/it'\''s'");
    }

    #[test]
    fn who_listens_names_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let who = super::who_listens(port).unwrap();
        assert!(
            who.starts_with(&format!("pid {} (", std::process::id())),
            "{who}"
        );
    }
}
