//! What every dashboard response passes through, whoever asks: the
//! Host/Origin allow-list (against DNS rebinding: a page of another site
//! whose name was pointed at this address would otherwise read an open
//! dashboard, and post its admin forms) and the browser's security headers.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The page may load its own script, style and data only; no frames, no
/// inline code, forms post to this origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The checks of one dashboard.
#[derive(Clone, Debug, Default)]
pub struct EdgeOptions {
    /// Host names (without port) the dashboard answers besides loopback
    /// names and addresses; None: any Host.
    pub allowed_hosts: Option<Vec<String>>,
    /// Served over TLS: add Strict-Transport-Security.
    pub hsts: bool,
}

impl EdgeOptions {
    /// Whether a `Host` header value (name or address, optional port) is
    /// one the dashboard answers.
    fn allows(&self, host: &str) -> bool {
        let Some(allowed) = &self.allowed_hosts else {
            return true;
        };
        let name = host_name(host).to_ascii_lowercase();
        is_loopback(&name) || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
    }
}

/// The name part of a `Host` (or Origin's authority): without port, an
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

/// Refuses a request whose Host (or Origin, when sent) is not allowed
/// (421 Misdirected Request, no body worth reading), and adds the security
/// headers to every answer.
pub(super) async fn edge(
    State(options): State<EdgeOptions>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = if permitted(&options, request.headers()) {
        next.run(request).await
    } else {
        (
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard does not answer to that host name\n",
        )
            .into_response()
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if options.hsts {
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    response
}

fn permitted(options: &EdgeOptions, headers: &HeaderMap) -> bool {
    if options.allowed_hosts.is_none() {
        return true;
    }
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    if !options.allows(host) {
        return false;
    }
    match headers.get(header::ORIGIN) {
        None => true,
        Some(origin) => origin.to_str().is_ok_and(|origin| {
            let authority = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            options.allows(authority)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_configured_names_only() {
        let options = EdgeOptions {
            allowed_hosts: Some(vec!["locks.example.com".into()]),
            hsts: false,
        };
        for host in [
            "localhost",
            "localhost:9090",
            "app.localhost:80",
            "127.0.0.1:9090",
            "127.1.2.3",
            "[::1]:9090",
            "LOCKS.example.com:443",
        ] {
            assert!(options.allows(host), "{host}");
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
            assert!(!options.allows(host), "{host}");
        }
        assert!(EdgeOptions::default().allows("anything"));
    }
}
