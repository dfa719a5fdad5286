//! What a Redis connection presents and trusts: the ACL user and password,
//! the CA that Redis' certificate must chain to, and an optional client
//! certificate (mutual TLS).
//!
//! Files are re-read when a new connection is made, at most once every
//! reload interval: a renewed certificate or a rotated password (a
//! Kubernetes Secret's symlink swap) is used by the next connection, while
//! open connections keep what they were made with, as the server's own
//! certificates do (`src/tls.rs`). Files that stop loading are logged and
//! the last good material stays in use.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{ClientTlsConfig, TlsCertificates};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the credentials come from (the `--redis-*` flags).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisCredentials {
    /// ACL user (`AUTH user password`); overrides the URL's.
    pub username: Option<String>,
    /// Password given directly; overrides the URL's.
    pub password: Option<String>,
    /// Password read from a file (trailing newline dropped); re-read like
    /// the TLS files.
    pub password_file: Option<PathBuf>,
    /// CA certificates (PEM) Redis' certificate must chain to; None: the
    /// system's roots.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM) for mutual TLS; needs `tls_key_file`.
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub tls_key_file: Option<PathBuf>,
    /// How often the files may be re-read; None: read once at start.
    pub reload_interval: Option<Duration>,
}

impl RedisCredentials {
    /// True when any TLS file is named (the URL must then be `rediss`).
    pub fn has_tls_files(&self) -> bool {
        self.tls_ca_file.is_some() || self.tls_cert_file.is_some() || self.tls_key_file.is_some()
    }
}

/// The files' content, checked.
#[derive(Clone, PartialEq, Eq)]
struct Material {
    password: Option<String>,
    ca: Option<Vec<u8>>,
    cert: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
}

impl Material {
    fn read(from: &RedisCredentials) -> Result<Self, String> {
        fn read(path: &Path, flag: &str) -> Result<Vec<u8>, String> {
            std::fs::read(path).map_err(|e| format!("cannot read {flag} {}: {e}", path.display()))
        }
        let password = match &from.password_file {
            Some(path) => {
                let bytes = read(path, "--redis-password-file")?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| "--redis-password-file: not UTF-8 text".to_owned())?;
                Some(text.trim_end_matches(['\r', '\n']).to_owned())
            }
            None => from.password.clone(),
        };
        let material = Material {
            password,
            ca: from
                .tls_ca_file
                .as_deref()
                .map(|p| read(p, "--redis-tls-ca-file"))
                .transpose()?,
            cert: from
                .tls_cert_file
                .as_deref()
                .map(|p| read(p, "--redis-tls-cert-file"))
                .transpose()?,
            key: from
                .tls_key_file
                .as_deref()
                .map(|p| read(p, "--redis-tls-key-file"))
                .transpose()?,
        };
        material.check()?;
        Ok(material)
    }

    /// The PEM files parse, so a broken file is named here rather than as
    /// a handshake failure later.
    fn check(&self) -> Result<(), String> {
        fn certs(pem: &[u8], flag: &str) -> Result<(), String> {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{flag}: invalid PEM: {e}"))?;
            if certs.is_empty() {
                return Err(format!("{flag}: no PEM certificate found"));
            }
            Ok(())
        }
        if let Some(ca) = &self.ca {
            certs(ca, "--redis-tls-ca-file")?;
        }
        if let Some(cert) = &self.cert {
            certs(cert, "--redis-tls-cert-file")?;
        }
        if let Some(key) = &self.key {
            PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("--redis-tls-key-file: no usable PEM private key: {e}"))?;
        }
        Ok(())
    }

    fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: match (&self.cert, &self.key) {
                (Some(cert), Some(key)) => Some(ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
                _ => None,
            },
            root_cert: self.ca.clone(),
        }
    }
}

/// The credentials in force: read at start (an error stops the start),
/// refreshed by [`Credentials::current`].
pub(crate) struct Credentials {
    from: RedisCredentials,
    state: Mutex<State>,
}

struct State {
    material: Material,
    read_at: Instant,
    /// The last reload error, logged once.
    last_error: Option<String>,
}

/// What one new connection uses.
pub(crate) struct Current {
    pub username: Option<String>,
    pub password: Option<String>,
    pub tls: TlsCertificates,
}

impl Credentials {
    /// Reads and checks the files; the error names the flag at fault.
    pub fn load(from: RedisCredentials) -> Result<Self, String> {
        match (&from.tls_cert_file, &from.tls_key_file) {
            (Some(_), None) => {
                return Err("--redis-tls-cert-file needs --redis-tls-key-file".into());
            }
            (None, Some(_)) => {
                return Err("--redis-tls-key-file needs --redis-tls-cert-file".into());
            }
            _ => {}
        }
        if from.password.is_some() && from.password_file.is_some() {
            return Err("give --redis-password or --redis-password-file, not both".into());
        }
        let material = Material::read(&from)?;
        // rustls picks its crypto from the process default; make it ring,
        // the provider the server's own TLS uses.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        Ok(Credentials {
            from,
            state: Mutex::new(State {
                material,
                read_at: Instant::now(),
                last_error: None,
            }),
        })
    }

    /// The material for a new connection, re-read first when the reload
    /// interval has passed since the last read.
    pub fn current(&self) -> Current {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(interval) = self.from.reload_interval
            && state.read_at.elapsed() >= interval
        {
            state.read_at = Instant::now();
            match Material::read(&self.from) {
                Ok(material) => {
                    if material != state.material {
                        tracing::info!(
                            "redis credentials or TLS files changed: new connections use them"
                        );
                        state.material = material;
                    }
                    state.last_error = None;
                }
                Err(error) => {
                    if state.last_error.as_ref() != Some(&error) {
                        tracing::error!(
                            error = %error,
                            "cannot reload the redis credentials; keeping the last good ones"
                        );
                        state.last_error = Some(error);
                    }
                }
            }
        }
        Current {
            username: self.from.username.clone(),
            password: state.material.password.clone(),
            tls: state.material.certificates(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partner_flags_and_unreadable_files_are_named() {
        let err = |from: RedisCredentials| Credentials::load(from).err().unwrap();
        assert!(
            err(RedisCredentials {
                tls_cert_file: Some("c.pem".into()),
                ..Default::default()
            })
            .contains("--redis-tls-key-file")
        );
        assert!(
            err(RedisCredentials {
                tls_ca_file: Some("/nonexistent/ca.pem".into()),
                ..Default::default()
            })
            .contains("--redis-tls-ca-file")
        );
        assert!(
            err(RedisCredentials {
                password: Some("a".into()),
                password_file: Some("p".into()),
                ..Default::default()
            })
            .contains("not both")
        );
    }

    #[test]
    fn a_password_file_loses_its_newline_and_is_reread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "first\n").unwrap();
        let credentials = Credentials::load(RedisCredentials {
            password_file: Some(path.clone()),
            reload_interval: Some(Duration::ZERO),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(credentials.current().password.as_deref(), Some("first"));
        std::fs::write(&path, "second").unwrap();
        assert_eq!(credentials.current().password.as_deref(), Some("second"));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(credentials.current().password.as_deref(), Some("second"));
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate").unwrap();
        let err = Credentials::load(RedisCredentials {
            tls_ca_file: Some(path),
            ..Default::default()
        })
        .err()
        .unwrap();
        assert!(err.contains("--redis-tls-ca-file"), "{err}");
    }
}
