//! Idempotent retries (docs/NODE.md "Retries and idempotency"): a front gives every
//! logical call one `x-stockade-idempotency` key and retries only when no answer
//! arrived; the node remembers each key's answer for [`TTL`] so a retry gets the first
//! answer instead of doing the call twice, and a retry of a call still going (a long
//! `run`) waits for it.
//!
//! Entries are per (sandbox key, call, idempotency key): one key cannot read another's
//! answers. The cache is bounded: when full, expired entries go first, then the oldest
//! finished one; when every entry is a call still going, the new call is done without
//! being remembered ([`Begin::Untracked`]) rather than forgetting a call in flight.
//!
//! [`Cache`] is the decision, pure but for the clock passed in; the handler does the
//! call and reports its answer with [`Cache::finish`].

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::sync::watch;

/// How long an answer is remembered.
pub const TTL: Duration = Duration::from_secs(600);

/// Most entries held.
pub const CAPACITY: usize = 20_000;

/// One remembered answer: the status and body of a plain call, or a `run`'s final
/// NDJSON line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// HTTP status.
    pub status: u16,
    /// The body (a `run`: its `result` or `error` line, newline included).
    pub body: bytes::Bytes,
}

/// What an entry is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Id {
    /// The sandbox key that signed it ("" for a node-wide call).
    pub key: String,
    /// The call.
    pub call: String,
    /// The idempotency key.
    pub idempotency: String,
}

#[derive(Debug)]
enum Entry {
    Going(watch::Receiver<Option<Stored>>),
    Done(Stored),
}

/// What to do with a call carrying an idempotency key.
#[derive(Debug)]
pub enum Begin {
    /// First time: do the call, then [`Cache::finish`] (the sender tells waiters).
    Fresh(watch::Sender<Option<Stored>>),
    /// Answered before: this is the answer.
    Done(Stored),
    /// Still going: wait for the answer on this.
    Wait(watch::Receiver<Option<Stored>>),
    /// The cache is full of calls in flight: do the call, remember nothing.
    Untracked,
}

/// The cache.
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<Id, (u64, Entry)>,
    order: VecDeque<(u64, Id)>,
    capacity: usize,
    ttl_ms: u64,
}

impl Cache {
    /// A cache of at most `capacity` entries, each kept `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Cache {
        Cache {
            entries: HashMap::new(),
            order: VecDeque::new(),
            capacity,
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    /// A call with `id` arrives at `now_ms`.
    pub fn begin(&mut self, id: &Id, now_ms: u64) -> Begin {
        self.expire(now_ms);
        match self.entries.get(id) {
            Some((_, e)) if Self::forgettable(e) && matches!(e, Entry::Going(_)) => {
                // Its doer went away without an answer: this attempt does the call.
                self.entries.remove(id);
            }
            Some((_, Entry::Done(s))) => return Begin::Done(s.clone()),
            Some((_, Entry::Going(rx))) => return Begin::Wait(rx.clone()),
            None => {}
        }
        if self.entries.len() >= self.capacity && !self.evict_one_done() {
            return Begin::Untracked;
        }
        let (tx, rx) = watch::channel(None);
        self.entries.insert(id.clone(), (now_ms, Entry::Going(rx)));
        self.order.push_back((now_ms, id.clone()));
        Begin::Fresh(tx)
    }

    /// The call `id` answered `stored`: remember it and tell whoever waits.
    pub fn finish(&mut self, id: &Id, tx: watch::Sender<Option<Stored>>, stored: Stored) {
        if let Some((_, e)) = self.entries.get_mut(id) {
            *e = Entry::Done(stored.clone());
        }
        let _ = tx.send(Some(stored));
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some((t, id)) = self.order.front() {
            if now_ms.saturating_sub(*t) < self.ttl_ms {
                break;
            }
            match self.entries.get(id) {
                // A call still going past the TTL stays: its waiters need the answer.
                Some((at, e)) if at == t && !Self::forgettable(e) => break,
                Some((at, _)) if at == t => {
                    self.entries.remove(id);
                }
                // A record of an entry since replaced.
                _ => {}
            }
            self.order.pop_front();
        }
    }

    /// A finished answer, or a call whose doer went away without one.
    fn forgettable(e: &Entry) -> bool {
        match e {
            Entry::Done(_) => true,
            Entry::Going(rx) => rx.has_changed().is_err() && rx.borrow().is_none(),
        }
    }

    fn evict_one_done(&mut self) -> bool {
        let Some(pos) = self.order.iter().position(|(t, id)| {
            matches!(self.entries.get(id), Some((at, e)) if at == t && Self::forgettable(e))
        }) else {
            return false;
        };
        let (_, id) = self.order.remove(pos).expect("position exists");
        self.entries.remove(&id);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str, call: &str, idem: &str) -> Id {
        Id {
            key: key.into(),
            call: call.into(),
            idempotency: idem.into(),
        }
    }

    fn stored(body: &str) -> Stored {
        Stored {
            status: 200,
            body: bytes::Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn a_retry_gets_the_first_answer_and_others_do_not() {
        let mut c = Cache::new(10, TTL);
        let a = id("alpha", "ensure", "i1");
        let Begin::Fresh(tx) = c.begin(&a, 0) else {
            panic!("first time is fresh")
        };
        // While it is going, a retry waits for it.
        let Begin::Wait(mut rx) = c.begin(&a, 1) else {
            panic!("a retry of a call going waits")
        };
        c.finish(&a, tx, stored("{\"ok\":\"c1\"}"));
        assert_eq!(
            rx.borrow_and_update().clone(),
            Some(stored("{\"ok\":\"c1\"}"))
        );
        // Then it gets the answer; another key, call or idempotency key does not.
        assert!(matches!(c.begin(&a, 2), Begin::Done(s) if s == stored("{\"ok\":\"c1\"}")));
        for other in [
            id("beta", "ensure", "i1"),
            id("alpha", "current", "i1"),
            id("alpha", "ensure", "i2"),
        ] {
            assert!(matches!(c.begin(&other, 3), Begin::Fresh(_)), "{other:?}");
        }
    }

    #[test]
    fn answers_are_forgotten_after_the_ttl_and_the_cache_is_bounded() {
        let ttl = Duration::from_millis(100);
        let mut c = Cache::new(2, ttl);
        let (a, b, d) = (
            id("k", "run", "a"),
            id("k", "run", "b"),
            id("k", "run", "d"),
        );
        let Begin::Fresh(tx) = c.begin(&a, 0) else {
            panic!()
        };
        c.finish(&a, tx, stored("a"));
        assert!(matches!(c.begin(&a, 99), Begin::Done(_)));
        let Begin::Fresh(_tx_a) = c.begin(&a, 100) else {
            panic!("expired: done anew")
        };
        // Full of calls still going: the next is done untracked, none forgotten.
        let Begin::Fresh(_tx_b) = c.begin(&b, 101) else {
            panic!()
        };
        assert_eq!(c.len(), 2);
        assert!(matches!(c.begin(&d, 102), Begin::Untracked));
        assert!(matches!(c.begin(&b, 103), Begin::Wait(_)));
        // A call going past the TTL is kept for its waiters.
        assert!(matches!(c.begin(&b, 500), Begin::Wait(_)));
    }

    #[test]
    fn when_full_the_oldest_finished_answer_goes_first() {
        let mut c = Cache::new(2, TTL);
        let (a, b, d) = (id("k", "x", "a"), id("k", "x", "b"), id("k", "x", "d"));
        let Begin::Fresh(_going) = c.begin(&a, 0) else {
            panic!()
        };
        let Begin::Fresh(tx) = c.begin(&b, 1) else {
            panic!()
        };
        c.finish(&b, tx, stored("b"));
        let Begin::Fresh(_tx_d) = c.begin(&d, 2) else {
            panic!("b's answer made room")
        };
        assert!(
            matches!(c.begin(&a, 3), Begin::Wait(_)),
            "the call going stays"
        );
        assert!(
            matches!(c.begin(&b, 4), Begin::Untracked),
            "b was evicted, and the cache is full of calls going"
        );
    }

    #[test]
    fn a_call_whose_doer_went_away_is_done_again() {
        let mut c = Cache::new(1, TTL);
        let a = id("k", "x", "a");
        let Begin::Fresh(tx) = c.begin(&a, 0) else {
            panic!()
        };
        let Begin::Wait(mut rx) = c.begin(&a, 1) else {
            panic!()
        };
        drop(tx);
        assert!(rx.has_changed().is_err(), "the waiter learns it");
        let _ = rx.borrow_and_update();
        assert!(matches!(c.begin(&a, 2), Begin::Fresh(_)));
    }
}
