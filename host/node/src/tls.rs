//! The node's identity and its TLS listener (docs/NODE.md "Transport and
//! authentication").
//!
//! On first start a node makes `<data_dir>/node/` (mode 0700) holding a self-signed
//! certificate (`cert.pem`, SAN `stockade-node` plus `node.hostnames`), its key
//! (`key.pem`) and the request secret (`secret`, 64 hex characters from
//! [`auth::new_secret`]); the files are 0600. Later starts reuse them, so a front's
//! pinned copy stays valid: to change the names, remove `cert.pem` and `key.pem` and
//! give the fronts the new certificate. Fronts pin the certificate itself (its SHA-256,
//! [`Identity::fingerprint`]), so no CA is involved.
//!
//! The secret is used as the HMAC key exactly as the file's text (the 64 ASCII
//! characters, surrounding whitespace trimmed), not hex-decoded: the same bytes a front
//! reads from its copy.
//!
//! [`TlsListener`] is an `axum::serve::Listener`: a task accepts TCP connections and
//! runs each TLS handshake in its own task (bounded in number and time), so one slow
//! client never holds up the others' accepts.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use stockade_node_protocol::auth;

/// The certificate's name that fronts verify (`certificateHost` in workerd).
pub const SERVER_NAME: &str = "stockade-node";

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes at once.
const MAX_HANDSHAKES: usize = 256;

/// Why the node's identity or listener could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NodeTlsError {
    /// A file or the directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate could not be made.
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    /// A file holds no usable PEM or secret.
    #[error("{path}: {why}")]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The node's certificate, key and secret.
pub struct Identity {
    /// `<data_dir>/node/cert.pem`.
    pub cert_path: PathBuf,
    /// `<data_dir>/node/key.pem`.
    pub key_path: PathBuf,
    /// `<data_dir>/node/secret`.
    pub secret_path: PathBuf,
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
    secret: Vec<u8>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key or the secret.
        f.debug_struct("Identity")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NodeTlsError + '_ {
    move |source| NodeTlsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Write `text` to `path`, mode 0600, replacing it.
fn write_private(path: &Path, text: &str) -> Result<(), NodeTlsError> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(text.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

impl Identity {
    /// Load `<data_dir>/node/`, making what is missing (a certificate naming
    /// `stockade-node` and `hostnames`; a secret).
    pub fn load_or_create(data_dir: &Path, hostnames: &[String]) -> Result<Identity, NodeTlsError> {
        let dir = data_dir.join("node");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io(&dir))?;
        let cert_path = dir.join("cert.pem");
        let key_path = dir.join("key.pem");
        let secret_path = dir.join("secret");
        if !(cert_path.is_file() && key_path.is_file()) {
            let mut names = vec![SERVER_NAME.to_owned()];
            names.extend(hostnames.iter().filter(|h| *h != SERVER_NAME).cloned());
            let key = rcgen::KeyPair::generate()?;
            let mut params = rcgen::CertificateParams::new(names)?;
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, SERVER_NAME);
            let cert = params.self_signed(&key)?;
            write_private(&key_path, &key.serialize_pem())?;
            write_private(&cert_path, &cert.pem())?;
            tracing::info!(target: "stockade::node", cert = %cert_path.display(), "node certificate made");
        }
        if !secret_path.is_file() {
            write_private(&secret_path, &format!("{}\n", auth::new_secret()))?;
            tracing::info!(target: "stockade::node", secret = %secret_path.display(), "node secret made");
        }
        for p in [&cert_path, &key_path, &secret_path] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).map_err(io(p))?;
        }
        let bad = |path: &Path, why: String| NodeTlsError::Bad {
            path: path.to_owned(),
            why,
        };
        let cert = CertificateDer::from_pem_file(&cert_path)
            .map_err(|e| bad(&cert_path, format!("no certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_file(&key_path)
            .map_err(|e| bad(&key_path, format!("no private key: {e}")))?;
        let secret = std::fs::read_to_string(&secret_path)
            .map_err(io(&secret_path))?
            .trim()
            .as_bytes()
            .to_vec();
        if secret.len() < 32 {
            return Err(bad(
                &secret_path,
                "the secret is shorter than 32 characters".into(),
            ));
        }
        Ok(Identity {
            cert_path,
            key_path,
            secret_path,
            cert,
            key,
            secret,
        })
    }

    /// The request secret (the HMAC key).
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// Lower-case hex SHA-256 of the certificate (DER): what a front pins.
    pub fn fingerprint(&self) -> String {
        auth::hex(ring::digest::digest(&ring::digest::SHA256, self.cert.as_ref()).as_ref())
    }

    /// The server side of TLS with this certificate (HTTP/1.1).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, NodeTlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], self.key.clone_key())?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// TLS connections, handshaken, for `axum::serve`.
pub struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        SocketAddr,
    )>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Serve TLS with `config` on `listener`.
    pub fn new(
        listener: tokio::net::TcpListener,
        config: Arc<ServerConfig>,
    ) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let tls = tokio_rustls::TlsAcceptor::from(config);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, peer) = match listener.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(target: "stockade::node", error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // No Nagle: a streamed line leaves at once.
                let _ = tcp.set_nodelay(true);
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(target: "stockade::node", %peer, error = %e, "TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(target: "stockade::node", %peer, "TLS handshake timed out");
                        }
                    }
                });
            }
        });
        Ok(TlsListener {
            rx,
            local,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The acceptor is gone (shutdown): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_made_once_private_and_reused() {
        let dir = std::env::temp_dir().join(format!("stockade-node-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let a =
            Identity::load_or_create(&dir, &["10.0.0.2".into(), "node.example".into()]).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("node")), 0o700);
        for p in [&a.cert_path, &a.key_path, &a.secret_path] {
            assert_eq!(mode(p), 0o600, "{}", p.display());
        }
        assert_eq!(a.secret().len(), 64);
        let b = Identity::load_or_create(&dir, &[]).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint(), "reused, not remade");
        assert_eq!(a.secret(), b.secret());
        assert!(a.server_config().is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
