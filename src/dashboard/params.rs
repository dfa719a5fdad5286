//! What the dashboard's requests carry: one `Deserialize` struct per
//! endpoint's query string or form, read by axum's `Query` and `Form`
//! extractors. Numbers are read as text first, so a value that is not one
//! is a 400 naming its field (`page_size: must be a whole number`), and
//! an empty value counts as absent; [`Query`] and [`Form`] turn axum's
//! rejections into the dashboard's JSON error. Unknown keys are ignored;
//! a key given twice is a 400 naming it.

use std::str::FromStr;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};

use super::errors::ApiError;
use crate::auth::Access;
use crate::service::validate;
use tumbler_engine::Namespace;

/// axum's `Query`, refusing with the dashboard's JSON 400.
pub(super) struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(ApiError::from)
    }
}

/// axum's `Form` (a urlencoded body), refusing with the dashboard's error.
pub(super) struct Form<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Form<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        axum::extract::Form::<T>::from_request(request, state)
            .await
            .map(|axum::extract::Form(value)| Form(value))
            .map_err(ApiError::from)
    }
}

/// The field and its rule (`page_size: must be a whole number`): the
/// message of the deserializer's error, which names the field.
fn rule(rejection: &dyn std::error::Error) -> String {
    rejection
        .source()
        .map_or_else(|| rejection.to_string(), |inner| inner.to_string())
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::bad_request(rule(&rejection))
    }
}

impl From<FormRejection> for ApiError {
    fn from(rejection: FormRejection) -> Self {
        match rejection {
            FormRejection::FailedToDeserializeForm(_)
            | FormRejection::FailedToDeserializeFormBody(_) => {
                ApiError::bad_request(rule(&rejection))
            }
            other => ApiError {
                status: other.status(),
                code: "INVALID_ARGUMENT",
                message: other.body_text(),
            },
        }
    }
}

/// A whole number; an empty value is absent.
fn whole<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
{
    match String::deserialize(deserializer)?.as_str() {
        "" => Ok(None),
        text => text
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom("must be a whole number")),
    }
}

/// A checkbox-like flag: `1`, `true`, `on` or `yes`; anything else is off.
fn flag<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(matches!(
        String::deserialize(deserializer)?.as_str(),
        "1" | "true" | "on" | "yes"
    ))
}

/// The `namespace` parameter (empty: `default`), valid and one the caller
/// may read (as Inspect and List would allow it); every namespace an
/// endpoint reads comes through here.
pub(super) fn readable(namespace: &str, access: &Access) -> Result<Namespace, ApiError> {
    let namespace = validate::namespace(namespace)?;
    access.read(&namespace)?;
    Ok(namespace)
}

/// `?namespace=`: the pages, the overview and the clear confirmation.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct NamespaceQuery {
    pub namespace: String,
}

/// `GET /api/v1/waits`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct WaitsQuery {
    pub namespace: String,
    pub page_token: String,
}

/// `GET /api/v1/locks`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct LocksQuery {
    pub namespace: String,
    pub prefix: String,
    #[serde(deserialize_with = "whole")]
    pub page_size: Option<u32>,
    pub page_token: String,
    #[serde(deserialize_with = "flag")]
    pub only_waiting: bool,
}

/// `GET /api/v1/locks/{name}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct LockQuery {
    pub namespace: String,
    #[serde(deserialize_with = "whole")]
    pub max_entries: Option<u32>,
}

/// `GET /api/v1/metrics`: `from_ms`/`to_ms` as the Metrics RPC takes
/// them, or `minutes` back from now.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct MetricsQuery {
    pub namespace: String,
    #[serde(deserialize_with = "whole")]
    pub from_ms: Option<i64>,
    #[serde(deserialize_with = "whole")]
    pub to_ms: Option<i64>,
    #[serde(deserialize_with = "whole")]
    pub minutes: Option<i64>,
    pub kind: String,
}

/// `GET /api/v1/changelog`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ChangelogQuery {
    pub namespace: String,
    pub prefix: String,
    pub holder: String,
    pub event: String,
    #[serde(deserialize_with = "whole")]
    pub limit: Option<usize>,
    pub page_token: String,
}

/// `GET /dashboard/release` (the confirmation page) and `POST
/// /dashboard/admin/release` (the action, pinned to `fencing_token` and
/// `confirm=yes`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ReleaseForm {
    pub namespace: String,
    pub name: String,
    pub holder: String,
    #[serde(deserialize_with = "whole")]
    pub fencing_token: Option<u64>,
    pub confirm: String,
}

/// `POST /dashboard/admin/clear`: the namespace, typed again to confirm.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ClearForm {
    pub namespace: String,
    pub typed: String,
    pub confirm: String,
}

/// `GET /dashboard/login?next=`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct NextQuery {
    pub next: String,
}

/// `POST /dashboard/login`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct LoginForm {
    pub token: String,
    pub next: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locks(query: &str) -> Result<LocksQuery, ApiError> {
        let uri: axum::http::Uri = format!("/api/v1/locks?{query}").parse().unwrap();
        axum::extract::Query::try_from_uri(&uri)
            .map(|q| q.0)
            .map_err(ApiError::from)
    }

    #[test]
    fn numbers_name_their_field_and_empty_is_absent() {
        let q = locks("page_size=&only_waiting=on&prefix=a%20b").unwrap();
        assert_eq!(
            (q.page_size, q.only_waiting, q.prefix.as_str()),
            (None, true, "a b")
        );
        assert_eq!(locks("page_size=7").unwrap().page_size, Some(7));
        let err = locks("page_size=many").err().unwrap();
        assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(err.message, "page_size: must be a whole number");
        assert!(locks("only_waiting=no").is_ok_and(|q| !q.only_waiting));
    }
}
