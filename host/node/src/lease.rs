//! Grant leases (docs/NODE.md "Grant leases"): a grant a node opened is closed by the
//! node itself when its front stops looking after it, so a front that dies or loses
//! the link mid-fence leaves no open grant past the lease.
//!
//! The decision is [`Lease`], pure: a grant's lease runs `grace` after `apply-grant`;
//! while a `run` on its container is going, until that run's timeout plus the grace;
//! after the run, the grace again. A `revoke-grant` (or the container's stop) ends it.
//! [`Leases`] holds one per container and [`spawn`] is the task that, when one runs
//! out with the grant still open, kills every tracked tree of the container
//! (`kill-all`) and then revokes the grant, logging `lease expired`. Killing first: a
//! process left running after its grant closed could not reach anything, but one
//! left running *while* it is still open could; and a revoke without the kill would
//! leave the fenced command running with no one to collect it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use stockade_runtime::substrate::Substrate;

/// One container's lease, in milliseconds of a monotonic clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lease {
    /// A grant is open (applied, not yet revoked).
    open: bool,
    /// The lease's end from the last apply or run end.
    base_until: u64,
    /// Runs going: their id and their end (start + timeout + grace).
    runs: HashMap<u64, u64>,
    /// The open grant's number, unique on this node ([`Leases::open_grant`]).
    grant: u64,
}

/// What happened on a container, as the lease sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEvent {
    /// `apply-grant` opened a grant.
    Applied,
    /// A `run` started (its id, its timeout in ms).
    RunStarted(u64, u64),
    /// That run ended.
    RunEnded(u64),
    /// `revoke-grant`, the container's stop, or the node's own revoke.
    Revoked,
}

impl Lease {
    /// The lease after `event` at `now`, with `grace` ms of grace.
    pub fn on(&mut self, event: LeaseEvent, now: u64, grace: u64) {
        match event {
            LeaseEvent::Applied => {
                self.open = true;
                self.base_until = self.base_until.max(now.saturating_add(grace));
            }
            LeaseEvent::RunStarted(id, timeout) => {
                self.runs
                    .insert(id, now.saturating_add(timeout).saturating_add(grace));
            }
            LeaseEvent::RunEnded(id) => {
                self.runs.remove(&id);
                self.base_until = self.base_until.max(now.saturating_add(grace));
            }
            LeaseEvent::Revoked => {
                self.open = false;
                self.base_until = 0;
            }
        }
    }

    /// When the lease runs out (`None`: no grant open, nothing to close).
    pub fn expires_at(&self) -> Option<u64> {
        self.open
            .then(|| self.runs.values().copied().fold(self.base_until, u64::max))
    }

    /// Has it run out at `now` with the grant still open?
    pub fn expired(&self, now: u64) -> bool {
        self.expires_at().is_some_and(|t| now >= t)
    }

    /// Nothing to remember (no grant, no run).
    fn idle(&self) -> bool {
        !self.open && self.runs.is_empty()
    }
}

/// Every container's lease, shared by the request handlers and the expiry task.
pub struct Leases {
    grace: u64,
    start: tokio::time::Instant,
    state: Mutex<HashMap<String, Lease>>,
    next_run: std::sync::atomic::AtomicU64,
    next_grant: std::sync::atomic::AtomicU64,
    changed: Notify,
    /// Woken (all waiters) whenever a run ends.
    run_ends: Notify,
}

impl Leases {
    /// Leases with `grace`.
    pub fn new(grace: Duration) -> Arc<Leases> {
        Arc::new(Leases {
            grace: grace.as_millis() as u64,
            start: tokio::time::Instant::now(),
            state: Mutex::new(HashMap::new()),
            next_run: std::sync::atomic::AtomicU64::new(1),
            next_grant: std::sync::atomic::AtomicU64::new(1),
            changed: Notify::new(),
            run_ends: Notify::new(),
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lease>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record `event` on `container`.
    pub fn on(&self, container: &str, event: LeaseEvent) {
        let now = self.now();
        let mut s = self.state();
        let lease = s.entry(container.to_owned()).or_default();
        lease.on(event, now, self.grace);
        if event == LeaseEvent::Applied {
            lease.grant = self
                .next_grant
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if lease.idle() {
            s.remove(container);
        }
        drop(s);
        self.changed.notify_one();
    }

    /// The number of the grant open on `container` (`None`: none is): a batch that
    /// opened one tears down only while it is still that one (docs/NODE.md "Batches").
    pub fn open_grant(&self, container: &str) -> Option<u64> {
        self.state()
            .get(container)
            .filter(|l| l.open)
            .map(|l| l.grant)
    }

    /// A run is going on `container`.
    pub fn running(&self, container: &str) -> bool {
        self.state()
            .get(container)
            .is_some_and(|l| !l.runs.is_empty())
    }

    /// A run starts on `container`: its id for [`Leases::run_ended`].
    pub fn run_started(&self, container: &str, timeout: Duration) -> u64 {
        let id = self
            .next_run
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.on(
            container,
            LeaseEvent::RunStarted(id, timeout.as_millis() as u64),
        );
        id
    }

    /// The run `id` ended.
    pub fn run_ended(&self, container: &str, id: u64) {
        self.on(container, LeaseEvent::RunEnded(id));
        self.run_ends.notify_waiters();
    }

    /// Wait until no run is going on `container`, at most `wait`: false if one still is.
    pub async fn runs_ended(&self, container: &str, wait: Duration) -> bool {
        // Every apply asks: the common answer costs one lookup, no waiter.
        if !self.running(container) {
            return true;
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let ended = self.run_ends.notified();
            tokio::pin!(ended);
            // Registered before the check: a run that ends in between still wakes it.
            ended.as_mut().enable();
            if !self.running(container) {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return !self.running(container);
            }
        }
    }

    /// Containers whose lease ran out, and when the next one runs out.
    fn due(&self) -> (Vec<String>, Option<u64>) {
        let now = self.now();
        let s = self.state();
        let due = s
            .iter()
            .filter(|(_, l)| l.expired(now))
            .map(|(c, _)| c.clone())
            .collect();
        let next = s.values().filter_map(Lease::expires_at).min();
        (due, next)
    }
}

/// The task closing grants whose lease ran out: `kill-all`, then `revoke-grant`.
pub fn spawn(leases: Arc<Leases>, substrate: Arc<dyn Substrate>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let changed = leases.changed.notified();
            let (due, next) = leases.due();
            for container in due {
                expire(&leases, substrate.as_ref(), &container).await;
            }
            if !leases.due().0.is_empty() {
                continue;
            }
            match next {
                Some(t) => {
                    let at = leases.start + Duration::from_millis(t);
                    tokio::select! {
                        _ = changed => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => changed.await,
            }
        }
    })
}

async fn expire(leases: &Leases, substrate: &dyn Substrate, container: &str) {
    // The lease is ended first: a failure below is logged, not retried forever.
    leases.on(container, LeaseEvent::Revoked);
    if !substrate.open_grants().iter().any(|c| c == container) {
        return;
    }
    let killed = substrate.kill_all(container).await;
    let revoked = substrate.revoke_grant(container).await;
    tracing::warn!(
        target: "stockade::node",
        container,
        killed = ?killed.as_ref().ok(),
        kill_error = ?killed.as_ref().err(),
        denied = ?revoked.as_ref().ok().map(|c| c.denied),
        revoke_error = ?revoked.as_ref().err(),
        "lease expired"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: u64 = 1_000;

    /// Events at times, then the lease's end.
    fn after(events: &[(u64, LeaseEvent)]) -> Option<u64> {
        let mut l = Lease::default();
        for (t, e) in events {
            l.on(*e, *t, GRACE);
        }
        l.expires_at()
    }

    #[test]
    fn a_lease_runs_out_as_the_doc_says() {
        use LeaseEvent::*;
        type Row<'a> = (&'a str, &'a [(u64, LeaseEvent)], Option<u64>);
        let rows: &[Row<'_>] = &[
            ("no grant: no lease", &[], None),
            (
                "the grace after apply-grant",
                &[(100, Applied)],
                Some(1_100),
            ),
            (
                "a run going: its timeout plus the grace",
                &[(100, Applied), (200, RunStarted(1, 5_000))],
                Some(6_200),
            ),
            (
                "after the run: the grace again",
                &[
                    (100, Applied),
                    (200, RunStarted(1, 5_000)),
                    (700, RunEnded(1)),
                ],
                Some(1_700),
            ),
            (
                "two runs: the later end",
                &[
                    (0, Applied),
                    (10, RunStarted(1, 100)),
                    (20, RunStarted(2, 9_000)),
                    (30, RunEnded(1)),
                ],
                Some(10_020),
            ),
            (
                "a revoke ends it",
                &[(0, Applied), (10, RunStarted(1, 100)), (20, Revoked)],
                None,
            ),
            (
                "a run before the grant counts once the grant is open",
                &[(0, RunStarted(1, 10_000)), (5, Applied)],
                Some(11_000),
            ),
            (
                "a run that ended before the grant: the grant's own grace",
                &[(0, RunStarted(1, 10_000)), (1, RunEnded(1)), (500, Applied)],
                Some(1_500),
            ),
            (
                "a new grant after a revoke starts afresh",
                &[(0, Applied), (10, Revoked), (5_000, Applied)],
                Some(6_000),
            ),
            (
                "an absurd timeout does not overflow",
                &[(0, Applied), (1, RunStarted(1, u64::MAX))],
                Some(u64::MAX),
            ),
        ];
        for (why, events, want) in rows {
            assert_eq!(after(events), *want, "{why}");
        }
    }

    #[test]
    fn expired_is_at_or_after_the_end_with_the_grant_open() {
        let mut l = Lease::default();
        l.on(LeaseEvent::Applied, 0, GRACE);
        assert!(!l.expired(999));
        assert!(l.expired(1_000));
        l.on(LeaseEvent::Revoked, 1_001, GRACE);
        assert!(!l.expired(10_000));
    }

    #[tokio::test]
    async fn the_task_kills_then_revokes_a_grant_left_open() {
        use stockade_runtime::substrate::Housekeeping;
        use stockade_runtime::substrate::mock::Mock;
        let mock = Arc::new(Mock::new(4));
        let c = mock.ensure("k").await.unwrap();
        let grant =
            stockade_egress::rules::Grant::parse(&[stockade_grammar::rules::RuleSpec::new(
                "example.com",
                &[],
                None,
            )])
            .unwrap();
        mock.apply_grant(&c, "f", grant).await.unwrap();
        let leases = Leases::new(Duration::from_millis(50));
        leases.on(&c, LeaseEvent::Applied);
        let task = spawn(leases.clone(), mock.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !mock.open_grants().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "grant still open");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let ops = mock.ops();
        let kill = ops
            .iter()
            .rposition(|o| *o == "kill-all")
            .expect("a kill-all");
        let revoke = ops
            .iter()
            .rposition(|o| *o == "revoke-grant")
            .expect("a revoke");
        assert!(kill < revoke, "{ops:?}");
        task.abort();
    }
}
