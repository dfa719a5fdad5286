//! Leader election: [`Election`] (campaign, who leads, observe) and
//! [`Leadership`] (the leader's guard). An election is a fair lock of
//! limit 1 on the server: the leadership is a grant whose fencing token is
//! the term, kept by the same watchdog as a [`Lock`]'s and resigned (the
//! Resign RPC pinned to the term, with the secret only the winning
//! Campaign was told; it elects the next candidate at once) when the
//! guard is dropped.

use std::time::Duration;

use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tumbler_proto as proto;

use crate::client::{Client, DEADLINE_SLACK};
use crate::error::{Error, NotAcquiredReason, Result};
use crate::lock::{Lock, cancellable, new_holder};

/// How long one Campaign call may wait when the campaign has no wait of
/// its own: a day (the server cuts it at its own longest wait; the
/// campaign is then sent again with the same candidate).
const CAMPAIGN_CALL: Duration = Duration::from_secs(24 * 3600);

impl Client {
    /// The election `name` of the client's namespace: see [`Election`].
    ///
    /// ```no_run
    /// # async fn run(client: tumbler_client::Client) -> tumbler_client::Result<()> {
    /// use std::time::Duration;
    /// let election = client.election("scheduler").ttl(Duration::from_secs(3));
    /// let leader = election.campaign("host-a:8080").await?;
    /// println!("leading with term {}", leader.term());
    /// tokio::select! {
    ///     _ = lead(leader.term()) => {}
    ///     lost = leader.lost() => eprintln!("stop leading: {lost}"),
    /// }
    /// leader.resign().await?;
    /// # Ok(()) }
    /// # async fn lead(_term: u64) {}
    /// ```
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election {
            client: self.clone(),
            name: name.into(),
            candidate: None,
            ttl: None,
            wait: None,
            cancel: None,
        }
    }
}

/// One election, to campaign in, ask who leads, or observe. Made by
/// [`Client::election`].
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    name: String,
    candidate: Option<String>,
    ttl: Option<Duration>,
    wait: Option<Duration>,
    cancel: Option<CancellationToken>,
}

impl Election {
    /// The candidate id (default: [`new_holder`]). Pass your own to make a
    /// campaign your code retries the same candidacy (a leader's retry gets
    /// its leadership back, same term).
    pub fn candidate(mut self, candidate: impl Into<String>) -> Self {
        self.candidate = Some(candidate.into());
        self
    }

    /// The leadership's lease: how long a crashed leader keeps leading (the
    /// watchdog renews it every third while the guard lives). Default: the
    /// server's.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Give up after waiting this long to be elected
    /// ([`Error::NotAcquired`], reason timeout). Default: wait until
    /// elected.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Stop campaigning when `token` is cancelled ([`Error::Cancelled`]; the
    /// server drops the candidacy at once). Dropping the future does the
    /// same.
    pub fn cancel_on(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Waits in the election's line (in the server, in arrival order) until
    /// elected, with `value` as the leader's value. Retried on UNAVAILABLE
    /// with the same candidate.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        let value = value.into();
        cancellable(self.cancel.clone(), self.campaign_inner(value)).await
    }

    async fn campaign_inner(&self, value: String) -> Result<Leadership> {
        let candidate = self.candidate.clone().unwrap_or_else(new_holder);
        let started = Instant::now();
        loop {
            let wait = match self.wait {
                Some(wait) => wait.saturating_sub(started.elapsed()),
                None => CAMPAIGN_CALL,
            };
            let mut sent = Instant::now();
            let reply = self
                .client
                .retry(
                    Instant::now() + wait + DEADLINE_SLACK,
                    |mut stub, request| async move { stub.campaign(request).await },
                    |left| {
                        sent = Instant::now();
                        proto::CampaignRequest {
                            namespace: self.client.namespace().to_owned(),
                            name: self.name.clone(),
                            candidate: candidate.clone(),
                            value: value.clone(),
                            ttl_ms: self.ttl.map(|t| t.as_millis() as u64),
                            wait_ms: self.wait.map(|_| {
                                wait.min(left.saturating_sub(Duration::from_millis(50)))
                                    .as_millis() as u64
                            }),
                            ..Default::default()
                        }
                    },
                )
                .await;
            let reply = match reply {
                Ok(reply) => reply,
                Err(status) if status.code() == tonic::Code::DeadlineExceeded => {
                    proto::CampaignResponse::default()
                }
                Err(status) => return Err(status.into()),
            };
            if let Some(leader) = reply.leader.filter(|_| reply.elected) {
                let grant = proto::Grant {
                    holder: leader.candidate.clone(),
                    fencing_token: leader.term,
                    slot: 1,
                    acquired_at_ms: leader.elected_at_ms,
                    expires_at_ms: leader.expires_at_ms,
                    ttl_ms: leader.ttl_ms,
                    ..Default::default()
                };
                // The lease started no earlier than the last try was sent.
                let lock = Lock::leadership(
                    self.client.clone(),
                    self.name.clone(),
                    grant,
                    sent,
                    reply.secret.clone(),
                );
                return Ok(Leadership {
                    client: self.client.clone(),
                    lock,
                    value: leader.value,
                });
            }
            if self.wait.is_some_and(|wait| started.elapsed() >= wait) {
                return Err(Error::NotAcquired {
                    name: self.name.clone(),
                    reason: NotAcquiredReason::Timeout,
                    holders: 1,
                    queue_position: reply.queue_position,
                });
            }
        }
    }

    /// Who leads now (None: nobody), with the term and the value.
    pub async fn leader(&self) -> Result<Option<proto::Leadership>> {
        let request = proto::LeaderRequest {
            namespace: self.client.namespace().to_owned(),
            name: self.name.clone(),
        };
        let reply = self
            .client
            .call(
                |mut stub, req| async move { stub.leader(req).await },
                request,
            )
            .await?;
        Ok(reply.leader)
    }

    /// The leader changes as they happen: first the leader of the moment
    /// (event `current`, no leader when nobody leads), then `elected`,
    /// `proclaimed`, and `resigned` / `expired` / `removed` (no leader).
    pub async fn observe(
        &self,
    ) -> Result<impl Stream<Item = Result<proto::LeaderChange>> + Send + 'static> {
        let request = proto::LeaderRequest {
            namespace: self.client.namespace().to_owned(),
            name: self.name.clone(),
        };
        let changes = self
            .client
            .stub()
            .observe(request)
            .await
            .map_err(Error::from)?
            .into_inner();
        Ok(changes.map(|change| change.map_err(Error::from)))
    }
}

/// The leader's guard: its term (the grant's fencing token: pass it to
/// what you lead, which refuses anything from a lower term), its value,
/// and the watchdog that renews the lease every third of it. Resigned when
/// dropped (in the background) or with [`resign`](Leadership::resign);
/// [`lost`](Leadership::lost) resolves the moment the leadership is gone
/// (the lease lapsed: the term can never act again).
#[derive(Debug)]
pub struct Leadership {
    client: Client,
    lock: Lock,
    value: String,
}

impl Leadership {
    /// The term: strictly greater than every term before it.
    pub fn term(&self) -> u64 {
        self.lock.fencing_token()
    }

    /// The candidate id that leads.
    pub fn candidate(&self) -> &str {
        self.lock.holder()
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The value as last proclaimed.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// True once the leadership is known to be gone.
    pub fn is_lost(&self) -> bool {
        self.lock.is_lost()
    }

    /// Resolves with [`Error::LockLost`] the moment the leadership is known
    /// to be gone (a renewal answered NOT_HELD, or renewals failed until
    /// the lease ran out).
    pub fn lost(&self) -> impl Future<Output = Error> + Send + 'static {
        self.lock.lost()
    }

    /// Replaces the leader's value, checked against the term:
    /// [`Error::LockLost`] when this term leads no more (and from then on
    /// [`is_lost`](Leadership::is_lost) is true and `lost()` resolves).
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        let request = proto::ProclaimRequest {
            namespace: self.client.namespace().to_owned(),
            name: self.lock.name().to_owned(),
            candidate: self.lock.holder().to_owned(),
            term: self.term(),
            value: value.clone(),
            secret: self.lock.secret().to_owned(),
        };
        let reply = self
            .client
            .call(
                |mut stub, req| async move { stub.proclaim(req).await },
                request,
            )
            .await?;
        if reply.status != proto::ProclaimStatus::Proclaimed as i32 {
            // The term leads no more: the leadership is lost for good.
            return Err(self.lock.mark_lost("not the leader with this term"));
        }
        self.value = value;
        Ok(())
    }

    /// Steps down: the next candidate in line is elected at once. True
    /// when this term still led.
    pub async fn resign(self) -> Result<bool> {
        self.lock.release().await
    }
}
