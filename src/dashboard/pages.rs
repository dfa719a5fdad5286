//! The dashboard's HTML: the page shell (`templates/page.html`) that
//! app.js fills in from the JSON endpoints, the server-rendered bodies of
//! the admin pages and notices, and the handlers of the live pages. Every
//! template is an askama template, checked when tumbler compiles and
//! escaping what it prints; a body goes into the shell already rendered
//! (and so escaped), the one value the shell prints as it is.

use askama::Template;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Response};

use super::errors::ApiError;
use super::login::Caller;
use super::params::{NamespaceQuery, Query};
use super::visible::filters;
use super::{Dashboard, redirect};
use crate::auth::Access;
use crate::service::validate;
use tumbler_engine::{LockId, REAPER_NAMESPACE};

/// The shell of every page but the login form.
#[derive(Template)]
#[template(path = "page.html")]
struct Shell<'a> {
    title: &'a str,
    /// The page's id (`data-page`), which app.js renders.
    page: &'a str,
    /// `on`: admin controls show; `denied`: the flag is on but this token
    /// is not an admin here; `off`: the flag is off.
    admin: &'a str,
    nav: Vec<NavItem>,
    /// With auth on: the token logged in (and the logout button).
    session: Option<&'a str>,
    /// The page's body, rendered by its own template.
    main: String,
}

struct NavItem {
    href: &'static str,
    label: &'static str,
    current: bool,
}

/// The body of a page app.js fills in.
#[derive(Template)]
#[template(path = "live.html")]
struct Live<'a> {
    heading: &'a str,
}

/// For a caller who may not see `default` and names no namespace.
#[derive(Template)]
#[template(path = "choose.html")]
struct Choose;

/// A refusal or failure, as a page.
#[derive(Template)]
#[template(path = "notice.html")]
struct Notice<'a> {
    heading: &'a str,
    message: &'a str,
}

/// Who a page is rendered for: the caller, and the namespace the page is
/// about (which decides whether its admin controls show).
pub(super) struct View<'a> {
    pub d: &'a Dashboard,
    pub access: &'a Access,
    pub namespace: &'a str,
}

impl<'a> View<'a> {
    /// A view of `namespace` as the request named it (`default` when none).
    pub fn of(d: &'a Dashboard, access: &'a Access, namespace: &'a str) -> Self {
        View {
            d,
            access,
            namespace: if namespace.is_empty() {
                "default"
            } else {
                namespace
            },
        }
    }

    /// A page: the shell around `main`, with the nav marking `page` current.
    fn page(&self, page: &str, title: &str, main: String) -> Response {
        let nav = [
            ("overview", "/dashboard", "Overview"),
            ("locks", "/dashboard/locks", "Locks"),
            ("metrics", "/dashboard/metrics", "Metrics"),
            ("changelog", "/dashboard/changelog", "Changelog"),
            ("reaper", "/dashboard/reaper", "Reaper"),
        ]
        .into_iter()
        // The reaper page is Inspect of a lock in tumbler-system.
        .filter(|(id, _, _)| *id != "reaper" || self.access.lists(REAPER_NAMESPACE))
        .map(|(id, href, label)| NavItem {
            href,
            label,
            current: id == page || (id == "locks" && page == "lock"),
        })
        .collect();
        let admin = match (
            self.d.options.admin,
            self.d.shows_admin(self.access, self.namespace),
        ) {
            (false, _) => "off",
            (true, true) => "on",
            (true, false) => "denied",
        };
        let session = match self.access {
            Access::Token(_) if self.d.options.auth.is_some() => Some(self.access.who()),
            _ => None,
        };
        html(
            StatusCode::OK,
            Shell {
                title,
                page,
                admin,
                nav,
                session,
                main,
            },
        )
    }

    /// A server-rendered page (confirmations and results), with its status.
    pub fn plain(&self, status: StatusCode, title: &str, main: impl Template) -> Response {
        let mut response = self.page("admin", title, render(&main));
        *response.status_mut() = status;
        response
    }

    pub fn error(&self, err: ApiError) -> Response {
        let heading = match err.status {
            StatusCode::FORBIDDEN => "Not allowed",
            _ => "Not done",
        };
        let notice = Notice {
            heading,
            message: &err.message,
        };
        self.plain(err.status, heading, notice)
    }
}

/// A template's text. The templates print only strings and numbers, so
/// rendering cannot fail; if it ever did, the page says so.
fn render(template: &impl Template) -> String {
    template.render().unwrap_or_else(|err| {
        tracing::error!(%err, "dashboard template failed");
        "<p role=\"alert\">This page could not be rendered.</p>".into()
    })
}

/// A rendered template as an HTML answer, never cached nor framed.
pub(super) fn html(status: StatusCode, template: impl Template) -> Response {
    (
        status,
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        Html(render(&template)),
    )
        .into_response()
}

/// A page app.js fills in, for the namespace in its query. The caller must
/// see that namespace (403 otherwise); one who names none and may not see
/// `default` is sent on to a namespace of its own.
pub(super) async fn shell(
    d: &Dashboard,
    access: &Access,
    uri: &Uri,
    named: &str,
    id: &str,
    title: &str,
) -> Response {
    let view = View::of(d, access, named);
    if named.is_empty() && !access.sees("default") {
        if let Some(home) = landing_namespace(d, access).await {
            return redirect(&with_param(uri, "namespace", &home));
        }
        return view.plain(StatusCode::FORBIDDEN, "Choose a namespace", Choose);
    }
    // A malformed name still gets the page: its endpoints answer 400 with
    // the rule.
    if validate::namespace(view.namespace).is_ok()
        && let Err(denied) = access.read(view.namespace)
    {
        return view.error(denied.into());
    }
    view.page(id, title, render(&Live { heading: title }))
}

/// Where a caller who may not see `default` starts: a namespace its token
/// names, else the first namespace in use that it sees.
async fn landing_namespace(d: &Dashboard, access: &Access) -> Option<String> {
    if let Some(home) = access.home_namespace() {
        return Some(home.to_owned());
    }
    super::api::visible_namespaces(d, access)
        .await
        .ok()?
        .into_iter()
        .next()
}

/// `uri` with the query parameter `key` set to `value`.
fn with_param(uri: &Uri, key: &str, value: &str) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        if k != key {
            query.append_pair(&k, &v);
        }
    }
    query.append_pair(key, value);
    format!("{}?{}", uri.path(), query.finish())
}

/// The handler of a live page: its id and title.
macro_rules! live_page {
    ($handler:ident, $id:literal, $title:literal) => {
        pub(super) async fn $handler(
            State(d): State<Dashboard>,
            Caller(access): Caller,
            Query(query): Query<NamespaceQuery>,
            uri: Uri,
        ) -> Response {
            shell(&d, &access, &uri, &query.namespace, $id, $title).await
        }
    };
}

live_page!(overview_page, "overview", "Overview");
live_page!(locks_page, "locks", "Locks");
live_page!(lock_page, "lock", "Lock");
live_page!(metrics_page, "metrics", "Metrics");
live_page!(changelog_page, "changelog", "Changelog");

/// `GET /dashboard/reaper`: only for callers who may read tumbler's own
/// namespace.
pub(super) async fn reaper_page(State(d): State<Dashboard>, Caller(access): Caller) -> Response {
    let view = View::of(&d, &access, REAPER_NAMESPACE);
    match access.read(REAPER_NAMESPACE) {
        Ok(()) => view.page("reaper", "Reaper", render(&Live { heading: "Reaper" })),
        Err(denied) => view.error(denied.into()),
    }
}

fn url_encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A lock's page.
pub(super) fn lock_href(lock: &LockId) -> String {
    format!(
        "/dashboard/lock?namespace={}&name={}",
        url_encode(&lock.namespace),
        url_encode(&lock.name)
    )
}

/// A namespace's overview.
pub(super) fn overview_href(namespace: &str) -> String {
    format!("/dashboard?namespace={}", url_encode(namespace))
}

/// `/dashboard/login?next=` for a page to come back to.
pub(super) fn login_href(path: &str, next: &str) -> String {
    match next {
        "" => path.to_owned(),
        next => format!("{path}?next={}", url_encode(next)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_escape_what_they_print() {
        let notice = Notice {
            heading: "Not done",
            message: "<a href=\"x\">&'",
        };
        let text = render(&notice);
        assert!(!text.contains("<a href=\"x\">"), "{text}");
        assert!(
            text.contains("&#60;a href=&#34;x&#34;&#62;&#38;&#39;"),
            "{text}"
        );
    }
}
