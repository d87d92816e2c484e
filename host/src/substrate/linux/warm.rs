//! The warm pool (`substrate.warm`): containers built ahead of demand, so a new key's
//! first `ensure` does not wait for a supervisor to come up.
//!
//! A warm container is complete but belongs to no key: an id range, its storage, its
//! cgroups and limits, a supervisor that built its root and answered `ready`, and an
//! egress listener nobody serves yet. It holds no ticket (at most `ceiling + warm`
//! containers exist; the id pool is checked for that many). Nothing of a key is in it
//! until [`Inner::assign`] gives it one: the key's snapshot restored into
//! `/workspace`, the key's fence behind its proxy, a ticket, the key's record. A warm
//! container is handed out once and never returns to the pool: when its key is done
//! with it, it is torn down like any other, so nothing a workload did can reach
//! another key.
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
use std::time::Duration;

use tokio::sync::watch;

use super::container::Built;
use super::{CALL_TIMEOUT, Inner, STOP_DEADLINE};

/// How long after a take the refiller starts.
const REFILL_DELAY: Duration = Duration::from_millis(100);

/// The pool's state, as tests and benchmarks watch it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmStatus {
    /// Warm containers ready to be handed out.
    pub ready: usize,
    /// A refill is running.
    pub building: bool,
    /// The pool is closed (shutting down): nothing more is built.
    pub closed: bool,
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

struct State {
    ready: VecDeque<Built>,
    building: bool,
    closed: bool,
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
        });
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
            if s.building || next(self.warm.target, s.ready.len(), s.closed) == Next::Stop {
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
                        let stop = next(inner.warm.target, s.ready.len(), s.closed) == Next::Stop;
                        if stop {
                            s.building = false;
                        }
                        inner.warm.publish(&s);
                        if stop {
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

    /// Wait until the pool holds its target and no build runs (tests, benchmarks).
    pub(super) async fn warm_filled(&self, within: Duration) -> bool {
        let target = self.warm.target;
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
}
