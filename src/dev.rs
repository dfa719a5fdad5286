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
