//! The preview listener: HTTP/1.1 in, each request forwarded to the door's container
//! over a connection its [`Connect`] makes from inside the container's network
//! namespace (`127.0.0.1:{port}` there; never an address the host can see), an upgrade
//! (WebSocket, CDP) spliced both ways once the container answers `101`.
//!
//! Every request is recorded in the [`Audit`](super::Audit) (time, token, port, method, path,
//! status) and in one `stockade::preview` line (the token's first six characters
//! only: a log line is no door key). A request naming no open door gets [`not_found`],
//! the same bytes whether the token was never issued, was closed, or was guessed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use super::audit::AuditEntry;
use super::doors::{Doors, Lookup};
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
/// Longest an inbound request's head may take to arrive.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Most inbound connections served at once (each holds a descriptor, and its requests
/// a connection into a container): past it, a new connection is closed at once, and
/// the host's descriptors stay bounded whatever a client opens.
pub const MAX_CONNECTIONS: usize = 512;

/// Serve doors on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, doors: Arc<Doors>, connect: Arc<dyn Connect>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
        let (doors, connect) = (doors.clone(), connect.clone());
        // The slot is held by the connection and by any upgrade spliced from it: a
        // WebSocket outlives the HTTP connection it came from, and still counts.
        let slot = Arc::new(slot);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let (doors, connect, slot) = (doors.clone(), connect.clone(), slot.clone());
                async move {
                    Ok::<_, std::convert::Infallible>(
                        handle(req, &doors, &*connect, peer, slot).await,
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                // No `date` header: the 404 is the same bytes at any time.
                .auto_date_header(false)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades()
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    doors: &Doors,
    connect: &dyn Connect,
    peer: SocketAddr,
    slot: Arc<tokio::sync::OwnedSemaphorePermit>,
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
    let (token, lookup) = match &route {
        Some(r) => (r.token.clone(), doors.admit(&r.token, Instant::now())),
        None => (String::new(), Lookup::Unknown),
    };
    let (resp, port) = match (route, lookup) {
        (Some(r), Lookup::Open(door)) if r.port.is_none_or(|p| p == door.port) => (
            forward(req, &r.target, &door.container, door.port, connect, slot).await,
            door.port,
        ),
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

/// Forward one request to the container and answer its response (an upgrade spliced).
async fn forward(
    mut req: Request<Incoming>,
    target: &str,
    container: &str,
    port: u16,
    connect: &dyn Connect,
    slot: Arc<tokio::sync::OwnedSemaphorePermit>,
) -> Response<Body> {
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
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(_) => {
            return fixed(
                StatusCode::BAD_GATEWAY,
                "the sandbox's port did not answer\n",
            );
        }
    };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
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
        tokio::spawn(async move {
            let _slot = slot;
            if let (Ok(a), Ok(b)) = (inbound.await, outbound.await) {
                let _ =
                    tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
            }
        });
    }
    resp.map(BodyExt::boxed)
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
