//! What the node's routes share: the node itself ([`Node`]: its substrate, store,
//! secrets, the owner map, leases, nonces, the idempotency cache and its bounds) and
//! its numbers ([`Settings`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::idempotency;
use crate::lease::Leases;
use crate::owners::Owners;
use stockade_egress::secrets::Secrets;
use stockade_node_protocol::auth;
use stockade_runtime::substrate::Substrate;

/// Nonces held at once (a request rate far above any front's, over twice the window).
pub const NONCES: usize = 100_000;

/// The longest `run` timeout a node takes (a day): past it, `invalid`.
pub const MAX_RUN_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// Everything the routes share.
pub struct Node {
    /// The node's name (`node.name`).
    pub name: String,
    /// The substrate every call goes to.
    pub substrate: Arc<dyn Substrate>,
    /// The ticket gate's ceiling (`substrate.ceiling`), for `health`.
    pub ceiling: u32,
    /// Where `put-secret` and `remove-secret` go (the store the substrate reads).
    pub secrets: Secrets,
    /// The node's store (the egress audit's admitted requests, for `admitted`).
    pub store: Arc<stockade_store::Store>,
    /// The request secret (HMAC key).
    pub secret: Vec<u8>,
    /// Nonces seen inside the window.
    pub nonces: Mutex<auth::Nonces>,
    /// Which key owns which container.
    pub owners: Mutex<Owners>,
    /// Grant leases.
    pub leases: Arc<Leases>,
    /// Answers of idempotency keys.
    pub answers: Mutex<idempotency::Cache>,
    /// A running `run` sends a heartbeat this often without other output.
    pub heartbeat: Duration,
    /// Largest request body.
    pub max_body: usize,
    /// Largest `run` body.
    pub max_run_body: usize,
    /// Permits to read a body over `max_body`.
    pub(crate) big_bodies: tokio::sync::Semaphore,
    /// Permits to read a body over [`SMALL_BODY`] whose signature is not yet checked.
    pub(crate) unverified: tokio::sync::Semaphore,
}

/// Bodies over [`SMALL_BODY`] read at once before their signature is checked (the
/// signature covers the body: it can only be checked once the body is in). Past it a
/// request is refused 503 at once rather than queued: the bound is what forged (well
/// formed, in time, unseen nonce, wrong signature) requests can make a node hold,
/// [`UNVERIFIED_BODIES`] times `api.max_body_bytes` at most.
pub const UNVERIFIED_BODIES: usize = 4;

/// A body declaring at most this many bytes is read without an [`UNVERIFIED_BODIES`]
/// permit: nearly every call's (an `ensure`, a `run` with a small stdin), so a
/// front's concurrent calls never meet the bound; its length is the most it can hold.
pub const SMALL_BODY: usize = 64 << 10;

/// Bodies over the plain bound read at once (each up to [`Node::max_run_body`]).
pub const BIG_BODIES: usize = 2;

/// A `run` body's bound: the largest stdin a front sends (an upload's archive,
/// [`stockade_node_protocol::MAX_STREAMED_STDIN`]) as base64, plus a MiB for the
/// rest of the command.
pub fn run_body_bound(max_body: usize) -> usize {
    let stdin = stockade_node_protocol::MAX_STREAMED_STDIN;
    max_body.max(stdin.div_ceil(3) * 4 + (1 << 20))
}

/// A node's numbers (from `[node]`, `[substrate]` and `[api]`).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The ticket gate's ceiling, for `health`.
    pub ceiling: u32,
    /// A grant's lease beyond its run's timeout.
    pub lease_grace: Duration,
    /// A running `run` sends a heartbeat this often without other output.
    pub heartbeat: Duration,
    /// Largest request body.
    pub max_body: usize,
}

impl Node {
    /// A node called `name` over `substrate` and `store`, verifying requests with
    /// `secret`.
    pub fn new(
        name: &str,
        substrate: Arc<dyn Substrate>,
        store: Arc<stockade_store::Store>,
        secrets: Secrets,
        secret: Vec<u8>,
        settings: Settings,
    ) -> Arc<Node> {
        Arc::new(Node {
            name: name.to_owned(),
            substrate,
            store,
            ceiling: settings.ceiling,
            secrets,
            secret,
            nonces: Mutex::new(auth::Nonces::new(NONCES)),
            owners: Mutex::new(Owners::default()),
            leases: Leases::new(settings.lease_grace),
            answers: Mutex::new(idempotency::Cache::new(
                idempotency::CAPACITY,
                idempotency::TTL,
            )),
            heartbeat: settings.heartbeat,
            max_body: settings.max_body,
            max_run_body: run_body_bound(settings.max_body),
            big_bodies: tokio::sync::Semaphore::new(BIG_BODIES),
            unverified: tokio::sync::Semaphore::new(UNVERIFIED_BODIES),
        })
    }

    /// The owner map.
    pub fn owners(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn answers(&self) -> std::sync::MutexGuard<'_, idempotency::Cache> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
