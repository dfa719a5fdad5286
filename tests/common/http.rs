//! An HTTP client for the tests of tumbler's HTTP port (metrics, health,
//! dashboard): reqwest, one request per fresh connection, redirects not
//! followed (the dashboard's are what is tested), the whole reply; and
//! reading samples off the /metrics page.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

/// An HTTP reply: status, headers (names lowercased) and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// An integer of a proto3-JSON answer (the dashboard's `/api/v1`,
/// Connect): a number, or a string for 64-bit ones, or left out at 0.
pub fn int(value: &Value) -> i64 {
    match value {
        Value::Null => 0,
        Value::Number(n) => n
            .as_i64()
            .unwrap_or_else(|| panic!("not an integer: {value}")),
        Value::String(s) => s
            .parse()
            .unwrap_or_else(|e| panic!("not an integer ({e}): {value}")),
        _ => panic!("not an integer: {value}"),
    }
}

/// A repeated field of a proto3-JSON answer: left out when empty.
pub fn items(value: &Value) -> &[Value] {
    match value {
        Value::Null => &[],
        Value::Array(items) => items,
        _ => panic!("not a list: {value}"),
    }
}

/// One HTTP/1.1 request on a fresh connection; the status and the body.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let reply = fetch(addr, method, path, headers, body).await;
    (reply.status, reply.body)
}

/// One HTTP/1.1 request on a fresh connection; the whole reply. A `host`
/// among `headers` replaces the address's own (the dashboard checks it).
pub async fn fetch(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .http1_only()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = client
        .request(method, format!("http://{addr}{path}"))
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let reply = request.send().await.expect("the HTTP port answers");
    let status = reply.status().as_u16();
    let headers = (reply.headers().iter())
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect();
    let body = reply.text().await.unwrap();
    Reply {
        status,
        headers,
        body,
    }
}

/// `GET path`: (status, body).
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path, &[], "").await
}

/// The value of the sample `name{labels}` (labels in any order), if any.
pub fn sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = match series.split_once('{') {
            Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let found: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split(',').collect()
        };
        let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        (metric == name
            && found.len() == wanted.len()
            && wanted.iter().all(|w| found.contains(&w.as_str())))
        .then(|| value.parse().unwrap())
    })
}

/// The /metrics page.
pub async fn scrape(addr: SocketAddr) -> String {
    let (status, page) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    page
}

/// Asserts that a Connect JSON `Acquire` with `body` sent to the gRPC port
/// at `endpoint` (`http://host:port`) is refused as `invalid_argument`
/// (HTTP 400) with a message naming `field` first.
pub async fn assert_connect_acquire_invalid(endpoint: &str, body: &str, field: &str) {
    let addr: SocketAddr = endpoint.trim_start_matches("http://").parse().unwrap();
    let (status, reply) = http(
        addr,
        "POST",
        "/tumbler.v1.LockService/Acquire",
        &[("content-type", "application/json")],
        body,
    )
    .await;
    let reply: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(
        (status, reply["code"].as_str()),
        (400, Some("invalid_argument")),
        "{reply}"
    );
    assert!(
        reply["message"].as_str().unwrap().starts_with(field),
        "{reply}"
    );
}
