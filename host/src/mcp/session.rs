//! The Streamable HTTP transport's sessions: a bounded table. A session is opened by
//! `initialize` and names its owner (the token that opened it) and its negotiated
//! revision; every later request must present its id and the same token.
//!
//! Bounded, so a flood of `initialize` calls cannot grow memory: at most `max`
//! sessions; one idle longer than `idle` is gone (checked when met, and swept before
//! every open); when the table is full, the least recently used session is dropped to
//! make room (its client's next request is a 404, and the protocol says a client then
//! initializes again). An id is chosen by the caller from a CSPRNG (`super::http`);
//! this table only keeps them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// At most this many sessions (the server's default).
pub const MAX_SESSIONS: usize = 256;
/// A session unused this long is gone (the server's default).
pub const IDLE: Duration = Duration::from_secs(30 * 60);

#[derive(Debug)]
struct Session {
    owner: String,
    version: &'static str,
    last_used: Instant,
}

/// What `open` did to make room.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened {
    /// Sessions dropped because they were idle too long.
    pub expired: usize,
    /// The least recently used session dropped because the table was full.
    pub evicted: Option<String>,
}

/// The table.
#[derive(Debug)]
pub struct Sessions {
    map: HashMap<String, Session>,
    max: usize,
    idle: Duration,
}

impl Sessions {
    /// An empty table of at most `max` (at least 1) sessions, each gone after `idle`.
    pub fn new(max: usize, idle: Duration) -> Self {
        Self {
            map: HashMap::new(),
            max: max.max(1),
            idle,
        }
    }

    /// How many sessions are held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Is the table empty?
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn expired(&self, s: &Session, now: Instant) -> bool {
        now.saturating_duration_since(s.last_used) > self.idle
    }

    /// Keep session `id` for `owner` at `version`, making room first.
    pub fn open(&mut self, id: String, owner: &str, version: &'static str, now: Instant) -> Opened {
        let before = self.map.len();
        let idle = self.idle;
        self.map
            .retain(|_, s| now.saturating_duration_since(s.last_used) <= idle);
        let expired = before - self.map.len();
        let mut evicted = None;
        if self.map.len() >= self.max
            && let Some(lru) = self
                .map
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone())
        {
            self.map.remove(&lru);
            evicted = Some(lru);
        }
        self.map.insert(
            id,
            Session {
                owner: owner.to_string(),
                version,
                last_used: now,
            },
        );
        Opened { expired, evicted }
    }

    /// The revision of session `id` if it is held, not idle too long, and `owner`'s;
    /// it counts as used now. Unknown, expired and another owner's are all `None`
    /// (answered alike: a 404).
    pub fn touch(&mut self, id: &str, owner: &str, now: Instant) -> Option<&'static str> {
        let s = self.map.get(id)?;
        if self.expired(s, now) {
            self.map.remove(id);
            return None;
        }
        let s = self.map.get_mut(id)?;
        if !crate::compare::same(s.owner.as_bytes(), owner.as_bytes()) {
            return None;
        }
        s.last_used = now;
        Some(s.version)
    }

    /// End session `id` if it is `owner`'s (and not expired); did it exist?
    pub fn close(&mut self, id: &str, owner: &str, now: Instant) -> bool {
        if self.touch(id, owner, now).is_none() {
            return false;
        }
        self.map.remove(id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: &str = "2025-11-25";

    #[test]
    fn a_session_answers_only_its_owner_and_only_until_idle() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(60);
        let mut s = Sessions::new(8, idle);
        s.open("a".into(), "tok", V, t0);
        let rows: &[(&str, &str, &str, Duration, Option<&str>)] = &[
            ("its owner, at once", "a", "tok", Duration::ZERO, Some(V)),
            ("another token", "a", "other", Duration::ZERO, None),
            ("a prefix of the token", "a", "to", Duration::ZERO, None),
            ("an unknown id", "b", "tok", Duration::ZERO, None),
            ("its owner within idle", "a", "tok", idle, Some(V)),
            ("used within idle keeps it", "a", "tok", idle * 2, Some(V)),
            ("idle too long", "a", "tok", idle * 4, None),
            ("gone once expired", "a", "tok", idle * 2, None),
        ];
        for (sentence, id, owner, at, want) in rows {
            assert_eq!(s.touch(id, owner, t0 + *at), *want, "{sentence}");
        }
        assert!(s.is_empty(), "the expired session was dropped");
    }

    #[test]
    fn a_flood_of_opens_never_holds_more_than_max() {
        let t0 = Instant::now();
        let mut s = Sessions::new(16, Duration::from_secs(60));
        for i in 0..10_000u64 {
            s.open(format!("s{i}"), "tok", V, t0 + Duration::from_millis(i));
            assert!(s.len() <= 16, "after {i}: {}", s.len());
        }
        assert_eq!(s.len(), 16);
        // The newest are kept, the oldest dropped.
        let now = t0 + Duration::from_secs(10);
        assert_eq!(s.touch("s9999", "tok", now), Some(V));
        assert_eq!(s.touch("s0", "tok", now), None);
    }

    #[test]
    fn a_full_table_drops_the_least_recently_used() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Sessions::new(2, Duration::from_secs(60));
        s.open("a".into(), "tok", V, t0);
        s.open("b".into(), "tok", V, t0 + ms(1));
        s.touch("a", "tok", t0 + ms(2));
        let o = s.open("c".into(), "tok", V, t0 + ms(3));
        assert_eq!(o.evicted.as_deref(), Some("b"), "b was used least recently");
        assert_eq!(s.touch("a", "tok", t0 + ms(4)), Some(V));
        assert_eq!(s.touch("c", "tok", t0 + ms(4)), Some(V));
    }

    #[test]
    fn idle_sessions_are_swept_before_an_open() {
        let t0 = Instant::now();
        let mut s = Sessions::new(4, Duration::from_secs(1));
        s.open("a".into(), "tok", V, t0);
        s.open("b".into(), "tok", V, t0);
        let o = s.open("c".into(), "tok", V, t0 + Duration::from_secs(5));
        assert_eq!(
            o,
            Opened {
                expired: 2,
                evicted: None
            }
        );
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn close_ends_only_the_owners_session() {
        let t0 = Instant::now();
        let mut s = Sessions::new(4, Duration::from_secs(60));
        s.open("a".into(), "tok", V, t0);
        assert!(!s.close("a", "other", t0), "another token cannot end it");
        assert!(!s.close("zz", "tok", t0), "an unknown id");
        assert!(s.close("a", "tok", t0));
        assert!(!s.close("a", "tok", t0), "already gone");
        assert!(s.is_empty());
    }
}
