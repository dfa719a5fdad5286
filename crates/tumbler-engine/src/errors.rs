//! The engine's side of its errors: the store's error sorted into the
//! face's store-neutral [`StoreTrouble`] (`tumbler-face`'s `errors.rs`
//! holds [`EngineError`] and its kinds), a full waiter registry as the
//! error it is, and why a layout cannot be used.

use crate::store::StoreError;

use super::waiters::RegisterError;
use super::{EngineError, StoreTrouble, TroubleKind};

/// The store's error as the face tells it: its kind and what it said.
pub fn trouble(err: StoreError) -> StoreTrouble {
    let (kind, detail) = match err {
        StoreError::Unavailable(detail) => (TroubleKind::Unavailable, detail),
        StoreError::Denied(detail) => (TroubleKind::Denied, detail),
        StoreError::Protocol(detail) => (TroubleKind::Protocol, detail),
        StoreError::Config(detail) => (TroubleKind::Config, detail),
    };
    StoreTrouble { kind, detail }
}

/// The store's error as an engine error ([`EngineError::Store`]).
pub fn store_failed(err: StoreError) -> EngineError {
    EngineError::Store(trouble(err))
}

/// A result of the store's as one of the engine's: `.or_trouble()?` where
/// `?` alone converted before the error type moved to the face (neither
/// type is the engine's own, so no `From` can join them here).
pub(crate) trait OrTrouble<T> {
    fn or_trouble(self) -> Result<T, EngineError>;
}

impl<T> OrTrouble<T> for Result<T, StoreError> {
    fn or_trouble(self) -> Result<T, EngineError> {
        self.map_err(store_failed)
    }
}

impl From<RegisterError> for EngineError {
    fn from(err: RegisterError) -> Self {
        match err {
            RegisterError::TooManyWaiters(max) => EngineError::TooManyWaiters(max),
            RegisterError::TooManyInNamespace(max) => EngineError::TooManyInNamespace(max),
            RegisterError::ShuttingDown => EngineError::ShuttingDown,
        }
    }
}

/// Why the layout recorded in Redis cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "redis holds tumbler data written with {found}; this server is configured for {expected} (the shard count of a deployment cannot change; data of an older layout must be cleared or migrated, see the README's \"Key layout\")"
    )]
    Mismatch { found: String, expected: String },
}
