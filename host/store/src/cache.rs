//! The records' read cache (DESIGN §6): a `records.get` and a `records.list` answered
//! from memory.
//!
//! Every `detached-status` reads its declaration, and every exec and linux substrate
//! call reads a record or two. A read from SQLite is a read transaction: in WAL mode
//! two `fcntl` locks on the shared-memory file, the WAL index header, the b-tree walk;
//! 7-10 µs here, a third of what the runtime adds to a status call
//! (docs/BENCHMARKS.md, "The records read from memory").
//!
//! Why it is never stale: the data directory belongs to one running instance (its
//! `flock`, datadir.rs), so every change to the `records` table is made by this
//! process through [`Store::put`](crate::Store::put) and
//! [`Store::remove`](crate::Store::remove). Each changes the cache only after
//! SQLite took the change, and while it holds the connection's lock; a miss is filled
//! while the reader holds that same lock. So an entry is always what the table holds.
//! (A process that writes the database file behind a running server's back, which
//! the data directory's lock forbids, would not be seen until the entry is dropped.)
//!
//! What it holds: the value, or its absence (a status of an unknown id reads two
//! missing records), of the [`CAPACITY`] most recent distinct names read or
//! written. A full cache is emptied, not walked: a consumer that reads random names
//! costs memory up to the bound and a refill, never more.
//!
//! Lists too: every fenced exec lists its key's declarations (does the key hold a
//! detached process the teardown must spare?), one more read transaction per exec. A
//! list is kept by its scope and prefix, filled on a miss under the connection's lock
//! as a record is, and dropped by any change to a record of its scope whose name
//! starts with its prefix (the change's own lock held). A list longer than
//! [`LIST_ROWS`] is not kept (it is read from the table each time), and all lists
//! together count at most [`CAPACITY`] (each its rows and one more, so a flood of
//! keys listed empty is bounded too): past that, they are emptied.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Most entries held. Each is a record of a few hundred bytes at most (a declaration,
/// a tombstone, a container id): a few MiB at the bound, and 1000 live containers'
/// records fit.
pub const CAPACITY: usize = 16_384;

/// The longest list kept. A key holds at most a few dozen declarations and
/// tombstones; a longer list (a scope the guest does not write) is read each time.
pub const LIST_ROWS: usize = 256;

/// A list's rows: (name, value) in name order.
pub type Rows = Vec<(String, String)>;

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
    held: Mutex<Held>,
    capacity: usize,
}

#[derive(Default)]
struct Held {
    entries: HashMap<String, Option<String>>,
    /// scope → prefix → the rows the table holds there.
    lists: HashMap<String, HashMap<String, Rows>>,
    /// What `lists` hold, all together: each list counts its rows and one more (an
    /// empty list is an entry too: a key listed and found empty).
    listed: usize,
}

/// What a list counts against the bound: its rows, and one for the list itself.
fn cost(rows: &[(String, String)]) -> usize {
    rows.len() + 1
}

impl Held {
    /// `scope`/`name` holds `value`; past `capacity` entries, the entries are emptied
    /// first.
    fn set(&mut self, capacity: usize, scope: &str, name: &str, value: Option<&str>) {
        if capacity == 0 {
            return;
        }
        let k = place(scope, name);
        if self.entries.len() >= capacity && !self.entries.contains_key(&k) {
            self.entries.clear();
        }
        self.entries.insert(k, value.map(str::to_owned));
    }

    /// A change to `scope`/`name`: the lists it is in are no longer what the table
    /// holds.
    fn drop_lists_holding(&mut self, scope: &str, name: &str) {
        if let Some(by_prefix) = self.lists.get_mut(scope) {
            let mut gone = 0;
            by_prefix.retain(|prefix, rows| {
                let keep = !name.starts_with(prefix.as_str());
                if !keep {
                    gone += cost(rows);
                }
                keep
            });
            self.listed -= gone;
            if by_prefix.is_empty() {
                self.lists.remove(scope);
            }
        }
    }
}

impl Default for RecordCache {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl RecordCache {
    /// A cache of at most `capacity` entries, and lists counting at most `capacity`
    /// all together (0: nothing is kept).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            held: Mutex::new(Held::default()),
            capacity,
        }
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is known of `scope`/`name`.
    pub fn get(&self, scope: &str, name: &str) -> Known {
        match self.held().entries.get(&place(scope, name)) {
            Some(v) => Known::Is(v.clone()),
            None => Known::Unknown,
        }
    }

    /// The table holds `value` for `scope`/`name` (`None`: no record), as a read
    /// found. Called only with the connection's lock held, after SQLite answered.
    pub fn set(&self, scope: &str, name: &str, value: Option<&str>) {
        self.held().set(self.capacity, scope, name, value);
    }

    /// SQLite took a change: `scope`/`name` now holds `value` (`None`: removed).
    /// Called only with the connection's lock held. The lists holding the name are
    /// dropped.
    pub fn changed(&self, scope: &str, name: &str, value: Option<&str>) {
        let mut h = self.held();
        h.drop_lists_holding(scope, name);
        h.set(self.capacity, scope, name, value);
    }

    /// Forget `scope`/`name` and the lists holding it (a change whose outcome is not
    /// known: the next read goes to the table).
    pub fn forget(&self, scope: &str, name: &str) {
        let mut h = self.held();
        h.entries.remove(&place(scope, name));
        h.drop_lists_holding(scope, name);
    }

    /// The rows of `scope` whose names start with `prefix`, if known.
    pub fn list(&self, scope: &str, prefix: &str) -> Option<Rows> {
        self.held().lists.get(scope)?.get(prefix).cloned()
    }

    /// The table holds `rows` under `scope`/`prefix`, as a read found. Called only
    /// with the connection's lock held, after SQLite answered.
    pub fn set_list(&self, scope: &str, prefix: &str, rows: &[(String, String)]) {
        if self.capacity == 0 || cost(rows) > (LIST_ROWS + 1).min(self.capacity) {
            return;
        }
        let mut h = self.held();
        let old = h.lists.get_mut(scope).and_then(|m| m.remove(prefix));
        h.listed -= old.map_or(0, |o| cost(&o));
        if h.listed + cost(rows) > self.capacity {
            h.lists.clear();
            h.listed = 0;
        }
        h.lists
            .entry(scope.to_owned())
            .or_default()
            .insert(prefix.to_owned(), rows.to_vec());
        h.listed += cost(rows);
    }

    /// How many entries are held.
    pub fn len(&self) -> usize {
        self.held().entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many lists are held, and what they count against the bound (rows, and
    /// one per list).
    pub fn lists(&self) -> (usize, usize) {
        let h = self.held();
        (h.lists.values().map(HashMap::len).sum(), h.listed)
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

    fn rows(names: &[&str]) -> Rows {
        names
            .iter()
            .map(|n| (n.to_string(), "v".to_string()))
            .collect()
    }

    #[test]
    fn a_list_is_dropped_by_a_change_to_a_name_it_holds_and_kept_by_others() {
        // (what changes, scope, name; whether the list "k"/"decl/" survives)
        let rows_: &[(&str, &str, &str, bool)] = &[
            ("a name under the prefix", "k", "decl/x", false),
            ("a name the list holds", "k", "decl/a", false),
            ("a name outside the prefix", "k", "tomb/a", true),
            ("the prefix's own name", "k", "decl/", false),
            ("the same name in another scope", "other", "decl/a", true),
            ("a name that is a prefix of the prefix", "k", "dec", true),
        ];
        for (what, scope, name, kept) in rows_ {
            for forgot in [false, true] {
                let c = RecordCache::default();
                c.set_list("k", "decl/", &rows(&["decl/a"]));
                c.set_list("k", "", &rows(&["decl/a", "tomb/b"]));
                if forgot {
                    c.forget(scope, name);
                } else {
                    c.changed(scope, name, Some("v"));
                }
                assert_eq!(
                    c.list("k", "decl/").is_some(),
                    *kept,
                    "{what} (forgot: {forgot})"
                );
                assert_eq!(
                    c.list("k", "").is_some(),
                    *scope != "k",
                    "the whole scope's list, after {what}"
                );
            }
        }
    }

    #[test]
    fn a_list_read_is_what_was_set_and_a_read_fill_drops_no_list() {
        let c = RecordCache::default();
        assert_eq!(c.list("k", "decl/"), None);
        c.set_list("k", "decl/", &rows(&["decl/a", "decl/b"]));
        c.set("k", "decl/a", Some("v"));
        assert_eq!(c.list("k", "decl/"), Some(rows(&["decl/a", "decl/b"])));
        c.set_list("k", "decl/", &[]);
        assert_eq!(c.list("k", "decl/"), Some(vec![]), "an empty list is known");
        assert_eq!(c.lists(), (1, 1), "an empty list counts one");
    }

    #[test]
    fn lists_are_bounded_in_rows_and_a_long_list_is_not_kept() {
        // Each list counts its rows and one more.
        let c = RecordCache::with_capacity(6);
        c.set_list(
            "k",
            "p/",
            &rows(&["p/a", "p/b", "p/c", "p/d", "p/e", "p/f"]),
        );
        assert_eq!(c.list("k", "p/"), None, "longer than the bound: not kept");
        c.set_list("k", "p/", &rows(&["p/a", "p/b", "p/c"]));
        c.set_list("k", "p/", &rows(&["p/a", "p/b"]));
        assert_eq!(c.lists(), (1, 3), "a list replaced counts its new rows");
        c.set_list("j", "p/", &rows(&["p/a", "p/b"]));
        assert_eq!(c.lists(), (2, 6));
        c.set_list("i", "p/", &[]);
        assert_eq!(
            c.lists(),
            (1, 1),
            "past the bound the lists are emptied first"
        );
        c.changed("i", "p/a", None);
        assert_eq!(c.lists(), (0, 0));
        let none = RecordCache::with_capacity(0);
        none.set_list("k", "p/", &[]);
        assert_eq!(none.list("k", "p/"), None);
    }

    #[test]
    fn a_flood_of_keys_listed_empty_stays_within_the_bound() {
        let c = RecordCache::with_capacity(100);
        for i in 0..10_000 {
            c.set_list(&format!("key-{i}"), "decl/", &[]);
            assert!(c.lists().1 <= 100);
        }
        assert!(c.lists().0 <= 100);
    }
}
