//! One node's HTTPS client (docs/NODE.md "Transport and authentication", "Retries and
//! idempotency").
//!
//! * TLS trusts exactly one certificate: the node's own, pinned from `cert_file`. The
//!   presented end-entity certificate must be byte-for-byte the pinned DER ([`Pinned`]);
//!   no CA, no name check beyond that (the pin is the identity). The handshake's
//!   signature is still verified with ring's algorithms, so only the holder of the
//!   pinned certificate's key gets through.
//! * Every request is signed ([`auth::Signed`]) with the node's secret (the text of
//!   `secret_file`, trimmed, as the node uses it) and a fresh nonce per attempt.
//! * One logical call has one idempotency key. It is retried only when no answer
//!   arrived (connect, TLS or send failure, a connection closed before the status
//!   line): at most [`ATTEMPTS`] attempts, within the call's deadline. An answer, any
//!   answer, is final.
//! * Connections are kept alive in a small pool (HTTP/1.1, one request at a time per
//!   connection): the fence's several calls per exec reuse them instead of paying a
//!   TCP and TLS handshake each. A pooled connection has no task of its own: the call
//!   using it drives it ([`Conn::drive`]) in the caller's task, so a round trip wakes
//!   no other task or thread on the front (a spawned driver cost two cross-thread
//!   hand-offs per call: docs/BENCHMARKS.md, "Remote exec"). An idle connection is not
//!   polled; one the node closed meanwhile is found so when next taken (its driver
//!   ends), and a fresh one is made.
//!
//! Answers map onto the WIT `substrate-error` ([`decode`], pure): transport failures
//! are `unreachable`; `400` and `413` are `invalid`, `401`/`403` are `failed`, each
//! with the body's message.

mod answers;
mod pinned;
mod pty;
mod stream;

pub use self::answers::{Lines, decode};
pub use self::pinned::{Pinned, pinned_config};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Response;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde::Serialize;
use serde::de::DeserializeOwned;

use stockade_node_protocol::auth::{self, Signed};
use stockade_node_protocol::{self as protocol, IDEMPOTENCY_HEADER};
use stockade_runtime::config::RemoteNode;
use stockade_runtime::substrate::{Result, SubstrateError};

/// Most attempts of one logical call.
pub const ATTEMPTS: u32 = 3;

/// Most idle connections kept per node.
const MAX_IDLE: usize = 64;

/// The largest answer read from a node (an artifact's part is the largest).
const MAX_ANSWER: usize = 64 << 20;

/// The longest NDJSON line a `run` answer may send (a chunk of output as base64).
const MAX_LINE: usize = 16 << 20;

/// The certificate name the front asks for (the node's certificate carries it).
const SERVER_NAME: &str = "stockade-node";

/// Why a node's client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A file could not be read or holds nothing usable.
    #[error("node {node}: {path}: {why}")]
    File {
        /// The node.
        node: String,
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The URL is not `https://HOST[:PORT]`.
    #[error("node {node}: url {url:?}: {why}")]
    Url {
        /// The node.
        node: String,
        /// The URL.
        url: String,
        /// What is wrong.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("node {node}: tls: {source}")]
    Tls {
        /// The node.
        node: String,
        /// Why.
        source: rustls::Error,
    },
}

/// One node's client.
pub struct NodeClient {
    name: String,
    /// `host:port` to connect to.
    connect: String,
    /// The `host` header.
    authority: String,
    secret: Vec<u8>,
    tls: tokio_rustls::TlsConnector,
    idle: Mutex<Vec<Conn>>,
    call_timeout: Duration,
    connect_timeout: Duration,
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("name", &self.name)
            .field("connect", &self.connect)
            .finish_non_exhaustive()
    }
}

/// A request that got no answer (the only kind retried).
#[derive(Debug)]
struct NoAnswer(String);

impl NodeClient {
    /// The client of `node`, reading its pinned certificate and its secret. A call
    /// takes at most `call_timeout` (a `run`: its own timeout more); a new connection
    /// (TCP, TLS, HTTP) at most `connect_timeout` per attempt, so a silent node (a cut
    /// link) is told `unreachable` in attempts × `connect_timeout`, not a TCP timeout.
    pub fn new(
        node: &RemoteNode,
        call_timeout: Duration,
        connect_timeout: Duration,
    ) -> std::result::Result<NodeClient, ClientError> {
        let file = |path: &std::path::Path, why: String| ClientError::File {
            node: node.name.clone(),
            path: path.to_owned(),
            why,
        };
        let cert = CertificateDer::from_pem_file(&node.cert_file)
            .map_err(|e| file(&node.cert_file, format!("no certificate: {e}")))?;
        let secret = std::fs::read_to_string(&node.secret_file)
            .map_err(|e| file(&node.secret_file, e.to_string()))?
            .trim()
            .as_bytes()
            .to_vec();
        if secret.len() < 32 {
            return Err(file(
                &node.secret_file,
                "the secret is shorter than 32 characters".into(),
            ));
        }
        let (connect, authority) = parse_url(&node.url).map_err(|why| ClientError::Url {
            node: node.name.clone(),
            url: node.url.clone(),
            why,
        })?;
        let tls = pinned_config(cert).map_err(|source| ClientError::Tls {
            node: node.name.clone(),
            source,
        })?;
        Ok(NodeClient {
            name: node.name.clone(),
            connect,
            authority,
            secret,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            idle: Mutex::new(Vec::new()),
            call_timeout,
            connect_timeout,
        })
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's secret (it also verifies the node's call backs).
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// One call (not `run`): its `ok` value, or the substrate error it maps to.
    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        call: &str,
        key: &str,
        body: &B,
    ) -> Result<T> {
        let deadline = Instant::now() + self.call_timeout;
        let body = Bytes::from(
            serde_json::to_vec(body).map_err(|e| SubstrateError::Invalid(e.to_string()))?,
        );
        let (resp, mut conn) = self.send(call, key, body, deadline).await?;
        let status = resp.status();
        let bytes = match tokio::time::timeout_at(
            deadline.into(),
            conn.drive(Limited::new(resp.into_body(), MAX_ANSWER).collect()),
        )
        .await
        {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) => return Err(self.unreachable(format!("{call}: reading the answer: {e}"))),
            Err(_) => {
                return Err(
                    self.unreachable(format!("{call}: no answer within {:?}", self.call_timeout))
                );
            }
        };
        self.keep(conn);
        decode(status, &bytes)
    }

    /// The node is unreachable: its kept connections are likely dead too (a cut link
    /// leaves them looking open), so they go, and the next call connects afresh
    /// (bounded by the connect timeout) instead of waiting on one for its deadline.
    /// The message says what a lost node costs: its containers are gone, and a key's
    /// next call restores the last checkpoint (docs/NODE.md).
    fn unreachable(&self, why: String) -> SubstrateError {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
        SubstrateError::Unreachable(format!(
            "node {} could not be reached ({why}); if the node was lost, the sandbox restarts from its last checkpoint",
            self.name
        ))
    }

    fn failed(&self, why: String) -> SubstrateError {
        SubstrateError::Failed(format!("node {}: {why}", self.name))
    }

    /// Send a signed request, retrying while no answer arrived; the answer's head and
    /// the connection to keep once its body is read.
    async fn send(
        &self,
        call: &str,
        key: &str,
        body: Bytes,
        deadline: Instant,
    ) -> Result<(Response<Incoming>, Conn)> {
        let idempotency = uuid::Uuid::new_v4().simple().to_string();
        let path = format!("{}{call}", protocol::PREFIX);
        let mut last = String::from("the call's deadline passed before it was sent");
        for attempt in 1..=ATTEMPTS {
            if Instant::now() >= deadline {
                break;
            }
            match tokio::time::timeout_at(
                deadline.into(),
                self.attempt(&path, key, &idempotency, body.clone()),
            )
            .await
            {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(NoAnswer(why))) => {
                    tracing::debug!(target: "stockade::remote", node = %self.name, call, attempt, error = %why, "no answer; retrying");
                    last = why;
                }
                Err(_) => {
                    last = "no answer before the call's deadline".to_owned();
                    break;
                }
            }
        }
        tracing::warn!(target: "stockade::remote", node = %self.name, call, error = %last, "node unreachable");
        Err(self.unreachable(format!("{call}: {last}")))
    }

    /// One attempt's signature over the canonical text (docs/NODE.md "Transport and
    /// authentication"): the time now and a fresh nonce.
    fn sign(&self, method: &str, path: &str, key: &str, idempotency: &str, body: &[u8]) -> Attempt {
        let time_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let nonce = auth::nonce();
        let signature = Signed {
            time_ms,
            nonce: &nonce,
            method,
            path,
            key,
            idempotency,
            body,
        }
        .sign(&self.secret);
        Attempt {
            time: time_ms.to_string(),
            nonce,
            signature,
        }
    }

    async fn attempt(
        &self,
        path: &str,
        key: &str,
        idempotency: &str,
        body: Bytes,
    ) -> std::result::Result<(Response<Incoming>, Conn), NoAnswer> {
        let (mut conn, reused) = self.connection().await?;
        let signed = self.sign("POST", path, key, idempotency, &body);
        let mut req = hyper::Request::post(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(IDEMPOTENCY_HEADER, idempotency);
        for (name, value) in signed.headers(key) {
            req = req.header(name, value);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| NoAnswer(format!("request: {e}")))?;
        match drive(&mut conn.driver, conn.send.send_request(req)).await {
            Ok(resp) => Ok((resp, conn)),
            Err(e) => {
                if reused {
                    // A kept connection the node closed: the others are likely stale too.
                    self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
                }
                Err(NoAnswer(format!("send: {e}")))
            }
        }
    }

    /// A kept connection ready for a request, or a new one (and whether it was kept).
    async fn connection(&self) -> std::result::Result<(Conn, bool), NoAnswer> {
        loop {
            let kept = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some(mut conn) = kept else { break };
            if conn.send.is_closed() {
                continue;
            }
            let ready = drive(&mut conn.driver, conn.send.ready());
            if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(1), ready).await {
                return Ok((conn, true));
            }
        }
        let (conn, driver) = self.handshake().await?;
        let driver: Driver = Box::pin(driver);
        Ok((
            Conn {
                send: conn,
                driver: Some(driver),
            },
            false,
        ))
    }

    /// Keep a connection whose answer was read to its end.
    fn keep(&self, conn: Conn) {
        if conn.send.is_closed() || conn.driver.is_none() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }
}

impl NodeClient {
    /// A new connection (TCP, TLS, HTTP/1.1) within the connect timeout, its driver
    /// spawned.
    async fn open<B>(&self) -> std::result::Result<SendRequest<B>, NoAnswer>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (conn, driver) = self.handshake().await?;
        tokio::spawn(driver);
        Ok(conn)
    }

    /// A new connection to the node (TCP with no delay, pinned TLS, HTTP/1.1), within
    /// the connect timeout: its request half, and its driver, which logs how it ended.
    async fn handshake<B>(
        &self,
    ) -> std::result::Result<
        (
            SendRequest<B>,
            impl Future<Output = hyper::Result<()>> + Send + 'static,
        ),
        NoAnswer,
    >
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let connect = async {
            let tls = self.tls_stream().await?;
            hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| NoAnswer(format!("http: {e}")))
        };
        let (conn, driver) = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| {
                NoAnswer(format!(
                    "connect {}: no connection within {:?}",
                    self.connect, self.connect_timeout
                ))
            })??;
        let node = self.name.clone();
        Ok((conn, async move {
            let r = driver.await;
            if let Err(e) = &r {
                tracing::debug!(target: "stockade::remote", %node, error = %e, "node connection ended");
            }
            r
        }))
    }
}

/// One attempt's signing: what [`NodeClient::sign`] made, sent as headers.
struct Attempt {
    time: String,
    nonce: String,
    signature: String,
}

impl Attempt {
    /// The signing headers, as (name, value): the time, the nonce, the key, the
    /// signature (the idempotency key is the request's own header).
    fn headers<'a>(&'a self, key: &'a str) -> [(&'static str, &'a str); 4] {
        [
            (auth::TIME_HEADER, &self.time),
            (auth::NONCE_HEADER, &self.nonce),
            (auth::KEY_HEADER, key),
            (auth::SIGNATURE_HEADER, &self.signature),
        ]
    }
}

impl NodeClient {
    /// A TLS connection to the node (TCP with no delay, the pinned certificate).
    async fn tls_stream(
        &self,
    ) -> std::result::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, NoAnswer> {
        let tcp = tokio::net::TcpStream::connect(&self.connect)
            .await
            .map_err(|e| NoAnswer(format!("connect {}: {e}", self.connect)))?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(SERVER_NAME).map_err(|e| NoAnswer(e.to_string()))?;
        self.tls
            .connect(name, tcp)
            .await
            .map_err(|e| NoAnswer(format!("tls: {e}")))
    }
}

/// A connection's driver (hyper's HTTP/1.1 state machine over TLS), type-erased.
type Driver = std::pin::Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// A connection to the node: its request half and its driver, which whoever uses the
/// connection polls beside its own future ([`drive`]); `None` once it ended.
struct Conn {
    send: SendRequest<Full<Bytes>>,
    driver: Option<Driver>,
}

impl Conn {
    /// `fut` with this connection driven beside it.
    async fn drive<F: Future>(&mut self, fut: F) -> F::Output {
        drive(&mut self.driver, fut).await
    }
}

/// Poll `fut` to its end, polling `driver` beside it in the same task (no other task
/// carries the connection's bytes). The driver goes first, so what it reads (an answer's
/// head, a body's frame) is seen by `fut` in the same poll. A driver that ends (the
/// connection closed or failed) is dropped, which ends a pending request or body with
/// an error, as a spawned driver's end did.
async fn drive<F: Future>(driver: &mut Option<Driver>, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Some(d) = driver.as_mut()
            && d.as_mut().poll(cx).is_ready()
        {
            *driver = None;
        }
        fut.as_mut().poll(cx)
    })
    .await
}

/// `https://HOST[:PORT][/]` → (`host:port` to connect to, the `host` header).
pub fn parse_url(url: &str) -> std::result::Result<(String, String), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err("not https".into());
    }
    let auth = uri.authority().ok_or("no host")?;
    let port = auth.port_u16().unwrap_or(443);
    let host = auth.host();
    Ok((format!("{host}:{port}"), auth.as_str().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;
    use rustls::client::danger::ServerCertVerifier;
    use rustls_pki_types::UnixTime;
    use std::collections::BTreeSet;
    use stockade_node_protocol::RunLine;

    use rustls_pki_types::PrivateKeyDer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn cert() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (
            cert.der().clone(),
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
    }

    #[derive(Debug)]
    struct Fixed(Arc<rustls::sign::CertifiedKey>);

    impl rustls::server::ResolvesServerCert for Fixed {
        fn resolve(
            &self,
            _: rustls::server::ClientHello<'_>,
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            Some(self.0.clone())
        }
    }

    /// A TLS handshake over an in-memory pipe: the server presents `served`, the client
    /// pins `pinned`; whether a byte got across.
    async fn handshake(
        served: (CertificateDer<'static>, PrivateKeyDer<'static>),
        pinned: CertificateDer<'static>,
    ) -> std::result::Result<(), String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // A fixed resolver, not `with_single_cert`: that refuses a key that does not
        // match its certificate, which is the case under test.
        let signing = provider.key_provider.load_private_key(served.1).unwrap();
        let certified = Arc::new(rustls::sign::CertifiedKey::new(vec![served.0], signing));
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Fixed(certified)));
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let connector = tokio_rustls::TlsConnector::from(Arc::new(pinned_config(pinned).unwrap()));
        let (a, b) = tokio::io::duplex(1 << 16);
        let srv = tokio::spawn(async move {
            let mut s = acceptor.accept(a).await.map_err(|e| e.to_string())?;
            s.write_all(b"x").await.map_err(|e| e.to_string())?;
            s.flush().await.map_err(|e| e.to_string())
        });
        let name = ServerName::try_from(SERVER_NAME).unwrap();
        let mut c = connector
            .connect(name, b)
            .await
            .map_err(|e| e.to_string())?;
        let mut one = [0u8; 1];
        c.read_exact(&mut one).await.map_err(|e| e.to_string())?;
        let _ = srv.await;
        Ok(())
    }

    #[tokio::test]
    async fn only_the_pinned_certificate_is_accepted() {
        let a = cert();
        let b = cert();
        let pinned = a.0.clone();
        assert_eq!(
            handshake((a.0.clone(), a.1.clone_key()), pinned.clone()).await,
            Ok(())
        );
        // Another certificate, even with the same name: refused.
        let err = handshake(b, pinned.clone()).await.unwrap_err();
        assert!(err.contains("certificate"), "{err}");
        // The pinned certificate presented with another key: the handshake signature
        // does not verify.
        let other_key = cert().1;
        let err = handshake((a.0.clone(), other_key), pinned).await;
        assert!(err.is_err(), "a certificate without its key got through");
    }

    /// A node stand-in over TLS with certificate `served`: connection `n` (from 0) is
    /// answered by `script(n)`: `None` closes it without a word (no answer), `Some`
    /// writes that raw HTTP answer. Every request's headers go to the channel.
    async fn stand_in(
        served: (CertificateDer<'static>, PrivateKeyDer<'static>),
        script: fn(usize) -> Option<&'static str>,
    ) -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![served.0], served.1)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for n in 0.. {
                let Ok((tcp, _)) = l.accept().await else {
                    return;
                };
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    continue;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    loop {
                        let mut head = Vec::new();
                        let mut b = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            if s.read_exact(&mut b).await.is_err() {
                                return;
                            }
                            head.push(b[0]);
                        }
                        let head = String::from_utf8_lossy(&head).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        let mut body = vec![0u8; len];
                        let _ = s.read_exact(&mut body).await;
                        let _ = tx.send(format!("{head}x-connection: {n}\r\n"));
                        let Some(answer) = script(n) else { return };
                        let _ = s.write_all(answer.as_bytes()).await;
                        let _ = s.flush().await;
                        if answer.contains("connection: close") {
                            let _ = s.shutdown().await;
                            return;
                        }
                    }
                });
            }
        });
        (addr, rx)
    }

    fn client_of(
        addr: std::net::SocketAddr,
        pinned: &CertificateDer<'static>,
        dir: &std::path::Path,
    ) -> NodeClient {
        let cert_pem = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pinned.as_ref())
        );
        std::fs::write(dir.join("cert.pem"), cert_pem).unwrap();
        std::fs::write(dir.join("secret"), "cd".repeat(32)).unwrap();
        let node = RemoteNode {
            name: "n".into(),
            url: format!("https://{addr}"),
            cert_file: dir.join("cert.pem"),
            secret_file: dir.join("secret"),
        };
        NodeClient::new(&node, Duration::from_secs(10), Duration::from_secs(2)).unwrap()
    }

    fn header<'a>(head: &'a str, name: &str) -> &'a str {
        head.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or("")
            .trim()
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\nconnection: close\r\n\r\n{\"ok\":\"c1\"}";
    const FAILED: &str =
        "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\nconnection: close\r\n\r\noops";

    const KEPT: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":\"c1\"}";

    #[tokio::test]
    async fn calls_in_turn_share_one_kept_connection() {
        let dir = std::env::temp_dir().join(format!("stockade-client-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = cert();
        let pinned = a.0.clone();
        let (addr, mut seen) = stand_in(a, |_| Some(KEPT)).await;
        let c = client_of(addr, &pinned, &dir);
        for _ in 0..5 {
            let id: String = c
                .call(protocol::call::CURRENT, "k", &serde_json::json!({}))
                .await
                .unwrap();
            assert_eq!(id, "c1");
        }
        let conns: BTreeSet<String> = (0..5)
            .map(|_| header(&seen.try_recv().unwrap(), "x-connection").to_owned())
            .collect();
        assert_eq!(conns.len(), 1, "one TCP and TLS handshake for five calls");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_call_without_an_answer_is_retried_freshly_signed_with_one_idempotency_key() {
        let dir = std::env::temp_dir().join(format!("stockade-client-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = cert();
        let pinned = a.0.clone();
        // Two connections closed unanswered, then an answer: three attempts.
        let (addr, mut seen) = stand_in(a, |n| (n >= 2).then_some(OK)).await;
        let c = client_of(addr, &pinned, &dir);
        let id: String = c
            .call(protocol::call::ENSURE, "k", &serde_json::json!({}))
            .await
            .unwrap();
        assert_eq!(id, "c1");
        let heads: Vec<String> = (0..3).map(|_| seen.try_recv().unwrap()).collect();
        let nonces: BTreeSet<&str> = heads
            .iter()
            .map(|h| header(h, auth::NONCE_HEADER))
            .collect();
        let idem: BTreeSet<&str> = heads
            .iter()
            .map(|h| header(h, IDEMPOTENCY_HEADER))
            .collect();
        assert_eq!(nonces.len(), 3, "a fresh nonce per attempt");
        assert_eq!(idem.len(), 1, "one idempotency key per call");
        assert!(heads.iter().all(|h| header(h, auth::KEY_HEADER) == "k"));
        assert!(heads.iter().all(|h| h.starts_with("post /node/v1/ensure ")));
        // A second call has its own idempotency key.
        let _: String = c
            .call(protocol::call::ENSURE, "k", &serde_json::json!({}))
            .await
            .unwrap();
        let again = seen.try_recv().unwrap();
        assert!(!idem.contains(header(&again, IDEMPOTENCY_HEADER)));

        // Never an answer: at most three attempts, then unreachable.
        let b = cert();
        let pinned = b.0.clone();
        let (addr, mut seen) = stand_in(b, |_| None).await;
        let c = client_of(addr, &pinned, &dir);
        let r: Result<String> = c
            .call(protocol::call::ENSURE, "k", &serde_json::json!({}))
            .await;
        assert!(
            matches!(&r, Err(SubstrateError::Unreachable(m))
                if m.ends_with("if the node was lost, the sandbox restarts from its last checkpoint")),
            "{r:?}"
        );
        let mut n = 0;
        while seen.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, ATTEMPTS);

        // An answer, even a failure, is final: one attempt.
        let d = cert();
        let pinned = d.0.clone();
        let (addr, mut seen) = stand_in(d, |_| Some(FAILED)).await;
        let c = client_of(addr, &pinned, &dir);
        let r: Result<String> = c
            .call(protocol::call::ENSURE, "k", &serde_json::json!({}))
            .await;
        assert!(matches!(r, Err(SubstrateError::Failed(_))), "{r:?}");
        assert!(seen.try_recv().is_ok());
        assert!(seen.try_recv().is_err(), "not retried");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_verifier_compares_the_whole_certificate() {
        let (a, _) = cert();
        let (b, _) = cert();
        let v = Pinned::new(
            a.clone(),
            Arc::new(rustls::crypto::ring::default_provider()),
        );
        let name = ServerName::try_from(SERVER_NAME).unwrap();
        let now = UnixTime::now();
        assert!(v.verify_server_cert(&a, &[], &name, &[], now).is_ok());
        assert!(v.verify_server_cert(&b, &[], &name, &[], now).is_err());
        // The pinned certificate as an intermediate does not help another leaf.
        assert!(
            v.verify_server_cert(&b, std::slice::from_ref(&a), &name, &[], now)
                .is_err()
        );
        let mut truncated = a.as_ref().to_vec();
        truncated.pop();
        assert!(
            v.verify_server_cert(&CertificateDer::from(truncated), &[], &name, &[], now)
                .is_err()
        );
    }

    #[test]
    fn answers_map_onto_the_substrate_error() {
        let err = |kind: &str, m: &str| {
            format!(r#"{{"error":{{"kind":"{kind}","message":"{m}"}}}}"#).into_bytes()
        };
        let rows: Vec<(StatusCode, Vec<u8>, Result<String>)> = vec![
            (StatusCode::OK, br#"{"ok":"c1"}"#.to_vec(), Ok("c1".into())),
            (
                StatusCode::OK,
                err("over-capacity", ""),
                Err(SubstrateError::OverCapacity),
            ),
            (
                StatusCode::OK,
                err("unreachable", "gone"),
                Err(SubstrateError::Unreachable("gone".into())),
            ),
            (
                StatusCode::BAD_REQUEST,
                err("invalid", "bad body"),
                Err(SubstrateError::Invalid("bad body".into())),
            ),
            (
                StatusCode::UNAUTHORIZED,
                err("failed", "replay"),
                Err(SubstrateError::Failed(
                    "the node refused the request's signature: replay".into(),
                )),
            ),
            (
                StatusCode::FORBIDDEN,
                b"not yours".to_vec(),
                Err(SubstrateError::Failed(
                    "the node refused: another key's container: not yours".into(),
                )),
            ),
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                b"too big".to_vec(),
                Err(SubstrateError::Invalid(
                    "the request is larger than the node takes: too big".into(),
                )),
            ),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                b"".to_vec(),
                Err(SubstrateError::Unreachable(
                    "HTTP 503 Service Unavailable: ".into(),
                )),
            ),
        ];
        for (status, body, want) in rows {
            assert_eq!(decode::<String>(status, &body), want, "{status}");
        }
        assert!(matches!(
            decode::<String>(StatusCode::OK, b"{\"ok\":1"),
            Err(SubstrateError::Failed(_))
        ));
    }

    #[test]
    fn run_lines_are_read_across_any_cut() {
        let text = b"{\"stdout\":\"aGkK\"}\n{\"heartbeat\":7}\n\n{\"result\":{\"exit_code\":0,\"stdout\":\"\",\"stderr\":\"\",\"timed_out\":false,\"truncated\":false,\"limits\":[]}}\n";
        for cut in 0..text.len() {
            let mut l = Lines::default();
            let mut got = l.push(&text[..cut]).unwrap();
            got.extend(l.push(&text[cut..]).unwrap());
            assert_eq!(got.len(), 3, "cut at {cut}");
            assert_eq!(got[0], RunLine::Stdout(b"hi\n".to_vec()));
            assert_eq!(got[1], RunLine::Heartbeat(7));
            assert!(matches!(got[2], RunLine::Result(_)));
        }
        assert!(Lines::default().push(b"{\"nope\":1}\n").is_err());
    }

    #[test]
    fn urls_name_where_to_connect() {
        assert_eq!(
            parse_url("https://10.0.0.2:8788").unwrap(),
            ("10.0.0.2:8788".into(), "10.0.0.2:8788".into())
        );
        assert_eq!(
            parse_url("https://node.example/").unwrap(),
            ("node.example:443".into(), "node.example".into())
        );
        assert_eq!(
            parse_url("https://[::1]:9").unwrap(),
            ("[::1]:9".into(), "[::1]:9".into())
        );
        assert!(parse_url("http://10.0.0.2:8788").is_err());
    }
}
