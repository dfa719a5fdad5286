//! What `--redis-url` names: one Redis server, a Redis Cluster (several
//! seed nodes), or a master found through Redis Sentinel.
//!
//! ```text
//! redis://[user:password@]host:port[/db]              one server (also redis+unix://, unix://)
//! redis+cluster://[user:password@]host:port[,host:port…]
//! redis+sentinel://[user:password@]host:port[,host:port…]/<master-name>[/db]
//! ```
//!
//! `rediss://`, `rediss+cluster://` and `rediss+sentinel://` are the same
//! over TLS (with Sentinel: to the sentinels and to the master).
//!
//! In the cluster form every host is a seed: any reachable one is enough to
//! discover the cluster. In the sentinel form the hosts are the sentinels
//! (port 26379 when omitted); the credentials and db are those of the Redis
//! master, not of the sentinels.

/// A parsed `--redis-url`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server, as the redis crate understands its URL.
    Single { url: String },
    /// A Redis Cluster: seed nodes, each as `redis://[user:password@]host:port`
    /// (`rediss://` over TLS).
    Cluster { seeds: Vec<String> },
    /// A master named `master`, found through `sentinels` (each as
    /// `redis://host:port`, or `rediss://`); `redis` is a `redis://` (or
    /// `rediss://`) URL whose credentials, db and TLS mode are used for
    /// the master.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        redis: String,
    },
}

const CLUSTER: &str = "redis+cluster://";
const SENTINEL: &str = "redis+sentinel://";
const TLS_CLUSTER: &str = "rediss+cluster://";
const TLS_SENTINEL: &str = "rediss+sentinel://";
const SYNTAX: &str = "expected redis://host:port[/db], redis+cluster://host:port,host:port,… or redis+sentinel://host:port,host:port,…/<master-name>[/db] (rediss… for TLS)";

impl RedisTarget {
    /// Parses and checks a `--redis-url`; the error names what is wrong.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let lower = url.to_ascii_lowercase();
        if lower.starts_with(CLUSTER) {
            return parse_cluster(&url[CLUSTER.len()..], "redis");
        }
        if lower.starts_with(TLS_CLUSTER) {
            return parse_cluster(&url[TLS_CLUSTER.len()..], "rediss");
        }
        if lower.starts_with(SENTINEL) {
            return parse_sentinel(&url[SENTINEL.len()..], "redis");
        }
        if lower.starts_with(TLS_SENTINEL) {
            return parse_sentinel(&url[TLS_SENTINEL.len()..], "rediss");
        }
        if !["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|scheme| lower.starts_with(scheme))
        {
            return Err(format!("unknown scheme in {url:?}: {SYNTAX}"));
        }
        if url[url.find("://").map_or(0, |i| i + 3)..]
            .split('/')
            .next()
            .is_some_and(|authority| authority.contains(','))
        {
            return Err(format!(
                "several hosts in a redis:// URL: use redis+cluster://… for a Redis Cluster or redis+sentinel://…/<master-name> for Sentinel ({SYNTAX})"
            ));
        }
        redis::Client::open(url).map_err(|e| format!("bad redis URL: {e}"))?;
        Ok(RedisTarget::Single {
            url: url.to_owned(),
        })
    }

    /// True when connections use TLS (`rediss…`).
    pub fn is_tls(&self) -> bool {
        let tls = |url: &str| url.to_ascii_lowercase().starts_with("rediss://");
        match self {
            RedisTarget::Single { url } => tls(url),
            RedisTarget::Cluster { seeds } => seeds.iter().any(|s| tls(s)),
            RedisTarget::Sentinel { redis, .. } => tls(redis),
        }
    }

    /// A short description for logs (no credentials).
    pub fn describe(&self) -> String {
        match self {
            RedisTarget::Single { .. } => "one redis server".into(),
            RedisTarget::Cluster { seeds } => {
                format!("redis cluster ({} seed nodes)", seeds.len())
            }
            RedisTarget::Sentinel {
                sentinels, master, ..
            } => format!("master {master:?} via {} sentinels", sentinels.len()),
        }
    }
}

/// Splits `[userinfo@]hosts` (the part before the first `/`).
fn split_userinfo(authority: &str) -> (Option<&str>, &str) {
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    }
}

/// `host:port,host:port` → `host:port` items, with `default_port` filled in.
fn hosts(list: &str, default_port: Option<u16>) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in list.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!("empty host in {list:?}: {SYNTAX}"));
        }
        let (host, port) = if let Some(rest) = item.strip_prefix('[') {
            // [ipv6]:port
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("unclosed '[' in host {item:?}"))?;
            (format!("[{host}]"), after.strip_prefix(':'))
        } else {
            match item.rsplit_once(':') {
                Some((host, port)) => (host.to_owned(), Some(port)),
                None => (item.to_owned(), None),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err(format!("missing host in {item:?}"));
        }
        let port = match (port, default_port) {
            (Some(port), _) => port
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("bad port in {item:?}"))?,
            (None, Some(port)) => port,
            (None, None) => return Err(format!("missing port in {item:?} (host:port)")),
        };
        out.push(format!("{host}:{port}"));
    }
    Ok(out)
}

fn parse_cluster(rest: &str, scheme: &str) -> Result<RedisTarget, String> {
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !path.is_empty() {
        return Err(format!(
            "a redis+cluster:// URL takes no path (Redis Cluster has only db 0); got /{path}"
        ));
    }
    if authority.contains('?') {
        return Err("a redis+cluster:// URL takes no query parameters".into());
    }
    let (userinfo, list) = split_userinfo(authority);
    let seeds = hosts(list, None)?;
    let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let seeds: Vec<String> = seeds
        .into_iter()
        .map(|host| format!("{scheme}://{auth}{host}"))
        .collect();
    for seed in &seeds {
        redis::Client::open(seed.as_str()).map_err(|e| format!("bad cluster seed: {e}"))?;
    }
    Ok(RedisTarget::Cluster { seeds })
}

fn parse_sentinel(rest: &str, scheme: &str) -> Result<RedisTarget, String> {
    if rest.contains('?') {
        return Err("a redis+sentinel:// URL takes no query parameters".into());
    }
    let mut parts = rest.split('/');
    let authority = parts.next().unwrap_or_default();
    let master = parts.next().unwrap_or_default();
    let db = parts.next().filter(|db| !db.is_empty());
    if parts.next().is_some_and(|p| !p.is_empty()) {
        return Err(format!("too many path segments: {SYNTAX}"));
    }
    if master.is_empty() {
        return Err(format!(
            "a redis+sentinel:// URL must name the master after the hosts, e.g. redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster ({SYNTAX})"
        ));
    }
    if let Some(db) = db {
        db.parse::<u32>()
            .map_err(|_| format!("bad db {db:?} (a number)"))?;
    }
    let (userinfo, list) = split_userinfo(authority);
    let sentinels: Vec<String> = hosts(list, Some(26379))?
        .into_iter()
        .map(|host| format!("{scheme}://{host}"))
        .collect();
    let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    // Host and port are placeholders: only credentials and db are used.
    let redis = format!("{scheme}://{auth}localhost/{}", db.unwrap_or("0"));
    redis::Client::open(redis.as_str()).map_err(|e| format!("bad credentials: {e}"))?;
    Ok(RedisTarget::Sentinel {
        sentinels,
        master: master.to_owned(),
        redis,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_server_urls_pass_through() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379/2").unwrap(),
            RedisTarget::Single {
                url: "redis://127.0.0.1:6379/2".into()
            }
        );
        assert!(RedisTarget::parse("redis+unix:///tmp/redis.sock").is_ok());
    }

    #[test]
    fn cluster_urls_list_seeds_with_credentials() {
        assert_eq!(
            RedisTarget::parse("redis+cluster://u:p@127.0.0.1:7001,127.0.0.1:7002,[::1]:7003")
                .unwrap(),
            RedisTarget::Cluster {
                seeds: vec![
                    "redis://u:p@127.0.0.1:7001".into(),
                    "redis://u:p@127.0.0.1:7002".into(),
                    "redis://u:p@[::1]:7003".into(),
                ]
            }
        );
        assert!(RedisTarget::parse("REDIS+CLUSTER://a:1").is_ok());
    }

    #[test]
    fn sentinel_urls_name_the_master() {
        assert_eq!(
            RedisTarget::parse("redis+sentinel://:pw@s1:26380,s2/mymaster/3").unwrap(),
            RedisTarget::Sentinel {
                sentinels: vec!["redis://s1:26380".into(), "redis://s2:26379".into()],
                master: "mymaster".into(),
                redis: "redis://:pw@localhost/3".into(),
            }
        );
    }

    #[test]
    fn tls_forms_keep_tls_for_every_node() {
        let cluster = RedisTarget::parse("rediss+cluster://u:p@a:1,b:2").unwrap();
        assert_eq!(
            cluster,
            RedisTarget::Cluster {
                seeds: vec!["rediss://u:p@a:1".into(), "rediss://u:p@b:2".into()]
            }
        );
        assert!(cluster.is_tls());
        let sentinel = RedisTarget::parse("rediss+sentinel://s1/m").unwrap();
        assert_eq!(
            sentinel,
            RedisTarget::Sentinel {
                sentinels: vec!["rediss://s1:26379".into()],
                master: "m".into(),
                redis: "rediss://localhost/0".into(),
            }
        );
        assert!(sentinel.is_tls());
        assert!(RedisTarget::parse("rediss://h:1").unwrap().is_tls());
        assert!(!RedisTarget::parse("redis://h:1").unwrap().is_tls());
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let err = |url: &str| RedisTarget::parse(url).unwrap_err();
        assert!(err("redis+cluster://").contains("empty host"));
        assert!(err("redis+cluster://a:1,,b:2").contains("empty host"));
        assert!(err("redis+cluster://a").contains("missing port"));
        assert!(err("redis+cluster://a:x").contains("bad port"));
        assert!(err("redis+cluster://a:1/0").contains("no path"));
        assert!(err("redis+sentinel://a:1").contains("must name the master"));
        assert!(err("redis+sentinel://a:1/m/x").contains("bad db"));
        assert!(err("redis://a:1,b:2").contains("redis+cluster://"));
        assert!(err("http://a:1").contains("unknown scheme"));
    }
}
