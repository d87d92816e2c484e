//! Which node a key's container lives on (docs/NODE.md "Capacity and placement").
//!
//! A key's container lives on one node: its snapshot, artifacts and denials are there.
//! The front records the key's node durably (the store's `placements` table), so a
//! restarted front sends the key back to the same node. A new key goes to the node with
//! the highest rendezvous score, SHA-256(node name ‖ 0 ‖ key) read as a big-endian
//! number: every front computes the same order without talking to the others, and
//! adding or removing a node moves only the keys whose best node changed. If that node
//! answers `over-capacity` or cannot be reached, the next by score is tried, and so on
//! ([`falls_through`]); a placed key never moves (its node being down is `unreachable`).
//!
//! [`order`] and [`falls_through`] are pure and table-tested; [`Placements`] is the
//! durable table behind them.

use std::sync::Arc;

use ring::digest;

use stockade_runtime::substrate::SubstrateError;
use stockade_store::Store;

/// The rendezvous score of `node` for `key`: SHA-256(name ‖ 0x00 ‖ key), compared as a
/// big-endian number (byte-wise, which is the same order).
pub fn score(node: &str, key: &str) -> [u8; 32] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(node.as_bytes());
    ctx.update(&[0]);
    ctx.update(key.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The indices of `nodes` in the order a new `key` tries them: highest score first
/// (a tie, which SHA-256 makes unheard of, goes to the name that sorts first).
pub fn order(nodes: &[&str], key: &str) -> Vec<usize> {
    let mut scored: Vec<(usize, [u8; 32])> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (i, score(n, key)))
        .collect();
    scored.sort_by(|(a, sa), (b, sb)| sb.cmp(sa).then_with(|| nodes[*a].cmp(nodes[*b])));
    scored.into_iter().map(|(i, _)| i).collect()
}

/// Does a NEW key go on to the next node after this answer from one? Only when the
/// node could not take it: its gate is full, or it could not be reached. Anything else
/// (an invalid request, a failure) is the answer.
pub fn falls_through(e: &SubstrateError) -> bool {
    matches!(
        e,
        SubstrateError::OverCapacity | SubstrateError::Unreachable(_)
    )
}

/// The error a new key gets when every node refused it: `over-capacity` when any node
/// was full (the fleet is full: the caller may retry later), else the last error.
pub fn exhausted(errors: Vec<SubstrateError>) -> SubstrateError {
    if errors.contains(&SubstrateError::OverCapacity) {
        return SubstrateError::OverCapacity;
    }
    errors
        .into_iter()
        .next_back()
        .unwrap_or_else(|| SubstrateError::Unreachable("no node is configured".into()))
}

/// The durable placements: key → node name.
#[derive(Clone)]
pub struct Placements {
    store: Arc<Store>,
}

impl Placements {
    /// The placements in `store`.
    pub fn new(store: Arc<Store>) -> Placements {
        Placements { store }
    }

    /// The node `key` was placed on, if any.
    pub fn get(&self, key: &str) -> Result<Option<String>, SubstrateError> {
        self.store
            .placement(key)
            .map_err(|e| SubstrateError::Failed(format!("placement of {key:?}: {e}")))
    }

    /// Record `key` on `node` (durable before the caller answers).
    pub fn set(&self, key: &str, node: &str) -> Result<(), SubstrateError> {
        self.store
            .place(key, node)
            .map_err(|e| SubstrateError::Failed(format!("placement of {key:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_score_is_sha256_of_name_zero_key() {
        // sha256(b"a\0k"), computed independently (python3 hashlib).
        assert_eq!(
            stockade_node_protocol::auth::hex(&score("a", "k")),
            "9a2a77afb0d50c76464e852f250f179997217d5e6d61f2630d825bbaca8039a4"
        );
        // The separator matters: ("ab", "c") and ("a", "bc") differ.
        assert_ne!(score("ab", "c"), score("a", "bc"));
    }

    #[test]
    fn the_order_of_nodes_for_a_key() {
        let nodes = ["node-1", "node-2", "node-3"];
        // (key, order), computed independently (python3: sorted by
        // hashlib.sha256(name + b"\0" + key).digest(), highest first).
        let rows: [(&str, [usize; 3]); 5] = [
            ("alpha", [1, 0, 2]),
            ("beta", [0, 1, 2]),
            ("gamma", [1, 2, 0]),
            ("k-0", [0, 1, 2]),
            ("", [2, 1, 0]),
        ];
        for (key, want) in &rows {
            assert_eq!(order(&nodes, key), want.to_vec(), "key {key:?}");
        }
        // The order of the list does not matter: the same node comes first.
        let reversed = ["node-3", "node-2", "node-1"];
        for (key, _) in &rows {
            assert_eq!(
                nodes[order(&nodes, key)[0]],
                reversed[order(&reversed, key)[0]],
                "key {key:?}"
            );
        }
        // One node: itself. None: nothing.
        assert_eq!(order(&["only"], "k"), vec![0]);
        assert!(order(&[], "k").is_empty());
    }

    #[test]
    fn keys_spread_over_nodes_and_removing_a_node_moves_only_its_keys() {
        let three = ["n1", "n2", "n3"];
        let two = ["n1", "n2"];
        let mut per = [0u32; 3];
        for i in 0..300 {
            let k = format!("key-{i}");
            let first = order(&three, &k)[0];
            per[first] += 1;
            let after = two[order(&two, &k)[0]];
            if first < 2 {
                assert_eq!(after, three[first], "{k} stayed on its node");
            }
        }
        for (i, n) in per.iter().enumerate() {
            assert!(*n > 60, "node {i} got {n} of 300 keys");
        }
    }

    #[test]
    fn a_new_key_falls_through_only_when_the_node_could_not_take_it() {
        let rows = [
            (SubstrateError::OverCapacity, true),
            (SubstrateError::Unreachable("down".into()), true),
            (SubstrateError::Invalid("bad".into()), false),
            (SubstrateError::Failed("no".into()), false),
            (SubstrateError::Trap("t".into()), false),
        ];
        for (e, want) in rows {
            assert_eq!(falls_through(&e), want, "{e}");
        }
    }

    #[test]
    fn every_node_refusing_is_over_capacity_when_one_was_full() {
        let u = || SubstrateError::Unreachable("down".into());
        assert_eq!(
            exhausted(vec![u(), SubstrateError::OverCapacity]),
            SubstrateError::OverCapacity
        );
        assert_eq!(exhausted(vec![u(), u()]), u());
        assert!(matches!(exhausted(vec![]), SubstrateError::Unreachable(_)));
    }

    #[test]
    fn a_placement_is_durable() {
        let dir = std::env::temp_dir().join(format!("stockade-placement-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        {
            let p = Placements::new(Arc::new(Store::open_in(&dir).unwrap()));
            assert_eq!(p.get("k").unwrap(), None);
            p.set("k", "node-2").unwrap();
            assert_eq!(p.get("k").unwrap().as_deref(), Some("node-2"));
        }
        let p = Placements::new(Arc::new(Store::open_in(&dir).unwrap()));
        assert_eq!(p.get("k").unwrap().as_deref(), Some("node-2"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
