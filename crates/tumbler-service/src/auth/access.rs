//! What one caller may do: the [`Access`] the interceptor puts into each
//! request, the [`LiveAccess`] of a long-lived stream (looked up again as
//! the tokens file changes), and the denials, which say nothing about the
//! token or its namespaces.

use super::*;

pub(super) fn revoked() -> Status {
    Status::unauthenticated("the bearer token was revoked or has expired")
}

/// The access of a long-lived stream (Session, Watch), kept current: the
/// token is looked up again at every command, at every reload of the
/// tokens file and when it expires, so a revoked or expired token ends
/// its streams instead of living on in them.
pub struct LiveAccess {
    pub(super) access: Access,
    /// None: authentication is off.
    pub(super) auth: Option<(Arc<Authenticator>, tokio::sync::watch::Receiver<u64>)>,
    /// The client's address, when the transport knows it.
    pub(super) peer: Option<std::net::IpAddr>,
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
        Ok(LiveAccess {
            access,
            auth,
            peer: request.remote_addr().map(|addr| addr.ip()),
        })
    }

    /// The client's address (for [`super::Throttle`]), when known.
    pub fn peer(&self) -> Option<std::net::IpAddr> {
        self.peer
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
pub(super) fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

pub(super) fn unauthenticated() -> Status {
    Status::unauthenticated("missing, unknown or expired bearer token")
}

pub(super) fn permission_denied() -> Status {
    Status::permission_denied("this token may not do that")
}

pub(super) fn reserved() -> Status {
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
    /// Told the request's extensions once its call got past
    /// authentication (the server marks the connection trusted there).
    pub authenticated: fn(&tonic::Extensions),
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
        // The connection carried an authenticated call: it is no longer
        // the first to close when its port needs room (`limits`).
        (self.authenticated)(request.extensions());
        if let Some(auth) = &self.authenticator {
            // For streams, which look their token up again while open.
            request.extensions_mut().insert(auth.clone());
        }
        Ok(request)
    }
}
