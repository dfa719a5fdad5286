//! Connect's JSON bodies: the proto3 JSON mapping of tumbler's messages
//! (pbjson's serde impls, generated in `tumbler-proto` from the `.proto`).
//! On input, field names in lowerCamel or as in the `.proto`, enums by name
//! or number and 64-bit integers as strings or numbers, as the mapping
//! allows; but a number above 2^53 is refused (a JSON number that large has
//! usually been rounded by its sender already: a fencing token must then be
//! a string), and so are unknown fields (protojson's default; a misspelt
//! `ttlMs` must not become the default lease). Every refusal names the
//! field.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::errors::ConnectError;

/// The largest integer every JSON reader holds exactly (2^53).
const EXACT_LIMIT: u64 = 1 << 53;

/// A request message from its JSON body (empty means the empty message).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ConnectError::invalid_argument(format!("malformed JSON: {e}")))?
    };
    check_numbers(&value, &mut String::new())?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // pbjson reads numbers through an untagged enum, whose error says
        // only that; say what the field takes.
        let inner = if inner.contains("untagged enum") {
            "expected a number (a JSON number, or a string of digits for 64-bit fields)".to_owned()
        } else {
            inner
        };
        if path == "." {
            ConnectError::invalid_argument(format!("request body: {inner}"))
        } else {
            ConnectError::invalid_argument(format!("{path}: {inner}"))
        }
    })
}

/// A response message as JSON.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, ConnectError> {
    serde_json::to_vec(message).map_err(|e| {
        ConnectError::internal(format!("tumbler's reply does not encode as JSON: {e}"))
    })
}

/// Refuses any JSON number beyond ±2^53, naming where it is.
fn check_numbers(value: &Value, path: &mut String) -> Result<(), ConnectError> {
    match value {
        Value::Number(number) => {
            let exact = if let Some(n) = number.as_u64() {
                n <= EXACT_LIMIT
            } else if let Some(n) = number.as_i64() {
                n.unsigned_abs() <= EXACT_LIMIT
            } else {
                number
                    .as_f64()
                    .is_some_and(|n| n.abs() <= EXACT_LIMIT as f64)
            };
            if exact {
                Ok(())
            } else {
                let at = if path.is_empty() {
                    "request body"
                } else {
                    path.as_str()
                };
                Err(ConnectError::invalid_argument(format!(
                    "{at}: the JSON number {number} is above 2^53 and may have been rounded; send 64-bit integers as strings (\"{number}\")"
                )))
            }
        }
        Value::Array(items) => items.iter().enumerate().try_for_each(|(i, item)| {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            let checked = check_numbers(item, path);
            path.truncate(len);
            checked
        }),
        Value::Object(fields) => fields.iter().try_for_each(|(name, item)| {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(name);
            let checked = check_numbers(item, path);
            path.truncate(len);
            checked
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{AcquireRequest, ReleaseRequest};

    fn message(result: Result<impl std::fmt::Debug, ConnectError>) -> String {
        result.unwrap_err().message
    }

    #[test]
    fn the_mapping_both_spellings_and_strings_for_64_bit() {
        let request: AcquireRequest =
            decode(br#"{"name":"a","ttlMs":"1500","wait_ms":20}"#).unwrap();
        assert_eq!(
            (request.name.as_str(), request.ttl_ms, request.wait_ms),
            ("a", Some(1500), 20)
        );
        let request: ReleaseRequest = decode(b"").unwrap();
        assert_eq!(request, ReleaseRequest::default());
        let json = String::from_utf8(
            encode(&ReleaseRequest {
                fencing_token: Some(7),
                ..Default::default()
            })
            .unwrap(),
        )
        .unwrap();
        assert_eq!(json, r#"{"fencingToken":"7"}"#);
    }

    #[test]
    fn refusals_name_their_cause() {
        assert!(message(decode::<AcquireRequest>(b"{\"name\":")).starts_with("malformed JSON"));
        let wrong = message(decode::<AcquireRequest>(br#"{"name":"a","ttlMs":true}"#));
        assert!(wrong.starts_with("ttlMs: expected a number"), "{wrong}");
        let big = message(decode::<ReleaseRequest>(
            br#"{"fencingToken":9007199254740993}"#,
        ));
        assert!(
            big.starts_with("fencingToken: the JSON number 9007199254740993 is above 2^53"),
            "{big}"
        );
        assert!(decode::<ReleaseRequest>(br#"{"fencingToken":"9007199254740993"}"#).is_ok());
        let unknown = message(decode::<AcquireRequest>(br#"{"name":"a","ttlMS":5}"#));
        assert!(unknown.contains("unknown field `ttlMS`"), "{unknown}");
        assert!(message(decode::<AcquireRequest>(b"[1]")).starts_with("request body: "));
    }
}
