//! Builds and runs the gRPC server: the lock service, gRPC health (tied to
//! Redis) and reflection, on a listener the caller bound, until the caller's
//! shutdown future resolves.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

use crate::api::{LockApi, StreamLimits};
use crate::auth::AuthInterceptor;
use crate::config::ServerConfig;
use crate::limits::{ConnLimits, Gate, GatedListener, TrackLayer};
use crate::proto::{self, lock_service_server::LockServiceServer};
use tumbler_engine::keys::Layout;
use tumbler_engine::{EngineSettings, LayoutError, LockEngine};
use tumbler_store::{Store, StoreError};

/// Health service names that follow Redis: the server as a whole ("") and
/// the lock service. Readiness probes use these.
const REDIS_BOUND_SERVICES: [&str; 2] = ["", "tumbler.v1.LockService"];

/// Health service name that is SERVING while the process runs, whatever
/// Redis does: for liveness probes, so a Redis outage drains traffic
/// (readiness) without restarting every replica.
pub const LIVENESS_SERVICE: &str = "liveness";

/// The response header of a NOT_SERVING health answer that says why (the
/// health protocol's reply has no field for it): `tumbler health` prints it.
pub use crate::proto::metadata::HEALTH_REASON as HEALTH_REASON_HEADER;

/// Why the replica is NOT_SERVING (None while it serves), as the health
/// loop last found it and logged it.
type HealthReason = Arc<std::sync::RwLock<Option<String>>>;

/// grpc.health.v1 as tonic-health serves it, its NOT_SERVING answers for
/// the Redis-bound services carrying the reason in [`HEALTH_REASON_HEADER`].
struct ReasonedHealth {
    inner: HealthService,
    reason: HealthReason,
}

#[tonic::async_trait]
impl Health for ReasonedHealth {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let bound = REDIS_BOUND_SERVICES.contains(&request.get_ref().service.as_str());
        let mut response = self.inner.check(request).await?;
        let serving = response.get_ref().status()
            == tonic_health::pb::health_check_response::ServingStatus::Serving;
        let reason = self.reason.read().unwrap().clone();
        if bound
            && !serving
            && let Some(reason) = reason
        {
            // Header values are visible ASCII.
            let printable: String = reason
                .chars()
                .map(|c| {
                    if c == ' ' || c.is_ascii_graphic() {
                        c
                    } else {
                        '?'
                    }
                })
                .collect();
            if let Ok(value) = printable.parse() {
                response.metadata_mut().insert(HEALTH_REASON_HEADER, value);
            }
        }
        Ok(response)
    }

    type WatchStream = tonic_health::server::WatchStream;

    async fn watch(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        self.inner.watch(request).await
    }
}

/// Serves until `shutdown` resolves, then stops accepting, lets in-flight
/// RPCs finish and returns. Returns an error when the data in Redis was
/// written with another layout (the server must not run against it).
pub async fn serve(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    serve_with_http(config, listener, None, shutdown).await
}

/// Upgrades the data in Redis from key layout 3 to this build's layout
/// in place (`tumbler upgrade-layout`, decision 0090).
pub async fn upgrade_layout(
    config: &ServerConfig,
    force: bool,
) -> anyhow::Result<tumbler_engine::Upgraded> {
    let store = Store::new(&config.store)?;
    let layout = Layout::new(&config.key_prefix, config.shards);
    Ok(tumbler_engine::upgrade_layout(&store, &layout, force).await?)
}

/// [`serve`], plus the HTTP port (Prometheus `/metrics`, `/healthz`) on
/// `http` when given; it closes when the server has stopped.
pub async fn serve_with_http(
    config: ServerConfig,
    listener: TcpListener,
    http: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let listeners = Listeners {
        grpc: listener,
        http,
        health: None,
    };
    serve_on(config, listeners, shutdown).await
}

/// The ports a server runs on, bound by the caller.
pub struct Listeners {
    /// The gRPC port (TLS when the config has it).
    pub grpc: TcpListener,
    /// The HTTP port: Prometheus `/metrics`, `/healthz`, the dashboard.
    pub http: Option<TcpListener>,
    /// A plaintext port serving only gRPC health, from the same statuses as
    /// the gRPC port: for probes that cannot speak TLS.
    pub health: Option<TcpListener>,
}

/// [`serve_with_http`], on every port in `listeners`; the extra ports
/// close when the server has stopped.
pub async fn serve_on(
    config: ServerConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let Listeners {
        grpc: listener,
        http,
        health,
    } = listeners;
    // Every port gets the same caps, lowered if need be so all of them at
    // their caps fit in the open-files limit (raised to its hard limit).
    crate::limits::raise_fd_limit();
    let ports = 1 + usize::from(http.is_some()) + usize::from(health.is_some());
    let conn_limits = config.transport.connections.fitted(ports);
    let gated = |port, listener| GatedListener::new(listener, Gate::new(port, conn_limits.clone()));
    let listener = gated("grpc", listener);
    let http = http.map(|http| gated("http", http));
    let health = health.map(|health| gated("health", health));
    // One authenticator for gRPC and the dashboard, so a reload of the
    // tokens file applies to both at once; loaded first, so a bad file
    // stops the start before anything runs.
    let authenticator = match &config.auth_tokens_file {
        Some(path) => Some(crate::auth::Authenticator::load(path)?),
        None => None,
    };
    // Failed logins and session resumes, counted per client address over
    // both ports.
    let auth_throttle = Arc::new(crate::auth::Throttle::new(config.auth_throttle.clone()));
    let replica = format!("replica-{}", uuid::Uuid::now_v7());
    tracing::info!(%replica, "starting");
    let running = LockEngine::start(
        Store::new(&config.store)?,
        EngineSettings {
            layout: Layout::new(&config.key_prefix, config.shards),
            wait_limits: config.wait_limits.clone(),
            changelog: config.changelog.clone(),
            reap_interval: config.reap_interval,
            replica,
            library_grace: config.library_grace,
        },
    );
    let engine = running.engine().clone();
    let http = match http {
        Some(http) => {
            let tls = config.tls.clone().filter(|tls| tls.http);
            let dashboard = crate::dashboard::Options {
                admin: config.dashboard_admin,
                auth: authenticator.clone(),
                secure_cookie: tls.is_some(),
                hosts: config.allowed_hosts.clone(),
                cookie_key: config.dashboard_cookie_key.clone(),
                auth_throttle: auth_throttle.clone(),
            };
            Some(tokio::spawn(crate::http::serve(
                http,
                crate::observe::install_recorder(
                    env!("CARGO_PKG_VERSION"),
                    env!("TUMBLER_COMMIT"),
                )?,
                engine.clone(),
                dashboard,
                tls,
            )))
        }
        None => None,
    };

    let reporter = HealthReporter::new();
    let health_reason = HealthReason::default();
    let health_service = HealthServer::new(ReasonedHealth {
        inner: HealthService::from_health_reporter(reporter.clone()),
        reason: health_reason.clone(),
    });
    set_status(&reporter, ServingStatus::NotServing).await;
    reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
        .await;
    // The health port: grpc.health.v1, plus reflection of that one service
    // so tools like grpcurl can ask it without a .proto.
    let health_port = match health {
        Some(listener) => {
            let reflection = || {
                tonic_reflection::server::Builder::configure()
                    .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            };
            let gate = listener.gate().clone();
            let health = grpc_builder(&conn_limits)
                .layer(TrackLayer::new(gate))
                .add_service(health_service.clone())
                .add_service(reflection().build_v1()?)
                .add_service(reflection().build_v1alpha()?)
                .serve_with_incoming(listener.into_stream());
            Some(tokio::spawn(async {
                if let Err(e) = health.await {
                    tracing::error!(error = %e, "the health port stopped");
                }
            }))
        }
        None => None,
    };
    let watcher = tokio::spawn(watch_redis(
        engine.clone(),
        reporter.clone(),
        health_reason,
        config.health_interval,
    ));

    // Both reflection versions: grpcurl and many tools still ask v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let api = LockApi::new(
        engine.clone(),
        config.limits.clone(),
        &stream_limits(&config.transport),
        auth_throttle,
    );
    let reloader = authenticator
        .clone()
        .map(|auth| tokio::spawn(auth.run_reloader(config.auth_reload_interval)));
    let lock_service = InterceptedService::new(
        LockServiceServer::new(api).max_decoding_message_size(config.transport.max_request_bytes),
        AuthInterceptor {
            authenticator,
            authenticated: |extensions| {
                // The connection carried an authenticated call: it is no
                // longer the first to close when its port needs room.
                if let Some(conn) = extensions.get::<Arc<crate::limits::ConnState>>() {
                    conn.trust();
                }
            },
        },
    );

    let mut watcher = std::pin::pin!(watcher);
    let mut fatal = None;
    let draining = tokio::sync::Notify::new();
    let stop = async {
        tokio::select! {
            () = shutdown => {}
            outcome = &mut watcher => fatal = Some(outcome),
        }
        // Probes see the drain before the port closes. Long-lived work
        // moves at once: Session streams end with UNAVAILABLE ("resume
        // elsewhere"), keeping their grants for the session TTL, and new
        // ones are refused; waiting Acquires answer UNAVAILABLE, keeping
        // their place in the queue for their queue TTL. Short RPCs are
        // still served until endpoints have moved away.
        set_status(&reporter, ServingStatus::NotServing).await;
        running.drain();
        if fatal.is_none() && !config.shutdown_drain.is_zero() {
            tracing::info!(drain = ?config.shutdown_drain, "NOT_SERVING; sessions and waiters told to move; draining before shutdown");
            tokio::time::sleep(config.shutdown_drain).await;
        }
        tracing::info!("shutting down: no new connections, finishing in-flight RPCs");
        draining.notify_one();
    };
    // One port, three protocols, told apart by content type. First the
    // Host/Origin rule (`origin.rs`): Connect and gRPC-Web, and anything
    // with a browser's Origin, answer only the Host names and origins
    // this port is meant for (native gRPC over HTTP/2 passes). Connect
    // (`application/json`, `application/proto`, `application/connect+…`,
    // over HTTP/1.1 or HTTP/2) is turned into gRPC by `ConnectLayer`,
    // gRPC-Web (`application/grpc-web…`) by tonic-web (its decoded body
    // then watched by `GrpcWebWatchLayer`), and both then pass
    // the RPC layer, auth and the handlers as gRPC does.
    let router = grpc_builder(&conn_limits)
        .accept_http1(true)
        .max_concurrent_streams(config.transport.max_concurrent_streams)
        .layer(TrackLayer::new(listener.gate().clone()))
        .layer(crate::origin::OriginLayer::new(
            crate::origin::PortRule::new(config.allowed_hosts.clone(), &config.cors_allow_origins),
        ))
        .layer(crate::connect::ConnectLayer {
            max_request_bytes: config.transport.max_request_bytes,
        })
        .layer(tonic_web::GrpcWebLayer::new())
        .layer(crate::limits::GrpcWebWatchLayer)
        .layer(tower::util::MapResponseLayer::new(
            |response: http::Response<_>| response.map(tonic::body::Body::new),
        ))
        .layer(crate::observe::RpcLayer)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(lock_service);
    let serving = crate::tls::serve(router, listener, config.tls.as_ref(), stop);
    // A client that keeps its connection open (or stops reading) must not
    // hold the process past the grace period.
    let grace_over = async {
        draining.notified().await;
        tokio::time::sleep(config.shutdown_grace).await;
    };
    tokio::select! {
        served = serving => served?,
        () = grace_over => tracing::warn!(
            grace = ?config.shutdown_grace,
            "connections still open after the shutdown grace period; closing them"
        ),
    }

    if let Some(reloader) = reloader {
        reloader.abort();
    }
    running.shutdown().await;
    if let Some(http) = http {
        http.abort();
        let _ = http.await;
    }
    if let Some(health_port) = health_port {
        health_port.abort();
        let _ = health_port.await;
    }
    match fatal {
        Some(Ok(Err(err))) => Err(err.into()),
        Some(Err(join)) => Err(anyhow::anyhow!("redis watcher failed: {join}")),
        _ => {
            watcher.abort();
            Ok(())
        }
    }
}

/// A gRPC server builder with the connection limits' HTTP/2 keep-alive
/// (the caps and idle timeouts are the listener's, see `limits`).
fn grpc_builder(limits: &ConnLimits) -> Server {
    Server::builder()
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
}

async fn set_status(reporter: &HealthReporter, status: ServingStatus) {
    for service in REDIS_BOUND_SERVICES {
        reporter.set_service_status(service, status).await;
    }
}

/// Checks Redis every `interval` and reports SERVING only while it answers
/// and holds this deployment's key layout record (asserted at every tick:
/// create if absent, then compare, so a Redis that lost its data is claimed
/// again within a tick). A mismatch before this replica ever served stops
/// the server; later (Redis restarted empty and a replica of another
/// layout claimed it first) it turns the replica NOT_SERVING until the
/// record is this deployment's again.
async fn watch_redis(
    engine: Arc<LockEngine>,
    reporter: HealthReporter,
    reason: HealthReason,
    interval: Duration,
) -> Result<(), LayoutError> {
    let mut serving = false;
    let mut served = false;
    // The last outage reason logged: each new reason is logged once, also
    // before the first SERVING (a wrong CA or password says so at start).
    let mut told: Option<String> = None;
    loop {
        let reachable = engine.check_redis().await;
        let mut why = None;
        let now_serving = match reachable {
            Ok(()) => true,
            Err(LayoutError::Mismatch { found, expected }) if !served => {
                tracing::error!(%found, %expected, "refusing to serve: redis key layout differs");
                return Err(LayoutError::Mismatch { found, expected });
            }
            Err(LayoutError::Mismatch { found, expected }) => {
                if serving {
                    tracing::error!(%found, %expected, "redis now holds another key layout (it lost its data and a replica of another layout claimed it): NOT_SERVING");
                }
                why = Some(LayoutError::Mismatch { found, expected }.to_string());
                false
            }
            Err(LayoutError::Store(StoreError::Denied(reason))) => {
                if serving || told.as_ref() != Some(&reason) {
                    tracing::error!(error = %reason, "redis refuses the configured user what locks need: NOT_SERVING");
                    told = Some(reason.clone());
                }
                why = Some(reason);
                false
            }
            Err(LayoutError::Store(err)) => {
                let reason = err.to_string();
                if serving || told.as_ref() != Some(&reason) {
                    tracing::warn!(error = %reason, "redis unreachable: NOT_SERVING");
                    told = Some(reason.clone());
                }
                why = Some(reason);
                false
            }
        };
        *reason.write().unwrap() = why;
        if now_serving {
            told = None;
        }
        crate::observe::redis_up(now_serving);
        served |= now_serving;
        if now_serving != serving {
            serving = now_serving;
            if serving {
                tracing::info!("redis reachable: SERVING");
            }
            let status = if serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            set_status(&reporter, status).await;
        }
        tokio::time::sleep(interval).await;
    }
}

/// The streams and waiters a replica and a tenant may hold open, as the
/// gRPC adapter counts them.
fn stream_limits(transport: &crate::config::TransportLimits) -> StreamLimits {
    StreamLimits {
        max_sessions: transport.max_sessions,
        max_watchers: transport.max_watchers,
        max_sessions_per_token: transport.max_sessions_per_token,
        max_watchers_per_token: transport.max_watchers_per_token,
        max_watchers_per_namespace: transport.max_watchers_per_namespace,
        max_waiters_per_token: transport.max_waiters_per_token,
    }
}
