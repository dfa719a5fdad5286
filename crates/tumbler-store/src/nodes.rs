//! What the store asks of the deployment as a whole rather than of one
//! key: the pub/sub subscription (on its own connection), a `SCAN` walk
//! over every primary, a command sent to each primary, and the health
//! check that every primary answers.

use std::sync::atomic::Ordering;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Client, RedisError, Value};

use super::connection::{Conn, NodeAddr, Target, is_master};
use super::{ScanCursor, Store, StoreError};

impl Store {
    /// Subscribes to `channels` on a connection of its own. The sink can
    /// change the subscriptions; the stream ends when the connection is lost.
    ///
    /// On a cluster the subscription lives on one node: classic PUBLISH is
    /// forwarded to every node of the cluster, so any node hears every
    /// message. Each call starts from the seed after the one used last, so
    /// a subscription that was lost moves to another node.
    pub async fn subscribe(
        &self,
        channels: &[&str],
    ) -> Result<(redis::aio::PubSubSink, redis::aio::PubSubStream), StoreError> {
        let on = |client: Client| async move {
            let mut pubsub = client.get_async_pubsub().await?;
            for channel in channels {
                pubsub.subscribe(*channel).await?;
            }
            Ok::<_, RedisError>(pubsub.split())
        };
        let timeout = self.command_timeout;
        let within = |what: &'static str| {
            StoreError::Unavailable(format!("redis did not accept {what} within {timeout:?}"))
        };
        let backend = &*self.backend;
        match &backend.target {
            Target::Single(info) => {
                let client = backend.client(info, false).map_err(|e| self.fail(e))?;
                match tokio::time::timeout(timeout, on(client)).await {
                    Ok(found) => found.map_err(|e| self.fail(e)),
                    Err(_) => Err(within("a subscription")),
                }
            }
            Target::Sentinel {
                master,
                sentinels,
                settings,
                ..
            } => {
                let subscribe = async {
                    let (client, _) = backend
                        .sentinel_master(sentinels, master, settings, timeout)
                        .await?;
                    on(client).await
                };
                match tokio::time::timeout(timeout, subscribe).await {
                    Ok(found) => found.map_err(|e| self.fail(e)),
                    Err(_) => Err(within("a subscription")),
                }
            }
            Target::Cluster {
                seeds, next_seed, ..
            } => {
                let first = next_seed.load(Ordering::Relaxed);
                let mut last_error = StoreError::Unavailable("no cluster seed node".into());
                for i in 0..seeds.len() {
                    let index = (first + i) % seeds.len();
                    let client = match backend.client(&seeds[index], false) {
                        Ok(client) => client,
                        Err(err) => {
                            last_error = self.fail(err);
                            continue;
                        }
                    };
                    match tokio::time::timeout(timeout, on(client)).await {
                        Ok(Ok(subscribed)) => {
                            next_seed.store((index + 1) % seeds.len(), Ordering::Relaxed);
                            tracing::debug!(seed = index, "subscribed on a cluster node");
                            return Ok(subscribed);
                        }
                        Ok(Err(err)) => last_error = self.fail(err),
                        Err(_) => last_error = within("a subscription"),
                    }
                }
                Err(last_error)
            }
        }
    }

    /// The cluster's primaries that own slots, by address, in a stable
    /// order (`CLUSTER SLOTS`).
    async fn primaries(conn: &mut ClusterConnection) -> Result<Vec<NodeAddr>, RedisError> {
        let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
        let mut primaries = std::collections::BTreeSet::new();
        for range in ranges {
            // [first slot, last slot, [host, port, id, …], replicas…]
            if let Value::Array(range) = range
                && let Some(Value::Array(primary)) = range.get(2)
                && let (Some(host), Some(Value::Int(port))) = (primary.first(), primary.get(1))
                && let Ok(host) = redis::from_redis_value::<String>(host.clone())
                && !host.is_empty()
            {
                primaries.insert((host, *port as u16));
            }
        }
        Ok(primaries.into_iter().collect())
    }

    /// Sends `cmd` (a command about no key, such as `FUNCTION LIST`) to
    /// every primary: the one server, or each cluster primary that owns
    /// slots, by address, in a stable order. Each primary's answer, an
    /// error reply included (one primary's refusal is its own); reaching
    /// the primaries at all is the outer result.
    pub async fn on_every_primary(
        &self,
        cmd: redis::Cmd,
    ) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        let replies: Vec<Result<Value, RedisError>> = self
            .with_connection(|conn| async move {
                match conn {
                    Conn::Single(mut conn) => Ok(vec![cmd.query_async(&mut conn).await]),
                    Conn::Cluster(mut conn) => {
                        let mut replies = Vec::new();
                        for (host, port) in Self::primaries(&mut conn).await? {
                            let routing =
                                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                    host,
                                    port,
                                });
                            replies.push(conn.route_command(cmd.clone(), routing).await);
                        }
                        Ok(replies)
                    }
                }
            })
            .await?;
        Ok(replies
            .into_iter()
            .map(|reply| reply.map_err(|err| self.fail(err)))
            .collect())
    }

    /// Every primary that owns slots answers PING, asked by address (the
    /// cluster connection's own PING to all primaries quietly skips nodes
    /// it lost), and the cluster calls itself OK (`CLUSTER INFO`).
    async fn ping_cluster(&self) -> Result<(), StoreError> {
        use redis::{ErrorKind, ServerErrorKind};
        self.with_connection(|conn| async move {
            let Conn::Cluster(mut conn) = conn else {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "not a cluster connection",
                )));
            };
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await?;
            if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
                return Err(RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ClusterDown),
                    "the cluster reports cluster_state:fail",
                )));
            }
            for (host, port) in Self::primaries(&mut conn).await? {
                let routing =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                conn.route_command(redis::cmd("PING"), routing).await?;
            }
            Ok(())
        })
        .await
    }

    /// One `SCAN` step over the whole deployment: `cursor` names a node
    /// (0 on a single server; on a cluster the index of a primary in
    /// address order) and that node's SCAN cursor. Returns the keys found
    /// and where the next step goes on (None: every node is done). Keys
    /// that exist for the whole walk are found at least once.
    pub async fn scan(
        &self,
        cursor: ScanCursor,
        pattern: &str,
        count: u32,
    ) -> Result<(Vec<String>, Option<ScanCursor>), StoreError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor.position)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let (next, keys, nodes): (u64, Vec<String>, u32) = self
            .with_connection(|conn| async move {
                match conn {
                    Conn::Single(mut conn) => {
                        let (next, keys): (u64, Vec<String>) = scan.query_async(&mut conn).await?;
                        Ok((next, keys, 1))
                    }
                    Conn::Cluster(mut conn) => {
                        let primaries = Self::primaries(&mut conn).await?;
                        let Some((host, port)) = primaries.get(cursor.node as usize).cloned()
                        else {
                            return Ok((0, Vec::new(), primaries.len() as u32));
                        };
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host,
                            port,
                        });
                        let (next, keys): (u64, Vec<String>) =
                            redis::from_redis_value(conn.route_command(scan, routing).await?)?;
                        Ok((next, keys, primaries.len() as u32))
                    }
                }
            })
            .await?;
        let following = if next != 0 {
            Some(ScanCursor {
                node: cursor.node,
                position: next,
            })
        } else if cursor.node + 1 < nodes {
            Some(ScanCursor {
                node: cursor.node + 1,
                position: 0,
            })
        } else {
            None
        };
        Ok((keys, following))
    }

    /// True when Redis can serve writes: one server or every cluster
    /// primary answers PING; a sentinel-found server still says it is the
    /// master (after a failover the old connections may lead to a replica).
    pub async fn ping(&self) -> Result<(), StoreError> {
        if let Target::Sentinel {
            master,
            sentinels,
            current,
            ..
        } = &self.backend.target
        {
            // Where the sentinels say the master is now: connections that
            // lead elsewhere are replaced at their next checkout. Sentinels
            // that cannot be asked do not stop the service (the master may
            // be fine); they only delay noticing a failover.
            match self
                .backend
                .ask_sentinels(sentinels, master, self.command_timeout)
                .await
            {
                Ok(addr) => {
                    let mut current = current.write().unwrap();
                    if current.as_ref() != Some(&addr) {
                        if current.is_some() {
                            tracing::warn!(master = %master, host = %addr.0, port = addr.1, "the sentinels name a new master; reconnecting");
                        }
                        *current = Some(addr);
                    }
                }
                Err(err) => tracing::warn!(error = %err, "no sentinel answered"),
            }
            return self
                .with_connection(|conn| async move {
                    match conn {
                        Conn::Single(mut conn) => is_master(&mut conn).await,
                        Conn::Cluster(_) => Ok(()),
                    }
                })
                .await;
        }
        if self.is_cluster() {
            return self.ping_cluster().await;
        }
        let pong: String = self.command(redis::cmd("PING")).await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(StoreError::Protocol(format!("PING answered {pong:?}")))
        }
    }
}
