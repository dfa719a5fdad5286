//! The few etcd v3 messages the benchmark uses (field numbers from etcd
//! 3.4's `rpc.proto` and `v3lock.proto`; response headers are skipped),
//! and an etcd server of the benchmark's own.
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tonic::transport::Channel;

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    #[prost(int64, tag = "2")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LockRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub name: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LockResponse {
    #[prost(bytes = "vec", tag = "2")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UnlockRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UnlockResponse {}

/// One unary call; panics on any error status.
pub async fn call<Q, R>(
    grpc: &mut tonic::client::Grpc<Channel>,
    path: &'static str,
    request: Q,
) -> R
where
    Q: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + Sync + 'static,
{
    try_call(grpc, path, request)
        .await
        .unwrap_or_else(|status| panic!("{path}: {status}"))
}

async fn try_call<Q, R>(
    grpc: &mut tonic::client::Grpc<Channel>,
    path: &'static str,
    request: Q,
) -> Result<R, tonic::Status>
where
    Q: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Q, R>::default();
    Ok(grpc
        .unary(
            tonic::Request::new(request),
            http::uri::PathAndQuery::from_static(path),
            codec,
        )
        .await?
        .into_inner())
}

/// `etcd` on loopback free ports, its data dir on tmpfs when there is
/// one; killed on drop.
pub struct EtcdServer {
    child: Child,
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

impl EtcdServer {
    /// None when there is no `etcd` binary.
    pub fn start() -> Option<Self> {
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let client = tumbler::dev::free_port().unwrap();
        let peer = tumbler::dev::free_port().unwrap();
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .arg("--name=bench")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=bench={peer_url}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        Some(EtcdServer {
            child,
            endpoint: client_url,
            _dir: dir,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until a lease can be granted.
    pub async fn ready(&self) {
        for _ in 0..200 {
            if let Ok(channel) = Channel::from_shared(self.endpoint.clone())
                .unwrap()
                .connect()
                .await
            {
                let mut grpc = tonic::client::Grpc::new(channel);
                let granted: Result<LeaseGrantResponse, _> = try_call(
                    &mut grpc,
                    "/etcdserverpb.Lease/LeaseGrant",
                    LeaseGrantRequest { ttl: 5, id: 0 },
                )
                .await;
                if granted.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("etcd did not come up at {}", self.endpoint);
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
