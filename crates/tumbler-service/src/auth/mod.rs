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

mod access;
mod rate;
mod throttle;
mod tokens;

pub use access::*;
pub use rate::CallerRate;
pub use throttle::*;
pub use tokens::*;

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
        // An empty file is one caught while it is rewritten in place (a
        // write truncates first): revoking every token takes a file that
        // says so (a comment, no `[[token]]`), not an empty one.
        if text.trim().is_empty() {
            tracing::warn!(file = %self.path.display(), "tokens file empty (being rewritten?); keeping the tokens loaded before");
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
