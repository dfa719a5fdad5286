//! Whether a replica may call Redis for a request, and if not, the real
//! cause. Three things decide it: the key layout record is this
//! deployment's (checked at start, at each health tick and on every new
//! connection), the last health check found no ACL refusal, and a
//! connection could be made. [`Readiness`] owns that state; the engine's
//! health check feeds it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::LayoutError;
use super::keys::{LAYOUT_VERSION, Layout};
use crate::store::{Store, StoreError};

/// What the engine knows of Redis' fitness for requests.
pub(super) struct Readiness {
    /// Set while the data in Redis is known to use this deployment's
    /// layout; unset, every operation answers UNAVAILABLE. Shared with the
    /// check every new Redis connection passes.
    layout_verified: Arc<AtomicBool>,
    /// The layout record a new connection found instead of this
    /// deployment's (set by the connection check, taken by the health check).
    layout_mismatch: Arc<Mutex<Option<String>>>,
    /// Why the last health check failed (None after one passed): what an
    /// RPC is told while the layout is not verified, when no connection
    /// failure says more.
    not_ready: Mutex<Option<String>>,
    /// The ACL refusal the last health check found (None after one
    /// passed): the reason, naming what to grant, every RPC is told.
    denied: Mutex<Option<String>>,
    /// Whether `denied` is set (read on every call without the lock).
    lock_path_denied: AtomicBool,
}

impl Readiness {
    /// Unverified; every new connection of `store` checks the layout record.
    pub(super) fn new(store: &Store, layout: &Layout) -> Self {
        let readiness = Readiness {
            layout_verified: Arc::new(AtomicBool::new(false)),
            layout_mismatch: Arc::default(),
            not_ready: Mutex::default(),
            denied: Mutex::default(),
            lock_path_denied: AtomicBool::new(false),
        };
        store.on_connect(layout_check(
            layout,
            readiness.layout_verified.clone(),
            Arc::clone(&readiness.layout_mismatch),
        ));
        readiness
    }

    pub(super) fn is_verified(&self) -> bool {
        self.layout_verified.load(Ordering::Acquire)
    }

    /// What the layout check found: this deployment's record, or not.
    pub(super) fn set_verified(&self, verified: bool) {
        self.layout_verified.store(verified, Ordering::Release);
    }

    /// The other layout's record a new connection found, once.
    pub(super) fn take_mismatch(&self) -> Option<String> {
        self.layout_mismatch.lock().unwrap().take()
    }

    /// A health check's result. An ACL refusal anywhere in it (the layout
    /// record's commands, the lock path) is answered to every RPC until a
    /// check passes; other failures (an outage) leave the calls to find
    /// out.
    pub(super) fn checked(&self, checked: &Result<(), LayoutError>) {
        *self.not_ready.lock().unwrap() = checked.as_ref().err().map(detail);
        match checked {
            Ok(()) => {
                self.lock_path_denied.store(false, Ordering::Release);
                *self.denied.lock().unwrap() = None;
            }
            Err(LayoutError::Store(StoreError::Denied(reason))) => {
                *self.denied.lock().unwrap() = Some(reason.clone());
                self.lock_path_denied.store(true, Ordering::Release);
            }
            Err(_) => {}
        }
    }

    /// Whether a request may call Redis now, and if not, the real cause:
    /// the ACL refusal the health check found, or until the layout is
    /// verified, why the last connection (or health check) failed — a
    /// refused port, an unknown host, an untrusted certificate, a missing
    /// or wrong password — as the log says it.
    pub(super) fn ready(&self, store: &Store) -> Result<(), StoreError> {
        if self.lock_path_denied.load(Ordering::Acquire)
            && let Some(reason) = self.denied.lock().unwrap().clone()
        {
            return Err(StoreError::Denied(reason));
        }
        if self.is_verified() {
            return Ok(());
        }
        if let Some(failed) = store.last_connect_error() {
            return Err(failed);
        }
        let reason = self.not_ready.lock().unwrap().clone().unwrap_or_else(|| {
            "not connected to redis yet (the first connection is under way)".into()
        });
        Err(StoreError::Unavailable(reason))
    }
}

/// A failed health check's reason without the error's own prefix.
fn detail(err: &LayoutError) -> String {
    match err {
        LayoutError::Store(
            StoreError::Unavailable(detail)
            | StoreError::Denied(detail)
            | StoreError::Protocol(detail)
            | StoreError::Config(detail),
        ) => detail.clone(),
        mismatch => mismatch.to_string(),
    }
}

/// The layout record of a deployment: `v<version>/<shards> shards`.
pub(super) fn layout_record(layout: &Layout) -> String {
    format!("v{LAYOUT_VERSION}/{} shards", layout.shards())
}

/// The commands that assert the layout record, written once for the
/// start/health check and the check of every new connection: create it
/// when absent, then read back the one in force.
pub(super) fn claim_layout(meta: &str, expected: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("HSETNX")
        .arg(meta)
        .arg("layout")
        .arg(expected)
        .ignore();
    pipe.cmd("HGET").arg(meta).arg("layout");
    pipe
}

/// The check every new connection passes before it is used: the layout
/// record is there (created if absent: a Redis that restarted empty is
/// claimed again at once) and is this deployment's. A mismatch fails the
/// connection and marks the engine unverified, so the replica answers
/// UNAVAILABLE and its health check reports NOT_SERVING.
fn layout_check(
    layout: &Layout,
    verified: Arc<AtomicBool>,
    mismatch: Arc<Mutex<Option<String>>>,
) -> crate::store::ConnectCheck {
    let meta = layout.meta_key();
    let expected = layout_record(layout);
    Arc::new(move |mut conn| {
        let (meta, expected) = (meta.clone(), expected.clone());
        let (verified, mismatch) = (verified.clone(), mismatch.clone());
        Box::pin(async move {
            let (found,): (String,) = claim_layout(&meta, &expected)
                .query_async(&mut conn)
                .await?;
            if found == expected {
                return Ok(());
            }
            verified.store(false, Ordering::Release);
            tracing::error!(%found, %expected, "redis holds another tumbler key layout: NOT_SERVING");
            *mismatch.lock().unwrap() = Some(found.clone());
            Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "redis holds another tumbler key layout",
                format!("found {found}, expected {expected}"),
            )))
        })
    })
}
