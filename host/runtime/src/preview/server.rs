//! The preview listener: HTTP/1.1 in, each request forwarded to the door's container
//! over a connection its [`Connect`] makes from inside the container's network
//! namespace (`127.0.0.1:{port}` there; never an address the host can see), an upgrade
//! (WebSocket, CDP) spliced both ways once the container answers `101`.
//!
//! Connections are bounded per door (docs/PREVIEW.md "Connections"): a connection
//! starts in the small anonymous pool ([`super::conns`]) and its first request through
//! an open door claims it for that door's share ([`PER_DOOR`]); an upgrade takes the
//! share on into its splice. Closing a door cancels its `closed` token: every connection
//! it claimed, every forward in flight and every splice through it ends.
//!
//! Every request is recorded in the [`Audit`](super::Audit) (time, token, port, method, path,
//! status) and in one `stockade::preview` line (the token's first six characters
//! only: a log line is no door key). A request naming no open door gets [`not_found`],
//! the same bytes whether the token was never issued, was closed, or was guessed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::audit::AuditEntry;
use super::conns::{ANONYMOUS, Anonymous};
use super::doors::{Door, Doors, Lookup, PER_DOOR};
use super::route;

/// Makes a connection to `127.0.0.1:{port}` inside a container's network namespace.
pub trait Connect: Send + Sync + 'static {
    /// Connect to `port` on the container's loopback.
    fn connect(
        &self,
        container: &str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>>;
}

type Body = BoxBody<Bytes, hyper::Error>;

/// The one answer for a request that names no open door: the same status, headers and
/// body whatever the reason.
pub fn not_found() -> Response<Body> {
    fixed(StatusCode::NOT_FOUND, "no such preview\n")
}

fn fixed(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Longest a connection into the container may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest an inbound request's head may take to arrive, counted from the moment the
/// connection waits for one (a fresh connection, and a kept-alive one between
/// requests): a connection that sends no token holds its slot this long at most.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest an upgraded connection (WebSocket, CDP) may carry nothing either way before
/// the listener ends it: a splice holds its door's share only while it is used.
pub const UPGRADE_IDLE: Duration = Duration::from_secs(300);

/// Most inbound connections and splices at once, all doors together (each holds
/// descriptors): past it a new connection is closed at once. One key holds at most
/// `8 × PER_DOOR` of it through its doors and no connection without a door holds more
/// than the anonymous pool ([`ANONYMOUS`](super::conns::ANONYMOUS), evicted oldest
/// first), so one key never holds the whole listener.
pub const MAX_CONNECTIONS: usize = 1024;

/// One inbound connection: its listener slot, the token that ends it, its place in the
/// anonymous pool until a door claims it, and the door that did.
struct Conn {
    slot: Arc<OwnedSemaphorePermit>,
    kill: CancellationToken,
    anonymous: Arc<Anonymous>,
    id: u64,
    bound: Mutex<Option<Binding>>,
}

/// The door a connection's first admitted request claimed it for, with the share it
/// holds there (an upgrade takes it on into its splice).
struct Binding {
    token: String,
    share: Option<OwnedSemaphorePermit>,
}

/// What a connection holds for one admitted request.
enum Claim {
    /// The connection is the door's (it holds the door's share).
    Bound,
    /// The connection is another door's: this request holds a share of its own door,
    /// and the connection closes after it.
    Passing(OwnedSemaphorePermit),
    /// The door's share is all taken.
    Full,
}

impl Conn {
    fn binding(&self) -> std::sync::MutexGuard<'_, Option<Binding>> {
        self.bound.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claim this connection (or, if another door has it, this request) for `door`.
    fn claim(&self, token: &str, door: &Door) -> Claim {
        let mut b = self.binding();
        match &*b {
            Some(x) if x.token == token => return Claim::Bound,
            Some(_) => {
                return door
                    .share
                    .clone()
                    .try_acquire_owned()
                    .map_or(Claim::Full, Claim::Passing);
            }
            None => {}
        }
        let Ok(share) = door.share.clone().try_acquire_owned() else {
            return Claim::Full;
        };
        *b = Some(Binding {
            token: token.to_string(),
            share: Some(share),
        });
        drop(b);
        self.anonymous.leave(self.id);
        // The connection is the door's now: it ends when the door closes.
        let (closed, kill) = (door.closed.clone(), self.kill.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = closed.cancelled() => kill.cancel(),
                () = kill.cancelled() => {}
            }
        });
        Claim::Bound
    }

    /// The share an upgrade on this connection takes on into its splice.
    fn take_share(&self) -> Option<OwnedSemaphorePermit> {
        self.binding().as_mut().and_then(|b| b.share.take())
    }
}

/// Serve doors on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, doors: Arc<Doors>, connect: Arc<dyn Connect>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let anonymous = Arc::new(Anonymous::new(ANONYMOUS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(target: "stockade::preview", error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(target: "stockade::preview", %peer, "connection refused: {MAX_CONNECTIONS} open");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let kill = CancellationToken::new();
        // Anonymous until a request through an open door claims it; the pool evicts
        // its oldest to make room.
        let id = anonymous.enter(kill.clone());
        let conn = Arc::new(Conn {
            // Held by the connection and by any upgrade spliced from it: a WebSocket
            // outlives the HTTP connection it came from, and still counts.
            slot: Arc::new(slot),
            kill,
            anonymous: anonymous.clone(),
            id,
            bound: Mutex::new(None),
        });
        let (doors, connect) = (doors.clone(), connect.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn({
                let conn = conn.clone();
                move |req| {
                    let (doors, connect, conn) = (doors.clone(), connect.clone(), conn.clone());
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            handle(req, &doors, &*connect, peer, &conn).await,
                        )
                    }
                }
            });
            let serving = hyper::server::conn::http1::Builder::new()
                // No `date` header: the 404 is the same bytes at any time.
                .auto_date_header(false)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            // Evicted from the anonymous pool, or its door closed: the connection ends
            // (dropping it closes the socket).
            tokio::select! {
                _ = serving => {}
                () = conn.kill.cancelled() => {}
            }
            conn.anonymous.leave(conn.id);
            conn.kill.cancel();
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    doors: &Doors,
    connect: &dyn Connect,
    peer: SocketAddr,
    conn: &Conn,
) -> Response<Body> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned);
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    let method = req.method().to_string();
    let route = route::parse(host.as_deref(), &target, doors.domain().as_deref());
    // The door is decided wholly (token and the Host form's port) before its bucket is
    // charged: a request naming no door spends no door's bound.
    let (token, lookup) = match &route {
        Some(r) => (
            r.token.clone(),
            doors.admit(&r.token, r.port, Instant::now()),
        ),
        None => (String::new(), Lookup::Unknown),
    };
    let (resp, port) = match (route, lookup) {
        (Some(r), Lookup::Open(door)) => {
            let resp = match conn.claim(&r.token, &door) {
                Claim::Full => {
                    tracing::info!(target: "stockade::preview", port = door.port, per_door = PER_DOOR, "the door's connections are all taken");
                    closing(fixed(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the preview's connections are all in use\n",
                    ))
                }
                claim => {
                    let passing = match claim {
                        Claim::Passing(p) => Some(p),
                        _ => None,
                    };
                    let close_after = passing.is_some();
                    let closed = door.closed.clone();
                    // The door closing mid-request ends it too.
                    let resp = tokio::select! {
                        r = forward(req, &r.target, &door, connect, conn, passing) => r,
                        () = closed.cancelled() => not_found(),
                    };
                    if close_after && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
                        closing(resp)
                    } else {
                        resp
                    }
                }
            };
            (resp, door.port)
        }
        (_, Lookup::Limited) => (
            fixed(StatusCode::TOO_MANY_REQUESTS, "too many requests\n"),
            0,
        ),
        _ => (not_found(), 0),
    };
    let status = resp.status().as_u16();
    tracing::info!(
        target: "stockade::preview",
        token = %token.get(..6).unwrap_or(""),
        port,
        method = %method,
        path = %bounded(&redacted(&target), 256),
        status,
        peer = %peer,
        "preview request"
    );
    doors.audit().push(AuditEntry {
        at_ms: now_ms(),
        token: bounded(&token, 64),
        port,
        method,
        path: bounded(&target, 256),
        status,
    });
    resp
}

/// The response, and the connection closes after it.
fn closing(mut r: Response<Body>) -> Response<Body> {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Forward one request to the container and answer its response (an upgrade spliced).
/// Everything it makes (the connection into the container, the splice) ends when the
/// door closes.
async fn forward(
    mut req: Request<Incoming>,
    target: &str,
    door: &Door,
    connect: &dyn Connect,
    conn: &Conn,
    passing: Option<OwnedSemaphorePermit>,
) -> Response<Body> {
    let (container, port) = (door.container.as_str(), door.port);
    let upgrade = is_upgrade(req.headers());
    let inbound = upgrade.then(|| hyper::upgrade::on(&mut req));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect.connect(container, port)).await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(target: "stockade::preview", %container, port, error = %e, "the container refused the preview connection");
            return fixed(
                StatusCode::BAD_GATEWAY,
                "the sandbox's port did not answer\n",
            );
        }
        Err(_) => {
            return fixed(
                StatusCode::GATEWAY_TIMEOUT,
                "the sandbox's port did not answer\n",
            );
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, client) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(x) => x,
            Err(_) => {
                return fixed(
                    StatusCode::BAD_GATEWAY,
                    "the sandbox's port did not answer\n",
                );
            }
        };
    let closed = door.closed.clone();
    tokio::spawn(async move {
        // The door closing drops the connection into the container: a response body
        // still streaming ends with it.
        tokio::select! {
            _ = client.with_upgrades() => {}
            () = closed.cancelled() => {}
        }
    });
    let (mut parts, body) = req.into_parts();
    parts.uri = match target.parse() {
        Ok(u) => u,
        Err(_) => return not_found(),
    };
    strip_hop_by_hop(&mut parts.headers, upgrade);
    if let Ok(v) = HeaderValue::from_str(&format!("127.0.0.1:{port}")) {
        parts.headers.insert(header::HOST, v);
    }
    let mut resp = match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(_) => {
            return fixed(
                StatusCode::BAD_GATEWAY,
                "the sandbox's port did not answer\n",
            );
        }
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(inbound) = inbound
    {
        let outbound = hyper::upgrade::on(&mut resp);
        // The splice holds a share of the door (the connection's, taken on, or this
        // request's own) and the listener slot, until it ends.
        let share = passing.or_else(|| conn.take_share());
        let slot = conn.slot.clone();
        let closed = door.closed.clone();
        tokio::spawn(async move {
            let (_slot, _share) = (slot, share);
            let ends = tokio::select! {
                ends = async { (inbound.await, outbound.await) } => ends,
                () = closed.cancelled() => return,
            };
            if let (Ok(a), Ok(b)) = ends {
                splice(TokioIo::new(a), TokioIo::new(b), UPGRADE_IDLE, closed).await;
            }
        });
    }
    resp.map(BodyExt::boxed)
}

/// Copy both ways until both sides have ended, the door closes (`closed`), or nothing
/// moves either way for `idle`. Dropping the two ends closes both sockets.
async fn splice<A, B>(a: A, b: B, idle: Duration, closed: CancellationToken)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let pump = async {
        let (mut from_a, mut from_b) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
        let (mut a_open, mut b_open) = (true, true);
        let quiet = tokio::time::sleep(idle);
        tokio::pin!(quiet);
        while a_open || b_open {
            // A write the other side never drains counts as nothing moving.
            let moved = tokio::select! {
                () = &mut quiet => {
                    tracing::info!(target: "stockade::preview", idle_s = idle.as_secs(), "an idle upgraded connection ended");
                    return;
                }
                n = ar.read(&mut from_a), if a_open => match n {
                    Ok(0) => {
                        a_open = false;
                        let _ = bw.shutdown().await;
                        true
                    }
                    Ok(n) => tokio::time::timeout(idle, bw.write_all(&from_a[..n])).await.is_ok_and(|w| w.is_ok()),
                    Err(_) => false,
                },
                n = br.read(&mut from_b), if b_open => match n {
                    Ok(0) => {
                        b_open = false;
                        let _ = aw.shutdown().await;
                        true
                    }
                    Ok(n) => tokio::time::timeout(idle, aw.write_all(&from_b[..n])).await.is_ok_and(|w| w.is_ok()),
                    Err(_) => false,
                },
            };
            if !moved {
                return;
            }
            quiet.as_mut().reset(tokio::time::Instant::now() + idle);
        }
    };
    tokio::select! {
        () = pump => {}
        () = closed.cancelled() => {}
    }
}

fn is_upgrade(h: &hyper::HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

/// Hop-by-hop headers are the listener's, not the container's (an upgrade keeps its
/// `Connection: upgrade` and `Upgrade`).
fn strip_hop_by_hop(h: &mut hyper::HeaderMap, upgrade: bool) {
    for name in [
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
    ] {
        h.remove(name);
    }
    if !upgrade {
        h.remove(header::CONNECTION);
        h.remove(header::UPGRADE);
    }
}

/// The target with a path-form token cut to its first six characters (a log line is no
/// door key).
fn redacted(target: &str) -> String {
    match target.strip_prefix("/p/") {
        Some(rest) => {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            let shown: String = rest[..end].chars().take(6).collect();
            format!("/p/{shown}…{}", &rest[end..])
        }
        None => target.to_string(),
    }
}

fn bounded(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read until EOF (or an error) within 5 s: true when the other end closed.
    async fn ends(s: &mut tokio::io::DuplexStream) -> bool {
        let mut b = [0u8; 64];
        loop {
            match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }

    #[tokio::test]
    async fn a_splice_carries_both_ways_and_ends_on_close_or_idle() {
        // (how it ends, the idle bound)
        let rows = [
            ("door closed", Duration::from_secs(60)),
            ("idle", Duration::from_millis(100)),
        ];
        for (how, idle) in rows {
            let (mut client, a) = tokio::io::duplex(64);
            let (b, mut server) = tokio::io::duplex(64);
            let closed = CancellationToken::new();
            let task = tokio::spawn(splice(a, b, idle, closed.clone()));
            client.write_all(b"ping").await.unwrap();
            let mut got = [0u8; 4];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping", "{how}: client to server");
            server.write_all(b"pong").await.unwrap();
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"pong", "{how}: server to client");
            if how == "door closed" {
                closed.cancel();
            }
            assert!(ends(&mut client).await, "{how}: the client's end closed");
            assert!(ends(&mut server).await, "{how}: the server's end closed");
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("the splice returned")
                .unwrap();
        }
    }

    #[tokio::test]
    async fn a_half_closed_splice_still_carries_the_other_way() {
        let (mut client, a) = tokio::io::duplex(64);
        let (b, mut server) = tokio::io::duplex(64);
        let task = tokio::spawn(splice(
            a,
            b,
            Duration::from_secs(60),
            CancellationToken::new(),
        ));
        client.write_all(b"last").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last", "the client's data, then its end");
        server.write_all(b"reply").await.unwrap();
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(
            got, b"reply",
            "the server still answers after the client's end"
        );
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("both ended: the splice returned")
            .unwrap();
    }

    #[test]
    fn a_logged_target_never_holds_a_whole_token() {
        let rows = [
            ("/p/abcdefghijklmnopqrstuvwx/a?b", "/p/abcdef…/a?b"),
            ("/p/abcdefghijklmnopqrstuvwx", "/p/abcdef…"),
            ("/p/ab", "/p/ab…"),
            ("/index.html", "/index.html"),
        ];
        for (target, want) in rows {
            assert_eq!(redacted(target), want);
        }
    }
}
