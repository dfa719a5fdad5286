//! The admin actions: force release of one grant and clear of a
//! namespace. They exist only with `--dashboard-admin`, and, with auth on,
//! only for a token with the admin role in the namespace. Each is a GET
//! confirmation page and a POST that does it; a POST must come from this
//! site (see [`same_origin`]) and carry the confirmation. Every outcome is
//! a server-rendered page (templates `release.html`, `not_held.html`,
//! `released.html`, `clear.html`, `cleared.html`).

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

use super::Dashboard;
use super::errors::{ApiError, ApiResult};
use super::login::Caller;
use super::pages::{View, lock_href, overview_href};
use super::params::{ClearForm, Form, NamespaceQuery, Query, ReleaseForm};
use super::visible::filters;
use crate::auth::Access;
use crate::service::validate;
use tumbler_engine::{ClearCounts, LockId, Namespace, ReleaseOutcome};

#[derive(Template)]
#[template(path = "release.html")]
struct ConfirmRelease<'a> {
    namespace: &'a str,
    name: &'a str,
    holder: &'a str,
    token: u64,
    slot: u32,
    /// Seconds, one decimal.
    remaining: String,
    back: String,
}

#[derive(Template)]
#[template(path = "not_held.html")]
struct NotHeld<'a> {
    holder: &'a str,
    name: &'a str,
    back: String,
}

#[derive(Template)]
#[template(path = "released.html")]
struct Released<'a> {
    title: &'a str,
    holder: &'a str,
    name: &'a str,
    text: &'a str,
    back: String,
}

#[derive(Template)]
#[template(path = "clear.html")]
struct ConfirmClear<'a> {
    namespace: &'a str,
    back: String,
}

#[derive(Template)]
#[template(path = "cleared.html")]
struct Cleared<'a> {
    namespace: &'a str,
    counts: ClearCounts,
    back: String,
}

/// The namespace of an admin page or action, once allowed: the flag on,
/// the name valid, and the caller an admin there (anyone, with auth off).
fn admin_namespace(d: &Dashboard, access: &Access, namespace: &str) -> Result<Namespace, ApiError> {
    if !d.options.admin {
        return Err(ApiError::admin_off());
    }
    let namespace = validate::namespace(namespace)?;
    access.admin(&namespace)?;
    Ok(namespace)
}

/// Refuses a POST a browser sent from another site. The login cookie is
/// SameSite=Strict already; this also covers an open dashboard (auth off)
/// and older browsers. Clients that are not browsers send neither header
/// and pass.
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    match (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        (Some(origin), Some(host)) => {
            let origin = origin.to_str().unwrap_or("");
            let origin = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            host.to_str().is_ok_and(|host| host == origin)
        }
        _ => true,
    }
}

/// Checks what every admin POST needs (admin allowed in the namespace,
/// same origin, confirmed) and returns the namespace.
fn admin_guard(
    d: &Dashboard,
    access: &Access,
    headers: &HeaderMap,
    namespace: &str,
    confirm: &str,
) -> Result<Namespace, ApiError> {
    let namespace = admin_namespace(d, access, namespace)?;
    if !same_origin(headers) {
        return Err(ApiError::cross_site());
    }
    if confirm != "yes" {
        return Err(ApiError::bad_request(
            "confirm: must be yes (use the confirmation page)",
        ));
    }
    Ok(namespace)
}

/// `GET /dashboard/release?namespace=&name=&holder=`: the confirmation
/// page for a force release, showing the grant it will end.
pub(super) async fn confirm_release(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    query: Result<Query<ReleaseForm>, ApiError>,
) -> Response {
    match query {
        Ok(Query(form)) => {
            let view = View::of(&d, &access, &form.namespace);
            release_preview(&view, &form)
                .await
                .unwrap_or_else(|err| view.error(err))
        }
        Err(err) => View::of(&d, &access, "").error(err),
    }
}

async fn release_preview(view: &View<'_>, form: &ReleaseForm) -> ApiResult {
    let lock = LockId {
        namespace: admin_namespace(view.d, view.access, &form.namespace)?,
        name: validate::name(&form.name)?,
    };
    let holder = validate::holder(&form.holder)?;
    let state = view.d.engine.locks().inspect(&lock).await?;
    let Some(grant) = state.holders.iter().find(|g| g.holder == holder) else {
        let not_held = NotHeld {
            holder: &holder,
            name: &lock.name,
            back: lock_href(&lock),
        };
        return Ok(view.plain(StatusCode::NOT_FOUND, "Not held", not_held));
    };
    let confirm = ConfirmRelease {
        namespace: &lock.namespace,
        name: &lock.name,
        holder: &grant.holder,
        token: grant.fencing_token,
        slot: grant.slot,
        remaining: format!(
            "{:.1}",
            (grant.expires_at_ms - state.now_ms) as f64 / 1000.0
        ),
        back: lock_href(&lock),
    };
    Ok(view.plain(StatusCode::OK, "Force release?", confirm))
}

/// `POST /dashboard/admin/release` (form: namespace, name, holder,
/// fencing_token, confirm=yes): the same engine release as the Release
/// RPC, pinned to the token shown on the confirmation page.
pub(super) async fn admin_release(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    headers: HeaderMap,
    form: Result<Form<ReleaseForm>, ApiError>,
) -> Response {
    match form {
        Ok(Form(form)) => {
            let view = View::of(&d, &access, &form.namespace);
            do_release(&view, &headers, &form)
                .await
                .unwrap_or_else(|err| view.error(err))
        }
        Err(err) => View::of(&d, &access, "").error(err),
    }
}

async fn do_release(view: &View<'_>, headers: &HeaderMap, form: &ReleaseForm) -> ApiResult {
    let lock = LockId {
        namespace: admin_guard(view.d, view.access, headers, &form.namespace, &form.confirm)?,
        name: validate::name(&form.name)?,
    };
    let holder = validate::holder(&form.holder)?;
    let token = validate::fencing_token(form.fencing_token)?;
    let engine = &view.d.engine;
    let outcome = engine.locks().release(&lock, &holder, token).await?;
    let released = matches!(outcome, ReleaseOutcome::Released { .. });
    crate::service::report::released(&**engine, &lock, &holder, token, outcome);
    tracing::warn!(namespace = %lock.namespace, name = %lock.name, %holder, released, who = %view.access.who(), "force release from the dashboard");
    let (title, text) = if released {
        ("Released", "was released")
    } else {
        (
            "Not held",
            "was not held any more (released, expired, or re-acquired with another token): nothing changed",
        )
    };
    let page = Released {
        title,
        holder: &holder,
        name: &lock.name,
        text,
        back: lock_href(&lock),
    };
    Ok(view.plain(StatusCode::OK, title, page))
}

/// `GET /dashboard/clear?namespace=`: the confirmation page for clearing
/// a namespace; the namespace must be typed to confirm.
pub(super) async fn confirm_clear(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    query: Result<Query<NamespaceQuery>, ApiError>,
) -> Response {
    let named = query.as_ref().map_or("", |Query(q)| q.namespace.as_str());
    let view = View::of(&d, &access, named);
    let allowed = match &query {
        Ok(_) => admin_namespace(&d, &access, named),
        Err(err) => Err(err.clone()),
    };
    let namespace = match allowed {
        Ok(namespace) => namespace,
        Err(err) => return view.error(err),
    };
    let confirm = ConfirmClear {
        namespace: &namespace,
        back: overview_href(&namespace),
    };
    view.plain(StatusCode::OK, "Clear namespace?", confirm)
}

/// `POST /dashboard/admin/clear` (form: namespace, typed = the namespace,
/// confirm=yes): the same engine clear as the Clear RPC.
pub(super) async fn admin_clear(
    State(d): State<Dashboard>,
    Caller(access): Caller,
    headers: HeaderMap,
    form: Result<Form<ClearForm>, ApiError>,
) -> Response {
    match form {
        Ok(Form(form)) => {
            let view = View::of(&d, &access, &form.namespace);
            do_clear(&view, &headers, &form)
                .await
                .unwrap_or_else(|err| view.error(err))
        }
        Err(err) => View::of(&d, &access, "").error(err),
    }
}

async fn do_clear(view: &View<'_>, headers: &HeaderMap, form: &ClearForm) -> ApiResult {
    let namespace = admin_guard(view.d, view.access, headers, &form.namespace, &form.confirm)?;
    if form.typed != namespace.as_str() {
        return Err(ApiError::bad_request(
            "typed: must be the namespace's name, to confirm",
        ));
    }
    let mut counts = tumbler_engine::ClearCounts::default();
    (view.d.engine.walks())
        .clear(&namespace, &mut counts)
        .await?;
    tracing::warn!(?counts, %namespace, who = %view.access.who(), "namespace cleared from the dashboard");
    let page = Cleared {
        namespace: &namespace,
        back: overview_href(&namespace),
        counts,
    };
    Ok(view.plain(StatusCode::OK, "Cleared", page))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_site_posts_are_refused() {
        let mut headers = HeaderMap::new();
        assert!(same_origin(&headers));
        headers.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert!(same_origin(&headers));
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "127.0.0.1:9090".parse().unwrap());
        headers.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, "http://127.0.0.1:9090".parse().unwrap());
        assert!(same_origin(&headers));
    }
}
