//! The fence's selective teardown (docs/DESIGN.md §3, invariants 2 and 7).
//!
//! No declared process → `kill-all` with no `list-processes` call: the hot path is
//! unchanged. Declared processes → list, kill every tracked process that is not
//! declared (including what the fenced command backgrounded), spare the declared
//! ones, and reap declarations whose process is gone. List unreadable → `kill-all`:
//! killing a declared process is a wrong answer, leaving a grant-holder alive is a
//! worse one.

use crate::stockade::sandbox::substrate::{ProcessInfo, SubstrateError};

/// The first step of a teardown, before anything is listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Nothing declared in this container: kill everything, list nothing.
    KillAll,
    /// Something is declared: list the tracked processes first.
    List,
}

/// What to do once the list was (or was not) read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Kill every tracked process; every declaration of the container goes with it.
    KillAll,
    /// Kill exactly these undeclared processes; forget these declarations, whose
    /// process the container no longer tracks.
    Selective {
        kill: Vec<String>,
        reap: Vec<String>,
    },
}

/// Step one: does this teardown need a list at all? `None`: the declarations could
/// not be read (the records store failed): by invariant 2's own reasoning (list unreadable
/// → kill-all), a declaration set that cannot be read means kill-all.
pub fn start(declared: Option<&[String]>) -> Start {
    match declared {
        Some(d) if !d.is_empty() => Start::List,
        _ => Start::KillAll,
    }
}

/// Step two: given the declared ids and the list (or `None` when it could not be
/// read), which processes die and which declarations are reaped.
pub fn after_listing(declared: &[String], listed: Option<&[ProcessInfo]>) -> Plan {
    let Some(listed) = listed else {
        return Plan::KillAll;
    };
    let kill = listed
        .iter()
        .filter(|p| !declared.contains(&p.id))
        .map(|p| p.id.clone())
        .collect();
    let reap = declared
        .iter()
        .filter(|d| !listed.iter().any(|p| &p.id == *d))
        .cloned()
        .collect();
    Plan::Selective { kill, reap }
}

/// A selective kill failed for one undeclared process: that process may still be
/// alive and would hold the next grant, so the teardown falls back to `kill-all`.
pub fn after_failed_kill() -> Plan {
    Plan::KillAll
}

/// What `kill-all` answered means for the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterKillAll {
    /// Everything died.
    Killed(u32),
    /// The container is gone, and its whole tree with it: nothing is left to kill.
    Gone,
    /// The kill failed: what the command backgrounded may be alive, and a fence never
    /// leaves it behind (invariant 7): stop the container, its tree dies with it.
    StopContainer,
}

/// Step three, when it came to `kill-all`.
pub fn after_kill_all(result: &Result<u32, SubstrateError>) -> AfterKillAll {
    match result {
        Ok(n) => AfterKillAll::Killed(*n),
        Err(SubstrateError::Unreachable(_)) => AfterKillAll::Gone,
        Err(_) => AfterKillAll::StopContainer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: &str, running: bool) -> ProcessInfo {
        ProcessInfo {
            id: id.into(),
            running,
            exit_code: if running { None } else { Some(0) },
        }
    }

    fn ids(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn after_kill_all_rows() {
        let rows = [
            ("all killed", Ok(3), AfterKillAll::Killed(3)),
            (
                "the container is gone: nothing left to kill",
                Err(SubstrateError::Unreachable("gone".into())),
                AfterKillAll::Gone,
            ),
            (
                "a kill that failed stops the container",
                Err(SubstrateError::Failed("cgroup.kill refused".into())),
                AfterKillAll::StopContainer,
            ),
            (
                "any other error stops it too",
                Err(SubstrateError::Invalid("?".into())),
                AfterKillAll::StopContainer,
            ),
        ];
        for (what, r, want) in rows {
            assert_eq!(after_kill_all(&r), want, "{what}");
        }
    }

    #[test]
    fn start_rows() {
        assert_eq!(
            start(Some(&[])),
            Start::KillAll,
            "no declared process: kill-all, no list"
        );
        assert_eq!(
            start(Some(&ids(&["d"]))),
            Start::List,
            "declared processes: list first"
        );
        assert_eq!(
            start(None),
            Start::KillAll,
            "the declarations cannot be read: kill-all (a surviving grant-holder is worse)"
        );
    }

    #[test]
    fn after_listing_rows() {
        let listed = [p("d1", true), p("run", true), p("x", false)];
        let rows: &[(&str, &[&str], Option<&[ProcessInfo]>, Plan)] = &[
            (
                "undeclared processes die, declared ones are spared",
                &["d1"],
                Some(&listed),
                Plan::Selective {
                    kill: ids(&["run", "x"]),
                    reap: vec![],
                },
            ),
            (
                "a declaration whose process is gone is reaped",
                &["d1", "gone"],
                Some(&listed),
                Plan::Selective {
                    kill: ids(&["run", "x"]),
                    reap: ids(&["gone"]),
                },
            ),
            (
                "an exited declared process keeps its record",
                &["d1", "x"],
                Some(&listed),
                Plan::Selective {
                    kill: ids(&["run"]),
                    reap: vec![],
                },
            ),
            (
                "list unreadable: kill-all, declared processes too",
                &["d1"],
                None,
                Plan::KillAll,
            ),
        ];
        for (what, declared, list, plan) in rows {
            assert_eq!(&after_listing(&ids(declared), *list), plan, "{what}");
        }
    }

    #[test]
    fn a_failed_selective_kill_falls_back_to_kill_all() {
        assert_eq!(after_failed_kill(), Plan::KillAll);
    }
}
