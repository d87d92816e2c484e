//! What a proxy's connections share: the options and inputs it is served with
//! (interception, attribution), the fence, the sink, the throttles of its lines and
//! records, its budget, and each connection's place under the connection cap.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::audit::{DenialSink, Throttle};
use crate::budget::{self, Budget};
use crate::fence::Fence;
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

/// Which process tree holds a client connection. Given to [`serve_with`], an open grant
/// admits only the fenced run's own connections (a detached process's are denied
/// `detached`: docs/DESIGN.md §3, invariant 3); credentials are added only to them in any
/// case.
pub trait Attribution: Send + Sync + 'static {
    /// Does a process of tree `tree` hold the client end of the connection from
    /// `peer` to `listener`? Anything that cannot be established is `false`.
    fn holds(&self, tree: &str, peer: SocketAddr, listener: SocketAddr) -> bool;

    /// [`Attribution::holds`], answered from what was read of the kernel's records at
    /// `since` or later: the later of the connection's acceptance (a socket held now
    /// existed then) and its run's start (a tree id may be given again, so a reading of
    /// the same id before that was a reading of another run's processes). A burst of
    /// connections costs one reading, not one each.
    fn holds_since(
        &self,
        tree: &str,
        peer: SocketAddr,
        listener: SocketAddr,
        since: std::time::Instant,
    ) -> bool {
        let _ = since;
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
    /// `detached` (docs/DESIGN.md §3, invariant 3).
    pub(crate) exclusive: bool,
    /// What this container may spend of the server's descriptors and TLS work.
    pub(crate) budget: Budget,
    /// How long a client may take to send a request head (`h1::HEAD_TIMEOUT`; tests
    /// shorten it).
    pub(crate) head_timeout: std::time::Duration,
}

/// A client connection's place under the connection cap and in the descriptor pool,
/// shared with the tunnel it may become.
pub(crate) struct Slot {
    pub(crate) _cap: tokio::sync::OwnedSemaphorePermit,
    pub(crate) _fd: Option<budget::Place>,
}
