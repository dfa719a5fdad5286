//! The tokens file: its entries (a SHA-256 digest, a role, the namespaces
//! a token may act in, an expiry and request quotas), how they are parsed
//! and checked, and how a new token and its digest are made.

use super::*;

/// What a token may do besides acting on locks of its namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Acquire, release, extend, inspect, list, watch, sessions, metrics
    /// and plain reaping, in its namespaces.
    Client,
    /// Also Clear, Reap with a cutoff, and the dashboard's admin actions.
    Admin,
}

/// The tokens file: `[[token]]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenFile {
    #[serde(default, rename = "token")]
    pub(super) tokens: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenEntry {
    /// Shown in logs; never the secret.
    pub(super) name: String,
    /// Hex SHA-256 of the bearer token.
    sha256: String,
    pub(super) role: Role,
    /// Namespace names, `prefix*` patterns, or `*` for every namespace.
    pub(super) namespaces: Vec<String>,
    /// RFC 3339; past it the token is refused.
    #[serde(default)]
    pub(super) expires_at: Option<String>,
    /// Requests per second this token may make on each replica.
    #[serde(default)]
    pub(super) requests_per_second: Option<u32>,
    /// Per-token overrides of the replica's quotas (`--max-*-per-token`).
    #[serde(default)]
    pub(super) max_sessions: Option<usize>,
    #[serde(default)]
    pub(super) max_watchers: Option<usize>,
    #[serde(default)]
    pub(super) max_waiters: Option<usize>,
}

/// A token's own quotas, where its file entry sets them (None: the
/// replica's `--max-*-per-token` default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenQuotas {
    pub sessions: Option<usize>,
    pub watchers: Option<usize>,
    pub waiters: Option<usize>,
}

/// One configured token.
pub struct Token {
    pub name: String,
    pub role: Role,
    pub(super) digest: [u8; 32],
    pub(super) namespaces: Vec<NamespacePattern>,
    pub(super) expires_at: Option<SystemTime>,
    /// Shared with this token's next version after a reload of the file
    /// (same name, same rate), so a reload does not refill the budget.
    pub(super) rate: Option<Arc<DefaultDirectRateLimiter>>,
    pub(super) requests_per_second: Option<u32>,
    pub quotas: TokenQuotas,
}

/// The namespace of tumbler's own locks (the reaper's). No client may act
/// in it; only a token that names it exactly, with the admin role, may
/// read it (Inspect, Queue, List).
pub const SYSTEM_NAMESPACE: &str = "tumbler-system";

pub(super) enum NamespacePattern {
    Any,
    Exact(String),
    Prefix(String),
}

impl NamespacePattern {
    fn parse(text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(NamespacePattern::Any);
        }
        let (stem, prefix) = match text.strip_suffix('*') {
            Some(stem) => (stem, true),
            None => (text, false),
        };
        let valid = !stem.is_empty()
            && stem.len() <= 64
            && stem
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !valid {
            return Err(format!(
                "namespace pattern {text:?}: expected a namespace name, `prefix*` or `*`"
            ));
        }
        Ok(if prefix {
            NamespacePattern::Prefix(stem.to_owned())
        } else {
            NamespacePattern::Exact(stem.to_owned())
        })
    }

    fn matches(&self, namespace: &str) -> bool {
        match self {
            NamespacePattern::Any => true,
            NamespacePattern::Exact(name) => name == namespace,
            NamespacePattern::Prefix(stem) => namespace.starts_with(stem.as_str()),
        }
    }
}

impl Token {
    fn from_entry(entry: TokenEntry) -> Result<Token, String> {
        let context = |e: String| format!("token {:?}: {e}", entry.name);
        if entry.name.is_empty() {
            return Err("a token has an empty name".into());
        }
        let digest: [u8; 32] = hex::decode(entry.sha256.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| context("sha256 must be 64 hex digits".into()))?;
        if entry.namespaces.is_empty() {
            return Err(context("namespaces must name at least one".into()));
        }
        let namespaces = entry
            .namespaces
            .iter()
            .map(|p| NamespacePattern::parse(p))
            .collect::<Result<_, _>>()
            .map_err(context)?;
        let expires_at = entry
            .expires_at
            .as_deref()
            .map(humantime::parse_rfc3339_weak)
            .transpose()
            .map_err(|e| context(format!("expires_at: {e} (expected RFC 3339)")))?;
        let rate = match entry.requests_per_second {
            None => None,
            Some(rps) => {
                let per_second = std::num::NonZeroU32::new(rps)
                    .ok_or_else(|| context("requests_per_second must be at least 1".into()))?;
                Some(Arc::new(RateLimiter::direct(Quota::per_second(per_second))))
            }
        };
        for (field, value) in [
            ("max_sessions", entry.max_sessions),
            ("max_watchers", entry.max_watchers),
            ("max_waiters", entry.max_waiters),
        ] {
            if value == Some(0) {
                return Err(context(format!("{field} must be at least 1")));
            }
        }
        Ok(Token {
            name: entry.name,
            role: entry.role,
            digest,
            namespaces,
            expires_at,
            rate,
            requests_per_second: entry.requests_per_second,
            quotas: TokenQuotas {
                sessions: entry.max_sessions,
                watchers: entry.max_watchers,
                waiters: entry.max_waiters,
            },
        })
    }

    /// Whether this token's namespaces include `namespace` (for
    /// [`SYSTEM_NAMESPACE`], see [`Access::act`] and [`Access::read`]).
    pub fn allows(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|p| p.matches(namespace))
    }

    /// Whether this token may read tumbler's own namespace: the admin role
    /// and the namespace named exactly (`*` and patterns do not count).
    pub fn reads_system(&self) -> bool {
        self.role == Role::Admin
            && self
                .namespaces
                .iter()
                .any(|p| matches!(p, NamespacePattern::Exact(n) if n == SYSTEM_NAMESPACE))
    }

    /// A short tag that changes when the token's secret does and tells
    /// nothing about it (a hash of its digest): the dashboard's login
    /// session carries it, so a secret replaced under the same name ends
    /// the sessions logged in with the old one.
    pub fn secret_tag(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"tumbler dashboard session\0");
        hasher.update(self.digest);
        hex::encode(&hasher.finalize()[..8])
    }

    pub(super) fn is_expired(&self) -> bool {
        self.expires_at.is_some_and(|at| at <= SystemTime::now())
    }

    /// Charges one request to this token's rate, if it has one.
    pub fn charge(&self) -> Result<(), Status> {
        match &self.rate {
            Some(rate) if rate.check().is_err() => Err(Status::resource_exhausted(
                "request rate limit of this token exceeded; retry later",
            )),
            _ => Ok(()),
        }
    }
}

/// The digest stored for a bearer token: hex SHA-256 (`tumbler-proto`'s,
/// which `tumbler token` writes too).
pub use crate::proto::tokens::digest as token_digest;

/// Parses a tokens file's text; a token that keeps its name and rate
/// keeps its rate budget from `before`.
pub(super) fn parse_tokens_after(
    text: &str,
    before: &[Arc<Token>],
) -> Result<Vec<Arc<Token>>, String> {
    let mut tokens = parse_tokens(text)?;
    for token in &mut tokens {
        let old = before
            .iter()
            .find(|t| t.name == token.name && t.requests_per_second == token.requests_per_second);
        if let (Some(old), Some(token)) = (old, Arc::get_mut(token)) {
            token.rate = old.rate.clone();
        }
    }
    Ok(tokens)
}

/// Parses a tokens file's text.
pub(super) fn parse_tokens(text: &str) -> Result<Vec<Arc<Token>>, String> {
    let file: TokenFile = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut tokens = Vec::with_capacity(file.tokens.len());
    for entry in file.tokens {
        let token = Token::from_entry(entry)?;
        if tokens.iter().any(|t: &Arc<Token>| t.name == token.name) {
            return Err(format!("token {:?} appears twice", token.name));
        }
        tokens.push(Arc::new(token));
    }
    Ok(tokens)
}
