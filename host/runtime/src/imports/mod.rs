//! Host implementations of the interfaces the guest imports, one file per WIT
//! interface, over one per-call state [`Ctx`].

pub mod clock;
mod log;
mod policy;
mod records;
mod substrate;

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::StoreLimits;

use crate::substrate::Substrate;
use stockade_egress::secrets::Secrets;
use stockade_store::Store;

pub use self::substrate::FenceState;

/// What the imports of one facade call share: the store data of a disposable instance.
///
/// No WASI: the guest imports the Stockade interfaces alone (`host/runtime/build.rs` turns
/// the WASI that std links for a panic's message into traps), so a call builds no
/// WASI context (its RNG seeding was 1.3 % of an instance).
pub struct Ctx {
    pub(crate) substrate: Arc<dyn Substrate>,
    pub(crate) store: Arc<Store>,
    pub(crate) floor: Arc<Vec<Vec<String>>>,
    /// The server's secrets: only their bindings cross into the guest, never a value.
    pub(crate) secrets: Secrets,
    pub(crate) limits: StoreLimits,
    /// Containers whose grant this call applied (or tried to) and has not revoked
    /// yet; the runtime settles whatever is left when the call ends (a trap included:
    /// invariant 1).
    pub(crate) open_fences: Vec<(String, FenceState)>,
    /// Keys whose batch opened with their `ensure`, applied on the container it
    /// answered, and did not answer: a fence may be open on the key's current
    /// container, which is not known yet (resolved by the guest's `current`, else by
    /// the runtime when the call ends).
    pub(crate) unresolved_fences: Vec<String>,
    /// Processes this call started (container, id). A call that traps never handed
    /// their ids to the consumer: the runtime kills them (nobody could stop them, and
    /// an undeclared process must not outlive the call into the next fence's grant).
    pub(crate) started_processes: Vec<(String, String)>,
    /// When the call started, and how long it has spent inside imports: the epoch
    /// deadline bounds guest compute, not a 20-minute `run`.
    pub(crate) started: Instant,
    pub(crate) in_imports: Duration,
    /// Where this call's run sends its live output (a streaming exec).
    pub(crate) output: Option<crate::substrate::OutputSink>,
    /// The caller's presence: when its sender is dropped (an HTTP client that went
    /// away), the run is abandoned and the guest's teardown kills it.
    pub(crate) caller: Option<tokio::sync::watch::Receiver<()>>,
    /// The host's own stdin for this call's run (an upload's archive), used once.
    pub(crate) stdin: Option<crate::substrate::StdinStream>,
    /// An interactive terminal for this call's run (`stockade shell`), used once.
    pub(crate) pty: Option<crate::substrate::pty::Attach>,
}

impl Ctx {
    /// Per-call state.
    pub fn new(
        substrate: Arc<dyn Substrate>,
        store: Arc<Store>,
        floor: Arc<Vec<Vec<String>>>,
        secrets: Secrets,
        limits: StoreLimits,
    ) -> Self {
        Self {
            substrate,
            store,
            floor,
            secrets,
            limits,
            open_fences: Vec::new(),
            unresolved_fences: Vec::new(),
            started_processes: Vec::new(),
            started: Instant::now(),
            in_imports: Duration::ZERO,
            output: None,
            caller: None,
            stdin: None,
            pty: None,
        }
    }

    /// Guest compute so far: wall time minus time inside imports.
    pub fn guest_compute(&self) -> Duration {
        self.started.elapsed().saturating_sub(self.in_imports)
    }

    /// Processes this call started.
    pub fn take_started_processes(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.started_processes)
    }

    /// Fences this call left open.
    pub fn take_open_fences(&mut self) -> Vec<(String, FenceState)> {
        std::mem::take(&mut self.open_fences)
    }

    /// Keys on whose current container this call may have left a fence open.
    pub fn take_unresolved_fences(&mut self) -> Vec<String> {
        std::mem::take(&mut self.unresolved_fences)
    }
}

/// `types` declares no functions; the trait is empty.
impl crate::bindings::stockade::sandbox::types::Host for Ctx {}
