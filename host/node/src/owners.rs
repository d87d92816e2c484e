//! Which key owns which container on this node (docs/NODE.md: "a container is owned by
//! the key that `ensure`d it"). The node keeps the map itself, filled from the
//! substrate's own `ensure` and `current` answers, so the check needs no substrate
//! call and works the same for every substrate (`linux`, `mock`).
//!
//! A stopped container moves to a bounded list of retired ones: its owner naming it
//! again gets the substrate's own answer (it is gone), not a 403. A container the node
//! never answered to anyone (an id guessed, or of a previous run of the node) has no
//! owner: every key naming it is refused.

use std::collections::{HashMap, VecDeque};

/// How many stopped containers keep their owner.
pub const RETIRED: usize = 10_000;

/// The decision for one call naming a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// The key owns it (live or retired): the call goes on.
    Owned,
    /// Another key owns it: 403.
    Other,
    /// No key owns it here: 403 as well (the key did not `ensure` it).
    Unknown,
}

/// The owner map.
#[derive(Debug)]
pub struct Owners {
    live: HashMap<String, String>,
    retired: HashMap<String, String>,
    retired_order: VecDeque<String>,
    retired_cap: usize,
}

impl Default for Owners {
    fn default() -> Self {
        Owners::new(RETIRED)
    }
}

impl Owners {
    /// An empty map that remembers `retired_cap` stopped containers.
    pub fn new(retired_cap: usize) -> Owners {
        Owners {
            live: HashMap::new(),
            retired: HashMap::new(),
            retired_order: VecDeque::new(),
            retired_cap,
        }
    }

    /// The substrate answered `container` to `key` (`ensure` or `current`).
    pub fn record(&mut self, container: &str, key: &str) {
        self.live.insert(container.to_owned(), key.to_owned());
    }

    /// The container stopped (asked to, or on its own).
    pub fn retire(&mut self, container: &str) {
        let Some(key) = self.live.remove(container) else {
            return;
        };
        if self.retired_cap == 0 {
            return;
        }
        while self.retired.len() >= self.retired_cap {
            match self.retired_order.pop_front() {
                Some(old) => {
                    self.retired.remove(&old);
                }
                None => break,
            }
        }
        self.retired.insert(container.to_owned(), key);
        self.retired_order.push_back(container.to_owned());
    }

    /// May `key` name `container`?
    pub fn check(&self, container: &str, key: &str) -> Ownership {
        match self
            .live
            .get(container)
            .or_else(|| self.retired.get(container))
        {
            Some(owner) if owner == key => Ownership::Owned,
            Some(_) => Ownership::Other,
            None => Ownership::Unknown,
        }
    }

    /// The owner of a live container.
    pub fn owner(&self, container: &str) -> Option<&str> {
        self.live.get(container).map(String::as_str)
    }

    /// Live containers the node answered.
    pub fn live(&self) -> usize {
        self.live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_is_named_only_by_the_key_it_was_answered_to() {
        let mut o = Owners::new(2);
        o.record("c1", "alpha");
        o.record("c2", "beta");
        // (container, key, decision): rows read as the doc's sentences.
        let rows = [
            ("c1", "alpha", Ownership::Owned),   // its owner
            ("c1", "beta", Ownership::Other),    // another key: 403
            ("c9", "alpha", Ownership::Unknown), // never answered: 403
            ("c2", "beta", Ownership::Owned),
        ];
        for (c, k, want) in rows {
            assert_eq!(o.check(c, k), want, "{c} {k}");
        }
        assert_eq!(o.live(), 2);
        assert_eq!(o.owner("c1"), Some("alpha"));
    }

    #[test]
    fn a_stopped_container_keeps_its_owner_for_a_bounded_while() {
        let mut o = Owners::new(2);
        for (c, k) in [("c1", "a"), ("c2", "b"), ("c3", "c")] {
            o.record(c, k);
        }
        o.retire("c1");
        assert_eq!(o.check("c1", "a"), Ownership::Owned);
        assert_eq!(o.check("c1", "b"), Ownership::Other);
        assert_eq!(o.owner("c1"), None, "no longer live");
        o.retire("c2");
        o.retire("c3");
        // The oldest retired one is forgotten past the bound.
        assert_eq!(o.check("c1", "a"), Ownership::Unknown);
        assert_eq!(o.check("c3", "c"), Ownership::Owned);
        assert_eq!(o.live(), 0);
        // Retiring what is not live changes nothing.
        o.retire("c9");
        assert_eq!(o.check("c9", "a"), Ownership::Unknown);
    }
}
