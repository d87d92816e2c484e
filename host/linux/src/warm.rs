//! The warm pool (`substrate.warm`): containers built ahead of demand, so a new key's
//! first `ensure` does not wait for a supervisor to come up.
//!
//! A warm container is complete but belongs to no key: an id range, its storage, its
//! cgroups and limits, a supervisor that built its root and answered `ready`, and an
//! egress listener nobody serves yet. It holds no ticket. Nothing of a key is in it
//! until [`Inner::assign`] gives it one: the key's snapshot restored into
//! `/workspace`, the key's fence behind its proxy, a ticket, the key's record. A warm
//! container is handed out once and never returns to the pool: when its key is done
//! with it, it is torn down like any other, so nothing a workload did can reach
//! another key.
//!
//! **Adaptive size.** `substrate.warm` is the pool's floor. The pool
//! remembers when new keys arrived over the last [`HORIZON`]; its peak, the most
//! arrivals within any [`WINDOW`], is how many a burst asks for at once, and the pool
//! refills up to that peak ([`target`]): after one burst of 16 new keys, the next finds
//! 16 containers ready. The learned part is capped by [`LEARNED_CAP`] and by the
//! ticket gate's free tickets: a warm container holds no ticket, so the pool never
//! holds more than `substrate.warm` + the tickets nobody holds, and every container
//! that exists is still within `ceiling + warm` (what the id pool is checked for). A
//! pool of 0 stays off. When the arrivals age out of the horizon the target falls back
//! to the floor and the containers past it are discarded ([`Inner::trim_warm`]), oldest
//! first.
//!
//! One refiller at a time builds one container at a time (a burst of builds would
//! compete with the calls being served for the same CPUs), started at start-up and
//! [`REFILL_DELAY`] after every take (so the key that took a container runs its first
//! command without a build beside it: on 2 CPUs that halved its cold start). A build that fails is logged and ends the refill; the next take
//! starts another. A warm container whose supervisor died is discarded when it would
//! be handed out. Shutdown closes the pool, waits for the build in flight, and
//! discards every warm container.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::container::Built;
use super::{CALL_TIMEOUT, Inner, STOP_DEADLINE};

/// How long after a take the refiller starts.
const REFILL_DELAY: Duration = Duration::from_millis(100);

/// How long the pool remembers an arrival of a new key.
pub const HORIZON: Duration = Duration::from_secs(60);

/// Arrivals this close together are one burst (the peak counts them together).
pub const WINDOW: Duration = Duration::from_secs(1);

/// The most containers the pool holds because of what it learned (each is an id
/// range, a tmpfs and a supervisor: memory held for keys that may not come).
pub const LEARNED_CAP: usize = 16;

/// The pool's state, as tests and benchmarks watch it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmStatus {
    /// Warm containers ready to be handed out.
    pub ready: usize,
    /// A refill is running.
    pub building: bool,
    /// The pool is closed (shutting down): nothing more is built.
    pub closed: bool,
    /// How many it fills to now: the floor, or the learned peak ([`target`]).
    pub target: usize,
}

/// What the refiller does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Build one more container.
    Build,
    /// The pool is full or closed.
    Stop,
}

/// The refiller's decision (pure): build while the pool is open and below its target.
pub(super) fn next(target: usize, ready: usize, closed: bool) -> Next {
    if closed || ready >= target {
        Next::Stop
    } else {
        Next::Build
    }
}

/// The most arrivals within any [`WINDOW`] (pure): `arrivals` oldest first.
pub(super) fn peak(arrivals: &[Instant]) -> usize {
    let mut best = 0;
    let mut first = 0;
    for (i, t) in arrivals.iter().enumerate() {
        while t.saturating_duration_since(arrivals[first]) >= WINDOW {
            first += 1;
        }
        best = best.max(i + 1 - first);
    }
    best
}

/// How many containers the pool fills to (pure): its floor `base`, raised to the
/// learned `peak` within [`LEARNED_CAP`] and `base` + the gate's `free` tickets (so
/// live containers and warm ones stay within `ceiling + warm`). A pool of 0 is off.
pub(super) fn target(base: usize, peak: usize, free: usize) -> usize {
    if base == 0 {
        return 0;
    }
    base.max(peak.min(LEARNED_CAP).min(base.saturating_add(free)))
}

struct State {
    ready: VecDeque<Built>,
    building: bool,
    closed: bool,
    /// When new keys arrived (oldest first, within [`HORIZON`]).
    arrivals: VecDeque<Instant>,
    /// A trim of the learned part is scheduled.
    trimming: bool,
    /// The last target computed (published).
    target: usize,
}

impl State {
    /// Forget arrivals older than the horizon; the peak of the rest.
    fn peak(&mut self, now: Instant) -> usize {
        while self
            .arrivals
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= HORIZON)
        {
            self.arrivals.pop_front();
        }
        peak(self.arrivals.make_contiguous())
    }
}

/// The warm containers and their refiller's state.
pub(super) struct Warm {
    target: usize,
    state: Mutex<State>,
    status: watch::Sender<WarmStatus>,
}

impl Warm {
    pub(super) fn new(target: u32) -> Self {
        Self {
            target: target as usize,
            state: Mutex::new(State {
                ready: VecDeque::new(),
                building: false,
                closed: false,
                arrivals: VecDeque::new(),
                trimming: false,
                target: target as usize,
            }),
            status: watch::channel(WarmStatus::default()).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, s: &State) {
        self.status.send_replace(WarmStatus {
            ready: s.ready.len(),
            building: s.building,
            closed: s.closed,
            target: s.target,
        });
    }

    /// The target now, given the gate's free tickets (recorded for [`WarmStatus`]).
    fn retarget(&self, s: &mut State, free: usize) -> usize {
        let peak = s.peak(Instant::now());
        s.target = target(self.target, peak, free);
        s.target
    }

    /// Follow the pool's state.
    pub(super) fn watch(&self) -> watch::Receiver<WarmStatus> {
        self.status.subscribe()
    }

    /// The ids of the warm containers (tests).
    pub(super) fn ids(&self) -> Vec<String> {
        self.lock()
            .ready
            .iter()
            .map(|b| b.id().to_string())
            .collect()
    }
}

impl Inner {
    /// Start the refiller unless it runs, the pool is full, or it is closed.
    pub(super) fn refill(self: &Arc<Self>) {
        {
            let mut s = self.warm.lock();
            let target = self.warm.retarget(&mut s, self.gate.free());
            if s.building || next(target, s.ready.len(), s.closed) == Next::Stop {
                self.warm.publish(&s);
                return;
            }
            s.building = true;
            self.warm.publish(&s);
        }
        let inner = self.clone();
        tokio::spawn(async move {
            loop {
                let built = match inner.build().await {
                    Ok(built) => built,
                    Err(e) => {
                        tracing::warn!(target: "stockade::substrate", error = %e, "warm container not built; the next new key builds its own");
                        let mut s = inner.warm.lock();
                        s.building = false;
                        inner.warm.publish(&s);
                        return;
                    }
                };
                let late = {
                    let mut s = inner.warm.lock();
                    if s.closed {
                        Some(built)
                    } else {
                        tracing::debug!(target: "stockade::substrate", container = built.id(), ready = s.ready.len() + 1, "warm container ready");
                        s.ready.push_back(built);
                        // Decided and published under one lock: a take in between
                        // finds either a running refiller or none, never one about
                        // to stop.
                        let target = inner.warm.retarget(&mut s, inner.gate.free());
                        let stop = next(target, s.ready.len(), s.closed) == Next::Stop;
                        if stop {
                            s.building = false;
                        }
                        inner.warm.publish(&s);
                        if stop {
                            let learned = s.ready.len() > inner.warm.target && !s.trimming;
                            if learned {
                                s.trimming = true;
                            }
                            drop(s);
                            if learned {
                                inner.schedule_trim();
                            }
                            return;
                        }
                        None
                    }
                };
                if let Some(built) = late {
                    // Closed while it was built: gone before the refiller says it is done.
                    inner.discard(built).await;
                    let mut s = inner.warm.lock();
                    s.building = false;
                    inner.warm.publish(&s);
                    return;
                }
            }
        });
    }

    /// A warm container for a new key, if one is ready and alive (one whose
    /// supervisor died is discarded); the refiller then builds its replacement.
    pub(super) async fn take_warm(self: &Arc<Self>) -> Option<Built> {
        if self.warm.target > 0 {
            self.warm.lock().arrivals.push_back(Instant::now());
        }
        let found = loop {
            let Some(built) = self.warm.lock().ready.pop_front() else {
                break None;
            };
            if built.alive() {
                break Some(built);
            }
            tracing::warn!(target: "stockade::substrate", container = built.id(), "a warm container's supervisor died; discarded");
            self.discard(built).await;
        };
        {
            let s = self.warm.lock();
            self.warm.publish(&s);
        }
        // The key that took it runs its first command on a quiet machine: a build
        // (a clone, ~40 mounts) would compete with it for the CPUs.
        let inner = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REFILL_DELAY).await;
            inner.refill();
        });
        found
    }

    /// Close the pool: nothing more is built; wait for the build in flight, then
    /// discard every warm container.
    pub(super) async fn close_warm(self: &Arc<Self>) {
        {
            let mut s = self.warm.lock();
            s.closed = true;
            self.warm.publish(&s);
        }
        let mut status = self.warm.watch();
        let _ = tokio::time::timeout(
            CALL_TIMEOUT + STOP_DEADLINE,
            status.wait_for(|s| !s.building),
        )
        .await;
        let drained: Vec<Built> = self.warm.lock().ready.drain(..).collect();
        for built in drained {
            self.discard(built).await;
        }
        let s = self.warm.lock();
        self.warm.publish(&s);
    }

    /// In [`HORIZON`], discard the warm containers past the target then (the learned
    /// part whose arrivals aged out), oldest first; again while the pool holds more
    /// than its floor.
    fn schedule_trim(self: &Arc<Self>) {
        let inner = self.clone();
        let mut status = self.warm.watch();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(HORIZON) => {}
                    // Shutdown discards every warm container itself.
                    _ = status.wait_for(|s| s.closed) => return,
                }
                let (excess, again) = {
                    let mut s = inner.warm.lock();
                    if s.closed {
                        s.trimming = false;
                        return;
                    }
                    let target = inner.warm.retarget(&mut s, inner.gate.free());
                    let n = s.ready.len().saturating_sub(target);
                    let excess: Vec<Built> = s.ready.drain(..n).collect();
                    let again = s.ready.len() > inner.warm.target;
                    s.trimming = again;
                    inner.warm.publish(&s);
                    (excess, again)
                };
                if !excess.is_empty() {
                    tracing::info!(target: "stockade::substrate", discarded = excess.len(), "warm pool back towards its floor (the burst it learned aged out)");
                }
                for built in excess {
                    inner.discard(built).await;
                }
                if !again {
                    return;
                }
            }
        });
    }

    /// Wait until the pool holds its target and no build runs (tests, benchmarks).
    pub(super) async fn warm_filled(&self, within: Duration) -> bool {
        let target = {
            let mut s = self.warm.lock();
            let t = self.warm.retarget(&mut s, self.gate.free());
            self.warm.publish(&s);
            t
        };
        let mut status = self.warm.watch();
        tokio::time::timeout(
            within,
            status.wait_for(|s| s.ready >= target && !s.building),
        )
        .await
        .is_ok_and(|r| r.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refiller_builds_while_open_and_below_target() {
        let rows = [
            // (target, ready, closed, next)
            (2, 0, false, Next::Build),
            (2, 1, false, Next::Build),
            (2, 2, false, Next::Stop),
            (2, 3, false, Next::Stop),
            (0, 0, false, Next::Stop),
            (2, 0, true, Next::Stop),
            (2, 1, true, Next::Stop),
        ];
        for (target, ready, closed, want) in rows {
            assert_eq!(
                next(target, ready, closed),
                want,
                "target {target} ready {ready} closed {closed}"
            );
        }
    }

    #[test]
    fn the_peak_is_the_most_arrivals_within_one_window() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let rows: [(&[u64], usize); 7] = [
            (&[], 0),
            (&[0], 1),
            // A burst of four at once.
            (&[0, 0, 0, 0], 4),
            // Spread: never two within a window.
            (&[0, 1000, 2000, 3000], 1),
            // Two bursts: the larger counts.
            (&[0, 10, 20, 5000, 5001, 5002, 5003, 5004], 5),
            // A window is half-open: 999 ms apart is one burst, 1000 ms two.
            (&[0, 999], 2),
            (&[0, 500, 1000, 1499], 3),
        ];
        for (offsets, want) in rows {
            let arrivals: Vec<Instant> = offsets.iter().map(|o| ms(*o)).collect();
            assert_eq!(peak(&arrivals), want, "{offsets:?}");
        }
    }

    #[test]
    fn the_target_is_the_learned_peak_within_the_cap_and_the_free_tickets() {
        let rows = [
            // (floor, peak, free tickets, target)
            // Nothing learned: the floor.
            (2, 0, 16, 2),
            (2, 1, 16, 2),
            // A burst of 16: the pool fills to 16.
            (2, 16, 16, 16),
            (2, 16, 40, 16),
            // Past the cap: the cap.
            (2, 100, 100, LEARNED_CAP),
            // The gate: at most the floor + the tickets nobody holds.
            (2, 16, 5, 7),
            (2, 16, 0, 2),
            // A floor above the peak stays.
            (8, 3, 0, 8),
            // A pool of 0 is off, whatever came.
            (0, 16, 16, 0),
        ];
        for (base, peak, free, want) in rows {
            assert_eq!(
                target(base, peak, free),
                want,
                "floor {base} peak {peak} free {free}"
            );
        }
    }
}
