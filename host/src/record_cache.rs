//! The records' read cache (issue 25): a `records.get` answered from memory.
//!
//! Every `detached-status` reads its declaration, and every exec and linux substrate
//! call reads a record or two. A read from SQLite is a read transaction: in WAL mode
//! two `fcntl` locks on the shared-memory file, the WAL index header, the b-tree walk;
//! 7-10 µs here, a third of what the runtime adds to a status call
//! (docs/BENCHMARKS.md, "The records read from memory").
//!
//! Why it is never stale: the data directory belongs to one running instance (its
//! `flock`, datadir.rs), so every change to the `records` table is made by this
//! process through [`Store::put`](crate::store::Store::put) and
//! [`Store::remove`](crate::store::Store::remove). Each changes the cache only after
//! SQLite took the change, and while it holds the connection's lock; a miss is filled
//! while the reader holds that same lock. So an entry is always what the table holds.
//! (A process that writes the database file behind a running server's back, which
//! the data directory's lock forbids, would not be seen until the entry is dropped.)
//!
//! What it holds: the value, or its absence (a status of an unknown id reads two
//! missing records), of the [`CAPACITY`] most recent distinct names read or
//! written. A full cache is emptied, not walked: a consumer that reads random names
//! costs memory up to the bound and a refill, never more.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Most entries held. Each is a record of a few hundred bytes at most (a declaration,
/// a tombstone, a container id): a few MiB at the bound, and 1000 live containers'
/// records fit.
pub const CAPACITY: usize = 16_384;

/// A record's place: scope and name, unambiguous (the scope's length first).
fn place(scope: &str, name: &str) -> String {
    use std::fmt::Write;
    let mut k = String::with_capacity(scope.len() + name.len() + 8);
    let _ = write!(k, "{}:{scope}{name}", scope.len());
    k
}

/// What the cache knows of one record.
#[derive(Debug, PartialEq, Eq)]
pub enum Known {
    /// Not in the cache: read the table.
    Unknown,
    /// The table's value (`None`: no such record).
    Is(Option<String>),
}

/// The cache. Its own lock, so a hit never waits behind the connection (the audit
/// writer holds that for a whole batch).
pub struct RecordCache {
    entries: Mutex<HashMap<String, Option<String>>>,
    capacity: usize,
}

impl Default for RecordCache {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl RecordCache {
    /// A cache of at most `capacity` entries (0: nothing is kept).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, Option<String>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is known of `scope`/`name`.
    pub fn get(&self, scope: &str, name: &str) -> Known {
        match self.entries().get(&place(scope, name)) {
            Some(v) => Known::Is(v.clone()),
            None => Known::Unknown,
        }
    }

    /// The table holds `value` for `scope`/`name` (`None`: no record). Called only
    /// with the connection's lock held, after SQLite answered or took the change.
    pub fn set(&self, scope: &str, name: &str, value: Option<&str>) {
        if self.capacity == 0 {
            return;
        }
        let mut e = self.entries();
        let k = place(scope, name);
        if e.len() >= self.capacity && !e.contains_key(&k) {
            e.clear();
        }
        e.insert(k, value.map(str::to_owned));
    }

    /// Forget `scope`/`name` (a change whose outcome is not known: the next read
    /// goes to the table).
    pub fn forget(&self, scope: &str, name: &str) {
        self.entries().remove(&place(scope, name));
    }

    /// How many entries are held.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_unknown_until_read_or_written_then_what_the_table_holds() {
        let c = RecordCache::default();
        assert_eq!(c.get("k", "a"), Known::Unknown);
        c.set("k", "a", None);
        assert_eq!(c.get("k", "a"), Known::Is(None));
        c.set("k", "a", Some("v"));
        assert_eq!(c.get("k", "a"), Known::Is(Some("v".into())));
        c.forget("k", "a");
        assert_eq!(c.get("k", "a"), Known::Unknown);
    }

    #[test]
    fn places_do_not_collide_across_the_scope_name_split() {
        let c = RecordCache::default();
        c.set("ab", "c", Some("1"));
        c.set("a", "bc", Some("2"));
        c.set("1:a", "b", Some("3"));
        assert_eq!(c.get("ab", "c"), Known::Is(Some("1".into())));
        assert_eq!(c.get("a", "bc"), Known::Is(Some("2".into())));
        assert_eq!(c.get("1:a", "b"), Known::Is(Some("3".into())));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn a_full_cache_is_emptied_never_grown_past_its_bound() {
        let c = RecordCache::with_capacity(3);
        for n in ["a", "b", "c"] {
            c.set("k", n, Some(n));
        }
        c.set("k", "a", Some("again"));
        assert_eq!(c.len(), 3, "a known place is replaced, not added");
        c.set("k", "d", Some("d"));
        assert_eq!(c.len(), 1, "the fourth place empties the cache first");
        assert_eq!(c.get("k", "a"), Known::Unknown);
        assert_eq!(c.get("k", "d"), Known::Is(Some("d".into())));
        for i in 0..100 {
            c.set("k", &format!("n{i}"), None);
            assert!(c.len() <= 3);
        }
    }

    #[test]
    fn a_cache_of_capacity_zero_keeps_nothing() {
        let c = RecordCache::with_capacity(0);
        c.set("k", "a", Some("v"));
        assert_eq!(c.get("k", "a"), Known::Unknown);
        assert!(c.is_empty());
    }
}
