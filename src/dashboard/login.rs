//! Who is looking at the dashboard. With an auth tokens file, every page,
//! admin route and `/api/v1` endpoint needs one of the tokens gRPC accepts,
//! checked by the same [`crate::auth::Authenticator`] instance, so a reload
//! of the file, an expiry or a removed token applies to the dashboard at
//! its next request, as it does to gRPC. Scripts send the token as
//! `authorization: Bearer <token>`; a browser logs in once on a form, which
//! sets an HttpOnly, SameSite=Strict cookie holding a signed session that
//! names the token, never the token itself (see `session.rs`). The
//! session's token is looked up again on every request, so removing or
//! expiring it logs its browsers out at once (the server keeps no session
//! table).
//!
//! Refusals say nothing about the token: an endpoint answers 401 with one
//! fixed message, a page redirects to the login form. `/metrics` and
//! `/healthz` are not dashboard routes and stay open (Prometheus, probes);
//! so do the static assets, which hold no data.

use std::sync::Arc;

use askama::Template;

use axum::Extension;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};

use super::admin::same_origin;
use super::errors::ApiError;
use super::pages::{html, login_href};
use super::params::{Form, LoginForm, NextQuery, Query};
use super::session::Session;
use super::{Dashboard, redirect};
use crate::auth::Access;
use crate::limits::ConnState;

const LOGIN_PATH: &str = "/dashboard/login";
/// The cookie a logged-in browser sends: a session signed by the server
/// (its token's name, a tag of its secret, an expiry), not the token.
const COOKIE: &str = "tumbler_token";

/// The login form (`templates/login.html`).
#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage<'a> {
    /// Where to go once logged in (a dashboard page, or empty).
    next: &'a str,
    /// Why the last attempt failed.
    error: Option<&'a str>,
}

/// The caller of a dashboard request, as [`require_access`] found it. A
/// handler reached without it answers 401 (fail closed).
#[derive(Clone)]
pub(super) struct Caller(pub Access);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::unauthenticated().into_response())
    }
}

/// Middleware on every guarded route: the caller's [`Access`] (everything
/// when auth is off) goes to the handler as a [`Caller`], or the request
/// is refused.
pub(super) async fn require_access(
    State(d): State<Dashboard>,
    mut request: Request,
    next: Next,
) -> Response {
    match access(&d, request.headers()) {
        Ok(access) => {
            // An authenticated request: its connection is no longer the
            // first closed when the port needs room (`limits`).
            if let Some(conn) = request.extensions().get::<Arc<ConnState>>() {
                conn.trust();
            }
            request.extensions_mut().insert(Caller(access));
            next.run(request).await
        }
        Err(status) => refuse(&d, &request, status),
    }
}

/// A bearer header if there is one (a bad one is not passed over for the
/// cookie), else the login cookie.
fn access(d: &Dashboard, headers: &HeaderMap) -> Result<Access, tonic::Status> {
    let Some(auth) = d.options.auth.as_deref() else {
        return Ok(Access::Open);
    };
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return Access::from_header(Some(auth), Some(value.as_bytes()));
    }
    let refused = || tonic::Status::unauthenticated("no valid login session");
    let jar = CookieJar::from_headers(headers);
    let value = cookie_value(&jar).ok_or_else(refused)?;
    let session = Session::open(value, &d.options.cookie_key, COOKIE).ok_or_else(refused)?;
    // The token under that name now: gone or expired ends the session; so
    // does a new secret under the same name.
    let token = auth.named(&session.name)?;
    if !session.holds_for(&token) {
        return Err(refused());
    }
    Ok(Access::Token(token))
}

/// An endpoint gets the JSON error (401 with the fixed message, or 429
/// over the token's rate); a page without a valid token goes to the login
/// form, coming back here afterwards (GETs only), and loses a cookie that
/// no longer works.
fn refuse(d: &Dashboard, request: &Request, status: tonic::Status) -> Response {
    let err = ApiError::from(status);
    let unauthenticated = err.status == StatusCode::UNAUTHORIZED;
    if request.uri().path().starts_with("/api/") || !unauthenticated {
        let mut response = err.into_response();
        if unauthenticated {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tumbler\""),
            );
        }
        return response;
    }
    let back = match *request.method() {
        Method::GET | Method::HEAD => request
            .uri()
            .path_and_query()
            .map_or("", |p| p.as_str())
            .to_owned(),
        _ => String::new(),
    };
    let to = redirect(&login_href(LOGIN_PATH, safe_next(&back)));
    let jar = CookieJar::from_headers(request.headers());
    if cookie_value(&jar).is_some() {
        let jar = CookieJar::new().add(cleared_cookie(d.options.secure_cookie));
        return (jar, to).into_response();
    }
    to
}

/// `GET /dashboard/login?next=`: the login form (with auth off there is
/// nothing to log in to: the overview).
pub(super) async fn login_page(
    State(d): State<Dashboard>,
    query: Result<Query<NextQuery>, ApiError>,
) -> Response {
    if d.options.auth.is_none() {
        return redirect("/dashboard");
    }
    let next = query.map(|Query(q)| q.next).unwrap_or_default();
    login_form(StatusCode::OK, safe_next(&next), None)
}

/// `POST /dashboard/login` (form: token, next): checks the token with the
/// gRPC authenticator, sets the cookie and goes on to `next`. Unknown
/// tokens count against the client's address (`auth::Throttle`); past its
/// limit, attempts from there are refused with 429 before any token is
/// checked.
pub(super) async fn log_in(
    State(d): State<Dashboard>,
    conn: Option<Extension<Arc<ConnState>>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, ApiError>,
) -> Response {
    let Some(auth) = d.options.auth.as_deref() else {
        return redirect("/dashboard");
    };
    let form = match form {
        Ok(Form(form)) => form,
        Err(err) => return login_form(err.status, "", Some(&err.message)),
    };
    let next = safe_next(&form.next);
    if !same_origin(&headers) {
        return login_form(
            StatusCode::FORBIDDEN,
            next,
            Some("Cross-site logins are refused."),
        );
    }
    let from = conn.as_ref().map(|Extension(conn)| conn.peer().ip());
    if let Err(refused) = d.options.auth_throttle.check(from) {
        tracing::info!(client = ?from, "dashboard login refused: too many failures from this address");
        let message = refused.to_string();
        let mut response = login_form(StatusCode::TOO_MANY_REQUESTS, next, Some(&message));
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(refused.retry_after_secs()),
        );
        return response;
    }
    let presented = form.token.trim();
    match auth.authenticate_token(presented) {
        Ok(token) => {
            if let Some(Extension(conn)) = &conn {
                conn.trust();
            }
            tracing::info!(token = %token.name, "dashboard login");
            let to = redirect(if next.is_empty() { "/dashboard" } else { next });
            let session = Session::start(&token).seal(&d.options.cookie_key, COOKIE);
            let jar = CookieJar::new().add(session_cookie(session, d.options.secure_cookie));
            (jar, to).into_response()
        }
        Err(status) if status.code() == tonic::Code::ResourceExhausted => {
            login_form(StatusCode::TOO_MANY_REQUESTS, next, Some(status.message()))
        }
        Err(_) => {
            d.options.auth_throttle.failed(from);
            tracing::info!(client = ?from, "dashboard login refused");
            login_form(
                StatusCode::UNAUTHORIZED,
                next,
                Some("That token was not accepted: it is unknown or has expired."),
            )
        }
    }
}

/// `POST /dashboard/logout`: forgets the cookie.
pub(super) async fn log_out(State(d): State<Dashboard>, headers: HeaderMap) -> Response {
    if !same_origin(&headers) {
        return ApiError::cross_site().into_response();
    }
    let to = if d.options.auth.is_some() {
        LOGIN_PATH
    } else {
        "/dashboard"
    };
    let jar = CookieJar::new().add(cleared_cookie(d.options.secure_cookie));
    (jar, redirect(to)).into_response()
}

fn login_form(status: StatusCode, next: &str, error: Option<&str>) -> Response {
    html(status, LoginPage { next, error })
}

/// Where to go after logging in: a dashboard page of this server (never
/// another site, `//host`, or the login page itself); empty otherwise.
fn safe_next(next: &str) -> &str {
    let local = next.starts_with("/dashboard")
        && !next.starts_with(LOGIN_PATH)
        && next.bytes().all(|b| b.is_ascii_graphic());
    if local { next } else { "" }
}

/// The login cookie for a sealed session: no Max-Age (it ends with the
/// browser session; the session's own expiry and its token are checked on
/// every request).
fn session_cookie(sealed: String, secure: bool) -> Cookie<'static> {
    Cookie::build((COOKIE, sealed))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .build()
}

/// The login cookie, emptied and expired.
fn cleared_cookie(secure: bool) -> Cookie<'static> {
    let mut cookie = session_cookie(String::new(), secure);
    cookie.make_removal();
    cookie
}

/// The value of the request's login cookie, if any (not yet verified).
fn cookie_value(jar: &CookieJar) -> Option<&str> {
    jar.get(COOKIE)
        .map(Cookie::value)
        .filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_carries_the_sealed_session_and_is_locked_down() {
        let sealed = "c2lnbmF0dXJl+/=s1.1.tag.b3Bz";
        let cookie = session_cookie(sealed.into(), false).to_string();
        let mut attributes: Vec<&str> = cookie.split("; ").skip(1).collect();
        attributes.sort();
        assert_eq!(
            attributes,
            ["HttpOnly", "Path=/", "SameSite=Strict"],
            "{cookie}"
        );
        let secure = session_cookie(sealed.into(), true).to_string();
        assert!(secure.split("; ").any(|a| a == "Secure"), "{secure}");
        let cleared = cleared_cookie(false).to_string();
        assert!(cleared.starts_with("tumbler_token=;") && cleared.contains("Max-Age=0"));
        let pair = cookie.split(';').next().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("theme=dark; {pair}; other=1").parse().unwrap(),
        );
        let jar = CookieJar::from_headers(&headers);
        assert_eq!(cookie_value(&jar), Some(sealed));
        headers.insert(header::COOKIE, "tumbler_token=".parse().unwrap());
        assert_eq!(cookie_value(&CookieJar::from_headers(&headers)), None);
    }

    #[test]
    fn next_stays_on_the_dashboard() {
        assert_eq!(
            safe_next("/dashboard/lock?name=a"),
            "/dashboard/lock?name=a"
        );
        assert_eq!(safe_next("/dashboard"), "/dashboard");
        for bad in [
            "https://evil.example/",
            "//evil.example/dashboard",
            "/api/v1/locks",
            "/dashboard/login?next=/dashboard",
            "/dashboard\r\nSet-Cookie: x=1",
            "/dashboard/ x",
            "",
        ] {
            assert_eq!(safe_next(bad), "", "{bad:?}");
        }
        assert_eq!(
            login_href(LOGIN_PATH, "/dashboard/lock?name=a&namespace=b"),
            "/dashboard/login?next=%2Fdashboard%2Flock%3Fname%3Da%26namespace%3Db"
        );
    }
}
