//! `tumbler elect`: real processes against a real server. A campaign
//! prints when elected and leads until interrupted, then resigns (the next
//! candidate is elected at once); a command runs while leading with the
//! term in its environment; a SIGKILLed leader hands over at its lease's
//! end; `--listen` prints the leader and every change.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const TUMBLER: &str = env!("CARGO_BIN_EXE_tumbler");

/// `tumbler elect --addr <endpoint> <args>`, stdout and stderr piped.
fn elect(endpoint: &str, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(TUMBLER)
        .arg("elect")
        .args(["--addr", endpoint])
        .args(args)
        .env_remove("TUMBLER_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("a line within 10 s")
        .unwrap()
        .expect("stdout still open")
}

/// The `term=` of an ELECTED line.
fn term_of(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix("term="))
        .unwrap_or_else(|| panic!("no term in {line:?}"))
        .parse()
        .unwrap()
}

async fn exit_code(child: &mut Child) -> i32 {
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10 s")
        .unwrap()
        .code()
        .expect("an exit code")
}

async fn leader(
    client: &mut proto::lock_service_client::LockServiceClient<tonic::transport::Channel>,
    name: &str,
) -> Option<proto::Leadership> {
    client
        .leader(proto::LeaderRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .leader
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_prints_when_elected_leads_until_interrupted_then_hands_over() {
    let server = TestServer::new().start().await;
    let endpoint = server.endpoint();
    let mut client = server.client().await;
    let (mut first, mut first_out) = elect(&endpoint, &["e-cli", "host-a", "--candidate", "a"]);
    let line = next_line(&mut first_out).await;
    assert!(
        line.starts_with("ELECTED e-cli ") && line.ends_with("candidate=a value=host-a"),
        "{line}"
    );
    let term_a = term_of(&line);
    // A second candidate waits in line.
    let (mut second, mut second_out) = elect(&endpoint, &["e-cli", "host-b", "--candidate", "b"]);
    until_waiters(&mut client, "e-cli", 1).await;
    let shown = leader(&mut client, "e-cli").await.unwrap();
    assert_eq!(
        (shown.candidate.as_str(), shown.term, shown.value.as_str()),
        ("a", term_a, "host-a")
    );
    // Ctrl-C: the leader resigns and exits 0; b is elected at once.
    kill(Pid::from_raw(first.id().unwrap() as i32), Signal::SIGINT).unwrap();
    assert_eq!(exit_code(&mut first).await, 0);
    let line = next_line(&mut second_out).await;
    assert!(line.contains("candidate=b value=host-b"), "{line}");
    assert!(term_of(&line) > term_a, "terms rise");
    kill(Pid::from_raw(second.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(exit_code(&mut second).await, 0);
    assert_eq!(leader(&mut client, "e-cli").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_a_command_while_leading_and_a_sigkilled_leader_hands_over_at_its_lease() {
    let server = TestServer::new().start().await;
    let endpoint = server.endpoint();
    let mut client = server.client().await;
    let (mut leading, mut out) = elect(
        &endpoint,
        &[
            "e-cmd",
            "v",
            "--ttl-ms",
            "1000",
            "--",
            "sh",
            "-c",
            "echo $TUMBLER_TERM $TUMBLER_CANDIDATE; exec sleep 30",
        ],
    );
    let line = next_line(&mut out).await;
    let (term, candidate) = line.split_once(' ').unwrap();
    let shown = leader(&mut client, "e-cmd").await.unwrap();
    assert_eq!(
        (shown.term.to_string().as_str(), shown.candidate.as_str()),
        (term, candidate)
    );
    // The elect process dies by SIGKILL (its command with it): the
    // leadership ends at its lease, and a waiting candidate takes over.
    let mut next = server.client().await;
    let waiting = tokio::spawn(async move {
        next.campaign(proto::CampaignRequest {
            name: "e-cmd".into(),
            candidate: "next".into(),
            wait_ms: Some(10_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
    });
    until_waiters(&mut client, "e-cmd", 1).await;
    leading.kill().await.unwrap();
    let started = std::time::Instant::now();
    let elected = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("elected once the lease lapses")
        .unwrap();
    assert!(elected.elected, "{elected:?}");
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "took {:?}",
        started.elapsed()
    );
    assert!(elected.leader.unwrap().term > term.parse::<u64>().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_listen_prints_the_leader_then_every_change() {
    let server = TestServer::new().start().await;
    let endpoint = server.endpoint();
    let mut client = server.client().await;
    let (mut listening, mut out) = elect(&endpoint, &["--listen", "e-listen"]);
    let line = next_line(&mut out).await;
    assert!(line.contains(" current e-listen (no leader)"), "{line}");
    // Campaign and resign until the listener shows it (events flow once
    // the replica's subscription is up), then once more, watched.
    let mut seen = Vec::new();
    for _ in 0..50 {
        let reply = client
            .campaign(proto::CampaignRequest {
                name: "e-listen".into(),
                candidate: "probe".into(),
                value: "p".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let term = reply.leader.unwrap().term;
        client
            .resign(proto::ResignRequest {
                name: "e-listen".into(),
                candidate: "probe".into(),
                term,
                secret: reply.secret,
                ..Default::default()
            })
            .await
            .unwrap();
        if let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_millis(100), out.next_line()).await
        {
            seen.push(line);
            seen.push(next_line(&mut out).await);
            break;
        }
    }
    assert!(
        seen.iter()
            .any(|l| l.contains(" elected e-listen ") && l.contains("candidate=probe value=p")),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|l| l.contains(" resigned e-listen ") && l.ends_with("(no leader)")),
        "{seen:?}"
    );
    kill(
        Pid::from_raw(listening.id().unwrap() as i32),
        Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(exit_code(&mut listening).await, 130);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_session_keeps_its_leadership_and_term_when_its_server_is_sigkilled() {
    let redis = start_redis();
    let staying = TestServer::new().redis(&redis.url()).start().await;
    let mut doomed = TumblerProcess::start(&redis.url(), &[]).await;
    let mut client = staying.client().await;
    let addrs = format!("{},{}", doomed.endpoint, staying.endpoint());
    let (mut leading, mut out) = elect(
        &addrs,
        &["e-session", "on-session", "--session", "--ttl-ms", "1500"],
    );
    let line = next_line(&mut out).await;
    assert!(
        line.starts_with("ELECTED e-session ") && line.ends_with("value=on-session"),
        "{line}"
    );
    let term = term_of(&line);
    // The server the session streams through dies; elect resumes the
    // session on the next --addr within its TTL and leads on, same term,
    // well past the TTL.
    doomed.kill();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let shown = leader(&mut client, "e-session")
        .await
        .expect("still leading");
    assert_eq!((shown.term, shown.value.as_str()), (term, "on-session"));
    assert!(shown.candidate.starts_with("session-"), "{shown:?}");
    assert!(leading.try_wait().unwrap().is_none(), "elect runs on");
    // Ctrl-C ends the session: nobody leads, at once.
    kill(Pid::from_raw(leading.id().unwrap() as i32), Signal::SIGINT).unwrap();
    assert_eq!(exit_code(&mut leading).await, 0);
    assert_eq!(leader(&mut client, "e-session").await, None);
}
