//! The proxy's tests, by concern, and the harness they share: loopback upstreams, a
//! proxy per test, clients (hyper, curl, raw bytes).

use std::sync::atomic::AtomicUsize;

use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::rules::{Grant, RuleSpec};
use crate::{
    Admitted, DENIAL_HEADER, Denial, DenialSink, Fence, Interception, MAX_CONNECTIONS,
    ProxyOptions, audit, bounded,
};

/// Deadline for anything a test waits on.
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct Recorded(
    Mutex<Vec<(String, String, Denial)>>,
    pub(crate) Mutex<Vec<Admitted>>,
);

impl DenialSink for Recorded {
    fn record(&self, key: &str, container: &str, denial: Denial) {
        self.0
            .lock()
            .unwrap()
            .push((key.into(), container.into(), denial));
    }

    fn record_admitted(&self, _key: &str, _container: &str, admitted: Admitted) {
        self.1.lock().unwrap().push(admitted);
    }
}

impl Recorded {
    pub(crate) fn admitted(&self) -> Vec<Admitted> {
        self.1.lock().unwrap().clone()
    }

    pub(crate) fn reasons(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, _, d)| d.reason.clone())
            .collect()
    }
    fn last(&self) -> Denial {
        self.0
            .lock()
            .unwrap()
            .last()
            .expect("a denial was recorded")
            .2
            .clone()
    }
}

/// A loopback HTTP server: `/hang` never answers, `/stall-head` sends headers only,
/// `/stall` sends headers and one
/// chunk then nothing; everything else echoes what it received. Each request is
/// announced on the channel.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    pub(crate) hits: Arc<AtomicUsize>,
    pub(crate) seen: mpsc::UnboundedReceiver<String>,
}

struct Stall(bool);
impl Body for Stall {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.0 {
            Poll::Pending
        } else {
            self.0 = true;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"first-chunk")))))
        }
    }
}

type TestBody = http_body_util::Either<http_body_util::Full<Bytes>, Stall>;

pub(crate) async fn upstream() -> Upstream {
    upstream_on(None).await
}

/// The test upstream: it answers with what it saw (method, target, headers, body);
/// over TLS with `tls`.
pub(crate) async fn upstream_on(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let (tx, seen) = mpsc::unbounded_channel();
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let (h, tx) = (h.clone(), tx.clone());
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (h, tx) = (h.clone(), tx.clone());
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    let path = req.uri().path().to_owned();
                    let _ = tx.send(path.clone());
                    // `/late/<ms>`: an answer that takes that long.
                    if let Some(ms) = path.strip_prefix("/late/") {
                        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
                    }
                    if path == "/hang" {
                        std::future::pending::<()>().await;
                    }
                    if path == "/stall-head" {
                        // The head, then a body that never sends a byte.
                        return Ok::<_, Infallible>(Response::new(TestBody::Right(Stall(true))));
                    }
                    if path == "/stall" {
                        return Ok::<_, Infallible>(Response::new(TestBody::Right(Stall(false))));
                    }
                    let mut text = format!("upstream saw {} {}", req.method(), req.uri());
                    for (k, v) in req.headers() {
                        text.push_str(&format!("\n{k}: {}", v.to_str().unwrap_or("?")));
                    }
                    // A body the client broke off reads as what arrived (the fuzz
                    // cuts requests short).
                    let body = match req.into_body().collect().await {
                        Ok(b) => b.to_bytes(),
                        Err(_) => Bytes::new(),
                    };
                    text.push_str(&format!("\nbody: {}", String::from_utf8_lossy(&body)));
                    let mut resp =
                        Response::new(TestBody::Left(http_body_util::Full::new(Bytes::from(text))));
                    resp.headers_mut()
                        .insert("proxy-agent", HeaderValue::from_static("upstream"));
                    Ok(resp)
                }
            });
            match &tls {
                None => {
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(s), svc),
                    );
                }
                Some(config) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
                    tokio::spawn(async move {
                        if let Ok(t) = acceptor.accept(s).await {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(t), svc)
                                .await;
                        }
                    });
                }
            }
        }
    });
    Upstream { addr, hits, seen }
}

/// A loopback TCP echo server (the far end of tunnels).
async fn echo() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    pub(crate) fence: Fence,
    pub(crate) sink: Arc<Recorded>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn proxy_with(allow_private_targets: bool) -> Proxy {
    proxy_opts(ProxyOptions {
        allow_private_targets,
        max_connections: MAX_CONNECTIONS,
    })
}

fn proxy_opts(opts: ProxyOptions) -> Proxy {
    proxy_tls(opts, None)
}

/// A proxy, intercepting with `tls`.
pub(crate) fn proxy_tls(opts: ProxyOptions, tls: Option<Interception>) -> Proxy {
    proxy_attributed(opts, tls, None)
}

/// A proxy, intercepting with `tls`; with `attribution`, an open grant admits only the
/// connections it says the fenced run holds (`serve_with`).
pub(crate) fn proxy_attributed(
    opts: ProxyOptions,
    tls: Option<Interception>,
    attribution: Option<Arc<dyn crate::Attribution>>,
) -> Proxy {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fence = Fence::new("key-1", "container-1");
    let sink = Arc::new(Recorded::default());
    let task = crate::serve_with(
        listener,
        fence.clone(),
        opts,
        sink.clone(),
        tls,
        attribution,
        crate::budget::Budget::new(crate::budget::Limits::default()),
    );
    Proxy {
        addr,
        fence,
        sink,
        task,
    }
}

fn proxy() -> Proxy {
    proxy_with(true)
}

/// A request on a new connection that the proxy does not serve within 300 ms (it
/// is at its cap): the connection and a buffer to read its answer into later.
async fn unserved_request(addr: std::net::SocketAddr) -> (TcpStream, [u8; 64]) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET http://example.invalid/ HTTP/1.1\r\nhost: example.invalid\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await;
    assert!(early.is_err(), "served past the cap: {early:?}");
    (s, buf)
}

/// `n` idle client connections that the proxy accepted (each answered one request).
async fn held_connections(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET http://example.invalid/ HTTP/1.1\r\nhost: example.invalid\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        out.push(s);
    }
    out
}

fn grant(rules: &[(&str, &[&str], Option<&str>)]) -> Grant {
    let specs: Vec<RuleSpec> = rules
        .iter()
        .map(|(host, methods, path)| RuleSpec::new(host, methods, *path))
        .collect();
    Grant::parse(&specs).unwrap()
}

/// A keep-alive hyper client connection to the proxy.
struct Client {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>,
    closed: tokio::task::JoinHandle<()>,
}

async fn client(proxy: &Proxy) -> Client {
    let s = TcpStream::connect(proxy.addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    let closed = tokio::spawn(async move {
        let _ = conn.await;
    });
    Client { sender, closed }
}

struct Answer {
    status: StatusCode,
    denial: Option<String>,
    headers: HeaderMap,
    body: String,
}

impl Client {
    async fn send(&mut self, method: &str, url: &str, body: &str) -> Answer {
        let uri: Uri = url.parse().unwrap();
        let req = Request::builder()
            .method(method)
            .uri(url)
            .header(header::HOST, uri.authority().unwrap().as_str())
            .header(header::PROXY_AUTHORIZATION, "Basic c2VjcmV0")
            .header("proxy-connection", "keep-alive")
            .header("x-custom", "kept")
            .body(http_body_util::Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let resp = tokio::time::timeout(DEADLINE, async {
            self.sender.ready().await.unwrap();
            self.sender.send_request(req).await.unwrap()
        })
        .await
        .expect("proxy answered in time");
        let status = resp.status();
        let denial = resp
            .headers()
            .get(DENIAL_HEADER)
            .map(|v| v.to_str().unwrap().to_owned());
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            denial,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    async fn get(&mut self, url: &str) -> Answer {
        self.send("GET", url, "").await
    }
}

pub(crate) async fn curl(args: &[&str]) -> String {
    let out = tokio::time::timeout(
        DEADLINE,
        tokio::process::Command::new("curl")
            .args(["-s", "-i", "--noproxy", "", "--max-time", "8"])
            .args(args)
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .output(),
    )
    .await
    .expect("curl finished in time")
    .expect("curl is installed (apt-get install -y curl)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) async fn raw_connect(proxy: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(DEADLINE, async {
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            head.push(byte[0]);
        }
    })
    .await
    .expect("CONNECT answered in time");
    (s, String::from_utf8_lossy(&head).into_owned())
}

async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).await.unwrap();
    let mut buf = vec![0u8; msg.len()];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut buf))
        .await
        .expect("echo in time")
        .unwrap();
    buf
}

thread_local! {
    static LOG: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes into the calling thread's `LOG`.
struct ThreadLog;
impl std::io::Write for ThreadLog {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.with(|l| l.borrow_mut().extend_from_slice(b));
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One process-wide subscriber writing each thread's lines to that thread's buffer.
/// A thread-local subscriber (`with_default`) misses events whose callsite another
/// test's thread registered first (tracing caches interest per callsite), which
/// made this test flaky when the suite ran in parallel.
fn capture_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(|| ThreadLog)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
    });
    LOG.with(|l| l.borrow_mut().clear());
}

/// Send raw bytes on a fresh connection; the status codes of the answers that came
/// back before the proxy closed it (or went quiet).
async fn raw_exchange(proxy: SocketAddr, bytes: &[u8]) -> Vec<u16> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    exchange_statuses(&mut s, bytes).await
}

/// Write `bytes`, read until the other side closes or goes quiet, and return the
/// status of every answer read. Every row is answered, so the first bytes are waited
/// for up to [`DEADLINE`] (on a loaded machine a TLS round trip through the proxy and
/// the upstream took longer than the quiet gap: the answer was read as none); after
/// them, [`QUIET`] with nothing more ends the exchange (a second answer, a smuggled
/// request's, comes right behind the first).
pub(crate) async fn exchange_statuses<S>(s: &mut S, bytes: &[u8]) -> Vec<u16>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    /// How long the answer may go quiet before it is taken as whole.
    const QUIET: Duration = Duration::from_millis(1500);
    s.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut wait = DEADLINE;
    while let Ok(Ok(n)) = tokio::time::timeout(wait, s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        wait = QUIET;
    }
    String::from_utf8_lossy(&got)
        .split("HTTP/1.1 ")
        .skip(1)
        .filter_map(|r| r.get(..3)?.parse().ok())
        .collect()
}

/// The raw-socket table's requests (framing, smuggling, encoded separators, dot
/// segments), with `base` before each path: `http://HOST:PORT` through the proxy, empty
/// (origin-form) inside an intercepted tunnel. `u` is the upstream's `host:port` (the
/// `Host` header).
pub(crate) fn decided_request_rows(
    u: &str,
    base: &str,
) -> Vec<(&'static str, String, &'static [u16])> {
    let smuggle_body = format!("0\r\n\r\nGET {base}/secret.txt HTTP/1.1\r\nHost: {u}\r\n\r\n");
    // What an upstream that ignores a GET body reads as the next request: always
    // origin-form, as the proxy forwards.
    let inner = format!("GET /secret.txt HTTP/1.1\r\nHost: {u}\r\n\r\n");
    let with_body = |method: &str| {
        format!(
            "{method} {base}/allowed/ok.txt HTTP/1.1\r\nHost: {u}\r\nContent-Length: {}\r\n\r\n{inner}",
            inner.len()
        )
    };
    vec![
        (
            "a body on GET carrying a second request",
            with_body("GET"),
            &[400],
        ),
        ("a body on HEAD", with_body("HEAD"), &[400]),
        ("a body on OPTIONS", with_body("OPTIONS"), &[400]),
        ("a body on TRACE", with_body("TRACE"), &[400]),
        (
            "a chunked body on GET",
            format!(
                "GET {base}/allowed/ok.txt HTTP/1.1\r\nHost: {u}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{inner}\r\n0\r\n\r\n",
                inner.len()
            ),
            &[400],
        ),
        (
            "Content-Length with Transfer-Encoding, a request in the body",
            format!(
                "POST {base}/allowed/x HTTP/1.1\r\nHost: {u}\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n{smuggle_body}",
                smuggle_body.len()
            ),
            &[200],
        ),
        (
            "two Content-Lengths",
            format!(
                "POST {base}/allowed/x HTTP/1.1\r\nHost: {u}\r\nContent-Length: 0\r\nContent-Length: 45\r\n\r\nGET {base}/secret.txt HTTP/1.1\r\n\r\n"
            ),
            &[400],
        ),
        (
            "a Content-Length that is not a number",
            format!(
                "POST {base}/allowed/x HTTP/1.1\r\nHost: {u}\r\nContent-Length: +4\r\n\r\nabcd"
            ),
            &[400],
        ),
        (
            "gzip, chunked",
            format!(
                "POST {base}/allowed/x HTTP/1.1\r\nHost: {u}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n{smuggle_body}"
            ),
            &[400],
        ),
        (
            "obsolete line folding",
            format!("GET {base}/allowed/x HTTP/1.1\r\nHost: {u}\r\nX-A: a\r\n b\r\n\r\n"),
            &[400],
        ),
        (
            "an invalid chunk size",
            format!(
                "POST {base}/allowed/c HTTP/1.1\r\nHost: {u}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nGET {base}/secret.txt HTTP/1.1\r\n\r\n"
            ),
            // Admitted on its head, its body breaks while it is forwarded: the
            // upstream exchange fails, the client gets a 502, nothing follows.
            &[502],
        ),
        (
            "an encoded separator under a path rule",
            format!(
                "GET {base}/allowed/..%2Fsecret.txt HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n"
            ),
            &[403],
        ),
        (
            "an encoded dot-dot-slash",
            format!(
                "GET {base}/allowed/%2e%2e%2fsecret.txt HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n"
            ),
            &[403],
        ),
        (
            "dot segments out of the prefix",
            format!(
                "GET {base}/allowed/x/../../secret.txt HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n"
            ),
            &[403],
        ),
        (
            "a ; parameter",
            format!(
                "GET {base}/allowed/..;/secret.txt HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n"
            ),
            &[403],
        ),
        (
            "bare LF line ends (parsed, then forwarded as the proxy framed it)",
            format!("GET {base}/allowed/lf HTTP/1.1\nHost: {u}\nConnection: close\n\n"),
            &[200],
        ),
        (
            "an admitted path with dot segments arrives resolved",
            format!("GET {base}/allowed/x/../y HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n"),
            &[200],
        ),
    ]
}

/// An upstream that reads GET, HEAD, OPTIONS and TRACE requests as Python's
/// `http.server` does: the head only, so a body is read as the next request on the
/// connection. Other methods' bodies are read by `Content-Length` or chunked, unless
/// `ignore_all` (then it answers every request on its head alone). Keep-alive; over
/// TLS with `tls`. Each request's path is announced on `seen`.
pub(crate) async fn ignoring_upstream_on(
    tls: Option<Arc<rustls::ServerConfig>>,
    ignore_all: bool,
) -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let (tx, seen) = mpsc::unbounded_channel();
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (h, tx, tls) = (h.clone(), tx.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    None => serve_ignoring(s, h, tx, ignore_all).await,
                    Some(c) => {
                        if let Ok(t) = tokio_rustls::TlsAcceptor::from(c).accept(s).await {
                            serve_ignoring(t, h, tx, ignore_all).await;
                        }
                    }
                }
            });
        }
    });
    Upstream { addr, hits, seen }
}

async fn serve_ignoring<S>(
    s: S,
    hits: Arc<AtomicUsize>,
    tx: mpsc::UnboundedSender<String>,
    ignore_all: bool,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncBufReadExt;
    let mut s = tokio::io::BufReader::new(s);
    loop {
        let mut line = Vec::new();
        if !matches!(s.read_until(b'\n', &mut line).await, Ok(n) if n > 0) {
            return;
        }
        let line = String::from_utf8_lossy(&line).trim().to_owned();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let method = words.next().unwrap_or("").to_owned();
        let target = words.next().unwrap_or("").to_owned();
        let (mut length, mut chunked, mut close) = (0usize, false, false);
        loop {
            let mut h = Vec::new();
            if !matches!(s.read_until(b'\n', &mut h).await, Ok(n) if n > 0) {
                return;
            }
            let h = String::from_utf8_lossy(&h).trim().to_ascii_lowercase();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.trim() {
                    "content-length" => length = v.trim().parse().unwrap_or(0),
                    "transfer-encoding" => chunked = v.contains("chunked"),
                    "connection" => close = v.contains("close"),
                    _ => {}
                }
            }
        }
        hits.fetch_add(1, Ordering::SeqCst);
        let _ = tx.send(target.split('?').next().unwrap_or("").to_owned());
        let reads_body =
            !ignore_all && !["GET", "HEAD", "OPTIONS", "TRACE"].contains(&method.as_str());
        let mut body = Vec::new();
        if reads_body && chunked {
            loop {
                let mut size = Vec::new();
                if !matches!(s.read_until(b'\n', &mut size).await, Ok(n) if n > 0) {
                    return;
                }
                let size = String::from_utf8_lossy(&size);
                let Ok(n) = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16)
                else {
                    return;
                };
                let mut chunk = vec![0u8; n + 2];
                if s.read_exact(&mut chunk).await.is_err() {
                    return;
                }
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else if reads_body && length > 0 {
            body.resize(length, 0);
            if s.read_exact(&mut body).await.is_err() {
                return;
            }
        }
        let text = format!(
            "upstream saw {method} {target}\nbody: {}",
            String::from_utf8_lossy(&body)
        );
        let mut resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", text.len());
        if method != "HEAD" {
            resp.push_str(&text);
        }
        if s.get_mut().write_all(resp.as_bytes()).await.is_err() || close {
            return;
        }
    }
}

fn drain(seen: &mut mpsc::UnboundedReceiver<String>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(path) = seen.try_recv() {
        out.push(path);
    }
    out
}

/// Read from `s` until the other side closes or a response head and what follows it
/// in the same read have arrived.
async fn next_answer(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if got.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await
    .expect("an answer or a close in time");
    String::from_utf8_lossy(&got).into_owned()
}

/// A port on loopback nothing listens on.
pub(crate) fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

mod ask;
mod bounds;
mod decisions;
mod intercept;
mod log;
mod smuggling;
mod tunnel;
