//! Which Host names and browser Origins a port that speaks HTTP answers
//! (DESIGN invariant 19), so a page of another site cannot drive it: the
//! one rule of the dashboard (HTTP port, `dashboard/edge.rs`) and of the
//! gRPC port's HTTP requests (Connect, gRPC-Web; [`OriginLayer`]). Neither
//! transport owns it; both use it.
//!
//! - **Host** ([`HostRule`]): on whenever auth is off (`tumbler dev`,
//!   `--no-auth`), where nothing else stops a page whose name was pointed
//!   at this address (DNS rebinding), and whenever host names are
//!   configured (`--dashboard-allowed-hosts`, alias `--allowed-hosts`).
//!   Loopback names and addresses always pass. HTTP/2's `:authority`
//!   counts as the Host.
//! - **Origin on the gRPC port**: a request that carries an `Origin` (a
//!   browser's) is answered only when that origin is one of
//!   `--cors-allow-origin`, whatever the auth mode; the list is empty by
//!   default, so by default no browser page on any origin can call the
//!   port. A listed origin gets CORS: the preflight answered, its answers
//!   readable. A listed origin does not lift the Host rule.
//! - **Origin on the dashboard**: its pages post to their own origin, so
//!   an `Origin` must name a host the Host rule allows (checked when the
//!   Host rule is on).
//! - **Native gRPC** (`application/grpc` over HTTP/2, no `Origin`) is not
//!   a browser's (a browser sends `Origin` with every POST and speaks
//!   HTTP/1.1 to a plaintext port) and passes on after two header lookups.

mod layer;

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, Version, header};

pub use layer::{GuardFuture, OriginGuard, OriginLayer, refused};

/// The Host rule: names (without port) answered besides loopback names
/// and addresses; off (any Host) when `None`.
#[derive(Clone, Debug, Default)]
pub struct HostRule {
    allowed: Option<Arc<[String]>>,
}

impl HostRule {
    /// Any Host.
    pub fn off() -> Self {
        HostRule { allowed: None }
    }

    /// Loopback names and addresses, and `names`.
    pub fn loopback_and(names: &[String]) -> Self {
        HostRule {
            allowed: Some(names.iter().map(|n| n.to_ascii_lowercase()).collect()),
        }
    }

    pub fn is_on(&self) -> bool {
        self.allowed.is_some()
    }

    /// Whether a `Host` header value (name or address, optional port) is
    /// one the port answers.
    pub fn allows(&self, host: &str) -> bool {
        let Some(allowed) = &self.allowed else {
            return true;
        };
        let name = host_name(host).to_ascii_lowercase();
        is_loopback(&name) || allowed.contains(&name)
    }

    /// The Host (and HTTP/2 `:authority`) of a request, checked: every one
    /// present must be allowed, and one must be present.
    fn check_host(&self, headers: &HeaderMap, uri: &http::Uri) -> Result<(), Refusal> {
        if !self.is_on() {
            return Ok(());
        }
        let host = headers.get(header::HOST);
        let authority = uri.authority().map(|a| a.as_str());
        if host.is_none() && authority.is_none() {
            return Err(Refusal::NoHost);
        }
        if let Some(host) = host {
            match host.to_str() {
                Ok(host) if self.allows(host) => {}
                _ => return Err(Refusal::Host(lossy(host))),
            }
        }
        match authority {
            Some(authority) if !self.allows(authority) => Err(Refusal::Host(authority.to_owned())),
            _ => Ok(()),
        }
    }

    /// The dashboard's check: with the rule on, the Host must be allowed,
    /// and an `Origin`, when sent, must name an allowed host (its pages
    /// post to their own origin).
    pub fn permits_page_request(&self, headers: &HeaderMap) -> bool {
        if !self.is_on() {
            return true;
        }
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        if !self.allows(host) {
            return false;
        }
        match headers.get(header::ORIGIN) {
            None => true,
            Some(origin) => origin.to_str().is_ok_and(|origin| {
                let authority = origin.split_once("://").map_or(origin, |(_, rest)| rest);
                self.allows(authority)
            }),
        }
    }
}

/// The name part of a `Host` (or an Origin's authority): without port, an
/// IPv6 address without its brackets.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

fn is_loopback(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn lossy(value: &HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// A `--cors-allow-origin` value as browsers send it in `Origin`:
/// `scheme://host[:port]`, lower case, without a default port or a path.
/// `*` and `null` are refused: the list names the origins it trusts.
pub fn parse_origin(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty() {
        // An empty variable: no origin.
        return Ok(String::new());
    }
    let lower = value.to_ascii_lowercase();
    let Some((scheme, rest)) = lower.split_once("://") else {
        return Err(format!(
            "{value:?}: expected scheme://host[:port], e.g. https://app.example.com"
        ));
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!("{value:?}: the scheme must be http or https"));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', '*', ' ']) {
        return Err(format!(
            "{value:?}: an origin is scheme://host[:port], with no path, user or wildcard"
        ));
    }
    let parsed: http::uri::Authority = authority.parse().map_err(|e| format!("{value:?}: {e}"))?;
    let default_port = if scheme == "http" { 80 } else { 443 };
    let authority = match parsed.port_u16() {
        Some(port) if port == default_port => parsed.host().to_owned(),
        _ => parsed.as_str().to_owned(),
    };
    Ok(format!("{scheme}://{authority}"))
}

/// Why a request was refused, named in the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The rule is on and the request has neither Host nor `:authority`.
    NoHost,
    /// A Host (or `:authority`) the port does not answer.
    Host(String),
    /// An `Origin` that is not in `--cors-allow-origin`.
    Origin(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NoHost => write!(
                f,
                "a request without a Host is not answered here (auth is off: the port answers loopback names and addresses, and --allowed-hosts)"
            ),
            Refusal::Host(host) => write!(
                f,
                "this port does not answer to host name {host:?}: it answers loopback names and addresses, and --allowed-hosts (against DNS rebinding)"
            ),
            Refusal::Origin(origin) => write!(
                f,
                "browser origin {origin:?} is not allowed here: --cors-allow-origin lists the origins whose pages may call this port"
            ),
        }
    }
}

/// The gRPC port's rule: the Host rule and the CORS origins.
#[derive(Clone, Debug)]
pub struct PortRule {
    hosts: HostRule,
    /// `--cors-allow-origin`, normalized ([`parse_origin`]).
    cors: Arc<[String]>,
    expose: HeaderValue,
}

impl PortRule {
    pub fn new(hosts: HostRule, cors: &[String]) -> Self {
        PortRule {
            hosts,
            cors: cors.iter().cloned().collect(),
            expose: layer::expose_headers(),
        }
    }

    /// What to do with a request on the gRPC port.
    fn verdict<B>(&self, request: &http::Request<B>) -> Verdict {
        let headers = request.headers();
        let origin = headers.get(header::ORIGIN);
        if origin.is_none() && request.version() == Version::HTTP_2 && is_native_grpc(headers) {
            return Verdict::Pass(None);
        }
        if let Err(refusal) = self.hosts.check_host(headers, request.uri()) {
            return Verdict::Refuse(refusal);
        }
        let Some(origin) = origin else {
            return Verdict::Pass(None);
        };
        // Browsers send the origin serialized: compared as sent (lower
        // case), never parsed.
        let listed = origin.to_str().is_ok_and(|sent| {
            self.cors
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(sent))
        });
        if !listed {
            return Verdict::Refuse(Refusal::Origin(lossy(origin)));
        }
        if request.method() == Method::OPTIONS {
            return Verdict::Preflight(origin.clone());
        }
        Verdict::Pass(Some(origin.clone()))
    }
}

/// Native gRPC's content types (`application/grpc`, `application/grpc+…`,
/// `application/grpc;…`), not gRPC-Web's.
fn is_native_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|ct| {
        let ct = ct.as_bytes();
        ct.starts_with(b"application/grpc") && !ct.starts_with(b"application/grpc-web")
    })
}

enum Verdict {
    /// Served; with an allowed origin, whose answer gets CORS headers.
    Pass(Option<HeaderValue>),
    /// A listed origin's preflight.
    Preflight(HeaderValue),
    Refuse(Refusal),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_configured_names_only() {
        let rule = HostRule::loopback_and(&["locks.example.com".into()]);
        for host in [
            "localhost",
            "localhost:9090",
            "app.localhost:80",
            "127.0.0.1:9090",
            "127.1.2.3",
            "[::1]:9090",
            "LOCKS.example.com:443",
        ] {
            assert!(rule.allows(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:9090",
            "127.0.0.1.evil.example",
            "locks.example.com.evil",
            "10.0.0.1:9090",
            "[::2]:9090",
            "",
        ] {
            assert!(!rule.allows(host), "{host}");
        }
        assert!(HostRule::off().allows("anything"));
    }

    #[test]
    fn origins_are_normalized_as_browsers_send_them() {
        for (given, wanted) in [
            ("https://App.Example.com", "https://app.example.com"),
            ("https://app.example.com:443/", "https://app.example.com"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://localhost:80", "http://localhost"),
            ("http://[::1]:3000", "http://[::1]:3000"),
        ] {
            assert_eq!(parse_origin(given).unwrap(), wanted, "{given}");
        }
        for bad in [
            "*",
            "null",
            "app.example.com",
            "ftp://app.example.com",
            "https://*.example.com",
            "https://app.example.com/path",
            "https://user@app.example.com",
            "https://",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }

    fn request(
        version: Version,
        headers: &[(&str, &str)],
        method: Method,
    ) -> http::Request<tonic::body::Body> {
        let mut request = http::Request::new(tonic::body::Body::empty());
        *request.version_mut() = version;
        *request.method_mut() = method;
        for (name, value) in headers {
            request.headers_mut().insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        request
    }

    #[test]
    fn native_grpc_passes_and_browsers_meet_the_rule() {
        let rule = PortRule::new(
            HostRule::loopback_and(&[]),
            &["http://app.test:8080".into()],
        );
        let verdict = |version, headers: &[(&str, &str)], method| {
            rule.verdict(&request(version, headers, method))
        };
        let post = || Method::POST;
        // Native gRPC: any Host (a Service name), no Origin.
        assert!(matches!(
            verdict(
                Version::HTTP_2,
                &[
                    ("content-type", "application/grpc"),
                    ("host", "tumbler.svc:50051")
                ],
                post()
            ),
            Verdict::Pass(None)
        ));
        // The same over HTTP/1.1, or as gRPC-Web or Connect: the Host rule.
        for (version, ct) in [
            (Version::HTTP_11, "application/grpc"),
            (Version::HTTP_2, "application/grpc-web+proto"),
            (Version::HTTP_11, "application/json"),
        ] {
            let got = verdict(
                version,
                &[("content-type", ct), ("host", "evil.example:50051")],
                post(),
            );
            assert!(
                matches!(&got, Verdict::Refuse(Refusal::Host(h)) if h == "evil.example:50051"),
                "{ct}"
            );
        }
        // Native gRPC with an Origin is a browser's.
        let got = verdict(
            Version::HTTP_2,
            &[
                ("content-type", "application/grpc"),
                ("host", "127.0.0.1:50051"),
                ("origin", "http://evil.example"),
            ],
            post(),
        );
        assert!(matches!(got, Verdict::Refuse(Refusal::Origin(_))));
        // A listed origin: served with CORS, its preflight answered.
        let listed = [
            ("content-type", "application/json"),
            ("host", "127.0.0.1:50051"),
            ("origin", "http://app.test:8080"),
        ];
        assert!(matches!(
            verdict(Version::HTTP_11, &listed, post()),
            Verdict::Pass(Some(_))
        ));
        assert!(matches!(
            verdict(Version::HTTP_11, &listed, Method::OPTIONS),
            Verdict::Preflight(_)
        ));
        // ...but not under a foreign Host.
        let rebound = [
            ("content-type", "application/json"),
            ("host", "app.test:50051"),
            ("origin", "http://app.test:8080"),
        ];
        assert!(matches!(
            verdict(Version::HTTP_11, &rebound, post()),
            Verdict::Refuse(Refusal::Host(_))
        ));
        // No Host at all.
        assert!(matches!(
            verdict(
                Version::HTTP_11,
                &[("content-type", "application/json")],
                post()
            ),
            Verdict::Refuse(Refusal::NoHost)
        ));
        // Auth on (the Host rule off): any Host, but still no foreign Origin.
        let open = PortRule::new(HostRule::off(), &[]);
        let any_host = request(
            Version::HTTP_11,
            &[
                ("content-type", "application/json"),
                ("host", "locks.internal"),
            ],
            post(),
        );
        assert!(matches!(open.verdict(&any_host), Verdict::Pass(None)));
        let foreign = request(
            Version::HTTP_11,
            &[
                ("content-type", "application/json"),
                ("host", "locks.internal"),
                ("origin", "https://locks.internal"),
            ],
            post(),
        );
        assert!(matches!(
            open.verdict(&foreign),
            Verdict::Refuse(Refusal::Origin(_))
        ));
    }
}
