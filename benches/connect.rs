//! Connect JSON against gRPC on the same port, in the same run:
//! uncontended acquire+release pairs per second (distinct names, no
//! waiting) at 1 and 64 clients, over
//! - **gRPC**: tonic, one HTTP/2 connection per 8 clients;
//! - **Connect JSON, HTTP/2**: the same connections (a tonic Channel
//!   carries any HTTP/2 request), `POST /tumbler.v1.LockService/<Method>`
//!   with `application/json` bodies;
//! - **Connect JSON, HTTP/1.1**: reqwest, one keep-alive connection per
//!   client.
//!
//! The server (in this process) and its redis-server run on loopback on
//! the machine's cores with the load generator.
//!
//! `cargo bench --bench connect` (CONNECT_SECONDS=N per measurement,
//! default 4). Under `cargo test` a smoke run with tiny counts only checks
//! that numbers come out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use tonic::transport::Channel;
use tower::ServiceExt;

pub mod common;

use tumbler::config::{ServerConfig, ServiceArgs};
use tumbler::dev::RedisServer;
use tumbler::proto::lock_service_client::LockServiceClient;
use tumbler::proto::{self, AcquireStatus, ReleaseStatus};

const CLIENTS_PER_CHANNEL: usize = 8;

#[derive(Clone, Copy, Debug)]
enum Transport {
    Grpc,
    ConnectH2,
    ConnectH1,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Transport::Grpc => "gRPC",
            Transport::ConnectH2 => "Connect JSON, HTTP/2",
            Transport::ConnectH1 => "Connect JSON, HTTP/1.1",
        }
    }
}

/// One client's way in.
enum Client {
    Grpc(LockServiceClient<Channel>),
    ConnectH2(Channel, String),
    ConnectH1(reqwest::Client, String),
}

impl Client {
    /// One acquire+release pair on `name`.
    async fn pair(&mut self, name: &str) {
        match self {
            Client::Grpc(client) => {
                let acquired = client
                    .acquire(proto::AcquireRequest {
                        name: name.into(),
                        holder: "bench".into(),
                        ttl_ms: Some(30_000),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(acquired.status(), AcquireStatus::Acquired);
                let released = client
                    .release(proto::ReleaseRequest {
                        name: name.into(),
                        holder: "bench".into(),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(released.status(), ReleaseStatus::Released);
            }
            Client::ConnectH2(..) | Client::ConnectH1(..) => {
                let acquire = format!(r#"{{"name":"{name}","holder":"bench","ttlMs":"30000"}}"#);
                let body = self.post("Acquire", acquire).await;
                assert!(body.contains("ACQUIRE_STATUS_ACQUIRED"), "{body}");
                let release = format!(r#"{{"name":"{name}","holder":"bench"}}"#);
                let body = self.post("Release", release).await;
                assert!(body.contains("RELEASE_STATUS_RELEASED"), "{body}");
            }
        }
    }

    async fn post(&mut self, method: &str, body: String) -> String {
        match self {
            Client::ConnectH2(channel, endpoint) => {
                let request =
                    http::Request::post(format!("{endpoint}/tumbler.v1.LockService/{method}"))
                        .header("content-type", "application/json")
                        .body(tonic::body::Body::new(http_body_util::Full::new(
                            Bytes::from(body),
                        )))
                        .unwrap();
                let response = channel.clone().oneshot(request).await.unwrap();
                let bytes = response.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8(bytes.to_vec()).unwrap()
            }
            Client::ConnectH1(client, endpoint) => client
                .post(format!("{endpoint}/tumbler.v1.LockService/{method}"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            Client::Grpc(_) => unreachable!(),
        }
    }
}

async fn clients(transport: Transport, endpoint: &str, count: usize) -> Vec<Client> {
    let mut channels = Vec::new();
    for _ in 0..count.div_ceil(CLIENTS_PER_CHANNEL) {
        channels.push(
            Channel::from_shared(endpoint.to_owned())
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
    }
    (0..count)
        .map(|i| {
            let channel = channels[i / CLIENTS_PER_CHANNEL].clone();
            match transport {
                Transport::Grpc => Client::Grpc(LockServiceClient::new(channel)),
                Transport::ConnectH2 => Client::ConnectH2(channel, endpoint.to_owned()),
                Transport::ConnectH1 => Client::ConnectH1(
                    reqwest::Client::builder()
                        .pool_max_idle_per_host(1)
                        .build()
                        .unwrap(),
                    endpoint.to_owned(),
                ),
            }
        })
        .collect()
}

/// Pairs per second of `count` clients over `transport`.
async fn measure(
    transport: Transport,
    endpoint: &str,
    count: usize,
    warm_up: Duration,
    measure: Duration,
) -> f64 {
    let pairs = Arc::new(AtomicUsize::new(0));
    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_at = Instant::now() + warm_up + measure;
    let mut tasks = Vec::new();
    for (index, mut client) in clients(transport, endpoint, count)
        .await
        .into_iter()
        .enumerate()
    {
        let pairs = pairs.clone();
        let counting = counting.clone();
        let label = transport.label();
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < stop_at {
                client.pair(&format!("{label}-{count}-{index}-{i}")).await;
                if counting.load(Ordering::Relaxed) {
                    pairs.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }
    tokio::time::sleep(warm_up).await;
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let seconds = std::env::var("CONNECT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let (warm_up, window, counts) = if benching {
        (
            Duration::from_secs(1),
            Duration::from_secs(seconds),
            [1, 64],
        )
    } else {
        (
            Duration::from_millis(50),
            Duration::from_millis(200),
            [1, 4],
        )
    };
    let redis = RedisServer::start("redis-server").expect("redis-server");
    let args = ServiceArgs {
        reap_interval_ms: 0,
        ..ServiceArgs::default()
    };
    let config = ServerConfig::new(redis.url(), &args).unwrap();
    let endpoint = common::serve_in_process(config).await;
    common::wait_until_serving(&endpoint).await;

    println!("| clients | transport | pairs/s | vs gRPC |");
    println!("| ---: | --- | ---: | ---: |");
    for count in counts {
        let mut grpc = 0.0;
        for transport in [Transport::Grpc, Transport::ConnectH2, Transport::ConnectH1] {
            let rate = measure(transport, &endpoint, count, warm_up, window).await;
            assert!(rate > 0.0, "{transport:?} made no pairs");
            if let Transport::Grpc = transport {
                grpc = rate;
            }
            println!(
                "| {count} | {} | {rate:.0} | {:.2}× |",
                transport.label(),
                rate / grpc
            );
        }
    }
}
