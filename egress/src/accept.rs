//! The listener: the accept loop under the connection cap and the descriptor budget,
//! what a proxy is served with (options, interception, attribution), and the state
//! its connections share.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::DenialSink;
use crate::Fence;
use crate::audit::ADMITTED_BURST;
use crate::audit::ADMITTED_PER_SECOND;
use crate::audit::ALLOW_LINE_BURST;
use crate::audit::ALLOW_LINES_PER_SECOND;
use crate::audit::DENIAL_BURST;
use crate::audit::DENIALS_PER_SECOND;
use crate::audit::FAILURE_LINE_BURST;
use crate::audit::FAILURE_LINES_PER_SECOND;
use crate::audit::Throttle;
use crate::budget::{self, Budget};
use crate::conn::Conn;
use crate::h1::serve_http;
use crate::tls::Authority;

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

/// The default of [`ProxyOptions::max_connections`].
pub const MAX_CONNECTIONS: usize = 256;

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

pub(crate) struct Shared {
    pub(crate) fence: Fence,
    pub(crate) opts: ProxyOptions,
    pub(crate) sink: Arc<dyn DenialSink>,
    /// Cancelled when the serve task ends (or is aborted): connections and tunnels it
    /// started do not outlive it.
    pub(crate) shutdown: CancellationToken,
    /// Denial lines and records written (see `DENIAL_BURST`).
    pub(crate) throttle: Mutex<Throttle>,
    /// Audit records written (see `ADMITTED_BURST`).
    pub(crate) admitted_throttle: Mutex<Throttle>,
    /// Allow lines written (see `ALLOW_LINE_BURST`).
    pub(crate) allow_throttle: Mutex<Throttle>,
    /// Upstream-failure lines written (see `FAILURE_LINE_BURST`).
    pub(crate) failure_throttle: Mutex<Throttle>,
    /// Lines for requests that are not proxy requests (as denials).
    pub(crate) invalid_throttle: Mutex<Throttle>,
    /// `Some`: HTTPS to hosts whose rules need it is intercepted.
    pub(crate) tls: Option<Interception>,
    /// The listener's own address (the far end of every client connection).
    pub(crate) listener: Option<SocketAddr>,
    /// Who holds a connection: for credentials, and (when `exclusive`) for admission.
    pub(crate) attribution: Option<Arc<dyn Attribution>>,
    /// The open grant is the fenced run's alone: every other connection is denied
    /// `detached` (DESIGN invariant 3).
    pub(crate) exclusive: bool,
    /// What this container may spend of the server's descriptors and TLS work.
    pub(crate) budget: Budget,
}

/// A client connection's place under the connection cap and in the descriptor pool,
/// shared with the tunnel it may become.
pub(crate) struct Slot {
    pub(crate) _cap: tokio::sync::OwnedSemaphorePermit,
    pub(crate) _fd: Option<budget::Place>,
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
