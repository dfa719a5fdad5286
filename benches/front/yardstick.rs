//! The yardstick of `benches/front.rs`: a bare tonic server with
//! tumbler's proto that decodes an Acquire or Release, runs one plain Lua
//! lock script (`SET NX PX`, compare-and-delete) over one multiplexed
//! connection and encodes the reply: no auth, tracing, metrics or checks.
//! Every other RPC is UNIMPLEMENTED (Inspect answers, for the readiness
//! probe). Padded, each script first runs an empty Lua loop: Redis work
//! without anything else.

use std::pin::Pin;

use tonic::{Request, Response, Status};
use tumbler::proto::lock_service_server::{LockService, LockServiceServer};
use tumbler::proto::*;

/// `SET key holder NX PX ttl` as one script, and compare-and-delete.
const ACQUIRE: &str =
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0";
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

struct Yardstick {
    conn: redis::aio::MultiplexedConnection,
    acquire: redis::Script,
    release: redis::Script,
}

fn unavailable(err: redis::RedisError) -> Status {
    Status::unavailable(err.to_string())
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl LockService for Yardstick {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let request = request.into_inner();
        let granted: i64 = self
            .acquire
            .key(format!("y:{}:{}", request.namespace, request.name))
            .arg(&request.holder)
            .arg(request.ttl_ms.unwrap_or(30_000))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let status = if granted == 1 {
            AcquireStatus::Acquired
        } else {
            AcquireStatus::NotAcquired
        };
        Ok(Response::new(AcquireResponse {
            status: status.into(),
            ..Default::default()
        }))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let request = request.into_inner();
        let deleted: i64 = self
            .release
            .key(format!("y:{}:{}", request.namespace, request.name))
            .arg(&request.holder)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let status = if deleted == 1 {
            ReleaseStatus::Released
        } else {
            ReleaseStatus::NotHeld
        };
        Ok(Response::new(ReleaseResponse {
            status: status.into(),
        }))
    }

    async fn extend(&self, _: Request<ExtendRequest>) -> Result<Response<ExtendResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn batch(
        &self,
        _: Request<tumbler::proto::BatchRequest>,
    ) -> Result<Response<tumbler::proto::BatchResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn inspect(
        &self,
        _: Request<InspectRequest>,
    ) -> Result<Response<InspectResponse>, Status> {
        // Answers, so the benchmark's readiness probe sees it serve.
        Ok(Response::new(InspectResponse::default()))
    }
    async fn queue(&self, _: Request<QueueRequest>) -> Result<Response<QueueResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn list(&self, _: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn list_namespaces(
        &self,
        _: Request<ListNamespacesRequest>,
    ) -> Result<Response<ListNamespacesResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn reap(&self, _: Request<ReapRequest>) -> Result<Response<ReapResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn clear(&self, _: Request<ClearRequest>) -> Result<Response<ClearResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn metrics(
        &self,
        _: Request<MetricsRequest>,
    ) -> Result<Response<MetricsResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    type SessionStream = Stream<SessionResponse>;
    async fn session(
        &self,
        _: Request<tonic::Streaming<SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    type WatchStream = Stream<LockEvent>;
    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn campaign(
        &self,
        _: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn proclaim(
        &self,
        _: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn leader(&self, _: Request<LeaderRequest>) -> Result<Response<LeaderResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    type ObserveStream = Stream<LeaderChange>;
    async fn observe(
        &self,
        _: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
    async fn resign(&self, _: Request<ResignRequest>) -> Result<Response<ResignResponse>, Status> {
        Err(Status::unimplemented("yardstick"))
    }
}

fn padded(script: &str, pad: u64) -> String {
    if pad == 0 {
        return script.to_owned();
    }
    format!("for _ = 1, {pad} do end {script}")
}

/// Serves on `listen` until killed; with `pad` > 0 each script first
/// runs that many steps of an empty Lua loop.
pub async fn serve(listen: &str, redis_url: &str, pad: u64) {
    let conn = redis::Client::open(redis_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let service = Yardstick {
        conn,
        acquire: redis::Script::new(&padded(ACQUIRE, pad)),
        release: redis::Script::new(&padded(RELEASE, pad)),
    };
    tonic::transport::Server::builder()
        .add_service(LockServiceServer::new(service))
        .serve(listen.parse().unwrap())
        .await
        .unwrap();
}
