//! Tombstones: a gone reason holds on every poll (a consumer polls from its own durable
//! steps, docs/LIFECYCLE.md, so one poll's answer must not change on the next).
//!
//! When a declaration is cleared for a reason the consumer did not cause (its process
//! is no longer tracked, its container stopped or cannot be reached), a tombstone
//! with that reason is written under the key first; `detached-status` of an id with
//! no declaration reads it. `gone(unknown)` is left for ids the key never started, or
//! stopped itself (stop-detached, abort, checkpoint). At most [`MAX_PER_KEY`]
//! tombstones are kept per key, oldest evicted first.

use crate::stockade::sandbox::types::GoneReason;

/// Record-name prefix of a tombstone; the value is `<reason> <at-ms>`.
pub const PREFIX: &str = "gone/";

/// Most tombstones kept per key (a bounded record: a key that starts processes
/// forever does not grow the store forever).
pub const MAX_PER_KEY: usize = 256;

/// Why a declaration was cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleared {
    /// The consumer stopped the process (stop-detached), or the container (abort,
    /// checkpoint): the id now reads `unknown`, as one it stopped.
    ByConsumer,
    /// The container no longer tracks the process (a status lookup, a teardown's
    /// reap, or a fence's kill-all fallback that killed it).
    NotTracked,
    /// The container stopped on its own, or cannot be reached.
    ContainerGone,
}

/// The reason a tombstone keeps, or none (the id reads `unknown`).
pub fn reason(cleared: Cleared) -> Option<GoneReason> {
    match cleared {
        Cleared::ByConsumer => None,
        Cleared::NotTracked => Some(GoneReason::NotTracked),
        Cleared::ContainerGone => Some(GoneReason::ContainerUnreachable),
    }
}

/// The record name of an id's tombstone.
pub fn record_name(id: &str) -> String {
    format!("{PREFIX}{id}")
}

/// A tombstone's value.
pub fn value(reason: GoneReason, at_ms: u64) -> String {
    let name = match reason {
        GoneReason::Unknown => "unknown",
        GoneReason::NotTracked => "not-tracked",
        GoneReason::ContainerUnreachable => "container-unreachable",
    };
    format!("{name} {at_ms}")
}

/// Parse a tombstone's value back: its reason and when it was written. A value that
/// does not parse is no tombstone (the id reads `unknown`).
pub fn parse(value: &str) -> Option<(GoneReason, u64)> {
    let (name, at) = value.split_once(' ')?;
    let reason = match name {
        "not-tracked" => GoneReason::NotTracked,
        "container-unreachable" => GoneReason::ContainerUnreachable,
        _ => return None,
    };
    Some((reason, at.parse().ok()?))
}

/// Which existing tombstones to evict so that `adding` more fit under `max`: the
/// oldest first (by time, then name for a stable order). `existing` is (name, at-ms).
pub fn evict(existing: &[(String, u64)], adding: usize, max: usize) -> Vec<String> {
    let over = (existing.len() + adding).saturating_sub(max);
    if over == 0 {
        return Vec::new();
    }
    let mut by_age: Vec<&(String, u64)> = existing.iter().collect();
    by_age.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    by_age
        .into_iter()
        .take(over)
        .map(|(n, _)| n.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cleared_declaration_keeps_the_reason_the_consumer_did_not_cause() {
        let rows = [
            (
                "stopped by the consumer: unknown, as an id it stopped",
                Cleared::ByConsumer,
                None,
            ),
            (
                "the container no longer tracks it: not-tracked, on every poll",
                Cleared::NotTracked,
                Some(GoneReason::NotTracked),
            ),
            (
                "the container stopped or cannot be reached: container-unreachable",
                Cleared::ContainerGone,
                Some(GoneReason::ContainerUnreachable),
            ),
        ];
        for (what, cleared, want) in rows {
            assert_eq!(reason(cleared), want, "{what}");
        }
    }

    #[test]
    fn tombstone_values_round_trip_and_junk_is_no_tombstone() {
        for r in [GoneReason::NotTracked, GoneReason::ContainerUnreachable] {
            assert_eq!(parse(&value(r, 42)), Some((r, 42)));
        }
        assert_eq!(parse("unknown 1"), None, "unknown needs no tombstone");
        assert_eq!(parse("not-tracked"), None);
        assert_eq!(parse("not-tracked x"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn the_oldest_tombstones_are_evicted_past_the_bound() {
        let t = |n: &str, at| (n.to_string(), at);
        let rows: &[(&str, Vec<(String, u64)>, usize, usize, &[&str])] = &[
            ("under the bound nothing goes", vec![t("a", 1)], 1, 3, &[]),
            (
                "exactly at the bound nothing goes",
                vec![t("a", 1), t("b", 2)],
                1,
                3,
                &[],
            ),
            (
                "past it the oldest go first",
                vec![t("c", 3), t("a", 1), t("b", 2)],
                2,
                3,
                &["a", "b"],
            ),
            (
                "equal times go by name",
                vec![t("y", 5), t("x", 5)],
                1,
                2,
                &["x"],
            ),
        ];
        for (what, existing, adding, max, want) in rows {
            assert_eq!(evict(existing, *adding, *max), *want, "{what}");
        }
    }
}
