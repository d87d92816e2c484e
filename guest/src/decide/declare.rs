//! What `start-detached` does with the process the substrate started (docs/DESIGN.md
//! §3, invariant 5): the consumer gets an id only for a process it can later name, stop
//! and poll. Anything else is killed at once, never left undeclared (an undeclared
//! process would be killed by the next fence anyway, and until then nobody could stop
//! it).

/// The step after `start-process` answered, or after the declaration was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Record the declaration (after the start), or hand the id out (after the record).
    Go,
    /// Kill the process and answer `failed` with this reason.
    Kill(String),
}

/// After `start-process`: ids are substrate UUIDs (invariant 5). A substrate that
/// answers otherwise gets its process killed rather than a record we could not honour.
pub fn after_start(id: &str) -> Next {
    match stockade_grammar::names::process_id(id) {
        Ok(()) => Next::Go,
        Err(_) => Next::Kill(format!("substrate returned a non-UUID id {id:?}")),
    }
}

/// After writing the declaration: an id whose declaration was not written names
/// nothing the consumer could stop or poll, and the next fence would kill it anyway.
pub fn after_record(put: &Result<(), String>) -> Next {
    match put {
        Ok(()) => Next::Go,
        Err(e) => Next::Kill(format!("could not record the declaration: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_process_is_declared_or_killed() {
        let uuid = "3f2b8f5e-7c1a-4d2e-9b6f-0a1b2c3d4e5f";
        let rows: &[(&str, Next, bool)] = &[
            (
                "a UUID from the substrate goes on to be recorded",
                after_start(uuid),
                true,
            ),
            (
                "a pid is not an id: the process is killed",
                after_start("4242"),
                false,
            ),
            ("an empty id is killed", after_start(""), false),
            (
                "a recorded declaration hands the id out",
                after_record(&Ok(())),
                true,
            ),
            (
                "a declaration the store refused: the process is killed",
                after_record(&Err("disk full".into())),
                false,
            ),
        ];
        for (what, next, go) in rows {
            assert_eq!(*next == Next::Go, *go, "{what}: {next:?}");
        }
    }
}
