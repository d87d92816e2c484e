//! Named snapshots (docs/DESIGN.md §2, "Named snapshots and forks"): how the guest
//! records a key's snapshots, how many a key may hold, and when a fork may go ahead.
//! The substrate holds the archives; these records are the key's list of them.

/// Record-name prefix of a named snapshot. The value is when it was taken (ms).
pub const PREFIX: &str = "snapshot/";

/// Most named snapshots one key holds (each is an archive up to the disk cap).
pub const MAX_PER_KEY: usize = 16;

/// The record name of snapshot `name`.
pub fn record_name(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// A record (name, value) read back as (snapshot name, taken at); `None` if it is not
/// one (another prefix, or a value that is not a time).
pub fn parse(name: &str, value: &str) -> Option<(String, u64)> {
    let snapshot = name.strip_prefix(PREFIX)?;
    Some((snapshot.to_owned(), value.parse().ok()?))
}

/// May `name` be saved, given the names the key holds? Saving over one of them is a
/// replacement; a new name past [`MAX_PER_KEY`] is refused.
pub fn admit(held: &[String], name: &str) -> Result<(), String> {
    if held.len() >= MAX_PER_KEY && !held.iter().any(|h| h == name) {
        return Err(format!(
            "the key holds {MAX_PER_KEY} snapshots already: delete one first"
        ));
    }
    Ok(())
}

/// May `key` be forked from `source`'s snapshot? The snapshot must exist, and `key`
/// must have no container: its restore cache is replaced, and a running container
/// would go on with the workspace it has (the fork would be silently not there).
pub fn fork(source: &str, name: &str, exists: bool, key_has_container: bool) -> Result<(), String> {
    if !exists {
        return Err(stockade_grammar::names::no_snapshot(source, name));
    }
    if key_has_container {
        return Err(
            "the key has a container: abort or checkpoint it before forking onto it".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_others_are_not_snapshots() {
        assert_eq!(record_name("v1"), "snapshot/v1");
        assert_eq!(parse("snapshot/v1", "1700"), Some(("v1".into(), 1700)));
        assert_eq!(parse("detached/x", "1700"), None);
        assert_eq!(parse("snapshot/v1", "soon"), None);
    }

    #[test]
    fn a_key_holds_a_bounded_number_and_may_replace_one() {
        let full: Vec<String> = (0..MAX_PER_KEY).map(|i| format!("s{i}")).collect();
        let rows: [(&[String], &str, bool); 4] = [
            (&[], "a", true),
            (&full[..MAX_PER_KEY - 1], "new", true),
            (&full, "new", false),
            (&full, "s3", true),
        ];
        for (held, name, ok) in rows {
            assert_eq!(admit(held, name).is_ok(), ok, "{} held, {name}", held.len());
        }
    }

    #[test]
    fn a_fork_needs_the_snapshot_and_no_container() {
        let rows = [
            (true, false, Ok(())),
            (
                false,
                false,
                Err("src holds no snapshot named \"v1\"".to_string()),
            ),
            (
                false,
                true,
                Err("src holds no snapshot named \"v1\"".to_string()),
            ),
            (
                true,
                true,
                Err(
                    "the key has a container: abort or checkpoint it before forking onto it".into(),
                ),
            ),
        ];
        for (exists, running, want) in rows {
            assert_eq!(
                fork("src", "v1", exists, running),
                want,
                "{exists} {running}"
            );
        }
    }
}
