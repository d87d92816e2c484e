//! The fence: one container's grant slot. A grant is opened (`apply`), replaced or
//! closed (`revoke`) atomically; closing it cancels everything it admitted and answers
//! what it admitted and denied.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::ask::Asks;
use crate::audit::{Admitted, DenialSink, now_ms};
use crate::rules::Grant;
use crate::secrets::Resolved;

/// The grant that is open right now, with what belongs to its lifetime.
pub(crate) struct Open {
    /// The fence id (recorded as a denial's `rule_set`).
    pub(crate) id: String,
    pub(crate) grant: Grant,
    /// Cancelled when this grant is revoked or replaced: every request and tunnel it
    /// admitted is cut off.
    pub(crate) revoked: CancellationToken,
    /// Requests denied while this grant was open.
    pub(crate) denials: AtomicU32,
    /// Requests admitted while this grant was open (each has, or is counted in, an
    /// audit record).
    pub(crate) admitted: AtomicU32,
    /// Audit records the rate bound left out while this grant was open; [`CLOSED`]
    /// once the fence closed and its summary row was written.
    pub(crate) suppressed: AtomicU64,
    /// The values of the secrets the grant's rules name (resolved when it opened).
    pub(crate) secrets: Resolved,
    /// The fenced run's process tree, once it starts ([`Fence::begin_run`]).
    pub(crate) tree: Mutex<Option<RunTree>>,
    /// This grant's teardown began ([`Fence::kill_runs`]): no run begins under it.
    /// Read and written under `tree`'s lock, so a run begins either before the kill
    /// (and is named by it) or not at all.
    pub(crate) killed: std::sync::atomic::AtomicBool,
    /// The run that began under this grant answered ([`Fence::run_answered`]): the
    /// teardown's kill finds it in the container, nothing of it is still on its way.
    pub(crate) answered: std::sync::atomic::AtomicBool,
    /// What the approver approved while this grant was open: one
    /// `rules::widening` rule per approval, for this grant only (it dies with it).
    pub(crate) widened: Mutex<Grant>,
}

/// The process tree of the run under a grant: its id, and when the run began. An id
/// may be one an earlier run ended with ([`Fence::end_run`]), so what the kernel said of
/// a tree by that name before `began` was said of another run's processes.
#[derive(Debug, Clone)]
pub(crate) struct RunTree {
    pub(crate) id: String,
    pub(crate) began: Instant,
}

pub(crate) struct FenceInner {
    pub(crate) key: String,
    pub(crate) container: String,
    pub(crate) open: Mutex<Option<Arc<Open>>>,
    /// Where a closing fence writes its summary row (set when the proxy is served).
    pub(crate) sink: std::sync::OnceLock<Arc<dyn DenialSink>>,
    /// The server's pending decisions, for an `ask` grant (set when wired).
    pub(crate) asks: std::sync::OnceLock<Arc<Asks>>,
    /// Tree ids whose leaf the container keeps empty for a next run
    /// ([`Fence::end_run`]), at most [`KEPT_TREES`].
    pub(crate) kept: Mutex<Vec<String>>,
    /// Tree ids a teardown named before their run answered ([`Fence::kill_runs`]):
    /// never given again (the container may refuse a run by that name), at most
    /// [`KEPT_TREES`], oldest out first.
    pub(crate) dead: Mutex<std::collections::VecDeque<String>>,
}

/// How many kept tree ids a fence remembers (the supervisor keeps as many leaves).
pub const KEPT_TREES: usize = 2;

/// How many torn-down trees a fence remembers ([`Fence::kill_runs`]): far more than
/// the runs whose answers can still be on their way at once.
pub const DEAD_TREES: usize = 64;

/// A run may not begin: its grant's teardown began ([`Fence::kill_runs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornDown;

/// [`Open::suppressed`] of a fence that has closed.
pub(crate) const CLOSED: u64 = u64::MAX;

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
pub struct Fence(pub(crate) Arc<FenceInner>);

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
            asks: std::sync::OnceLock::new(),
            kept: Mutex::new(Vec::new()),
            dead: Mutex::new(std::collections::VecDeque::new()),
        }))
    }

    /// Where this fence's `ask` grants hold requests for the approver (docs/EGRESS.md).
    /// Without it an `ask` grant denies as any other does.
    pub fn set_asks(&self, asks: Arc<Asks>) {
        let _ = self.0.asks.set(asks);
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
            killed: std::sync::atomic::AtomicBool::new(false),
            answered: std::sync::atomic::AtomicBool::new(false),
            widened: Mutex::new(Grant::deny_all()),
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
    pub(crate) fn attach(&self, sink: &Arc<dyn DenialSink>) {
        let _ = self.0.sink.set(sink.clone());
    }

    /// End `open`: cut off what it admitted, write its summary row if the audit's rate
    /// bound left records out (a flood must not hide what a fence let through),
    /// and return its counts.
    pub(crate) fn close(&self, open: &Open) -> FenceCounts {
        // Its pending decisions go first: none can be approved once it is closing.
        if let Some(asks) = self.0.asks.get() {
            asks.drop_fence(&open.id);
        }
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

    /// A run is about to start under the open grant: the id its process tree gets,
    /// so the proxy can tell its connections from anyone else's. `None` when no grant
    /// is open. The id is one an earlier run ended with ([`Fence::end_run`]: the
    /// container kept its leaf empty, and placing the run there costs less than a new
    /// cgroup), else a new UUID. An id is never given to two runs at once: it leaves
    /// the kept list here and returns only when its run ended with nothing left.
    /// [`TornDown`] once the grant's teardown began ([`Fence::kill_runs`]): a run that
    /// reaches the container after the teardown's kill would outlive its fence.
    pub fn begin_run(&self) -> Result<Option<String>, TornDown> {
        let Some(open) = self.current() else {
            return Ok(None);
        };
        let mut tree = open.tree.lock().unwrap_or_else(|p| p.into_inner());
        if open.killed.load(Ordering::SeqCst) {
            return Err(TornDown);
        }
        let kept = self.0.kept.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let id = kept.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        *tree = Some(RunTree {
            id: id.clone(),
            began: Instant::now(),
        });
        open.answered.store(false, Ordering::SeqCst);
        Ok(Some(id))
    }

    /// The run `tree` answered (its leader exited, kept or not): a teardown after
    /// this finds whatever is left of it in the container.
    pub fn run_answered(&self, tree: &str) {
        if let Some(open) = self.current() {
            let t = open.tree.lock().unwrap_or_else(|p| p.into_inner());
            if t.as_ref().is_some_and(|t| t.id == tree) {
                open.answered.store(true, Ordering::SeqCst);
            }
        }
    }

    /// The open grant's teardown kills its runs (before its revoke): from now on no
    /// run begins under it ([`Fence::begin_run`] answers [`TornDown`]). Answers the
    /// tree of a run that began and has not answered: its request may still be on its
    /// way to the container, overtaken by the kill, so the kill names it and the
    /// container refuses it if it comes later; that id is never given again. `None`:
    /// no grant open, no run began, or it answered (the kill finds what is left).
    pub fn kill_runs(&self) -> Option<String> {
        let open = self.current()?;
        let t = open.tree.lock().unwrap_or_else(|p| p.into_inner());
        open.killed.store(true, Ordering::SeqCst);
        if open.answered.load(Ordering::SeqCst) {
            return None;
        }
        let id = t.as_ref()?.id.clone();
        let mut dead = self.0.dead.lock().unwrap_or_else(|p| p.into_inner());
        if dead.len() >= DEAD_TREES {
            dead.pop_front();
        }
        dead.push_back(id.clone());
        self.0
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k| *k != id);
        Some(id)
    }

    /// The run `tree` (from [`Fence::begin_run`]) ended with its tree empty and its
    /// leaf kept by the container (the supervisor's `kept`): a next run may have its
    /// id. Nothing of the run lives, so its id names no process until it is given
    /// again. At most [`KEPT_TREES`] are remembered; the rest get new ids.
    pub fn end_run(&self, tree: &str) {
        if self
            .0
            .dead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|d| d == tree)
        {
            return;
        }
        let mut kept = self.0.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < KEPT_TREES && !kept.iter().any(|t| t == tree) {
            kept.push(tree.to_owned());
        }
    }

    /// A grant is open.
    pub fn is_open(&self) -> bool {
        self.slot().is_some()
    }

    /// The open grant: one Arc clone under a lock held for no longer than that.
    pub(crate) fn current(&self) -> Option<Arc<Open>> {
        self.slot().clone()
    }

    pub(crate) fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Open>>> {
        // A poisoned slot still holds a valid Option: keep serving decisions.
        self.0.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_gets_a_kept_tree_id_once_and_a_new_one_otherwise() {
        let f = Fence::new("k", "c");
        assert_eq!(f.begin_run(), Ok(None), "no grant, no tree");
        f.apply("f1", Grant::deny_all());
        let a = f.begin_run().unwrap().unwrap();
        let b = f.begin_run().unwrap().unwrap();
        assert_ne!(a, b, "nothing kept yet: new ids");
        assert!(uuid::Uuid::parse_str(&a).is_ok(), "{a}");
        f.end_run(&a);
        f.end_run(&a);
        assert_eq!(
            f.begin_run().unwrap().as_deref(),
            Some(a.as_str()),
            "kept, given again"
        );
        assert_ne!(
            f.begin_run().unwrap().as_deref(),
            Some(a.as_str()),
            "given once"
        );
        for t in ["t1", "t2", "t3"] {
            f.end_run(t);
        }
        let next: Vec<String> = (0..3).map(|_| f.begin_run().unwrap().unwrap()).collect();
        assert_eq!(next[..2], ["t2", "t1"], "at most {KEPT_TREES} remembered");
        assert!(!["t1", "t2", "t3"].contains(&next[2].as_str()), "{next:?}");
        f.end_run("t1");
        f.apply("f2", Grant::deny_all());
        assert_eq!(
            f.begin_run().unwrap().as_deref(),
            Some("t1"),
            "kept across grants"
        );
    }

    /// The abandoned-run race (docs/LINUX.md, "A teardown that overtakes its run"): a
    /// teardown's kill may reach the container before the run it tears down. Once it
    /// began, no run begins under the grant; a run that began and has not answered is
    /// named (the container refuses it by that name), and its id is never given again.
    #[test]
    fn a_teardown_stops_later_runs_and_names_the_one_still_on_its_way() {
        let f = Fence::new("k", "c");
        assert_eq!(f.kill_runs(), None, "no grant: nothing to name");
        // The kill before the run began: the run does not begin.
        f.apply("f1", Grant::deny_all());
        assert_eq!(f.kill_runs(), None, "no run began");
        assert_eq!(f.begin_run(), Err(TornDown));
        // A new grant is a new fence: runs begin again.
        f.apply("f2", Grant::deny_all());
        let t = f.begin_run().unwrap().unwrap();
        // The run began and has not answered: the kill names it, once killed it stays.
        assert_eq!(f.kill_runs().as_deref(), Some(t.as_str()));
        assert_eq!(f.begin_run(), Err(TornDown));
        // Its answer, late: its id is not kept for another run.
        f.end_run(&t);
        f.apply("f3", Grant::deny_all());
        assert_ne!(
            f.begin_run().unwrap().as_deref(),
            Some(t.as_str()),
            "never given again"
        );
        // A run that answered: the kill finds what is left, and names nothing.
        f.apply("f4", Grant::deny_all());
        let u = f.begin_run().unwrap().unwrap();
        f.run_answered(&u);
        f.end_run(&u);
        assert_eq!(f.kill_runs(), None);
        f.apply("f5", Grant::deny_all());
        assert_eq!(
            f.begin_run().unwrap().as_deref(),
            Some(u.as_str()),
            "kept as before"
        );
    }
}
