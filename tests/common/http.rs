//! A plain HTTP/1.1 client for the tests of tumbler's HTTP port (metrics,
//! health, dashboard): one request per fresh connection, the whole reply;
//! and reading samples off the /metrics page.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// One HTTP/1.1 request on a fresh connection; the whole reply.
pub async fn fetch(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
        .await
        .expect("the HTTP port answers")
        .unwrap();
    let reply = String::from_utf8(reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
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
