//! The listener: the accept loop under the connection cap and the descriptor budget,
//! each accepted connection served as HTTP/1.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::audit::DenialSink;
use crate::audit::{
    ADMITTED_BURST, ADMITTED_PER_SECOND, ALLOW_LINE_BURST, ALLOW_LINES_PER_SECOND, DENIAL_BURST,
    DENIALS_PER_SECOND, FAILURE_LINE_BURST, FAILURE_LINES_PER_SECOND, Throttle,
};
use crate::budget::{self, Budget};
use crate::conn::Conn;
use crate::fence::Fence;
use crate::h1::{HEAD_TIMEOUT, serve_http};
use crate::shared::{Attribution, Interception, ProxyOptions, Shared, Slot};

/// Serve the proxy on `listener` until the returned task is aborted. Must be called from
/// within a tokio runtime. Without attribution the open grant is shared by every process
/// of the container (the fallback of docs/DESIGN.md §3, invariant 3); credentials still
/// go only where `tls`'s attribution says the fenced run holds the connection.
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
    serve_timed(
        listener,
        fence,
        opts,
        sink,
        tls,
        attribution,
        budget,
        HEAD_TIMEOUT,
    )
}

/// [`serve_with`], with the head timeout (tests shorten it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve_timed(
    listener: std::net::TcpListener,
    fence: Fence,
    opts: ProxyOptions,
    sink: Arc<dyn DenialSink>,
    tls: Option<Interception>,
    attribution: Option<Arc<dyn Attribution>>,
    budget: Budget,
    head_timeout: Duration,
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
        head_timeout,
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
            // Paced per container: what the server does per connection (accept,
            // parse, attribute, refuse) is CPU outside the container's limit.
            shared.budget.accept().await;
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
pub(crate) async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    slot: Slot,
) {
    let shutdown = shared.shutdown.clone();
    let conn = Conn::new(shared, None, peer);
    *conn.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(slot));
    serve_http(TokioIo::new(stream), conn, shutdown.cancelled_owned()).await;
}
