//! Who may call the lock service: bearer tokens (gRPC metadata
//! `authorization: Bearer <token>`) read from a TOML file, each bound to a
//! role and to the namespaces it may act in. The file holds only SHA-256
//! digests of the tokens, is compared in constant time, and is re-read
//! when it changes (a Kubernetes Secret update needs no restart).
//!
//! Authentication happens once per RPC in [`AuthInterceptor`], which puts
//! the caller's [`Access`] into the request; handlers then ask that
//! `Access` for each namespace they touch and for admin rights. Denials say
//! nothing about the token or its namespaces.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::Status;

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
struct TokenFile {
    #[serde(default, rename = "token")]
    tokens: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    /// Shown in logs; never the secret.
    name: String,
    /// Hex SHA-256 of the bearer token.
    sha256: String,
    role: Role,
    /// Namespace names, `prefix*` patterns, or `*` for every namespace.
    namespaces: Vec<String>,
    /// RFC 3339; past it the token is refused.
    #[serde(default)]
    expires_at: Option<String>,
    /// Requests per second this token may make on each replica.
    #[serde(default)]
    requests_per_second: Option<u32>,
    /// Per-token overrides of the replica's quotas (`--max-*-per-token`).
    #[serde(default)]
    max_sessions: Option<usize>,
    #[serde(default)]
    max_watchers: Option<usize>,
    #[serde(default)]
    max_waiters: Option<usize>,
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
    digest: [u8; 32],
    namespaces: Vec<NamespacePattern>,
    expires_at: Option<SystemTime>,
    /// Shared with this token's next version after a reload of the file
    /// (same name, same rate), so a reload does not refill the budget.
    rate: Option<Arc<DefaultDirectRateLimiter>>,
    requests_per_second: Option<u32>,
    pub quotas: TokenQuotas,
}

/// The namespace of tumbler's own locks (the reaper's). No client may act
/// in it; only a token that names it exactly, with the admin role, may
/// read it (Inspect, Queue, List).
pub const SYSTEM_NAMESPACE: &str = "tumbler-system";

enum NamespacePattern {
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

    fn is_expired(&self) -> bool {
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

/// The digest stored for a bearer token: hex SHA-256.
pub fn token_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random bearer token: 32 bytes from the OS, hex.
pub fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(format!("tmb_{}", hex::encode(bytes)))
}

/// Parses a tokens file's text; a token that keeps its name and rate
/// keeps its rate budget from `before`.
fn parse_tokens_after(text: &str, before: &[Arc<Token>]) -> Result<Vec<Arc<Token>>, String> {
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
fn parse_tokens(text: &str) -> Result<Vec<Arc<Token>>, String> {
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

/// The configured tokens, re-read from their file when it changes.
pub struct Authenticator {
    path: PathBuf,
    tokens: RwLock<Arc<Vec<Arc<Token>>>>,
    /// The file's text when last loaded, to notice changes.
    loaded_text: std::sync::Mutex<String>,
    /// Counts reloads, so open streams re-check their token at each one.
    reloads: tokio::sync::watch::Sender<u64>,
}

impl Authenticator {
    /// Reads the tokens file; a missing or broken file is an error.
    pub fn load(path: &Path) -> anyhow::Result<Arc<Self>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--auth-tokens-file {}: {e}", path.display()))?;
        let tokens = parse_tokens(&text)
            .map_err(|e| anyhow::anyhow!("--auth-tokens-file {}: {e}", path.display()))?;
        tracing::info!(tokens = tokens.len(), file = %path.display(), "authentication on");
        Ok(Arc::new(Authenticator {
            path: path.to_owned(),
            tokens: RwLock::new(Arc::new(tokens)),
            loaded_text: std::sync::Mutex::new(text),
            reloads: tokio::sync::watch::Sender::new(0),
        }))
    }

    /// Re-reads the file if its text changed. A file that cannot be read
    /// or parsed is logged and the tokens already loaded stay in force.
    pub fn reload_if_changed(&self) {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) => {
                tracing::error!(file = %self.path.display(), error = %e, "tokens file unreadable; keeping the tokens loaded before");
                return;
            }
        };
        let mut loaded = self.loaded_text.lock().unwrap();
        if *loaded == text {
            return;
        }
        let before = self.tokens.read().unwrap().clone();
        match parse_tokens_after(&text, &before) {
            Ok(tokens) => {
                tracing::info!(tokens = tokens.len(), file = %self.path.display(), "tokens file reloaded");
                *self.tokens.write().unwrap() = Arc::new(tokens);
                *loaded = text;
                self.reloads.send_modify(|n| *n += 1);
            }
            Err(e) => {
                tracing::error!(file = %self.path.display(), error = %e, "tokens file invalid; keeping the tokens loaded before");
            }
        }
    }

    /// Checks the file for changes every `interval`, for ever.
    pub async fn run_reloader(self: Arc<Self>, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            let auth = self.clone();
            // File reads block; keep them off the runtime's workers.
            let _ = tokio::task::spawn_blocking(move || auth.reload_if_changed()).await;
        }
    }

    /// The token an `authorization` header value carries, if it is a live
    /// configured token within its request rate.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Arc<Token>, Status> {
        let presented = header
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(bearer)
            .ok_or_else(unauthenticated)?;
        self.authenticate_token(presented)
    }

    /// [`Self::authenticate`] for a token presented without the `Bearer`
    /// scheme (the dashboard's login form and cookie).
    pub fn authenticate_token(&self, presented: &str) -> Result<Arc<Token>, Status> {
        let presented = presented.trim();
        if presented.is_empty() {
            return Err(unauthenticated());
        }
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let tokens = self.tokens.read().unwrap().clone();
        // Every digest is compared, each in constant time.
        let mut found = None;
        for token in tokens.iter() {
            if bool::from(token.digest.ct_eq(&digest)) {
                found = Some(token.clone());
            }
        }
        let token = found.ok_or_else(unauthenticated)?;
        if token.is_expired() {
            tracing::info!(token = %token.name, "expired token refused");
            return Err(unauthenticated());
        }
        token.charge()?;
        Ok(token)
    }

    /// The token called `name` in the file now, if it is live and within
    /// its request rate (the dashboard's login session names its token).
    pub fn named(&self, name: &str) -> Result<Arc<Token>, Status> {
        let tokens = self.tokens.read().unwrap().clone();
        let token = tokens
            .iter()
            .find(|t| t.name == name)
            .cloned()
            .ok_or_else(unauthenticated)?;
        if token.is_expired() {
            return Err(unauthenticated());
        }
        token.charge()?;
        Ok(token)
    }

    /// The version of `token` in force now (the file may have been
    /// reloaded since it was presented): UNAUTHENTICATED when it was
    /// removed or has expired. Nothing is charged to its rate.
    pub fn current(&self, token: &Token) -> Result<Arc<Token>, Status> {
        let tokens = self.tokens.read().unwrap().clone();
        let now = tokens
            .iter()
            .find(|t| bool::from(t.digest.ct_eq(&token.digest)))
            .cloned()
            .ok_or_else(revoked)?;
        if now.is_expired() {
            return Err(revoked());
        }
        Ok(now)
    }
}

fn revoked() -> Status {
    Status::unauthenticated("the bearer token was revoked or has expired")
}

/// The access of a long-lived stream (Session, Watch), kept current: the
/// token is looked up again at every command, at every reload of the
/// tokens file and when it expires, so a revoked or expired token ends
/// its streams instead of living on in them.
pub struct LiveAccess {
    access: Access,
    /// None: authentication is off.
    auth: Option<(Arc<Authenticator>, tokio::sync::watch::Receiver<u64>)>,
}

impl LiveAccess {
    /// The caller's access as the interceptor left it (fail closed).
    pub fn of<T>(request: &tonic::Request<T>) -> Result<LiveAccess, Status> {
        let access = Access::of(request)?;
        let auth = match &access {
            Access::Open => None,
            Access::Token(_) => {
                let auth = request
                    .extensions()
                    .get::<Arc<Authenticator>>()
                    .cloned()
                    .ok_or_else(unauthenticated)?;
                let reloads = auth.reloads.subscribe();
                Some((auth, reloads))
            }
        };
        Ok(LiveAccess { access, auth })
    }

    /// What the caller may do, as of the last [`Self::recheck`].
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// Looks the token up again: UNAUTHENTICATED when it was revoked or
    /// has expired (the stream must end).
    pub fn recheck(&mut self) -> Result<(), Status> {
        if let (Some((auth, _)), Access::Token(token)) = (&self.auth, &self.access) {
            match auth.current(token) {
                Ok(now) => self.access = Access::Token(now),
                Err(status) => {
                    tracing::info!(token = %token.name, "stream of a revoked or expired token ended");
                    return Err(status);
                }
            }
        }
        Ok(())
    }

    /// Charges one command to the token's request rate, like an RPC.
    pub fn charge(&self) -> Result<(), Status> {
        match &self.access {
            Access::Open => Ok(()),
            Access::Token(token) => token.charge(),
        }
    }

    /// Resolves when the token may have changed: the tokens file was
    /// reloaded, or the token's expiry came. Never, with auth off.
    pub async fn changed(&mut self) {
        let expiry = match &self.access {
            Access::Token(token) => token.expires_at,
            Access::Open => None,
        };
        let Some((_, reloads)) = &mut self.auth else {
            return std::future::pending().await;
        };
        let until_expiry = expiry.map(|at| {
            at.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            changed = reloads.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            () = async {
                match until_expiry {
                    Some(left) => tokio::time::sleep(left).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// The token of an `authorization: Bearer <token>` value.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn unauthenticated() -> Status {
    Status::unauthenticated("missing, unknown or expired bearer token")
}

fn permission_denied() -> Status {
    Status::permission_denied("this token may not do that")
}

fn reserved() -> Status {
    Status::permission_denied(format!(
        "namespace: {SYSTEM_NAMESPACE} is reserved for tumbler's own locks"
    ))
}

/// What the caller of one RPC may do.
#[derive(Clone)]
pub enum Access {
    /// Authentication is off: everything.
    Open,
    Token(Arc<Token>),
}

impl Access {
    /// PERMISSION_DENIED unless the caller's namespaces include
    /// `namespace`. The lock service asks [`Self::act`] or [`Self::read`],
    /// which also keep clients out of tumbler's own namespace; this plain
    /// check serves the dashboard's read-only views.
    pub fn namespace(&self, namespace: &str) -> Result<(), Status> {
        match self {
            Access::Open => Ok(()),
            Access::Token(token) if token.allows(namespace) => Ok(()),
            Access::Token(token) => {
                tracing::info!(token = %token.name, %namespace, "namespace denied");
                Err(permission_denied())
            }
        }
    }

    /// PERMISSION_DENIED unless the caller may act on locks of
    /// `namespace` (acquire, release, extend, reap, watch, sessions,
    /// metrics). Nobody acts in tumbler's own namespace, auth or not.
    pub fn act(&self, namespace: &str) -> Result<(), Status> {
        if namespace == SYSTEM_NAMESPACE {
            tracing::info!(token = %self.who(), %namespace, "reserved namespace denied");
            return Err(reserved());
        }
        self.namespace(namespace)
    }

    /// PERMISSION_DENIED unless the caller may read `namespace` (Inspect,
    /// Queue, List): tumbler's own namespace only with an admin token that
    /// names it exactly.
    pub fn read(&self, namespace: &str) -> Result<(), Status> {
        match self {
            Access::Token(token) if namespace == SYSTEM_NAMESPACE && token.reads_system() => Ok(()),
            _ => self.act(namespace),
        }
    }

    /// PERMISSION_DENIED unless the caller may act in `namespace` as admin
    /// (never in tumbler's own namespace).
    pub fn admin(&self, namespace: &str) -> Result<(), Status> {
        self.act(namespace)?;
        if self.may_admin(namespace) {
            return Ok(());
        }
        tracing::info!(token = %self.who(), %namespace, "admin action denied");
        Err(permission_denied())
    }

    /// Whether [`Self::admin`] would allow `namespace` (for showing admin
    /// controls; nothing is logged).
    pub fn may_admin(&self, namespace: &str) -> bool {
        match self {
            _ if namespace == SYSTEM_NAMESPACE => false,
            Access::Open => true,
            Access::Token(token) => token.role == Role::Admin && token.allows(namespace),
        }
    }

    /// A namespace to show this caller first: `default` when it may see
    /// it (or auth is off), else the first namespace its token names
    /// exactly; None when it names only patterns.
    pub fn home_namespace(&self) -> Option<&str> {
        match self {
            Access::Open => Some("default"),
            Access::Token(token) if token.allows("default") => Some("default"),
            Access::Token(token) => token.namespaces.iter().find_map(|p| match p {
                NamespacePattern::Exact(name) => Some(name.as_str()),
                _ => None,
            }),
        }
    }

    /// Whether the caller may see `namespace` at all (for listings).
    pub fn sees(&self, namespace: &str) -> bool {
        match self {
            Access::Open => true,
            Access::Token(token) => token.allows(namespace),
        }
    }

    /// Whether the caller may see `namespace` in the lock service's
    /// listings: tumbler's own namespace only for [`Self::read`]'s callers.
    pub fn lists(&self, namespace: &str) -> bool {
        self.read(namespace).is_ok()
    }

    /// The caller's token (None: auth is off).
    pub fn token(&self) -> Option<&Token> {
        match self {
            Access::Open => None,
            Access::Token(token) => Some(token),
        }
    }

    /// The caller's token name, for logs ("-" when auth is off).
    pub fn who(&self) -> &str {
        match self {
            Access::Open => "-",
            Access::Token(token) => &token.name,
        }
    }

    /// The access of a caller presenting `header` (an `authorization`
    /// value) when `authenticator` decides (None: auth is off, so
    /// [`Access::Open`]). The gRPC interceptor and the dashboard both ask
    /// this.
    pub fn from_header(
        authenticator: Option<&Authenticator>,
        header: Option<&[u8]>,
    ) -> Result<Access, Status> {
        match authenticator {
            None => Ok(Access::Open),
            Some(auth) => auth.authenticate(header).map(Access::Token),
        }
    }

    /// The caller's access as the interceptor left it. A request that did
    /// not pass the interceptor gets nothing (fail closed).
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Access, Status> {
        request
            .extensions()
            .get::<Access>()
            .cloned()
            .ok_or_else(unauthenticated)
    }
}

/// Authenticates every RPC of the lock service (None: auth is off).
#[derive(Clone)]
pub struct AuthInterceptor {
    pub authenticator: Option<Arc<Authenticator>>,
}

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let access = Access::from_header(
            self.authenticator.as_deref(),
            request
                .metadata()
                .get("authorization")
                .map(|v| v.as_bytes()),
        )?;
        request.extensions_mut().insert(access);
        if let Some(auth) = &self.authenticator {
            // For streams, which look their token up again while open.
            request.extensions_mut().insert(auth.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &str) -> Result<Vec<Arc<Token>>, String> {
        parse_tokens(entries)
    }

    fn entry(token: &str, role: &str, namespaces: &str) -> String {
        format!(
            "[[token]]\nname = \"t-{token}\"\nsha256 = \"{}\"\nrole = \"{role}\"\nnamespaces = {namespaces}\n",
            token_digest(token)
        )
    }

    #[test]
    fn patterns_match_names_prefixes_and_everything() {
        let tokens = file(&entry("a", "client", r#"["team-a", "shared.*", "x*"]"#)).unwrap();
        let t = &tokens[0];
        assert!(t.allows("team-a"));
        assert!(!t.allows("team-ab"));
        assert!(t.allows("shared.jobs"));
        assert!(!t.allows("shared"));
        assert!(t.allows("xylophone"));
        let any = file(&entry("b", "admin", r#"["*"]"#)).unwrap();
        assert!(any[0].allows("anything"));
    }

    #[test]
    fn broken_files_are_refused_with_the_reason() {
        for (text, needle) in [
            (entry("a", "root", r#"["x"]"#), "root"),
            (entry("a", "client", "[]"), "at least one"),
            (entry("a", "client", r#"["bad ns"]"#), "namespace pattern"),
            (
                "[[token]]\nname=\"a\"\nsha256=\"abc\"\nrole=\"client\"\nnamespaces=[\"x\"]\n"
                    .into(),
                "64 hex",
            ),
            (
                format!(
                    "{}{}",
                    entry("a", "client", r#"["x"]"#),
                    entry("a", "client", r#"["y"]"#)
                ),
                "twice",
            ),
            (
                format!(
                    "{}expires_at = \"soon\"\n",
                    entry("a", "client", r#"["x"]"#)
                ),
                "expires_at",
            ),
            (
                format!("{}colour = \"red\"\n", entry("a", "client", r#"["x"]"#)),
                "colour",
            ),
            (
                format!("{}max_watchers = 0\n", entry("a", "client", r#"["x"]"#)),
                "max_watchers",
            ),
        ] {
            let err = file(&text)
                .err()
                .unwrap_or_else(|| panic!("accepted: {text}"));
            assert!(err.contains(needle), "{err:?} lacks {needle:?}");
        }
    }

    #[test]
    fn tumbler_system_is_read_only_and_only_by_an_exact_admin_grant() {
        let tokens = file(&format!(
            "{}{}{}",
            entry("all", "admin", r#"["*"]"#),
            entry("sys", "admin", r#"["tumbler-system"]"#),
            entry("csys", "client", r#"["tumbler-system"]"#)
        ))
        .unwrap();
        let [all, sys, client] = [0, 1, 2].map(|i| Access::Token(tokens[i].clone()));
        for access in [&all, &sys, &client, &Access::Open] {
            let denied = access.act(SYSTEM_NAMESPACE).unwrap_err();
            assert!(denied.message().contains(SYSTEM_NAMESPACE));
            assert!(access.admin(SYSTEM_NAMESPACE).is_err());
            assert!(!access.may_admin(SYSTEM_NAMESPACE));
        }
        assert!(sys.read(SYSTEM_NAMESPACE).is_ok() && sys.lists(SYSTEM_NAMESPACE));
        for access in [&all, &client, &Access::Open] {
            assert!(access.read(SYSTEM_NAMESPACE).is_err());
            assert!(!access.lists(SYSTEM_NAMESPACE));
        }
        assert!(all.act("team-a").is_ok() && all.read("team-a").is_ok());
    }

    #[test]
    fn a_reload_keeps_the_rate_budget_of_an_unchanged_token() {
        let text = format!(
            "{}requests_per_second = 1\n",
            entry("a", "client", r#"["x"]"#)
        );
        let before = file(&text).unwrap();
        before[0].charge().unwrap();
        let after = parse_tokens_after(&text, &before).unwrap();
        assert!(after[0].charge().is_err(), "the budget was refilled");
        let faster = text.replace("= 1", "= 2");
        let changed = parse_tokens_after(&faster, &before).unwrap();
        assert!(changed[0].charge().is_ok(), "a new rate starts afresh");
    }

    #[test]
    fn bearer_header_forms() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer   abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("abc"), None);
    }

    #[test]
    fn admin_rights_and_home_namespaces() {
        let tokens = file(&format!(
            "{}{}{}",
            entry("a", "admin", r#"["team-a", "shared.*"]"#),
            entry("c", "client", r#"["x*", "team-c"]"#),
            entry("p", "client", r#"["x*"]"#)
        ))
        .unwrap();
        let [admin, client, patterns] = [0, 1, 2].map(|i| Access::Token(tokens[i].clone()));
        assert!(admin.may_admin("team-a") && admin.may_admin("shared.jobs"));
        assert!(!admin.may_admin("team-b"), "admin only in its namespaces");
        assert!(!client.may_admin("team-c") && client.sees("team-c"));
        assert!(Access::Open.may_admin("anything"));
        assert_eq!(
            admin.admin("team-b").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            client.admin("team-c").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert!(admin.admin("team-a").is_ok());
        assert_eq!(admin.home_namespace(), Some("team-a"));
        assert_eq!(client.home_namespace(), Some("team-c"));
        assert_eq!(patterns.home_namespace(), None);
        assert_eq!(Access::Open.home_namespace(), Some("default"));
        let everywhere = file(&entry("e", "client", r#"["*"]"#)).unwrap();
        assert_eq!(
            Access::Token(everywhere[0].clone()).home_namespace(),
            Some("default")
        );
    }

    #[test]
    fn authenticates_known_live_tokens_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let text = format!(
            "{}{}expires_at = \"2001-01-01T00:00:00Z\"\n",
            entry("good", "client", r#"["a"]"#),
            entry("old", "client", r#"["a"]"#)
        );
        std::fs::write(&path, text).unwrap();
        let auth = Authenticator::load(&path).unwrap();
        assert_eq!(
            auth.authenticate(Some(b"Bearer good")).unwrap().name,
            "t-good"
        );
        assert_eq!(auth.authenticate_token(" good ").unwrap().name, "t-good");
        for bad in ["", "nope", "old", "Bearer good"] {
            let err = auth.authenticate_token(bad).err().unwrap();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
        assert!(matches!(Access::from_header(None, None), Ok(Access::Open)));
        assert!(Access::from_header(Some(&auth), None).is_err());
        assert_eq!(
            Access::from_header(Some(&auth), Some(b"Bearer good"))
                .unwrap()
                .who(),
            "t-good"
        );
        for bad in [
            None,
            Some(&b"Bearer nope"[..]),
            Some(b"Bearer old"),
            Some(b"good"),
        ] {
            let err = auth.authenticate(bad).err().unwrap();
            assert_eq!(err.code(), tonic::Code::Unauthenticated);
        }
    }
}
