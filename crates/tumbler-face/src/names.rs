//! Validated names: a [`Namespace`] or a [`LockName`] can only be made by
//! checking its rule, so an engine call that takes one needs no check of
//! its own. A broken rule is an [`Invalid`], which names the field and the
//! rule and knows no transport: gRPC answers it INVALID_ARGUMENT, HTTP 400.

use std::fmt;

/// The namespace of a request that names none.
pub const DEFAULT_NAMESPACE: &str = "default";
pub const MAX_NAMESPACE_BYTES: usize = 64;
pub const MAX_NAME_BYTES: usize = 512;

/// A value that breaks its field's rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// The field, as the request spells it (`namespace`, `resume.secret`).
    pub field: &'static str,
    /// The rule it breaks (`must not be empty`).
    pub rule: String,
}

impl Invalid {
    pub fn new(field: &'static str, rule: impl fmt::Display) -> Self {
        Invalid {
            field,
            rule: rule.to_string(),
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl std::error::Error for Invalid {}

/// Free text of at most `max` bytes without control characters.
pub fn text(field: &'static str, value: &str, max: usize) -> Result<(), Invalid> {
    if value.len() > max {
        return Err(Invalid::new(field, format!("must be at most {max} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(Invalid::new(field, "must not contain control characters"));
    }
    Ok(())
}

macro_rules! validated_text {
    ($(#[$doc:meta])* $type:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $type(String);

        impl $type {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::ops::Deref for $type {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $type {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $type {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $type {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $type {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$type> for str {
            fn eq(&self, other: &$type) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$type> for &str {
            fn eq(&self, other: &$type) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$type> for String {
            fn eq(&self, other: &$type) -> bool {
                *self == other.0
            }
        }

        impl From<$type> for String {
            fn from(value: $type) -> String {
                value.0
            }
        }
    };
}

validated_text!(
    /// A namespace: 1..=64 characters of `[A-Za-z0-9_.-]` (it is part of
    /// the Redis hash tag, so braces and colons are out). Empty in a
    /// request means [`DEFAULT_NAMESPACE`].
    Namespace
);

validated_text!(
    /// A lock's name: 1..=512 bytes, no control characters.
    LockName
);

impl Namespace {
    /// Checks a namespace as a request gives it (empty: the default).
    pub fn parse(value: impl Into<String>) -> Result<Self, Invalid> {
        let value = value.into();
        if value.is_empty() {
            return Ok(Namespace(DEFAULT_NAMESPACE.to_owned()));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        if value.len() > MAX_NAMESPACE_BYTES || !value.chars().all(allowed) {
            return Err(Invalid::new(
                "namespace",
                format!("must be at most {MAX_NAMESPACE_BYTES} characters of [A-Za-z0-9_.-]"),
            ));
        }
        Ok(Namespace(value))
    }

    /// The default namespace.
    pub fn default_namespace() -> Self {
        Namespace(DEFAULT_NAMESPACE.to_owned())
    }

    /// A namespace read back from Redis or from this replica's own
    /// records: it passed [`Namespace::parse`] when it was written.
    pub fn stored(value: impl Into<String>) -> Self {
        Namespace(value.into())
    }
}

impl LockName {
    /// Checks a lock name as a request gives it.
    pub fn parse(value: impl Into<String>) -> Result<Self, Invalid> {
        let value = value.into();
        if value.is_empty() {
            return Err(Invalid::new("name", "must not be empty"));
        }
        text("name", &value, MAX_NAME_BYTES)?;
        Ok(LockName(value))
    }

    /// A name read back from Redis or from this replica's own records: it
    /// passed [`LockName::parse`] when it was written.
    pub fn stored(value: impl Into<String>) -> Self {
        LockName(value.into())
    }
}

validated_text!(
    /// Who holds (or asks for) a grant: 1..=256 bytes, no control
    /// characters.
    Holder
);

/// The longest holder.
pub const MAX_HOLDER_BYTES: usize = 256;

impl Holder {
    /// Checks a holder as a request gives it (required).
    pub fn parse(value: impl Into<String>) -> Result<Self, Invalid> {
        let value = value.into();
        if value.is_empty() {
            return Err(Invalid::new("holder", "must not be empty"));
        }
        text("holder", &value, MAX_HOLDER_BYTES)?;
        Ok(Holder(value))
    }

    /// A holder this replica made up, or read back from Redis or its own
    /// records: it passed [`Holder::parse`] (or was made to) when written.
    pub fn stored(value: impl Into<String>) -> Self {
        Holder(value.into())
    }
}

validated_text!(
    /// A label that groups locks in metrics, like a job type: 1..=32
    /// characters of `[a-z0-9_.-]` (it becomes a metrics label, so its
    /// alphabet and length are small). Empty in a request means
    /// [`DEFAULT_KIND`].
    Kind
);

/// The kind of a request that names none.
pub const DEFAULT_KIND: &str = "default";
/// The longest kind.
pub const MAX_KIND_BYTES: usize = 32;

impl Kind {
    /// Checks a kind as a request gives it (empty: the default).
    pub fn parse(value: impl Into<String>) -> Result<Self, Invalid> {
        let value = value.into();
        if value.is_empty() {
            return Ok(Self::default_kind());
        }
        let allowed =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-');
        if value.len() > MAX_KIND_BYTES || !value.chars().all(allowed) {
            return Err(Invalid::new(
                "kind",
                format!("must be at most {MAX_KIND_BYTES} characters of [a-z0-9_.-]"),
            ));
        }
        Ok(Kind(value))
    }

    /// The default kind.
    pub fn default_kind() -> Self {
        Kind(DEFAULT_KIND.to_owned())
    }
}

/// A lease length: 1 ms up to the server's longest lease. Made only by
/// [`Ttl::parse`] (which knows that bound), or by [`Ttl::stored`] for a
/// lease this replica decides itself or reads back from Redis, so an engine
/// call that takes one checks nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(u64);

impl Ttl {
    /// Checks a lease length as a request gives it, in `field`
    /// (`ttl_ms`, `open.ttl_ms`): 1..=`max_ms`.
    pub fn parse(field: &'static str, ms: u64, max_ms: u64) -> Result<Self, Invalid> {
        match ms {
            0 => Err(Invalid::new(field, "must be at least 1")),
            ms if ms > max_ms => Err(Invalid::new(field, format!("must be at most {max_ms}"))),
            ms => Ok(Ttl(ms)),
        }
    }

    /// A lease this replica decides itself (the reaper's, a session's lock
    /// delay) or reads back from Redis (a session's, which passed
    /// [`Ttl::parse`] when it was opened): at least 1 ms.
    pub fn stored(ms: u64) -> Self {
        Ttl(ms.max(1))
    }

    /// Milliseconds, as the functions take them.
    pub fn ms(self) -> u64 {
        self.0
    }

    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
}

impl fmt::Display for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_follow_their_rule() {
        assert_eq!(Namespace::parse("").unwrap(), "default");
        assert_eq!(Namespace::parse("team-a.v2_x").unwrap(), "team-a.v2_x");
        for bad in ["a{b", "a:b", "a b", &"n".repeat(65)] {
            let err = Namespace::parse(bad).unwrap_err();
            assert_eq!(err.field, "namespace", "{bad}");
            assert!(err.to_string().starts_with("namespace: must be at most 64"));
        }
    }

    #[test]
    fn names_follow_their_rule() {
        assert_eq!(LockName::parse("reports/daily").unwrap(), "reports/daily");
        assert_eq!(
            LockName::parse("").unwrap_err().to_string(),
            "name: must not be empty"
        );
        assert_eq!(
            LockName::parse("a\nb").unwrap_err().to_string(),
            "name: must not contain control characters"
        );
        assert!(LockName::parse("n".repeat(512)).is_ok());
        assert_eq!(
            LockName::parse("n".repeat(513)).unwrap_err().to_string(),
            "name: must be at most 512 bytes"
        );
    }

    #[test]
    fn kinds_and_ttls_follow_their_rule() {
        assert_eq!(Kind::parse("").unwrap(), "default");
        assert_eq!(Kind::parse("jobs.v2_x-y").unwrap(), "jobs.v2_x-y");
        for bad in ["Jobs", "a b", &"k".repeat(33)] {
            assert_eq!(Kind::parse(bad).unwrap_err().field, "kind", "{bad}");
        }
        assert_eq!(Ttl::parse("ttl_ms", 1, 10).unwrap().ms(), 1);
        assert_eq!(Ttl::parse("ttl_ms", 10, 10).unwrap().ms(), 10);
        assert_eq!(
            Ttl::parse("ttl_ms", 0, 10).unwrap_err().to_string(),
            "ttl_ms: must be at least 1"
        );
        assert_eq!(
            Ttl::parse("open.ttl_ms", 11, 10).unwrap_err().to_string(),
            "open.ttl_ms: must be at most 10"
        );
        assert_eq!(Ttl::stored(0).ms(), 1);
    }
}
