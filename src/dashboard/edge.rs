//! What every dashboard response passes through, whoever asks: the
//! Host/Origin allow-list (`crate::origin`'s rule, which the gRPC port
//! shares: against DNS rebinding, a page of another site whose name was
//! pointed at this address would otherwise read an open dashboard, and
//! post its admin forms) and the browser's security headers.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::origin::HostRule;

/// The page may load its own script, style and data only; no frames, no
/// inline code, forms post to this origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The checks of one dashboard.
#[derive(Clone, Debug, Default)]
pub struct EdgeOptions {
    /// The Host rule (`crate::origin`, shared with the gRPC port); off:
    /// any Host.
    pub hosts: HostRule,
    /// Served over TLS: add Strict-Transport-Security.
    pub hsts: bool,
}

/// Refuses a request whose Host (or Origin, when sent) is not allowed
/// (421 Misdirected Request, no body worth reading), and adds the security
/// headers to every answer.
pub(super) async fn edge(
    State(options): State<EdgeOptions>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = if options.hosts.permits_page_request(request.headers()) {
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
