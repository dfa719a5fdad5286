//! The login session a browser carries in its cookie: which token logged
//! in (its name in the tokens file and a tag of its secret) and until
//! when, signed by the server (HMAC-SHA256, `cookie`'s signed jar). The
//! token itself never leaves the login form: a stolen cookie is not a
//! bearer token for the gRPC port, and it stops working when its session
//! expires or its token leaves the file, expires, or gets a new secret.
//!
//! The server keeps no session table: every request checks the signature
//! and looks the named token up in the tokens file again, so revocation
//! is immediate and any replica that has the same key
//! (`--dashboard-cookie-key-file`) serves any logged-in browser.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cookie::{Cookie, CookieJar, Key};

use crate::auth::Token;

/// How long a login lasts at most (the token's own expiry and removal
/// end it sooner): a working day.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// Fewest bytes of secret a key file must hold.
const MIN_KEY_BYTES: usize = 32;

/// Marks the layout of the session value, so a later one can be told apart.
const VERSION: &str = "s1";

/// The key that signs login cookies. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct CookieKey(Key);

impl CookieKey {
    /// The key derived (HKDF) from the secret in `path`, or a random key
    /// of this process when there is no file. A missing, unreadable or
    /// short file is an error naming the flag.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = path.filter(|p| !p.as_os_str().is_empty()) else {
            return Ok(Self::random());
        };
        let flag = "--dashboard-cookie-key-file";
        let bytes =
            std::fs::read(path).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))?;
        let secret = bytes.trim_ascii();
        anyhow::ensure!(
            secret.len() >= MIN_KEY_BYTES,
            "{flag} {}: holds {} bytes; the key needs at least {MIN_KEY_BYTES} bytes of secret \
             (e.g. `openssl rand -base64 48 > FILE`)",
            path.display(),
            secret.len()
        );
        Ok(CookieKey(Key::derive_from(secret)))
    }

    /// A key of this process only.
    pub fn random() -> Self {
        CookieKey(Key::generate())
    }
}

impl Default for CookieKey {
    fn default() -> Self {
        Self::random()
    }
}

impl std::fmt::Debug for CookieKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CookieKey(..)")
    }
}

/// What a login cookie says, once its signature checked out.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Session {
    /// The token's name in the tokens file.
    pub name: String,
    /// [`Token::secret_tag`] of the token that logged in.
    pub tag: String,
    /// Unix seconds after which the session is over.
    pub expires: u64,
}

fn unix_secs(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Session {
    /// A session for `token`, starting now.
    pub fn start(token: &Token) -> Self {
        Session {
            name: token.name.clone(),
            tag: token.secret_tag(),
            expires: unix_secs(SystemTime::now() + SESSION_TTL),
        }
    }

    /// Whether `token` (the one in the file now under this session's name)
    /// is the one that logged in, and the session has not run out.
    pub fn holds_for(&self, token: &Token) -> bool {
        self.expires > unix_secs(SystemTime::now())
            && token.name == self.name
            && token.secret_tag() == self.tag
    }

    /// `s1.<expires>.<tag>.<name, base64url>`: cookie-safe characters
    /// only, whatever the token's name holds.
    fn encode(&self) -> String {
        format!(
            "{VERSION}.{}.{}.{}",
            self.expires,
            self.tag,
            URL_SAFE_NO_PAD.encode(&self.name)
        )
    }

    fn decode(value: &str) -> Option<Self> {
        let mut parts = value.splitn(4, '.');
        if parts.next()? != VERSION {
            return None;
        }
        let expires = parts.next()?.parse().ok()?;
        let tag = parts.next()?.to_owned();
        let name = String::from_utf8(URL_SAFE_NO_PAD.decode(parts.next()?).ok()?).ok()?;
        Some(Session { name, tag, expires })
    }

    /// The cookie value of the cookie `name`: the session and its
    /// signature with `key`.
    pub fn seal(&self, key: &CookieKey, name: &'static str) -> String {
        let mut jar = CookieJar::new();
        jar.signed_mut(&key.0).add(Cookie::new(name, self.encode()));
        jar.get(name)
            .map(|cookie| cookie.value().to_owned())
            .unwrap_or_default()
    }

    /// The session in a cookie value, if `key` signed it (None for a
    /// forged, altered or foreign cookie, or one of an older layout).
    pub fn open(value: &str, key: &CookieKey, name: &'static str) -> Option<Self> {
        let mut jar = CookieJar::new();
        jar.add_original(Cookie::new(name, value.to_owned()));
        let verified = jar.signed(&key.0).get(name)?;
        Session::decode(verified.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(name: &str, expires: u64) -> Session {
        Session {
            name: name.into(),
            tag: "0011223344556677".into(),
            expires,
        }
    }

    #[test]
    fn a_sealed_session_opens_with_its_key_only() {
        let key = CookieKey::random();
        let sealed = session("ops; odd=\"name\" é", 1_900_000_000).seal(&key, "c");
        assert!(
            sealed
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'"' | b'\\')),
            "{sealed}"
        );
        assert_eq!(
            Session::open(&sealed, &key, "c"),
            Some(session("ops; odd=\"name\" é", 1_900_000_000))
        );
        // Another key, any changed byte: nothing.
        assert_eq!(Session::open(&sealed, &CookieKey::random(), "c"), None);
        for at in 0..sealed.len() {
            let mut bytes = sealed.clone().into_bytes();
            bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap();
            assert_eq!(Session::open(&altered, &key, "c"), None, "byte {at}");
        }
        // A later expiry in the clear, without a new signature: refused.
        let longer = sealed.replace("1900000000", "1999999999");
        assert_ne!(longer, sealed);
        assert_eq!(Session::open(&longer, &key, "c"), None);
    }

    #[test]
    fn key_files_derive_the_same_key_and_must_hold_enough_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef-shared\n").unwrap();
        let (a, b) = (
            CookieKey::load(Some(&path)).unwrap(),
            CookieKey::load(Some(&path)).unwrap(),
        );
        let sealed = session("ops", 1_900_000_000).seal(&a, "c");
        assert!(Session::open(&sealed, &b, "c").is_some(), "replicas agree");
        assert!(Session::open(&sealed, &CookieKey::load(None).unwrap(), "c").is_none());
        std::fs::write(&path, "too short\n").unwrap();
        let err = CookieKey::load(Some(&path)).unwrap_err().to_string();
        assert!(
            err.contains("--dashboard-cookie-key-file") && err.contains("at least 32"),
            "{err}"
        );
        let missing = dir.path().join("nope");
        let err = CookieKey::load(Some(&missing)).unwrap_err().to_string();
        assert!(err.contains("--dashboard-cookie-key-file"), "{err}");
        assert_eq!(format!("{a:?}"), "CookieKey(..)");
    }

    #[test]
    fn values_of_another_layout_are_not_sessions() {
        for bad in ["", "s1", "s1.x.tag.b3Bz", "s2.1.tag.b3Bz", "s1.1.tag.%%%"] {
            assert_eq!(Session::decode(bad), None, "{bad:?}");
        }
        assert_eq!(
            Session::decode("s1.5.tag.b3Bz"),
            Some(Session {
                name: "ops".into(),
                tag: "tag".into(),
                expires: 5
            })
        );
    }
}
