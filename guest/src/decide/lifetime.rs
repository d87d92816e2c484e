//! A key's lifetime and metadata (docs/DESIGN.md §2, "Lifetime, metadata and
//! listing"): how the guest records them, what may be recorded, and which lifetimes
//! have ended. The runtime asks the guest to `expire` every second; what ends is the
//! guest's decision, made here.
//!
//! Records: the lifetime of key `k` is `k` in scope [`LIFETIMES`] (so one listing finds
//! every lifetime), `"<ends-at-ms> <abort|checkpoint>"`; its metadata is `meta/<name>` in
//! its own scope; a key is *known* (listed, described) from its first lifetime or
//! metadata until it is forgotten (`forget`, or a lifetime ending in an abort): `k` in
//! scope [`KNOWN`]. A scope name starting with `~` is never a key (keys are
//! `[A-Za-z0-9._-]`).

/// The scope holding every key's lifetime, by key.
pub const LIFETIMES: &str = "~lifetimes";
/// The scope holding every known key, by key.
pub const KNOWN: &str = "~known";
/// Record-name prefix of a metadata entry (in the key's scope).
pub const META_PREFIX: &str = "meta/";

/// Most metadata entries one key holds.
pub const MAX_ENTRIES: usize = 64;
/// Longest metadata name, in characters (as JSON Schema's `maxLength` counts).
pub const MAX_NAME: usize = 128;
/// Longest metadata value, in characters.
pub const MAX_VALUE: usize = 1024;
/// Most keys one listing answers.
pub const MAX_LISTED: usize = 1024;

/// What the end of a lifetime does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnEnd {
    /// Stop the container at once; the key is forgotten (its metadata too).
    Abort,
    /// Snapshot `/workspace` and stop; the key stays known, with no lifetime.
    Checkpoint,
}

impl OnEnd {
    fn label(self) -> &'static str {
        match self {
            OnEnd::Abort => "abort",
            OnEnd::Checkpoint => "checkpoint",
        }
    }
}

/// A lifetime as recorded.
pub fn format(ends_at_ms: u64, on_end: OnEnd) -> String {
    format!("{ends_at_ms} {}", on_end.label())
}

/// A recorded lifetime read back; `None` if it is not one.
pub fn parse(value: &str) -> Option<(u64, OnEnd)> {
    let (ms, action) = value.split_once(' ')?;
    let on_end = match action {
        "abort" => OnEnd::Abort,
        "checkpoint" => OnEnd::Checkpoint,
        _ => return None,
    };
    Some((ms.parse().ok()?, on_end))
}

/// The lifetimes that have ended at `now_ms`, in key order: (key, what its end does).
/// A record that does not parse ends as an abort: a lifetime nobody can read is not
/// kept alive for ever.
pub fn ended(now_ms: u64, lifetimes: &[(String, String)]) -> Vec<(String, OnEnd)> {
    let mut out: Vec<(String, OnEnd)> = lifetimes
        .iter()
        .filter_map(|(key, value)| match parse(value) {
            Some((at, on_end)) => (now_ms >= at).then(|| (key.clone(), on_end)),
            None => Some((key.clone(), OnEnd::Abort)),
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// May these metadata entries be recorded (they replace the key's)? At most
/// [`MAX_ENTRIES`], names 1 to [`MAX_NAME`] characters and values up to [`MAX_VALUE`],
/// neither with a control character, no name twice.
pub fn metadata(entries: &[(String, String)]) -> Result<(), String> {
    if entries.len() > MAX_ENTRIES {
        return Err(format!("metadata has more than {MAX_ENTRIES} entries"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (name, value) in entries {
        if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control)
        {
            return Err(format!(
                "metadata name {name:?} must be 1-{MAX_NAME} characters with no control character"
            ));
        }
        if value.chars().count() > MAX_VALUE || value.chars().any(char::is_control) {
            return Err(format!(
                "metadata {name:?}: a value must be at most {MAX_VALUE} characters with no control character"
            ));
        }
        if !seen.insert(name) {
            return Err(format!("metadata name {name:?} is given twice"));
        }
    }
    Ok(())
}

/// Is `key` in a listing of `prefix`?
pub fn listed(key: &str, prefix: &str) -> bool {
    key.starts_with(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lifetime_round_trips_and_what_is_not_one_does_not_parse() {
        assert_eq!(
            parse(&format(1700, OnEnd::Abort)),
            Some((1700, OnEnd::Abort))
        );
        assert_eq!(
            parse(&format(0, OnEnd::Checkpoint)),
            Some((0, OnEnd::Checkpoint))
        );
        for bad in ["", "1700", "1700 pause", "soon abort", "1700  abort"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn what_ended_is_due_at_or_after_its_end_and_unreadable_ends_as_an_abort() {
        let rows = vec![
            ("b".to_string(), format(100, OnEnd::Checkpoint)),
            ("a".to_string(), format(100, OnEnd::Abort)),
            ("c".to_string(), format(101, OnEnd::Abort)),
            ("d".to_string(), "garbage".to_string()),
        ];
        assert_eq!(
            ended(100, &rows),
            vec![
                ("a".to_string(), OnEnd::Abort),
                ("b".to_string(), OnEnd::Checkpoint),
                ("d".to_string(), OnEnd::Abort),
            ]
        );
        assert_eq!(ended(99, &rows), vec![("d".to_string(), OnEnd::Abort)]);
    }

    #[test]
    fn metadata_is_bounded_and_plain() {
        let e = |n: &str, v: &str| (n.to_string(), v.to_string());
        assert!(metadata(&[]).is_ok());
        assert!(metadata(&[e("team", "ci"), e("drive one", "x y")]).is_ok());
        // Characters, not bytes: as JSON Schema's maxLength counts.
        assert!(metadata(&[e(&"é".repeat(MAX_NAME), &"é".repeat(MAX_VALUE))]).is_ok());
        let many: Vec<_> = (0..=MAX_ENTRIES).map(|i| e(&i.to_string(), "")).collect();
        for (bad, why) in [
            (vec![e("", "v")], "empty name"),
            (vec![e(&"n".repeat(MAX_NAME + 1), "v")], "long name"),
            (vec![e("n", &"v".repeat(MAX_VALUE + 1))], "long value"),
            (vec![e("a\nb", "v")], "control in a name"),
            (vec![e("n", "a\0b")], "control in a value"),
            (vec![e("n", "1"), e("n", "2")], "twice"),
            (many, "too many"),
        ] {
            assert!(metadata(&bad).is_err(), "{why}");
        }
    }

    #[test]
    fn a_listing_is_by_prefix() {
        assert!(listed("ci-7", "ci-"));
        assert!(listed("ci-7", ""));
        assert!(!listed("cd-7", "ci-"));
    }
}
