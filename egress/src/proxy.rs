//! The egress proxy: one listener per container, one [`Fence`] (the grant slot) per
//! listener.
//!
//! The linux substrate opens the listener inside the container's network namespace
//! (`127.0.0.1:3128`) and calls [`serve`] from the host namespace, so the proxy resolves
//! and connects from the host. Every request on every connection is decided by
//! [`rules::decide`] against the grant open *at that moment*; an admitted request or
//! tunnel is raced against the revocation of the grant that admitted it, so revoking a
//! fence cuts off what it let through.
//!
//! Each decision produces exactly one `CANONICAL-EGRESS-DECISION` log line (target
//! `stockade::egress`).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::audit::{self, Admitted, Denial};
use super::bounded;
use super::budget::{self, Budget, Limit};
use super::rules::{self, Decision, Grant, Reason, Tunnel};
use super::secrets::Resolved;
use super::tls::{self, Authority};

/// How long a name may take to resolve before the request is refused.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to an upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The header that carries a denial's reason.
pub const DENIAL_HEADER: &str = "x-stockade-denial";
/// The header of a 502 that says why the upstream could not be used.
pub const UPSTREAM_ERROR_HEADER: &str = "x-stockade-upstream-error";
/// The header of a 429/503 that says which of the container's budgets was spent.
pub const LIMIT_HEADER: &str = "x-stockade-limit";
/// How long a TLS handshake (with the command's client, or upstream) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The grant that is open right now, with what belongs to its lifetime.
struct Open {
    /// The fence id (recorded as a denial's `rule_set`).
    id: String,
    grant: Grant,
    /// Cancelled when this grant is revoked or replaced: every request and tunnel it
    /// admitted is cut off.
    revoked: CancellationToken,
    /// Requests denied while this grant was open.
    denials: AtomicU32,
    /// Requests admitted while this grant was open (each has, or is counted in, an
    /// audit record).
    admitted: AtomicU32,
    /// Audit records the rate bound left out while this grant was open; [`CLOSED`]
    /// once the fence closed and its summary row was written.
    suppressed: AtomicU64,
    /// The values of the secrets the grant's rules name (resolved when it opened).
    secrets: Resolved,
    /// The id of the fenced run's process tree, once it starts ([`Fence::begin_run`]).
    tree: Mutex<Option<String>>,
}

struct FenceInner {
    key: String,
    container: String,
    open: Mutex<Option<Arc<Open>>>,
    /// Where a closing fence writes its summary row (set when the proxy is served).
    sink: std::sync::OnceLock<Arc<dyn DenialSink>>,
}

/// [`Open::suppressed`] of a fence that has closed.
const CLOSED: u64 = u64::MAX;

/// What one fence let through and refused, for the exec's outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceCounts {
    /// Requests (and blind tunnels) the fence admitted.
    pub admitted: u32,
    /// Requests the fence denied.
    pub denied: u32,
}

/// The grant slot of one container's proxy. Cloning shares the slot.
#[derive(Clone)]
pub struct Fence(Arc<FenceInner>);

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = self.current();
        f.debug_struct("Fence")
            .field("key", &self.0.key)
            .field("container", &self.0.container)
            .field("open", &open.as_ref().map(|o| o.id.as_str()))
            .finish()
    }
}

impl Fence {
    /// A closed fence for `container`, recording denials under `key`.
    pub fn new(key: &str, container: &str) -> Fence {
        Fence(Arc::new(FenceInner {
            key: key.to_owned(),
            container: container.to_owned(),
            open: Mutex::new(None),
            sink: std::sync::OnceLock::new(),
        }))
    }

    /// Open `grant` as fence `fence_id`, atomically replacing whatever was open. What
    /// the replaced grant admitted is cut off: its rules no longer hold.
    pub fn apply(&self, fence_id: &str, grant: Grant) {
        self.apply_with_secrets(fence_id, grant, Resolved::new());
    }

    /// [`Fence::apply`], with the values of the secrets the grant's rules name. They
    /// live exactly as long as this grant is open.
    pub fn apply_with_secrets(&self, fence_id: &str, grant: Grant, secrets: Resolved) {
        let next = Arc::new(Open {
            id: fence_id.to_owned(),
            grant,
            revoked: CancellationToken::new(),
            denials: AtomicU32::new(0),
            admitted: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
            secrets,
            tree: Mutex::new(None),
        });
        let previous = self.slot().replace(next);
        if let Some(previous) = previous {
            self.close(&previous);
        }
    }

    /// Close the fence: from now on every request is denied `no-grant`, and every
    /// request or tunnel the closed grant admitted is cut off. Returns the number of
    /// requests denied while it was open (0 if none was).
    pub fn revoke(&self) -> u32 {
        self.revoke_counts().denied
    }

    /// [`Fence::revoke`], returning what the closed grant admitted and denied (zeros
    /// if none was open).
    pub fn revoke_counts(&self) -> FenceCounts {
        let previous = self.slot().take();
        previous.map_or_else(FenceCounts::default, |open| self.close(&open))
    }

    /// Where a closing fence writes its audit summary row.
    fn attach(&self, sink: &Arc<dyn DenialSink>) {
        let _ = self.0.sink.set(sink.clone());
    }

    /// End `open`: cut off what it admitted, write its summary row if the audit's rate
    /// bound left records out (issue 21: a flood must not hide what a fence let through),
    /// and return its counts.
    fn close(&self, open: &Open) -> FenceCounts {
        open.revoked.cancel();
        // From here on a record of this fence is written, never counted (see `Audit`).
        let suppressed = open.suppressed.swap(CLOSED, Ordering::SeqCst);
        if suppressed > 0 && suppressed != CLOSED {
            tracing::warn!(target: "stockade::egress", key = %self.0.key, container = %self.0.container, fence = open.id.as_str(), suppressed, "egress audit: admitted requests counted in the fence's summary row, not recorded one by one (rate)");
            if let Some(sink) = self.0.sink.get() {
                sink.record_admitted(
                    &self.0.key,
                    &self.0.container,
                    Admitted::summary(&open.id, now_ms(), suppressed),
                );
            }
        }
        FenceCounts {
            admitted: open.admitted.load(Ordering::SeqCst),
            denied: open.denials.load(Ordering::SeqCst),
        }
    }

    /// A run is about to start under the open grant: the id its process tree gets
    /// (a UUID), so the proxy can tell its connections from anyone else's. `None`
    /// when no grant is open.
    pub fn begin_run(&self) -> Option<String> {
        let open = self.current()?;
        let id = uuid::Uuid::new_v4().to_string();
        *open.tree.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.clone());
        Some(id)
    }

    /// A grant is open.
    pub fn is_open(&self) -> bool {
        self.slot().is_some()
    }

    /// The open grant: one Arc clone under a lock held for no longer than that.
    fn current(&self) -> Option<Arc<Open>> {
        self.slot().clone()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Open>>> {
        // A poisoned slot still holds a valid Option: keep serving decisions.
        self.0.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Proxy configuration (`[egress]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyOptions {
    /// Admit loopback and private-range targets (tests need loopback servers).
    pub allow_private_targets: bool,
    /// Most client connections served at once; past it the proxy stops accepting and
    /// further connections wait in the kernel's backlog (a container cannot spend the
    /// host's descriptors: found by a red team, 20 000 connections starved every key).
    pub max_connections: usize,
}

/// Request framing the proxy refuses, as RFC 9112 and hardened proxies do (pure):
/// ambiguity between a proxy and an upstream about where a request ends is how a
/// second request is smuggled past a decision.
pub fn framing_error(headers: &hyper::HeaderMap) -> Option<&'static str> {
    let lengths = headers.get_all(header::CONTENT_LENGTH).iter().count();
    let encodings: Vec<&HeaderValue> = headers.get_all(header::TRANSFER_ENCODING).iter().collect();
    if lengths > 0 && !encodings.is_empty() {
        return Some("Content-Length together with Transfer-Encoding");
    }
    if lengths > 1 {
        return Some("more than one Content-Length");
    }
    if let Some(v) = headers.get(header::CONTENT_LENGTH)
        && !v
            .to_str()
            .is_ok_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
    {
        return Some("a Content-Length that is not a number");
    }
    match encodings.as_slice() {
        [] => None,
        [one] if one.as_bytes().eq_ignore_ascii_case(b"chunked") => None,
        _ => Some("a Transfer-Encoding other than a single `chunked`"),
    }
}

/// A body on a request whose method gives a body no meaning: GET, HEAD, OPTIONS and
/// TRACE (pure). Many upstreams (Python's `http.server` among them) read such a
/// request's head only and the body as the next request on the connection: a second
/// request nobody decided on (issue 21 item 17). `Content-Length: 0` is no body.
pub fn body_error<B: Body>(method: &Method, body: &B) -> Option<&'static str> {
    let bodiless = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method);
    (bodiless && !body.is_end_stream()).then_some("a body on GET, HEAD, OPTIONS or TRACE")
}

/// A method whose body an upstream may ignore without being wrong (RFC 9110 gives it
/// no defined meaning, or the method is not a standard one): anything but POST, PUT
/// and PATCH (GET, HEAD, OPTIONS and TRACE never carry one here: [`body_error`]).
fn body_may_be_ignored(method: &Method) -> bool {
    ![Method::POST, Method::PUT, Method::PATCH].contains(method)
}

/// The default of [`ProxyOptions::max_connections`].
pub const MAX_CONNECTIONS: usize = 256;

/// Most bytes of a request head the proxy buffers (hyper's minimum is 8 KiB).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a client may take to send a request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Denials logged and recorded per container: a burst, then a steady rate. Past it a
/// denial is still refused and counted (the exec's `denials`), not written: a command
/// looping on refused requests must not fill the host's disk with lines (red team: 120
/// MB/s of log). The next line written says how many were left out.
const DENIAL_BURST: f64 = 100.0;
const DENIALS_PER_SECOND: f64 = 20.0;

/// Allow lines logged per container (one per admitted request): as the audit's bound.
const ALLOW_LINE_BURST: f64 = 1000.0;
const ALLOW_LINES_PER_SECOND: f64 = 200.0;

/// Upstream-failure lines logged per container: as denials (red team: 34 MiB of them
/// in 4 s against a dead port).
const FAILURE_LINE_BURST: f64 = 100.0;
const FAILURE_LINES_PER_SECOND: f64 = 20.0;

/// Admitted requests recorded per container: a generous burst, then a steady rate
/// (the same reasoning as for denials; the line written after a gap says how many
/// records were left out).
const ADMITTED_BURST: f64 = 1000.0;
const ADMITTED_PER_SECOND: f64 = 200.0;

/// A token bucket for log lines and records.
struct Throttle {
    burst: f64,
    rate: f64,
    tokens: f64,
    at: std::time::Instant,
    suppressed: u64,
}

impl Throttle {
    fn new(burst: f64, rate: f64) -> Throttle {
        Throttle {
            burst,
            rate,
            tokens: burst,
            at: std::time::Instant::now(),
            suppressed: 0,
        }
    }

    /// May one more record be written? `Some(n)`: yes, and `n` were left out before it.
    fn take(&mut self, now: std::time::Instant) -> Option<u64> {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// Where denials and the audit of admitted requests go (the store, in production).
pub trait DenialSink: Send + Sync + 'static {
    /// Record one refused request for `key`'s container `container`.
    fn record(&self, key: &str, container: &str, denial: Denial);
    /// Record one admitted request, when it has ended.
    fn record_admitted(&self, _key: &str, _container: &str, _admitted: Admitted) {}
}

/// Which process tree holds a client connection. Given to [`serve_with`], an open
/// grant admits only the fenced run's own connections (a detached process's are denied
/// `detached`, issue 21); credentials are added only to them in any case (issue 14).
pub trait Attribution: Send + Sync + 'static {
    /// Does a process of tree `tree` hold the client end of the connection from
    /// `peer` to `listener`? Anything that cannot be established is `false`.
    fn holds(&self, tree: &str, peer: SocketAddr, listener: SocketAddr) -> bool;

    /// [`Attribution::holds`] for a connection accepted at `accepted`: the answer may
    /// come from what was read after that moment (a socket held now existed then), so a
    /// burst of connections costs one reading of the kernel's records, not one each.
    fn holds_since(
        &self,
        tree: &str,
        peer: SocketAddr,
        listener: SocketAddr,
        accepted: std::time::Instant,
    ) -> bool {
        let _ = accepted;
        self.holds(tree, peer, listener)
    }
}

/// Interception for one container: its CA and the upstream verification.
#[derive(Clone, Debug)]
pub struct Interception {
    /// The container's CA (its key stays in this process).
    pub authority: Arc<Authority>,
    /// How upstream certificates are verified.
    pub upstream: Arc<rustls::ClientConfig>,
    /// Who holds a connection, for credentials only (no attribution: credentials are
    /// never added). [`serve_with`]'s attribution, when given, wins.
    pub attribution: Option<Arc<dyn Attribution>>,
}

impl std::fmt::Debug for dyn Attribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Attribution")
    }
}

struct Shared {
    fence: Fence,
    opts: ProxyOptions,
    sink: Arc<dyn DenialSink>,
    /// Cancelled when the serve task ends (or is aborted): connections and tunnels it
    /// started do not outlive it.
    shutdown: CancellationToken,
    /// Denial lines and records written (see `DENIAL_BURST`).
    throttle: Mutex<Throttle>,
    /// Audit records written (see `ADMITTED_BURST`).
    admitted_throttle: Mutex<Throttle>,
    /// Allow lines written (see `ALLOW_LINE_BURST`).
    allow_throttle: Mutex<Throttle>,
    /// Upstream-failure lines written (see `FAILURE_LINE_BURST`).
    failure_throttle: Mutex<Throttle>,
    /// Lines for requests that are not proxy requests (as denials).
    invalid_throttle: Mutex<Throttle>,
    /// `Some`: HTTPS to hosts whose rules need it is intercepted.
    tls: Option<Interception>,
    /// The listener's own address (the far end of every client connection).
    listener: Option<SocketAddr>,
    /// Who holds a connection: for credentials, and (when `exclusive`) for admission.
    attribution: Option<Arc<dyn Attribution>>,
    /// The open grant is the fenced run's alone: every other connection is denied
    /// `detached` (DESIGN invariant 3).
    exclusive: bool,
    /// What this container may spend of the server's descriptors and TLS work.
    budget: Budget,
}

/// A client connection's place under the connection cap and in the descriptor pool,
/// shared with the tunnel it may become.
struct Slot {
    _cap: tokio::sync::OwnedSemaphorePermit,
    _fd: Option<budget::Place>,
}

/// Serve the proxy on `listener` until the returned task is aborted. Must be called
/// from within a tokio runtime. Without attribution the open grant is shared by every
/// process of the container (ADR-0012's sharing); credentials still go only where
/// `tls`'s attribution says the fenced run holds the connection.
pub fn serve(
    listener: std::net::TcpListener,
    fence: Fence,
    opts: ProxyOptions,
    sink: Arc<dyn DenialSink>,
    tls: Option<Interception>,
) -> tokio::task::JoinHandle<()> {
    serve_with(
        listener,
        fence,
        opts,
        sink,
        tls,
        None,
        Budget::new(budget::Limits::default()),
    )
}

/// [`serve`] with every input: the container's budget, and `attribution`, which says
/// who holds each connection: with it the open grant admits a request (plain HTTP, a
/// CONNECT, each request inside an intercepted tunnel) only on a connection the fenced
/// run's tree holds; every other is denied `detached` (recorded, counted). Attributed
/// once per connection per fence.
pub fn serve_with(
    listener: std::net::TcpListener,
    fence: Fence,
    opts: ProxyOptions,
    sink: Arc<dyn DenialSink>,
    tls: Option<Interception>,
    attribution: Option<Arc<dyn Attribution>>,
    budget: Budget,
) -> tokio::task::JoinHandle<()> {
    let exclusive = attribution.is_some();
    fence.attach(&sink);
    let attribution = attribution.or_else(|| tls.as_ref().and_then(|t| t.attribution.clone()));
    let shared = Arc::new(Shared {
        fence,
        opts,
        sink,
        shutdown: CancellationToken::new(),
        throttle: Mutex::new(Throttle::new(DENIAL_BURST, DENIALS_PER_SECOND)),
        admitted_throttle: Mutex::new(Throttle::new(ADMITTED_BURST, ADMITTED_PER_SECOND)),
        allow_throttle: Mutex::new(Throttle::new(ALLOW_LINE_BURST, ALLOW_LINES_PER_SECOND)),
        failure_throttle: Mutex::new(Throttle::new(FAILURE_LINE_BURST, FAILURE_LINES_PER_SECOND)),
        invalid_throttle: Mutex::new(Throttle::new(DENIAL_BURST, DENIALS_PER_SECOND)),
        tls,
        listener: listener.local_addr().ok(),
        attribution,
        exclusive,
        budget,
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(
        shared.opts.max_connections.max(1),
    ));
    tokio::spawn(async move {
        let _stop_everything_on_exit = shared.shutdown.clone().drop_guard();
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(target: "stockade::egress", error = %e, container = %shared.fence.0.container, "egress proxy cannot use its listener");
                return;
            }
        };
        loop {
            // A slot first: at the cap, nothing more is accepted; nor while the
            // server's descriptor pool is spent (the API's reserve is not in it).
            let Ok(cap) = slots.clone().acquire_owned().await else {
                return;
            };
            let Some(fd) = shared.budget.client().await else {
                return;
            };
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let shared = shared.clone();
                    let slot = Slot {
                        _cap: cap,
                        _fd: Some(fd),
                    };
                    tokio::spawn(serve_connection(stream, peer, shared, slot));
                }
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(target: "stockade::egress", error = %e, "egress proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
}

/// One client connection: an HTTP/1 server with keep-alive, every request decided on
/// its own.
/// `slot` is the connection's place under the cap: a tunnel (blind or intercepted)
/// the connection becomes keeps it until the tunnel ends.
async fn serve_connection(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, slot: Slot) {
    let shutdown = shared.shutdown.clone();
    let conn = Conn::new(shared, None, peer);
    *conn.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(slot));
    serve_http(TokioIo::new(stream), conn, shutdown.cancelled_owned()).await;
}

/// Serve HTTP/1 on `io` for `conn` until the client closes or `stop` fires: the
/// proxy's own connections, and the decrypted inside of an intercepted tunnel.
async fn serve_http<I>(io: I, conn: Arc<Conn>, stop: impl Future<Output = ()>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service_conn = conn.clone();
    let service = hyper::service::service_fn(move |req| {
        let conn = service_conn.clone();
        async move { Ok::<_, Infallible>(conn.handle(req).await) }
    });
    let mut http = std::pin::pin!(
        hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD_BYTES)
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .serve_connection(io, service)
            .with_upgrades()
    );
    // The kept upstream connection is driven by this same task, not a task of its
    // own: a request and its answer then cross no task boundary inside the proxy.
    let mut driver: Option<Driver> = None;
    let both = std::future::poll_fn(|cx| {
        let poll_driver = |driver: &mut Option<Driver>, cx: &mut Context<'_>| {
            if let Some(next) = conn
                .new_driver
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
            {
                // Replacing the driver drops (closes) the previous upstream connection:
                // its sender was replaced with it, and its last answer is complete.
                *driver = Some(next);
            }
            if let Some(d) = driver
                && d.as_mut().poll(cx).is_ready()
            {
                *driver = None;
            }
        };
        // An answer passes driver → handler → driver (the body) → handler → client:
        // a few rounds here carry it through in one poll of the task instead of a
        // reschedule per step. Polling a side that has nothing to do is cheap.
        for _ in 0..3 {
            poll_driver(&mut driver, cx);
            if http.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        poll_driver(&mut driver, cx);
        Poll::Pending
    });
    tokio::select! {
        _ = both => {}
        _ = stop => {}
    }
}

/// Serve HTTP/2 on `io` (an intercepted tunnel whose client chose h2 by ALPN): each
/// stream is a request decided on its own, as on HTTP/1; they run concurrently, so
/// each upstream connection is driven by a task of its own.
async fn serve_h2<I>(io: I, conn: Arc<Conn>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        async move {
            // Streams count across all of the container's connections: each may
            // hold an upstream socket (issue 21 item 13).
            let stream = match conn.shared.budget.stream() {
                Ok(s) => s,
                Err(limit) => return Ok::<_, Infallible>(limited(limit)),
            };
            let resp = conn.handle(req).await;
            drop(stream);
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .max_header_list_size(MAX_HEAD_BYTES as u32)
        .max_concurrent_streams(MAX_H2_STREAMS)
        .serve_connection(io, service)
        .await;
}

/// Most concurrent streams on one intercepted h2 connection (each may hold an upstream
/// connection; the connection cap bounds client connections, this bounds what one of
/// them multiplexes).
const MAX_H2_STREAMS: u32 = 64;

/// Drives one upstream HTTP connection until it closes or its grant is revoked.
type Driver = Pin<Box<dyn Future<Output = ()> + Send>>;

/// An upstream HTTP connection kept for the next request on the same client
/// connection, valid only for the grant and host it was admitted for.
struct Upstream {
    open: Arc<Open>,
    host: String,
    port: u16,
    tls: bool,
    sender: hyper::client::conn::http1::SendRequest<ProxyBody>,
}

/// The host an intercepted tunnel was opened to: every request inside goes there.
#[derive(Debug, Clone)]
struct Origin {
    host: String,
    port: u16,
}

struct Conn {
    shared: Arc<Shared>,
    /// `Some`: the decrypted inside of an intercepted tunnel to this host.
    origin: Option<Origin>,
    /// The client's address (of the outer connection, for a tunnel).
    peer: SocketAddr,
    /// When the client connection was accepted (at the latest): what attribution
    /// read after it holds for this connection.
    accepted: std::time::Instant,
    /// Whether the fenced run's tree holds this connection, per fence (attributed
    /// once, on the first request that would carry credentials).
    fenced: Mutex<Option<(String, bool)>>,
    /// Requests on one HTTP/1 connection are sequential, so this lock is never
    /// contended and never held across an await (take, use, put back).
    upstream: Arc<Mutex<Option<Upstream>>>,
    /// A new upstream connection for [`serve_http`] to drive.
    new_driver: Mutex<Option<Driver>>,
    /// Requests run concurrently (h2): each upstream connection's driver is a task.
    concurrent: bool,
    /// The client connection's place under the connection cap, shared with the tunnel
    /// it may become (hyper hands an upgraded connection over and forgets it).
    slot: Mutex<Option<Arc<Slot>>>,
}

/// Why an admitted request could not be completed.
enum Failure {
    Denied(Reason),
    Revoked,
    /// The upstream could not be used: a stable reason (the 502's header) and what
    /// happened.
    Upstream {
        reason: &'static str,
        detail: String,
    },
}

fn upstream(reason: &'static str, detail: impl Into<String>) -> Failure {
    Failure::Upstream {
        reason,
        detail: detail.into(),
    }
}

/// What a request is sent to, once decided.
struct Target {
    host: String,
    port: u16,
    /// The upstream is reached over TLS (an intercepted tunnel).
    tls: bool,
    /// The `Host` header the upstream gets: the host that was decided on.
    host_header: String,
}

/// The record of one admitted request, written when the last of its bodies is done.
struct Audit {
    shared: Arc<Shared>,
    /// The grant that admitted the request: it counts it, and the records the rate
    /// bound leaves out.
    open: Arc<Open>,
    record: Mutex<Admitted>,
    up: AtomicU64,
    down: AtomicU64,
    /// The request was denied after all (a private target): nothing to record.
    discard: std::sync::atomic::AtomicBool,
    /// The request body was all handed to the upstream connection.
    up_done: std::sync::atomic::AtomicBool,
    /// The upstream answered before the request body was all sent: the rest of it is
    /// not sent (an upstream done with the request would read it as a new one).
    cut_up: std::sync::atomic::AtomicBool,
}

impl Audit {
    fn new(shared: &Arc<Shared>, open: &Arc<Open>, record: Admitted) -> Arc<Audit> {
        open.admitted.fetch_add(1, Ordering::SeqCst);
        Arc::new(Audit {
            shared: shared.clone(),
            open: open.clone(),
            record: Mutex::new(record),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            discard: std::sync::atomic::AtomicBool::new(false),
            up_done: std::sync::atomic::AtomicBool::new(false),
            cut_up: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Not an admitted request after all (its target was private): not recorded, not
    /// counted.
    fn discard(&self) {
        if !self.discard.swap(true, Ordering::SeqCst) {
            self.open.admitted.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn set(&self, status: u16, error: &str) {
        let mut r = self.record.lock().unwrap_or_else(|p| p.into_inner());
        if status != 0 {
            r.status = status;
        }
        if !error.is_empty() && r.error.is_empty() {
            r.error = error.to_owned();
        }
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        if self.discard.load(Ordering::Relaxed) {
            return;
        }
        let mut record =
            std::mem::take(&mut *self.record.lock().unwrap_or_else(|p| p.into_inner()));
        record.bytes_up = self.up.load(Ordering::Relaxed);
        record.bytes_down = self.down.load(Ordering::Relaxed);
        let fence = &self.shared.fence.0;
        let (write, left_out) = record_written(
            &record,
            &self.shared.admitted_throttle,
            &self.open.suppressed,
        );
        if left_out > 0 {
            tracing::warn!(target: "stockade::egress", key = %fence.key, container = %fence.container, suppressed = left_out, "egress audit records left out (rate)");
        }
        if write {
            self.shared
                .sink
                .record_admitted(&fence.key, &fence.container, record);
        }
    }
}

/// Is the record of an ended request written? A request that carried (or was refused)
/// a credential always is: a flood of others must not hide it (issue 21). Another is
/// when the rate bound has a token (the second value: how many were left out before
/// it); otherwise it is counted in `suppressed` for its fence's summary row, unless the
/// fence already closed and wrote its summary (then it is written after all: at most
/// what was in flight when the fence closed).
fn record_written(
    record: &Admitted,
    throttle: &Mutex<Throttle>,
    suppressed: &AtomicU64,
) -> (bool, u64) {
    if record.credentialed() {
        return (true, 0);
    }
    if let Some(left_out) = take(throttle) {
        return (true, left_out);
    }
    let closed = suppressed
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n != CLOSED).then(|| n + 1)
        })
        .is_err();
    (closed, 0)
}

/// One token of `throttle`: `Some(n)` when a line or record may be written (`n` were
/// left out before it).
fn take(throttle: &Mutex<Throttle>) -> Option<u64> {
    throttle
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take(std::time::Instant::now())
}

impl Conn {
    fn new(shared: Arc<Shared>, origin: Option<Origin>, peer: SocketAddr) -> Arc<Conn> {
        Arc::new(Conn {
            shared,
            origin,
            peer,
            accepted: std::time::Instant::now(),
            fenced: Mutex::new(None),
            upstream: Arc::new(Mutex::new(None)),
            new_driver: Mutex::new(None),
            concurrent: false,
            slot: Mutex::new(None),
        })
    }

    /// The inside of an intercepted tunnel that speaks h2.
    fn new_h2(shared: Arc<Shared>, origin: Origin, peer: SocketAddr) -> Arc<Conn> {
        Arc::new(Conn {
            shared,
            origin: Some(origin),
            peer,
            accepted: std::time::Instant::now(),
            fenced: Mutex::new(None),
            upstream: Arc::new(Mutex::new(None)),
            new_driver: Mutex::new(None),
            concurrent: true,
            slot: Mutex::new(None),
        })
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        // Paced per container: what the server does per request is outside the
        // container's CPU limit (issue 21 items 13, 14).
        self.shared.budget.request().await;
        // Before any other work or line: a 30 kB method is not decided or logged whole
        // (issue 21 item 12).
        if req.method().as_str().len() > bounded::MAX_METHOD {
            return self.invalid(req.method(), "an extension method longer than 32 bytes");
        }
        let why = framing_error(req.headers()).or_else(|| body_error(req.method(), req.body()));
        if let Some(why) = why {
            // Where this request ends is in doubt: nothing after it on this
            // connection is read as another request.
            let mut resp = self.invalid(req.method(), why);
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return resp;
        }
        match (req.method() == Method::CONNECT, &self.origin) {
            (true, None) => self.tunnel(req).await,
            (true, Some(_)) => self.invalid(req.method(), "CONNECT inside a tunnel"),
            (false, _) => self.forward(req).await,
        }
    }

    /// Is this connection held by the open fence's run (not a detached process)?
    /// Decided once per fence per connection; no attribution, or anything unclear, is
    /// "no".
    fn held_by_fenced_run(&self, open: &Open) -> bool {
        let mut cached = self.fenced.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((fence, fenced)) = cached.as_ref()
            && *fence == open.id
        {
            return *fenced;
        }
        let tree = open.tree.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let attribution = self.shared.attribution.clone();
        let fenced = match (tree, attribution, self.shared.listener) {
            (Some(tree), Some(a), Some(listener)) => {
                a.holds_since(&tree, self.peer, listener, self.accepted)
            }
            _ => false,
        };
        // Exclusive: the request is denied `detached` (a throttled line), not logged here.
        if !fenced && !self.shared.exclusive {
            let fence = &self.shared.fence.0;
            tracing::warn!(target: "stockade::egress", key = %fence.key, container = %fence.container, fence = open.id.as_str(), peer = %self.peer, "credentials withheld: the connection is not the fenced command's");
        }
        *cached = Some((open.id.clone(), fenced));
        fenced
    }

    /// Where a request goes: for the proxy's own connections the absolute-form
    /// `http://` URI; inside an intercepted tunnel, the tunnel's host (the request's
    /// own authority is never used).
    fn target(&self, uri: &Uri) -> Result<Target, &'static str> {
        match &self.origin {
            Some(o) => {
                if !uri.path().starts_with('/') {
                    return Err("a request target that is not a path");
                }
                let host_header = if o.port == 443 {
                    o.host.clone()
                } else {
                    format!("{}:{}", o.host, o.port)
                };
                Ok(Target {
                    host: o.host.clone(),
                    port: o.port,
                    tls: true,
                    host_header,
                })
            }
            None => match (uri.scheme(), uri.authority()) {
                (Some(scheme), Some(a)) if *scheme == hyper::http::uri::Scheme::HTTP => {
                    Ok(Target {
                        host: a.host().to_owned(),
                        port: a.port_u16().unwrap_or(80),
                        tls: false,
                        host_header: host_and_port(a).to_owned(),
                    })
                }
                _ => Err(
                    "send absolute-form http:// requests to this proxy (https goes through CONNECT)",
                ),
            },
        }
    }

    /// A request (plain HTTP, or inside an intercepted tunnel): decide on host,
    /// method and path; add the rule's credentials over TLS; forward to the checked
    /// address.
    async fn forward(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let (mut parts, body) = req.into_parts();
        let target = match self.target(&parts.uri) {
            Ok(t) => t,
            Err(why) => return self.invalid(&parts.method, why),
        };
        let request = rules::Request {
            host: &target.host,
            port: target.port,
            method: parts.method.as_str(),
            path: parts.uri.path(),
            tunnel: false,
        };
        let (open, rule) = match self.admit(&request) {
            Ok(admitted) => admitted,
            Err(denied) => return *denied,
        };
        // Credentials go only over TLS, only on requests a rule carrying them admits,
        // only while that grant is open (they live in it), only to the fenced run's own
        // connections.
        let mut credentials: Vec<(HeaderName, HeaderValue)> = if target.tls {
            open.grant
                .headers_for(&request)
                .into_iter()
                .filter_map(|(name, secret)| {
                    let value = open.secrets.get(secret)?.header().clone();
                    Some((HeaderName::from_bytes(name.as_bytes()).ok()?, value))
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut withheld = false;
        if !credentials.is_empty() && !self.held_by_fenced_run(&open) {
            credentials.clear();
            withheld = true;
        }
        let audit = Audit::new(
            &self.shared,
            &open,
            Admitted {
                at_ms: now_ms(),
                fence: open.id.clone(),
                method: bounded::owned(request.method),
                host: bounded::owned(&target.host),
                port: target.port,
                path: bounded::owned(request.path),
                rule: rule as u32,
                via: if target.tls { "https" } else { "http" }.into(),
                status: 0,
                bytes_up: 0,
                bytes_down: 0,
                error: if withheld {
                    audit::CREDENTIALS_WITHHELD.into()
                } else {
                    String::new()
                },
                credentials: credentials.iter().map(|(n, _)| n.to_string()).collect(),
                suppressed: 0,
            },
        );
        let mut upstream = match self
            .upstream_for(&open, &target.host, target.port, target.tls)
            .await
        {
            Ok(u) => u,
            Err(f) => return self.target_failed(&open, &request, rule, f, Some(&audit)),
        };
        self.log_allow(
            &open,
            &request,
            rule,
            if target.tls { "https" } else { "http" },
        );

        // Origin-form to the upstream, with exactly the path that was decided on (a raw
        // `/allowed/x/../..` would reach what the decision resolved elsewhere).
        let sent = rules::forward_target(parts.uri.path_and_query().map_or("/", |pq| pq.as_str()));
        parts.uri = match Uri::try_from(sent) {
            Ok(u) => u,
            Err(_) => {
                return self.invalid(&parts.method, "a request target the proxy cannot forward");
            }
        };
        parts.version = hyper::Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        // The proxy frames the body it forwards itself (from what it parsed), never with
        // the client's framing headers: no bytes outside the decided request can ride
        // along to the upstream.
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.remove(header::TRANSFER_ENCODING);
        // The Host the upstream sees is the host that was checked: a different Host
        // header would let a client reach another site behind the same front
        // (domain fronting).
        match HeaderValue::from_str(&target.host_header) {
            Ok(v) => {
                parts.headers.insert(header::HOST, v);
            }
            Err(_) => {
                parts.headers.remove(header::HOST);
            }
        }
        // A credential replaces whatever the command sent under that name.
        for (name, value) in credentials {
            parts.headers.insert(name, value);
        }
        // A body on a method that gives it no defined meaning (DELETE, an extension
        // method) may be ignored by the upstream and read as its next request: the
        // upstream is told this request is its connection's last, and it is not kept.
        let last = !body.is_end_stream() && body_may_be_ignored(&parts.method);
        if last {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let body = if body.is_end_stream() {
            audit.up_done.store(true, Ordering::SeqCst);
            ProxyBody::empty()
        } else {
            ProxyBody::fenced(body, &open.revoked, Some((audit.clone(), Direction::Up)))
        };
        let upstream_req = Request::from_parts(parts, body);

        let sent = tokio::select! {
            biased;
            _ = open.revoked.cancelled() => {
                audit.set(503, "revoked");
                return revoked_response();
            }
            r = async {
                upstream.sender.ready().await?;
                upstream.sender.send_request(upstream_req).await
            } => r,
        };
        let resp = match sent {
            Ok(resp) => resp,
            Err(e) => {
                audit.set(502, "upstream-closed");
                return self.upstream_failed("upstream-closed", &e.to_string());
            }
        };
        // The connection is kept for this client's next request to the same host only
        // when it is certainly in step with the upstream (issue 21 item 17): the request
        // body was all sent before the answer came, the answer does not close, and its
        // body ends cleanly (`Keep`). In doubt it is dropped, and with it anything an
        // upstream could read past the decided request.
        let request_done = audit.up_done.load(Ordering::SeqCst);
        if !request_done {
            // Answered early: the rest of the body is not sent; the connection ends.
            audit.cut_up.store(true, Ordering::SeqCst);
        }
        let keep = (request_done && !last && !closes(&resp)).then(|| Keep {
            slot: self.upstream.clone(),
            upstream,
        });
        let (mut parts, mut body) = resp.into_parts();
        audit.set(parts.status.as_u16(), "");
        strip_hop_by_hop(&mut parts.headers);
        // Wait for the first piece of the body before answering, so the head and the
        // start of the body leave in one write (one wake-up for the client, not two).
        let first = if body.is_end_stream() {
            None
        } else {
            tokio::select! {
                biased;
                _ = open.revoked.cancelled() => {
                    audit.set(503, "revoked");
                    return revoked_response();
                }
                f = body.frame() => match f {
                    None => None,
                    Some(Ok(frame)) => Some(frame),
                    Some(Err(e)) => {
                        audit.set(502, "upstream-closed");
                        return self.upstream_failed("upstream-closed", &e.to_string());
                    }
                },
            }
        };
        if let Some(data) = first.as_ref().and_then(Frame::data_ref) {
            audit.down.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        let ended = body.is_end_stream();
        let mut body = ProxyBody::fenced(body, &open.revoked, Some((audit, Direction::Down)));
        if let ProxyBody::Fenced {
            first: slot,
            keep: kept,
            ..
        } = &mut body
        {
            *slot = first;
            match keep {
                // The answer is all read: the connection is free now.
                Some(k) if ended => k.put_back(),
                k => *kept = k,
            }
        }
        Response::from_parts(parts, body)
    }

    /// The kept upstream connection if it fits, otherwise resolve, check, connect
    /// (and, for an intercepted tunnel, a TLS handshake verified against the trust
    /// roots).
    async fn upstream_for(
        &self,
        open: &Arc<Open>,
        host: &str,
        port: u16,
        tls: bool,
    ) -> Result<Upstream, Failure> {
        let kept = self
            .upstream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(u) = kept
            && Arc::ptr_eq(&u.open, open)
            && u.port == port
            && u.tls == tls
            && u.host.eq_ignore_ascii_case(host)
            && !u.sender.is_closed()
        {
            // Same grant, same host: the address was checked when it was connected.
            return Ok(u);
        }
        if tls {
            self.shared
                .budget
                .handshake_rate()
                .map_err(|l| upstream("budget", format!("{host}: {}", l.as_str())))?;
        }
        let (stream, place) = self.connect(open, host, port).await?;
        let revoked = open.revoked.clone();
        let (sender, driver) = if tls {
            let stream = self.handshake_upstream(open, host, stream).await?;
            http1_client(TokioIo::new(stream), revoked).await?
        } else {
            http1_client(TokioIo::new(stream), revoked).await?
        };
        // The socket's place in the budget lives as long as the connection does.
        let driver: Driver = Box::pin(async move {
            let _place = place;
            driver.await
        });
        if self.concurrent {
            tokio::spawn(driver);
        } else {
            *self.new_driver.lock().unwrap_or_else(|p| p.into_inner()) = Some(driver);
        }
        Ok(Upstream {
            open: open.clone(),
            host: host.to_owned(),
            port,
            tls,
            sender,
        })
    }

    /// TLS to the upstream, verified against this machine's roots (and the configured
    /// extra CAs) for the name that was decided on.
    async fn handshake_upstream(
        &self,
        open: &Open,
        host: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Failure> {
        let Some(tls) = &self.shared.tls else {
            return Err(upstream("upstream-tls", "interception is off"));
        };
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let bare = bare.strip_suffix('.').unwrap_or(bare);
        let name = rustls_pki_types::ServerName::try_from(bare.to_owned())
            .map_err(|e| upstream("upstream-tls", format!("{host}: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(tls.upstream.clone());
        let handshake = tokio::select! {
            biased;
            _ = open.revoked.cancelled() => return Err(Failure::Revoked),
            r = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
                let _working = self.shared.budget.handshake().await;
                connector.connect(name, stream).await
            }) => r,
        };
        match handshake {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(upstream(tls::handshake_reason(&e), format!("{host}: {e}"))),
            Err(_) => Err(upstream(
                "upstream-tls",
                format!("{host}: handshake timed out"),
            )),
        }
    }

    /// Resolve `host`, pick an address the options allow, connect to exactly it; the
    /// socket's place in the container's budget comes with it (none left: refused
    /// before anything is resolved or opened).
    async fn connect(
        &self,
        open: &Open,
        host: &str,
        port: u16,
    ) -> Result<(TcpStream, budget::Place), Failure> {
        let place = self.shared.budget.upstream().map_err(|l| {
            upstream(
                "budget",
                format!("{host}: the container's {} are spent", l.as_str()),
            )
        })?;
        let target = match resolve(host, port, self.shared.opts.allow_private_targets).await {
            Ok(t) => t,
            Err(Reason::ResolveFailed) => {
                return Err(upstream(
                    "resolve-failed",
                    format!("{host} did not resolve"),
                ));
            }
            Err(reason) => return Err(Failure::Denied(reason)),
        };
        let stream = tokio::select! {
            biased;
            _ = open.revoked.cancelled() => return Err(Failure::Revoked),
            r = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)) => r,
        };
        match stream {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                Ok((s, place))
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(upstream(
                "connect-refused",
                format!("connect {target}: {e}"),
            )),
            Ok(Err(e)) => Err(upstream("connect-failed", format!("connect {target}: {e}"))),
            Err(_) => Err(upstream(
                "connect-timeout",
                format!("connect {target}: timed out"),
            )),
        }
    }

    /// CONNECT: decide on host and port. A tunnel whose rules need to see inside is
    /// intercepted (TLS terminated with a leaf from the container's CA, every request
    /// decided); otherwise, after connecting, bytes are spliced both ways until either
    /// side closes or the grant is revoked.
    async fn tunnel(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let Some(authority) = req.uri().authority().cloned() else {
            return self.invalid(req.method(), "CONNECT needs host:port");
        };
        // Tunnels are the container's way to make the server connect and shake hands:
        // rate-limited before anything is decided, minted or connected.
        if let Err(limit) = self.shared.budget.connect() {
            return limited(limit);
        }
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(443);
        let request = rules::Request {
            host,
            port,
            method: "CONNECT",
            path: "",
            tunnel: true,
        };
        let open = self.shared.fence.current();
        let decision = rules::decide_tunnel(
            open.as_ref().map(|o| &o.grant),
            host,
            port,
            self.shared.tls.is_some(),
        );
        let (open, rule) = match (decision, open) {
            (Tunnel::Deny(reason), open) => return self.deny(open.as_deref(), &request, reason),
            (Tunnel::Intercept { .. } | Tunnel::Blind { .. }, Some(open))
                if self.detached(&open) =>
            {
                return self.deny(Some(&open), &request, Reason::Detached);
            }
            (Tunnel::Intercept { rule }, Some(open)) => {
                if let Err(limit) = self.shared.budget.handshake_rate() {
                    return limited(limit);
                }
                return self.intercept(req, open, &request, rule);
            }
            (Tunnel::Blind { rule }, Some(open)) => (open, rule),
            (_, None) => return self.deny(None, &request, Reason::NoGrant),
        };
        let audit = Audit::new(
            &self.shared,
            &open,
            Admitted {
                at_ms: now_ms(),
                fence: open.id.clone(),
                method: "CONNECT".into(),
                host: bounded::owned(host),
                port,
                path: String::new(),
                rule: rule as u32,
                via: "tunnel".into(),
                status: 200,
                bytes_up: 0,
                bytes_down: 0,
                error: String::new(),
                credentials: Vec::new(),
                suppressed: 0,
            },
        );
        let (mut stream, place) = match self.connect(&open, host, port).await {
            Ok(s) => s,
            Err(f) => return self.target_failed(&open, &request, rule, f, Some(&audit)),
        };
        self.log_allow(&open, &request, rule, "tunnel");
        let on_upgrade = hyper::upgrade::on(&mut req);
        let revoked = open.revoked.clone();
        let shutdown = self.shared.shutdown.clone();
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _place = place;
            let upgraded = tokio::select! {
                biased;
                _ = revoked.cancelled() => return,
                _ = shutdown.cancelled() => return,
                u = on_upgrade => match u {
                    Ok(u) => u,
                    Err(_) => return,
                },
            };
            let mut client = Counted::new(TokioIo::new(upgraded));
            // Dropping both ends on revocation closes the tunnel for the client.
            let ended = tokio::select! {
                biased;
                _ = revoked.cancelled() => "revoked",
                _ = shutdown.cancelled() => "shutdown",
                r = tokio::io::copy_bidirectional(&mut client, &mut stream) => match r {
                    Ok(_) => "",
                    Err(_) => "reset",
                },
            };
            audit.up.store(client.read, Ordering::Relaxed);
            audit.down.store(client.written, Ordering::Relaxed);
            audit.set(0, ended);
        });
        Response::new(ProxyBody::empty())
    }

    /// An intercepted CONNECT: answer 200, then terminate the command's TLS with a
    /// leaf for the host it asked for and serve the requests inside, each decided as
    /// plain HTTP is. The whole connection ends when the grant that admitted the
    /// CONNECT is revoked.
    fn intercept(
        &self,
        mut req: Request<Incoming>,
        open: Arc<Open>,
        request: &rules::Request<'_>,
        rule: usize,
    ) -> Response<ProxyBody> {
        let Some(tls) = self.shared.tls.clone() else {
            return self.deny(Some(&open), request, Reason::NeedsInterception);
        };
        let host = request
            .host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(request.host);
        let (config, minted) = match tls.authority.server_config(host) {
            Ok(c) => c,
            Err(e) => return self.upstream_failed("mint-failed", &e.to_string()),
        };
        let fence = &self.shared.fence.0;
        tracing::info!(
            target: "stockade::egress",
            decision = "allow",
            rule,
            host = bounded::field(request.host),
            port = request.port,
            method = "CONNECT",
            path = "",
            via = "intercept",
            minted,
            key = %fence.key,
            container = %fence.container,
            fence = open.id.as_str(),
            "CANONICAL-EGRESS-DECISION"
        );
        let on_upgrade = hyper::upgrade::on(&mut req);
        let shared = self.shared.clone();
        let peer = self.peer;
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // The tunnel's requests come from this connection's holder: attributed once.
        let fenced = self
            .fenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let origin = Origin {
            host: request.host.to_ascii_lowercase(),
            port: request.port,
        };
        tokio::spawn(async move {
            let _slot = slot;
            let revoked = open.revoked.clone();
            let shutdown = shared.shutdown.clone();
            let stop = async move {
                tokio::select! {
                    _ = revoked.cancelled() => {}
                    _ = shutdown.cancelled() => {}
                }
            };
            let serve = async move {
                let Ok(upgraded) = on_upgrade.await else {
                    return;
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                // A bounded number of this container's handshakes run at once.
                let working = shared.budget.handshake().await;
                let accepted = tokio::time::timeout(
                    HANDSHAKE_TIMEOUT,
                    acceptor.accept(TokioIo::new(upgraded)),
                )
                .await;
                drop(working);
                let stream = match accepted {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        // A client that does not trust the container's CA (or pins
                        // its certificates) ends here: say so once.
                        tracing::info!(target: "stockade::egress", host = bounded::field(&origin.host), error = %e, "an intercepted client refused the handshake");
                        return;
                    }
                    Err(_) => return,
                };
                let h2 = stream.get_ref().1.alpn_protocol() == Some(tls::ALPN_H2);
                let inner = if h2 {
                    Conn::new_h2(shared, origin, peer)
                } else {
                    Conn::new(shared, Some(origin), peer)
                };
                *inner.fenced.lock().unwrap_or_else(|p| p.into_inner()) = fenced;
                if h2 {
                    serve_h2(TokioIo::new(stream), inner).await;
                } else {
                    serve_http(TokioIo::new(stream), inner, std::future::pending()).await;
                }
            };
            tokio::select! {
                _ = serve => {}
                _ = stop => {}
            }
        });
        Response::new(ProxyBody::empty())
    }

    /// The one decision a request gets, against the grant open right now: the grant
    /// that admits it and by which rule, or the 403 that denies it (logged, counted,
    /// recorded).
    fn admit(
        &self,
        request: &rules::Request<'_>,
    ) -> Result<(Arc<Open>, usize), Box<Response<ProxyBody>>> {
        let open = self.shared.fence.current();
        match rules::decide(open.as_ref().map(|o| &o.grant), request) {
            Decision::Allow { rule } => {
                let open = open.expect("decide admits nothing without a grant");
                if self.detached(&open) {
                    return Err(Box::new(self.deny(Some(&open), request, Reason::Detached)));
                }
                Ok((open, rule))
            }
            Decision::Deny(reason) => Err(Box::new(self.deny(open.as_deref(), request, reason))),
        }
    }

    /// Is the open grant the fenced run's alone, and this connection not held by its
    /// tree (a detached process's, or opened before the run began)?
    fn detached(&self, open: &Open) -> bool {
        self.shared.exclusive && !self.held_by_fenced_run(open)
    }

    /// An admitted request whose target could not be used: a private address (denied),
    /// a grant revoked meanwhile (cut off), or the upstream itself failing (502 with
    /// the reason in a header; the audit record says why).
    fn target_failed(
        &self,
        open: &Open,
        request: &rules::Request<'_>,
        rule: usize,
        failure: Failure,
        audit: Option<&Audit>,
    ) -> Response<ProxyBody> {
        match failure {
            Failure::Denied(reason) => {
                // Not an admitted request after all: a denial, not an audit record.
                if let Some(a) = audit {
                    a.discard();
                }
                self.deny(Some(open), request, reason)
            }
            Failure::Revoked => {
                if let Some(a) = audit {
                    a.set(503, "revoked");
                }
                revoked_response()
            }
            Failure::Upstream { reason, detail } => {
                self.log_allow(open, request, rule, "upstream-failed");
                if let Some(a) = audit {
                    a.set(502, reason);
                }
                self.upstream_failed(reason, &detail)
            }
        }
    }

    /// Log, count and record a denial; answer 403.
    fn deny(
        &self,
        open: Option<&Open>,
        req: &rules::Request<'_>,
        reason: Reason,
    ) -> Response<ProxyBody> {
        let fence = &self.shared.fence.0;
        let fence_id = open.map_or("none", |o| o.id.as_str());
        if let Some(open) = open {
            open.denials.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(suppressed) = take(&self.shared.throttle) {
            // What the client chose is kept to a bound, in the line and the record.
            let (host, method, path) = (
                bounded::field(req.host),
                bounded::field(req.method),
                bounded::field(req.path),
            );
            tracing::info!(
                target: "stockade::egress",
                decision = "deny",
                reason = reason.as_str(),
                host,
                port = req.port,
                method,
                path,
                key = %fence.key,
                container = %fence.container,
                fence = fence_id,
                suppressed,
                "CANONICAL-EGRESS-DECISION"
            );
            self.shared.sink.record(
                &fence.key,
                &fence.container,
                Denial {
                    at_ms: now_ms(),
                    host: host.to_owned(),
                    method: method.to_owned(),
                    path: path.to_owned(),
                    rule_set: fence_id.to_owned(),
                    reason: reason.as_str().to_owned(),
                },
            );
        }
        let mut resp = Response::new(ProxyBody::full(format!(
            "stockade: egress to {} denied: {reason}\n",
            bounded::field(req.host)
        )));
        *resp.status_mut() = StatusCode::FORBIDDEN;
        let h = resp.headers_mut();
        h.insert(
            HeaderName::from_static(DENIAL_HEADER),
            HeaderValue::from_static(reason.as_str()),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }

    /// The allow line: rate-bounded per container as denials are (the audit keeps the
    /// records); the line after a gap says how many were left out.
    fn log_allow(&self, open: &Open, req: &rules::Request<'_>, rule: usize, via: &'static str) {
        let Some(suppressed) = take(&self.shared.allow_throttle) else {
            return;
        };
        let fence = &self.shared.fence.0;
        tracing::info!(
            target: "stockade::egress",
            decision = "allow",
            rule,
            via,
            host = bounded::field(req.host),
            port = req.port,
            method = bounded::field(req.method),
            path = bounded::field(req.path),
            key = %fence.key,
            container = %fence.container,
            fence = open.id.as_str(),
            suppressed,
            "CANONICAL-EGRESS-DECISION"
        );
    }

    /// A 502 for an upstream that could not be used, with its line (rate-bounded per
    /// container; the detail, which names what the client chose, kept to a bound).
    fn upstream_failed(&self, reason: &'static str, detail: &str) -> Response<ProxyBody> {
        let detail = bounded::field(detail);
        if let Some(suppressed) = take(&self.shared.failure_throttle) {
            let fence = &self.shared.fence.0;
            tracing::warn!(target: "stockade::egress", reason, error = detail, key = %fence.key, container = %fence.container, suppressed, "egress upstream failed");
        }
        upstream_failed(reason, detail)
    }

    /// A request that is not a proxy request at all (no grant question to answer).
    fn invalid(&self, method: &Method, why: &'static str) -> Response<ProxyBody> {
        // Rate-bounded per container as denials are: a client can send these as fast
        // as it can write.
        if let Some(suppressed) = take(&self.shared.invalid_throttle) {
            let fence = &self.shared.fence.0;
            tracing::info!(
                target: "stockade::egress",
                decision = "invalid",
                method = bounded::field(method.as_str()),
                container = %fence.container,
                why,
                suppressed,
                "CANONICAL-EGRESS-DECISION"
            );
        }
        let mut resp = Response::new(ProxyBody::full(format!("stockade: {why}\n")));
        *resp.status_mut() = StatusCode::BAD_REQUEST;
        resp
    }
}

/// An HTTP/1 client connection on `io`: its sender, and its driver, which ends when
/// the connection does or `revoked` fires.
async fn http1_client<I>(
    io: I,
    revoked: CancellationToken,
) -> Result<(hyper::client::conn::http1::SendRequest<ProxyBody>, Driver), Failure>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| upstream("upstream-closed", e.to_string()))?;
    let driver: Driver = Box::pin(async move {
        tokio::select! {
            _ = connection => {}
            _ = revoked.cancelled() => {}
        }
    });
    Ok((sender, driver))
}

/// `host[:port]` of an authority, without any `userinfo@`.
fn host_and_port(authority: &hyper::http::uri::Authority) -> &str {
    let a = authority.as_str();
    a.rsplit_once('@').map_or(a, |(_, hp)| hp)
}

/// Resolve (unless `host` is an IP literal) and pick the address to connect to.
async fn resolve(host: &str, port: u16, allow_private: bool) -> Result<SocketAddr, Reason> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return rules::pick_target([SocketAddr::new(ip, port)], allow_private);
    }
    match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((bare, port))).await {
        Ok(Ok(addrs)) => rules::pick_target(addrs, allow_private),
        Ok(Err(_)) | Err(_) => Err(Reason::ResolveFailed),
    }
}

/// Headers that describe one hop, not the message: never forwarded.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
];

/// Strip hop-by-hop headers, those `Connection` names, and every `Proxy-*` header
/// (credentials meant for this proxy never reach the upstream).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    if headers.keys().any(|k| k.as_str().starts_with("proxy-")) {
        let proxy: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("proxy-"))
            .cloned()
            .collect();
        for name in proxy {
            headers.remove(name);
        }
    }
}

/// A request refused because the container spent its budget (issue 21 items 13, 14):
/// 429 for a rate, 503 for a cap; which one in `x-stockade-limit`. Logged by the budget
/// (at most a line a second), not here.
fn limited(limit: Limit) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(format!(
        "stockade: egress budget spent ({})\n",
        limit.as_str()
    )));
    *resp.status_mut() = match limit {
        Limit::ConnectRate | Limit::HandshakeRate => StatusCode::TOO_MANY_REQUESTS,
        Limit::Streams | Limit::Upstreams => StatusCode::SERVICE_UNAVAILABLE,
    };
    let h = resp.headers_mut();
    h.insert(
        HeaderName::from_static(LIMIT_HEADER),
        HeaderValue::from_static(limit.as_str()),
    );
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn revoked_response() -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full("stockade: egress grant revoked\n".into()));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// A 502: the reason (stable, kebab-case) in [`UPSTREAM_ERROR_HEADER`], what happened
/// in the body.
fn upstream_failed(reason: &'static str, detail: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(format!(
        "stockade: upstream failed ({reason}): {detail}\n"
    )));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    let h = resp.headers_mut();
    h.insert(
        HeaderName::from_static(UPSTREAM_ERROR_HEADER),
        HeaderValue::from_static(reason),
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A tunnel's client side, counting the bytes each way for the audit.
struct Counted<T> {
    inner: T,
    read: u64,
    written: u64,
}

impl<T> Counted<T> {
    fn new(inner: T) -> Self {
        Counted {
            inner,
            read: 0,
            written: 0,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.read += (buf.filled().len() - before) as u64;
        r
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.written += n as u64;
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body the proxy sends: a short answer of its own, or a message body streamed from
/// the other side that ends in an error the moment the admitting grant is revoked.
enum ProxyBody {
    Full(Option<Bytes>),
    Fenced {
        /// A frame already read from `inner`, sent first.
        first: Option<Frame<Bytes>>,
        inner: Incoming,
        revoked: Pin<Box<WaitForCancellationFutureOwned>>,
        /// The audit record this body's bytes count towards.
        audit: Option<(Arc<Audit>, Direction)>,
        /// An answer's upstream connection, kept for the next request once this body
        /// ends cleanly (dropped, and so closed, otherwise).
        keep: Option<Keep>,
    },
}

/// An upstream connection on its way back to its client connection, once the answer it
/// carries has ended cleanly.
struct Keep {
    slot: Arc<Mutex<Option<Upstream>>>,
    upstream: Upstream,
}

impl Keep {
    fn put_back(self) {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.upstream);
    }
}

/// Does this answer end its connection (HTTP/1.0, or `Connection: close`)?
fn closes<B>(resp: &Response<B>) -> bool {
    resp.version() < hyper::Version::HTTP_11
        || resp.headers().get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().map_or(true, |s| {
                s.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))
            })
        })
}

/// Which way a body goes, for the audit.
#[derive(Clone, Copy)]
enum Direction {
    /// The command's request body, to the upstream.
    Up,
    /// The upstream's answer body, to the command.
    Down,
}

impl ProxyBody {
    fn empty() -> Self {
        ProxyBody::Full(None)
    }

    fn full(s: String) -> Self {
        ProxyBody::Full(Some(Bytes::from(s)))
    }

    fn fenced(
        inner: Incoming,
        revoked: &CancellationToken,
        audit: Option<(Arc<Audit>, Direction)>,
    ) -> Self {
        ProxyBody::Fenced {
            first: None,
            inner,
            revoked: Box::pin(revoked.clone().cancelled_owned()),
            audit,
            keep: None,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Fenced {
                first,
                inner,
                revoked,
                audit,
                keep,
            } => {
                if revoked.as_mut().poll(cx).is_ready() {
                    if let Some((a, _)) = audit {
                        a.set(0, "revoked");
                    }
                    return Poll::Ready(Some(Err("egress grant revoked".into())));
                }
                if let Some((a, Direction::Up)) = audit.as_ref()
                    && a.cut_up.load(Ordering::SeqCst)
                {
                    // The upstream is done with this request: whatever is left of the
                    // body would be read as a new one. The connection ends instead.
                    a.set(0, "answered-before-the-body");
                    return Poll::Ready(Some(Err(
                        "the upstream answered before the request body was sent".into(),
                    )));
                }
                if let Some(frame) = first.take() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                let polled = Pin::new(&mut *inner).poll_frame(cx);
                let ended = match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some((a, direction)) = audit.as_ref() {
                            let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                            match direction {
                                Direction::Up => a.up.fetch_add(n, Ordering::Relaxed),
                                Direction::Down => a.down.fetch_add(n, Ordering::Relaxed),
                            };
                        }
                        inner.is_end_stream()
                    }
                    Poll::Ready(Some(Err(_))) => {
                        if let Some((a, _)) = audit.as_ref() {
                            a.set(0, "body-error");
                        }
                        // A broken body leaves the connection out of step: not kept.
                        keep.take();
                        false
                    }
                    Poll::Ready(None) => true,
                    Poll::Pending => false,
                };
                if ended {
                    if let Some((a, Direction::Up)) = audit.as_ref() {
                        a.up_done.store(true, Ordering::SeqCst);
                    }
                    if let Some(k) = keep.take() {
                        k.put_back();
                    }
                }
                polled.map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Fenced { first, inner, .. } => first.is_none() && inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            ProxyBody::Fenced { first, inner, .. } => {
                let already = first
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |b| b.len() as u64);
                let rest = inner.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + already);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + already);
                }
                hint
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    use super::*;
    use crate::rules::RuleSpec;

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

    /// A loopback HTTP server: `/hang` never answers, `/stall` sends headers and one
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
                        if path == "/hang" {
                            std::future::pending::<()>().await;
                        }
                        if path == "/stall" {
                            return Ok::<_, Infallible>(Response::new(TestBody::Right(Stall(
                                false,
                            ))));
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
                        let mut resp = Response::new(TestBody::Left(http_body_util::Full::new(
                            Bytes::from(text),
                        )));
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
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fence = Fence::new("key-1", "container-1");
        let sink = Arc::new(Recorded::default());
        let task = serve(listener, fence.clone(), opts, sink.clone(), tls);
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

    #[test]
    fn denial_lines_are_a_burst_then_a_rate_and_say_what_they_left_out() {
        let t0 = std::time::Instant::now();
        let mut t = Throttle::new(DENIAL_BURST, DENIALS_PER_SECOND);
        let written = (0..150).filter(|_| t.take(t0).is_some()).count();
        assert_eq!(written, DENIAL_BURST as usize, "the burst");
        // A second later: the rate's worth, the first of them counting the 50 left out.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(t.take(t1), Some(50));
        let more = (0..100).filter(|_| t.take(t1).is_some()).count();
        assert_eq!(more + 1, DENIALS_PER_SECOND as usize);
    }

    /// At the connection cap the proxy stops accepting: a connection past it gets no
    /// answer until one of the others closes.
    #[tokio::test]
    async fn past_the_connection_cap_nothing_more_is_served() {
        let p = proxy_opts(ProxyOptions {
            allow_private_targets: true,
            max_connections: 2,
        });
        let held: Vec<_> = held_connections(p.addr, 2).await;
        let (mut third, mut buf) = unserved_request(p.addr).await;
        drop(held);
        let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf))
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 403"),
            "{:?}",
            &buf[..n]
        );
    }

    /// A tunnel keeps its connection's place under the cap (hyper hands an upgraded
    /// connection over and forgets it: before, tunnels were not counted at all).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tunnels_count_against_the_connection_cap() {
        let target = echo().await;
        let p = proxy_opts(ProxyOptions {
            allow_private_targets: true,
            max_connections: 2,
        });
        p.fence.apply("f", grant(&[("127.0.0.1", &[], None)]));
        let mut tunnels = Vec::new();
        for _ in 0..2 {
            let (s, head) = raw_connect(p.addr, &target.to_string()).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            tunnels.push(s);
        }
        let (mut third, mut buf) = unserved_request(p.addr).await;
        drop(tunnels.pop());
        let n = tokio::time::timeout(DEADLINE, third.read(&mut buf))
            .await
            .expect("served once a tunnel closed")
            .unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1"));
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_allowed_request_passes_through_curl() {
        let up = upstream().await;
        let p = proxy();
        p.fence.apply(
            "fence-1",
            grant(&[("127.0.0.1", &["GET"], Some("/allowed/"))]),
        );
        let out = curl(&[
            "-x",
            &format!("http://{}", p.addr),
            &format!("http://{}/allowed/x?q=1", up.addr),
        ])
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(
            out.contains("upstream saw GET /allowed/x?q=1"),
            "origin-form upstream: {out}"
        );
        assert!(p.sink.reasons().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_allowed_request_is_forwarded_without_hop_by_hop_or_proxy_headers() {
        let up = upstream().await;
        let p = proxy();
        p.fence
            .apply("fence-1", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
        let mut c = client(&p).await;
        let a = c
            .send(
                "POST",
                &format!("http://{}/allowed/upload", up.addr),
                "payload",
            )
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        assert!(
            a.body.contains("upstream saw POST /allowed/upload"),
            "{}",
            a.body
        );
        assert!(a.body.contains("body: payload"), "{}", a.body);
        assert!(a.body.contains("x-custom: kept"), "{}", a.body);
        assert!(a.body.contains(&format!("host: {}", up.addr)), "{}", a.body);
        assert!(
            !a.body.contains("proxy-"),
            "proxy headers reached the upstream: {}",
            a.body
        );
        assert!(
            !a.headers.contains_key("proxy-agent"),
            "a proxy header came back: {:?}",
            a.headers
        );
        assert_eq!(a.denial, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_upstream_sees_the_checked_host_not_a_fronted_one() {
        let up = upstream().await;
        let p = proxy();
        p.fence.apply("fence-1", grant(&[("127.0.0.1", &[], None)]));
        let out = curl(&[
            "-x",
            &format!("http://{}", p.addr),
            "-H",
            "Host: evil.example",
            &format!("http://user:pw@{}/x", up.addr),
        ])
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.contains(&format!("host: {}", up.addr)), "{out}");
        assert!(!out.contains("evil.example"), "{out}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wrong_path_method_or_host_is_denied_with_403_header_and_record() {
        let up = upstream().await;
        let p = proxy();
        p.fence.apply(
            "fence-7",
            grant(&[("127.0.0.1", &["GET"], Some("/allowed/"))]),
        );
        let mut c = client(&p).await;
        let rows: &[(&str, &str, String, &str)] = &[
            (
                "a path outside the prefix",
                "GET",
                format!("http://{}/secret", up.addr),
                "path",
            ),
            (
                "a dot-dot escape from the prefix",
                "GET",
                format!("http://{}/allowed/../secret", up.addr),
                "path",
            ),
            (
                "a method the rule does not name",
                "DELETE",
                format!("http://{}/allowed/x", up.addr),
                "method",
            ),
            (
                "a host no rule names",
                "GET",
                "http://unlisted.example.invalid/allowed/".to_string(),
                "no-rule",
            ),
        ];
        for (sentence, method, url, reason) in rows {
            let a = c.send(method, url, "").await;
            assert_eq!(a.status, StatusCode::FORBIDDEN, "{sentence}");
            assert_eq!(a.denial.as_deref(), Some(*reason), "{sentence}");
            assert!(
                a.body.contains(reason) && a.body.contains("denied"),
                "{sentence}: {}",
                a.body
            );
            let d = p.sink.last();
            assert_eq!(
                (d.method.as_str(), d.reason.as_str(), d.rule_set.as_str()),
                (*method, *reason, "fence-7"),
                "{sentence}"
            );
        }
        let (key, container, d) = p.sink.0.lock().unwrap()[0].clone();
        assert_eq!((key.as_str(), container.as_str()), ("key-1", "container-1"));
        assert_eq!((d.host.as_str(), d.path.as_str()), ("127.0.0.1", "/secret"));
        assert!(d.at_ms > 0);
        assert_eq!(
            up.hits.load(Ordering::SeqCst),
            0,
            "no denied request reached the upstream"
        );
        assert_eq!(
            p.fence.revoke(),
            rows.len() as u32,
            "revoke reports the denials of its grant"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_that_is_not_a_proxy_request_gets_400() {
        let p = proxy();
        p.fence.apply("fence-1", grant(&[("127.0.0.1", &[], None)]));
        let mut c = client(&p).await;
        let req = Request::get("/x")
            .header(header::HOST, "127.0.0.1")
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap();
        c.sender.ready().await.unwrap();
        let resp = c.sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let a = c.get("https://127.0.0.1/x").await;
        assert_eq!(
            a.status,
            StatusCode::BAD_REQUEST,
            "https goes through CONNECT"
        );
        assert!(
            p.sink.reasons().is_empty(),
            "not a grant question, not a denial"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_no_fence_open_everything_is_denied_no_grant() {
        let up = upstream().await;
        let p = proxy();
        let mut c = client(&p).await;
        let a = c.get(&format!("http://{}/allowed/x", up.addr)).await;
        assert_eq!(
            (a.status, a.denial.as_deref()),
            (StatusCode::FORBIDDEN, Some("no-grant"))
        );
        assert_eq!(p.sink.last().rule_set, "none");
        assert!(!p.fence.is_open());
        assert_eq!(p.fence.revoke(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_revoke_the_same_request_is_denied() {
        let up = upstream().await;
        let p = proxy();
        let url = format!("http://{}/allowed/x", up.addr);
        p.fence.apply("fence-1", grant(&[("127.0.0.1", &[], None)]));
        assert!(p.fence.is_open());
        let mut c = client(&p).await;
        assert_eq!(c.get(&url).await.status, StatusCode::OK);
        assert_eq!(p.fence.revoke(), 0);
        assert!(!p.fence.is_open());
        let a = c.get(&url).await;
        assert_eq!(
            (a.status, a.denial.as_deref()),
            (StatusCode::FORBIDDEN, Some("no-grant"))
        );
        let out = curl(&["-x", &format!("http://{}", p.addr), &url]).await;
        assert!(
            out.starts_with("HTTP/1.1 403") && out.contains("x-stockade-denial: no-grant"),
            "{out}"
        );
        assert_eq!(up.hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_request_on_a_keep_alive_connection_is_checked() {
        let up = upstream().await;
        let p = proxy();
        p.fence
            .apply("fence-1", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
        let mut c = client(&p).await;
        let allowed = format!("http://{}/allowed/x", up.addr);
        let secret = format!("http://{}/secret", up.addr);
        assert_eq!(c.get(&allowed).await.status, StatusCode::OK);
        let a = c.get(&secret).await;
        assert_eq!(
            (a.status, a.denial.as_deref()),
            (StatusCode::FORBIDDEN, Some("path"))
        );
        assert_eq!(c.get(&allowed).await.status, StatusCode::OK);
        assert!(
            !c.closed.is_finished(),
            "all three went over one connection"
        );
        assert_eq!(up.hits.load(Ordering::SeqCst), 2);
        assert_eq!(p.fence.revoke(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn applying_a_new_grant_switches_the_rules() {
        let up = upstream().await;
        let p = proxy();
        let mut c = client(&p).await;
        p.fence
            .apply("fence-a", grant(&[("127.0.0.1", &[], Some("/a/"))]));
        assert_eq!(
            c.get(&format!("http://{}/a/1", up.addr)).await.status,
            StatusCode::OK
        );
        p.fence
            .apply("fence-b", grant(&[("127.0.0.1", &[], Some("/b/"))]));
        let a = c.get(&format!("http://{}/a/1", up.addr)).await;
        assert_eq!(a.denial.as_deref(), Some("path"));
        assert_eq!(p.sink.last().rule_set, "fence-b");
        assert_eq!(
            c.get(&format!("http://{}/b/1", up.addr)).await.status,
            StatusCode::OK
        );
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connect_to_an_allowed_host_tunnels_bytes_both_ways() {
        let far = echo().await;
        let up = upstream().await;
        let p = proxy();
        p.fence.apply("fence-1", grant(&[("127.0.0.1", &[], None)]));
        let (mut s, head) = raw_connect(p.addr, &far.to_string()).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(
            round_trip(&mut s, b"ping through the tunnel").await,
            b"ping through the tunnel"
        );
        assert_eq!(
            round_trip(&mut s, b"and back again").await,
            b"and back again"
        );
        // A real client: curl's --proxytunnel sends CONNECT even for http://.
        let out = curl(&[
            "-p",
            "-x",
            &format!("http://{}", p.addr),
            &format!("http://{}/over/tunnel", up.addr),
        ])
        .await;
        assert!(out.contains("upstream saw GET /over/tunnel"), "{out}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connect_matching_only_a_path_rule_needs_interception() {
        let far = echo().await;
        let p = proxy();
        p.fence.apply(
            "fence-1",
            grant(&[("127.0.0.1", &["GET"], Some("/allowed/"))]),
        );
        let (_s, head) = raw_connect(p.addr, &far.to_string()).await;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
        assert!(
            head.contains("x-stockade-denial: needs-interception"),
            "{head}"
        );
        let d = p.sink.last();
        assert_eq!(
            (d.method.as_str(), d.path.as_str(), d.reason.as_str()),
            ("CONNECT", "", "needs-interception")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_private_target_is_denied_unless_allowed() {
        let up = upstream().await;
        let far = echo().await;
        let p = proxy_with(false);
        p.fence.apply(
            "fence-1",
            grant(&[("127.0.0.1", &[], None), ("localhost", &[], None)]),
        );
        let mut c = client(&p).await;
        let a = c.get(&format!("http://{}/x", up.addr)).await;
        assert_eq!(
            (a.status, a.denial.as_deref()),
            (StatusCode::FORBIDDEN, Some("private-target"))
        );
        let a = c
            .get(&format!("http://localhost:{}/x", up.addr.port()))
            .await;
        assert_eq!(
            a.denial.as_deref(),
            Some("private-target"),
            "a name resolving to loopback"
        );
        let (_s, head) = raw_connect(p.addr, &far.to_string()).await;
        assert!(head.contains("x-stockade-denial: private-target"), "{head}");
        assert_eq!(up.hits.load(Ordering::SeqCst), 0);
        assert_eq!(p.fence.revoke(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tunnel_open_at_revoke_is_closed() {
        let far = echo().await;
        let p = proxy();
        p.fence.apply("fence-1", grant(&[("127.0.0.1", &[], None)]));
        let (mut s, head) = raw_connect(p.addr, &far.to_string()).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(round_trip(&mut s, b"before").await, b"before");
        p.fence.revoke();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(DEADLINE, async {
            // Writes may still be accepted by the kernel; the read must see the close.
            let _ = s.write_all(b"after").await;
            s.read(&mut buf).await
        })
        .await
        .expect("the tunnel closed in time");
        assert!(
            matches!(n, Ok(0) | Err(_)),
            "tunnel still open after revoke: {n:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_waiting_for_its_answer_at_revoke_is_cut_off() {
        let mut up = upstream().await;
        let p = proxy();
        p.fence.apply("fence-1", grant(&[("127.0.0.1", &[], None)]));
        let mut c = client(&p).await;
        let url = format!("http://{}/hang", up.addr);
        let pending = tokio::spawn(async move { c.get(&url).await });
        assert_eq!(
            tokio::time::timeout(DEADLINE, up.seen.recv())
                .await
                .unwrap()
                .as_deref(),
            Some("/hang")
        );
        p.fence.revoke();
        let a = tokio::time::timeout(DEADLINE, pending)
            .await
            .expect("cut off in time")
            .unwrap();
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.body);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_response_streaming_at_revoke_is_cut_off() {
        let up = upstream().await;
        let p = proxy();
        p.fence.apply("fence-1", grant(&[("127.0.0.1", &[], None)]));
        let mut c = client(&p).await;
        let req = Request::get(format!("http://{}/stall", up.addr))
            .header(header::HOST, up.addr.to_string())
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap();
        c.sender.ready().await.unwrap();
        let resp = c.sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let first = tokio::time::timeout(DEADLINE, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            first.into_data().unwrap(),
            Bytes::from_static(b"first-chunk")
        );
        p.fence.revoke();
        let next = tokio::time::timeout(DEADLINE, body.frame())
            .await
            .expect("cut off in time");
        assert!(
            matches!(next, Some(Err(_))),
            "the body did not end in an error: {next:?}"
        );
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

    #[test]
    fn each_decision_logs_exactly_one_canonical_line() {
        capture_logs();
        // One thread runs everything, so this thread's buffer holds every line.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        {
            rt.block_on(async {
                let up = upstream().await;
                let p = proxy();
                p.fence
                    .apply("fence-9", grant(&[("127.0.0.1", &["GET"], Some("/ok/"))]));
                let mut c = client(&p).await;
                assert_eq!(
                    c.get(&format!("http://{}/ok/1", up.addr)).await.status,
                    StatusCode::OK
                );
                assert_eq!(
                    c.get(&format!("http://{}/no", up.addr)).await.status,
                    StatusCode::FORBIDDEN
                );
            })
        }
        let text = LOG.with(|l| String::from_utf8(l.borrow().clone()).unwrap());
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("CANONICAL-EGRESS-DECISION"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        for want in [
            "decision=\"allow\"",
            "rule=0",
            "path=\"/ok/1\"",
            "fence=\"fence-9\"",
            "container=container-1",
        ] {
            assert!(
                lines[0].contains(want),
                "allow line lacks {want}: {}",
                lines[0]
            );
        }
        for want in [
            "decision=\"deny\"",
            "reason=\"path\"",
            "method=\"GET\"",
            "host=\"127.0.0.1\"",
        ] {
            assert!(
                lines[1].contains(want),
                "deny line lacks {want}: {}",
                lines[1]
            );
        }
    }

    /// Send raw bytes on a fresh connection; the status codes of the answers that came
    /// back before the proxy closed it (or went quiet).
    async fn raw_exchange(proxy: SocketAddr, bytes: &[u8]) -> Vec<u16> {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        exchange_statuses(&mut s, bytes).await
    }

    /// Write `bytes`, read until the other side closes (or 1.5 s pass), and return
    /// the status of every answer read.
    pub(crate) async fn exchange_statuses<S>(s: &mut S, bytes: &[u8]) -> Vec<u16>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        s.write_all(bytes).await.unwrap();
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_millis(1500), async {
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        String::from_utf8_lossy(&got)
            .split("HTTP/1.1 ")
            .skip(1)
            .filter_map(|r| r.get(..3)?.parse().ok())
            .collect()
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let h = |pairs: &[(&str, &str)]| {
            let mut m = hyper::HeaderMap::new();
            for (k, v) in pairs {
                m.append(
                    hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            m
        };
        let rows: &[(&[(&str, &str)], bool)] = &[
            (&[("content-length", "4")], true),
            (&[("transfer-encoding", "chunked")], true),
            (&[("transfer-encoding", "CHUNKED")], true),
            (
                &[("content-length", "4"), ("transfer-encoding", "chunked")],
                false,
            ),
            (&[("content-length", "0"), ("content-length", "0")], false),
            (&[("content-length", "+4")], false),
            (&[("content-length", "")], false),
            (&[("transfer-encoding", "gzip, chunked")], false),
            (
                &[
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "chunked"),
                ],
                false,
            ),
            (&[], true),
        ];
        for (headers, ok) in rows {
            assert_eq!(framing_error(&h(headers)).is_none(), *ok, "{headers:?}");
        }
    }

    /// Issue 12's raw requests, with `base` before each path: `http://HOST:PORT` through
    /// the proxy, empty (origin-form) inside an intercepted tunnel (issue 14). `u`
    /// is the upstream's `host:port` (the `Host` header).
    pub(crate) fn decided_request_rows(
        u: &str,
        base: &str,
    ) -> Vec<(&'static str, String, &'static [u16])> {
        let smuggle_body = format!("0\r\n\r\nGET {base}/secret.txt HTTP/1.1\r\nHost: {u}\r\n\r\n");
        // What an upstream that ignores a GET body reads as the next request (issue 21
        // item 17): always origin-form, as the proxy forwards.
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
                format!(
                    "GET {base}/allowed/x/../y HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n"
                ),
                &[200],
            ),
        ]
    }

    /// Issue 12: what reaches the upstream is only what was decided on. A table of raw
    /// requests (ambiguous framing, a smuggled second request, obsolete folding, bare
    /// LF, encoded separators, dot segments) through a proxy whose grant admits only
    /// `/allowed/`; the upstream never sees anything else, and an admitted path arrives
    /// as the proxy resolved it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_decided_request_reaches_the_upstream() {
        let mut up = upstream().await;
        let p = proxy();
        p.fence
            .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
        let u = up.addr.to_string();
        let rows = decided_request_rows(&u, &format!("http://{u}"));
        for (what, raw, want) in &rows {
            let got = raw_exchange(p.addr, raw.as_bytes()).await;
            // Exactly the one answer: nothing after it was parsed as another request.
            assert_eq!(&got[..], *want, "{what}: answered {got:?}");
        }
        let mut seen = Vec::new();
        while let Ok(path) = up.seen.try_recv() {
            seen.push(path);
        }
        assert!(
            !seen.iter().any(|p| p.contains("secret")),
            "a request nobody decided on reached the upstream: {seen:?}"
        );
        // The three admitted: the CL+TE one (hyper frames it by Transfer-Encoding, as
        // RFC 9112 §6.1 allows, drops Content-Length and closes the connection after
        // it), the bare-LF one, and the resolved one.
        assert_eq!(
            seen,
            ["/allowed/x", "/allowed/lf", "/allowed/y"],
            "the upstream saw {seen:?}"
        );
    }

    /// Fuzzing (issue 12): arbitrary raw requests (a grammar of tricky request lines,
    /// headers, framings and bodies, then random byte overwrites and truncation) through
    /// a proxy whose grant admits only `/allowed/`. The proxy never dies, answers or
    /// closes every connection, and the upstream never sees a path outside the prefix,
    /// a dot segment or an encoded separator. `PROPTEST_CASES` sets the number of
    /// requests (256 by default; the long run is in the README).
    #[test]
    fn arbitrary_raw_requests_never_reach_past_the_decision() {
        fuzz_raw_requests(false);
    }

    /// The same fuzzing against an upstream that reads GET requests' heads only (issue
    /// 21 item 17): a body it ignores would be its next request.
    #[test]
    fn arbitrary_raw_requests_never_reach_past_the_decision_of_an_upstream_ignoring_get_bodies() {
        fuzz_raw_requests(true);
    }

    fn fuzz_raw_requests(ignoring_upstream: bool) {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (mut up, p) = rt.block_on(async {
            let up = if ignoring_upstream {
                ignoring_upstream_on(None, false).await
            } else {
                upstream().await
            };
            let p = proxy();
            p.fence
                .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
            (up, p)
        });
        let u = up.addr.to_string();

        let segment = prop_oneof![
            Just("allowed"),
            Just("secret.txt"),
            Just(".."),
            Just("."),
            Just("%2e%2e"),
            Just("%2F"),
            Just("%2f"),
            Just("%5C"),
            Just(";x"),
            Just(""),
            Just("x"),
            Just("%00"),
        ];
        let target = (
            prop_oneof![
                12 => Just("http://{U}/allowed"),
                4 => Just("http://{U}"),
                1 => Just("http://{U}:99999"),
                1 => Just("HTTP://{U}"),
                1 => Just("http://user@{U}"),
                1 => Just(""),
                1 => Just("{U}"),
            ],
            proptest::collection::vec(segment, 0..6),
            prop_oneof![
                6 => Just(""),
                1 => Just("?a=%2F"),
                1 => Just("#frag"),
                1 => Just("?../secret.txt"),
            ],
        )
            .prop_map(|(base, segs, q)| format!("{base}/{}{q}", segs.join("/")));
        let header = prop_oneof![
            20 => Just("Host: {U}"),
            10 => Just("Connection: close"),
            1 => Just("Host: evil.example"),
            1 => Just("Content-Length: 0"),
            1 => Just("Content-Length: 5"),
            1 => Just("Content-Length: 100"),
            1 => Just("Content-Length: -1"),
            1 => Just("Content-Length: 1, 1"),
            1 => Just("Transfer-Encoding: chunked"),
            1 => Just("Transfer-Encoding: gzip, chunked"),
            1 => Just("Transfer-Encoding : chunked"),
            1 => Just(" folded: continuation"),
            1 => Just("Connection: keep-alive"),
            1 => Just("Expect: 100-continue"),
            1 => Just("Upgrade: websocket"),
            1 => Just("Proxy-Authorization: Basic x"),
            1 => Just("X-\u{0}: nul"),
            1 => Just(": no-name"),
        ];
        let body = prop_oneof![
            6 => Just(String::new()),
            1 => Just("hello".to_string()),
            1 => Just("0\r\n\r\n".to_string()),
            1 => Just("5\r\nhello\r\n0\r\n\r\n".to_string()),
            1 => Just("zz\r\n".to_string()),
            2 => Just("0\r\n\r\nGET http://{U}/secret.txt HTTP/1.1\r\nHost: {U}\r\n\r\n".to_string()),
            2 => Just("GET http://{U}/allowed/../secret.txt HTTP/1.1\r\nHost: {U}\r\n\r\n".to_string()),
            1 => "\\PC{0,40}",
        ];
        let request = (
            prop_oneof![
                8 => Just("GET"),
                4 => Just("POST"),
                1 => Just("CONNECT"),
                1 => Just("get"),
                1 => Just("G ET"),
            ],
            target,
            prop_oneof![
                8 => Just("HTTP/1.1"),
                2 => Just("HTTP/1.0"),
                1 => Just("HTTP/2"),
                1 => Just("HTTP/1.1 x"),
            ],
            proptest::collection::vec(header, 0..6),
            prop_oneof![8 => Just("\r\n"), 2 => Just("\n"), 1 => Just("\r")],
            body,
            prop_oneof![
                3 => Just(vec![]),
                1 => proptest::collection::vec((any::<usize>(), any::<u8>()), 1..3),
            ],
            prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)],
            0..2u8,
        )
            .prop_map(
                |(method, target, version, headers, eol, body, flips, cut, repeat)| {
                    let mut text = format!("{method} {target} {version}{eol}");
                    for h in headers {
                        text.push_str(h);
                        text.push_str(eol);
                    }
                    text.push_str(eol);
                    text.push_str(&body);
                    if repeat == 1 {
                        text = text.repeat(2);
                    }
                    let mut bytes = text.replace("{U}", &u).into_bytes();
                    for (at, b) in flips {
                        if !bytes.is_empty() {
                            let i = at % bytes.len();
                            bytes[i] = b;
                        }
                    }
                    if let Some(c) = cut
                        && !bytes.is_empty()
                    {
                        bytes.truncate(c % (bytes.len() + 1));
                    }
                    bytes
                },
            );

        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256);
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let addr = p.addr;
        let result = runner.run(&request, |bytes| {
            rt.block_on(async {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let _ = s.write_all(&bytes).await;
                // The client is done: a request the bytes left open ends here.
                let _ = s.shutdown().await;
                let mut sink = Vec::new();
                let read = tokio::time::timeout(DEADLINE, s.read_to_end(&mut sink)).await;
                prop_assert!(
                    read.is_ok(),
                    "the proxy neither answered nor closed: {:?}",
                    String::from_utf8_lossy(&bytes)
                );
                prop_assert!(!p.task.is_finished(), "the proxy died");
                Ok(())
            })
        });
        let mut seen = Vec::new();
        while let Ok(path) = up.seen.try_recv() {
            seen.push(path);
        }
        result.unwrap();
        eprintln!("{} of {cases} requests reached the upstream", seen.len());
        let bad: Vec<_> = seen
            .iter()
            .filter(|path| {
                let lower = path.to_ascii_lowercase();
                !path.starts_with("/allowed/")
                    || path.split('/').any(|seg| seg == ".." || seg == ".")
                    || lower.contains("%2f")
                    || lower.contains("%5c")
                    || lower.contains("%2e")
                    || path.contains(';')
            })
            .collect();
        assert!(bad.is_empty(), "the upstream saw {bad:?} (of {seen:?})");
        // Still serving: an ordinary allowed request goes through.
        let got = rt.block_on(raw_exchange(
            addr,
            format!("GET http://{u}/allowed/ok HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        ));
        assert_eq!(got, [200]);
        drop(p);
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

    /// Issue 21 item 17: the raw-socket table against an upstream that ignores GET
    /// bodies (as Python's `http.server` does). A body on GET used to be forwarded on the
    /// kept connection and read by the upstream as `GET /secret.txt`, a request nobody
    /// decided on; bodies on GET, HEAD, OPTIONS and TRACE are refused now.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_decided_request_reaches_an_upstream_that_ignores_get_bodies() {
        let mut up = ignoring_upstream_on(None, false).await;
        let p = proxy();
        p.fence
            .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
        let u = up.addr.to_string();
        let mut answers = Vec::new();
        for (what, raw, want) in decided_request_rows(&u, &format!("http://{u}")) {
            answers.push((what, raw_exchange(p.addr, raw.as_bytes()).await, want));
        }
        let seen = drain(&mut up.seen);
        assert!(
            !seen.iter().any(|p| p.contains("secret")),
            "a request nobody decided on reached the upstream: {seen:?}"
        );
        assert!(seen.iter().all(|p| p.starts_with("/allowed/")), "{seen:?}");
        for (what, got, want) in answers {
            assert_eq!(&got[..], want, "{what}: answered {got:?}");
        }
    }

    #[test]
    fn a_body_on_a_bodiless_method_is_refused() {
        let empty = http_body_util::Empty::<Bytes>::new();
        let some = http_body_util::Full::new(Bytes::from_static(b"GET /secret.txt"));
        let rows: &[(Method, bool, bool)] = &[
            (Method::GET, false, true),
            (Method::GET, true, false),
            (Method::HEAD, true, false),
            (Method::OPTIONS, true, false),
            (Method::TRACE, true, false),
            (Method::POST, true, true),
            (Method::PUT, true, true),
            (Method::DELETE, true, true),
            (Method::HEAD, false, true),
        ];
        for (method, with_body, ok) in rows {
            let refused = if *with_body {
                body_error(method, &some)
            } else {
                body_error(method, &empty)
            };
            assert_eq!(refused.is_none(), *ok, "{method} with a body: {with_body}");
        }
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

    /// Issue 21 item 17: an upstream that answers before the request body has arrived is
    /// done with the request, so the rest of the body would be read as a new request by
    /// one that does not read bodies. The proxy sends no more of it (the upstream
    /// connection ends) and does not keep the connection for the next request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_rest_of_a_body_answered_early_never_reaches_the_upstream() {
        let mut up = ignoring_upstream_on(None, true).await;
        let p = proxy();
        p.fence
            .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
        let u = up.addr.to_string();
        let smuggled = format!("GET /secret.txt HTTP/1.1\r\nHost: {u}\r\n\r\n");
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        s.write_all(
            format!(
                "POST http://{u}/allowed/upload HTTP/1.1\r\nHost: {u}\r\nContent-Length: {}\r\n\r\n",
                smuggled.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let first = next_answer(&mut s).await;
        assert!(
            first.starts_with("HTTP/1.1 200"),
            "answered on the head: {first}"
        );
        // The body, then the next request on the same connection: on a kept upstream
        // connection the upstream would read both, in order.
        let after = format!("GET http://{u}/allowed/after HTTP/1.1\r\nHost: {u}\r\n\r\n");
        let _ = s.write_all(format!("{smuggled}{after}").as_bytes()).await;
        let _ = next_answer(&mut s).await;
        let seen = drain(&mut up.seen);
        assert!(
            !seen.iter().any(|p| p.contains("secret")),
            "the rest of the body reached the upstream as a request: {seen:?}"
        );
        assert_eq!(seen.first().map(String::as_str), Some("/allowed/upload"));
    }

    /// Issue 21 item 17: a body on DELETE (or an extension method), which an upstream
    /// may ignore, goes on a connection the upstream is told to close after it: an
    /// upstream that ignores the body does not read it as its next request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_an_upstream_may_ignore_ends_its_connection() {
        let mut up = ignoring_upstream_on(None, true).await;
        let p = proxy();
        p.fence
            .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
        let u = up.addr.to_string();
        let inner = format!("GET /secret.txt HTTP/1.1\r\nHost: {u}\r\n\r\n");
        for method in ["DELETE", "PROPFIND"] {
            let got = raw_exchange(
                p.addr,
                format!(
                    "{method} http://{u}/allowed/x HTTP/1.1\r\nHost: {u}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{inner}",
                    inner.len()
                )
                .as_bytes(),
            )
            .await;
            assert_eq!(got, [200], "{method}");
        }
        // A request after them reaches the upstream: what came before it did, too.
        let got = raw_exchange(
            p.addr,
            format!(
                "GET http://{u}/allowed/last HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(got, [200]);
        let seen = drain(&mut up.seen);
        assert!(
            !seen.iter().any(|p| p.contains("secret")),
            "the ignored body was read as a request: {seen:?}"
        );
        assert_eq!(seen, ["/allowed/x", "/allowed/x", "/allowed/last"]);
    }

    /// A port on loopback nothing listens on.
    pub(crate) fn dead_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    /// Issue 21 item 12: a command choosing 20 kB hosts and paths, a 40-byte method and a
    /// flood of requests to a dead port does not get its input amplified: every line is
    /// short, allow and upstream-failure lines are rate-bounded per container like
    /// denials, and every stored row keeps a bounded field. Item 11: the fence counts
    /// what it admitted and denied, and its summary row counts the records the bound
    /// left out.
    #[test]
    fn a_flood_of_long_fields_and_failures_stays_bounded_in_lines_and_rows() {
        capture_logs();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        const FAILING: usize = 1200;
        const DENIED: usize = 150;
        const INVALID: usize = 300;
        let started = std::time::Instant::now();
        let (counts, sink) = rt.block_on(async {
            let p = proxy();
            let dead = dead_port();
            p.fence
                .apply("fence-flood", grant(&[("127.0.0.1", &[], None)]));
            let mut c = client(&p).await;
            let long_path = format!("/{}", "p".repeat(20_000));
            for _ in 0..FAILING {
                let a = c.get(&format!("http://127.0.0.1:{dead}{long_path}")).await;
                assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{}", a.body);
            }
            let long_host = format!("{}.example", "h".repeat(20_000));
            for _ in 0..DENIED {
                let a = c.get(&format!("http://{long_host}/x")).await;
                assert_eq!(a.denial.as_deref(), Some("no-rule"));
                assert!(a.body.len() < 2 * bounded::MAX_FIELD, "{}", a.body.len());
            }
            let method = "X".repeat(40);
            let got = raw_exchange(
                p.addr,
                format!("{method} http://127.0.0.1:{dead}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    .as_bytes(),
            )
            .await;
            assert_eq!(got, [400], "an extension method over 32 bytes");
            // Pipelined, as fast as the client writes: refused, lines rate-bounded.
            let one =
                format!("{method} http://127.0.0.1:{dead}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
            let got = raw_exchange(p.addr, one.repeat(INVALID).as_bytes()).await;
            assert!(got.iter().all(|s| *s == 400) && !got.is_empty(), "{got:?}");
            (p.fence.revoke_counts(), p.sink.clone())
        });
        let secs = started.elapsed().as_secs_f64();
        let text = LOG.with(|l| String::from_utf8(l.borrow().clone()).unwrap());
        let longest = text.lines().map(str::len).max().unwrap_or(0);
        assert!(longest < 2048, "a line of {longest} bytes");
        let count = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
        let bound = |burst: f64, rate: f64| (burst + rate * secs) as usize + 1;
        assert!(
            count("egress upstream failed") <= bound(FAILURE_LINE_BURST, FAILURE_LINES_PER_SECOND),
            "{} failure lines in {secs} s",
            count("egress upstream failed")
        );
        assert!(
            count("decision=\"allow\"") <= bound(ALLOW_LINE_BURST, ALLOW_LINES_PER_SECOND),
            "{} allow lines in {secs} s",
            count("decision=\"allow\"")
        );
        assert!(count("decision=\"deny\"") <= bound(DENIAL_BURST, DENIALS_PER_SECOND));
        assert!(
            count("decision=\"invalid\"") <= bound(DENIAL_BURST, DENIALS_PER_SECOND),
            "{} invalid lines",
            count("decision=\"invalid\"")
        );
        assert!(
            text.lines().any(|l| l
                .split("suppressed=")
                .nth(1)
                .is_some_and(|r| !r.starts_with('0'))),
            "a line after a gap says what was left out"
        );
        assert!(text.len() < 4 << 20, "{} bytes of log", text.len());
        // What the command chose is bounded in every row.
        let denials = sink.0.lock().unwrap().clone();
        assert!(!denials.is_empty());
        assert!(
            denials
                .iter()
                .all(|(_, _, d)| d.host.len() <= bounded::MAX_FIELD)
        );
        let rows = sink.admitted();
        assert!(rows.iter().all(|a| a.path.len() <= bounded::MAX_FIELD));
        // Item 11: the counts for the exec, and one summary row for what was left out.
        assert_eq!(
            counts,
            FenceCounts {
                admitted: FAILING as u32,
                denied: DENIED as u32
            }
        );
        let (summaries, records): (Vec<&Admitted>, Vec<&Admitted>) =
            rows.iter().partition(|a| a.via == audit::VIA_SUMMARY);
        assert!(
            records.len() < FAILING,
            "the audit's rate bound left records out"
        );
        assert_eq!(summaries.len(), 1, "one summary row per fence");
        assert_eq!(
            (
                summaries[0].fence.as_str(),
                summaries[0].suppressed as usize
            ),
            ("fence-flood", FAILING - records.len())
        );
    }

    /// Issue 21 item 11, as sentences: with the audit's rate bound spent, a record that
    /// carried or was refused a credential is written; another is counted for the
    /// fence's summary row; once the fence closed, it is written after all.
    #[test]
    fn a_credentialed_record_is_never_left_out() {
        let spent = || {
            let t = Mutex::new(Throttle::new(1.0, 0.0));
            assert!(take(&t).is_some());
            t
        };
        let with_credential = Admitted {
            credentials: vec!["authorization".into()],
            ..Admitted::default()
        };
        let withheld = Admitted {
            error: audit::CREDENTIALS_WITHHELD.into(),
            ..Admitted::default()
        };
        let ordinary = Admitted::default();
        let open = AtomicU64::new(0);
        let closed = AtomicU64::new(CLOSED);
        let rows: &[(&str, &Admitted, &AtomicU64, bool)] = &[
            ("a credential added: written", &with_credential, &open, true),
            ("a credential withheld: written", &withheld, &open, true),
            ("an ordinary record: left out", &ordinary, &open, false),
            ("after the close: written", &ordinary, &closed, true),
        ];
        for (sentence, record, suppressed, written) in rows {
            assert_eq!(
                record_written(record, &spent(), suppressed).0,
                *written,
                "{sentence}"
            );
        }
        assert_eq!(
            open.load(Ordering::SeqCst),
            1,
            "the one left out is counted"
        );
        assert_eq!(closed.load(Ordering::SeqCst), CLOSED);
        let fresh = Mutex::new(Throttle::new(1.0, 0.0));
        assert_eq!(record_written(&ordinary, &fresh, &open), (true, 0));
    }

    /// Issue 21 item 11: `revoke_counts` reports what the fence admitted and denied; a
    /// fence that left nothing out writes no summary row; `revoke` still reports the
    /// denials.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_reports_what_it_admitted_and_denied() {
        let up = upstream().await;
        let p = proxy();
        p.fence
            .apply("f1", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
        let mut c = client(&p).await;
        for path in ["/allowed/a", "/allowed/b", "/secret"] {
            c.get(&format!("http://{}{path}", up.addr)).await;
        }
        assert_eq!(
            p.fence.revoke_counts(),
            FenceCounts {
                admitted: 2,
                denied: 1
            }
        );
        assert_eq!(p.fence.revoke_counts(), FenceCounts::default());
        p.fence.apply("f2", grant(&[("127.0.0.1", &[], None)]));
        c.get(&format!("http://{}/secret", up.addr)).await;
        assert_eq!(p.fence.revoke(), 0);
        assert!(
            p.sink
                .admitted()
                .iter()
                .all(|a| a.via != audit::VIA_SUMMARY),
            "nothing was left out: no summary row"
        );
    }
}
