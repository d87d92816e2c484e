//! The listener's connections that no door has claimed yet ("anonymous": accepted, no
//! request through an open door on them so far). They sit in one small pool of their
//! own, [`ANONYMOUS`] at most: a new connection past it evicts the oldest anonymous one
//! (its `kill` is cancelled and the listener closes it). So connections that never send
//! a valid token hold only this pool, for at most the header-read deadline each, and a
//! flood of them cannot keep a door's client out: its connection evicts the flood's
//! oldest and claims a door's share with its first request.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

/// Most anonymous connections at once (each waits at most the header-read deadline).
pub const ANONYMOUS: usize = 64;

/// The anonymous pool: connection ids in arrival order, each with the token that ends it.
#[derive(Debug)]
pub struct Anonymous {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    waiting: VecDeque<(u64, CancellationToken)>,
}

impl Anonymous {
    /// An empty pool of at most `cap`.
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            inner: Mutex::default(),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new connection enters (ended by cancelling `kill`); its id. At the cap, the
    /// oldest anonymous connection is evicted first.
    pub fn enter(&self, kill: CancellationToken) -> u64 {
        let mut i = self.inner();
        while i.waiting.len() >= self.cap {
            if let Some((id, oldest)) = i.waiting.pop_front() {
                // Debug, not info: a flood evicts at the rate it connects, and a line
                // each would be a log flood of the attacker's choosing.
                tracing::debug!(target: "stockade::preview", evicted = id, cap = self.cap, "an anonymous connection evicted");
                oldest.cancel();
            }
        }
        let id = i.next;
        i.next += 1;
        i.waiting.push_back((id, kill));
        id
    }

    /// Connection `id` leaves the pool (a door claimed it, or it ended). Idempotent.
    pub fn leave(&self, id: u64) {
        self.inner().waiting.retain(|(w, _)| *w != id);
    }

    /// How many anonymous connections are held.
    pub fn len(&self) -> usize {
        self.inner().waiting.len()
    }

    /// No anonymous connection is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of the table: a connection (by its index) enters or leaves.
    enum Step {
        Enter(usize),
        Leave(usize),
    }

    #[test]
    fn the_oldest_is_evicted_past_the_cap_and_a_claimed_one_never() {
        let pool = Anonymous::new(2);
        let t: Vec<CancellationToken> = (0..5).map(|_| CancellationToken::new()).collect();
        let mut ids = [None; 5];
        // (what happens, the steps, then which of t[0..5] are cancelled, the pool's size)
        let rows: [(&str, Vec<Step>, [bool; 5], usize); 6] = [
            (
                "two fit",
                vec![Step::Enter(0), Step::Enter(1)],
                [false; 5],
                2,
            ),
            (
                "a third evicts the oldest",
                vec![Step::Enter(2)],
                [true, false, false, false, false],
                2,
            ),
            (
                "1 is claimed by a door: it leaves",
                vec![Step::Leave(1)],
                [true, false, false, false, false],
                1,
            ),
            (
                "leaving twice, or an evicted id, changes nothing",
                vec![Step::Leave(1), Step::Leave(0)],
                [true, false, false, false, false],
                1,
            ),
            (
                "a fourth fits (1 left)",
                vec![Step::Enter(3)],
                [true, false, false, false, false],
                2,
            ),
            (
                "a fifth evicts 2, never the claimed 1",
                vec![Step::Enter(4)],
                [true, false, true, false, false],
                2,
            ),
        ];
        for (what, steps, cancelled, len) in rows {
            for step in steps {
                match step {
                    Step::Enter(i) => ids[i] = Some(pool.enter(t[i].clone())),
                    Step::Leave(i) => pool.leave(ids[i].expect("entered before")),
                }
            }
            let got: Vec<bool> = t.iter().map(CancellationToken::is_cancelled).collect();
            assert_eq!(got, cancelled, "{what}");
            assert_eq!(pool.len(), len, "{what}");
        }
    }
}
