//! Tree kill (invariant 6): which mechanism the machine offers, and the degraded ones.
//!
//! * `Cgroup`: one cgroup v2 per tree, `cgroup.kill`, wait for `populated 0`
//!   (see [`super::cgroup`]). Nothing escapes it: not `setsid`, not a double fork, not a
//!   fork storm.
//! * `ProcessGroup`: the tree's leader starts its own session; the kill is
//!   `killpg(SIGKILL)`, guarded so only a group whose pgid is the leader's pid is ever
//!   signalled. A grandchild that calls `setsid` escapes it (documented by a test).
//! * `Single`: the leader only.

use std::collections::HashSet;
use std::io;
use std::sync::Mutex;

use rustix::process::{Pid, Signal};

use crate::config::KillMode;

/// The kill mode for a requested mode and what the machine offers, with the
/// degradations it implies. `Auto` takes the best; a forced mode the machine cannot
/// honour degrades (never upgrades).
pub fn choose_mode(
    requested: KillMode,
    root: bool,
    cgroup_v2: bool,
    cgroup_kill: bool,
) -> (KillMode, Vec<String>) {
    let cgroup_ok = root && cgroup_v2 && cgroup_kill;
    let mut why = Vec::new();
    let mode = match requested {
        KillMode::Auto | KillMode::Cgroup if cgroup_ok => KillMode::Cgroup,
        KillMode::Auto | KillMode::Cgroup => {
            let reason = if !root {
                "not root"
            } else if !cgroup_v2 {
                "no cgroup v2 at /sys/fs/cgroup or /sys/fs/cgroup/unified"
            } else {
                "cgroup.kill unavailable (kernel older than 5.14?)"
            };
            why.push(format!(
                "kill mode process-group: {reason}; a process that calls setsid escapes a kill"
            ));
            KillMode::ProcessGroup
        }
        KillMode::ProcessGroup => {
            why.push(
                "kill mode process-group (configured): a process that calls setsid escapes a kill"
                    .into(),
            );
            KillMode::ProcessGroup
        }
        KillMode::Single => {
            why.push("kill mode single (configured): only a tree's leader is killed".into());
            KillMode::Single
        }
    };
    (mode, why)
}

/// One canonical line per degradation, once per process.
pub fn log_degradation(what: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(what.to_string())
    {
        tracing::warn!(target: "stockade::degradation", degradation = what, "DEGRADATION {what}");
    }
}

/// The kill mode's name on the supervisor's command line.
pub fn mode_arg(mode: KillMode) -> &'static str {
    match mode {
        KillMode::Auto | KillMode::Cgroup => "cgroup",
        KillMode::ProcessGroup => "process-group",
        KillMode::Single => "single",
    }
}

/// Parse [`mode_arg`]'s output.
pub fn parse_mode(s: &str) -> Option<KillMode> {
    match s {
        "cgroup" => Some(KillMode::Cgroup),
        "process-group" => Some(KillMode::ProcessGroup),
        "single" => Some(KillMode::Single),
        _ => None,
    }
}

/// May `killpg(pgid)` be sent for a tree whose leader is `leader`? Only the leader's own
/// group: while the leader is unreaped its pid cannot be reused, so `getpgid(leader) ==
/// leader` proves it; once reaped, the group id is still reserved while members remain,
/// and it must not be another live tracked leader's pid (a reused number).
pub fn group_kill_allowed(
    leader: i32,
    leader_pgid: Option<i32>,
    leader_reaped: bool,
    other_live_leaders: &[i32],
) -> bool {
    if leader <= 1 {
        return false;
    }
    if leader_reaped {
        !other_live_leaders.contains(&leader)
    } else {
        leader_pgid == Some(leader)
    }
}

/// `getpgid(pid)`.
pub fn getpgid(pid: i32) -> Option<i32> {
    let pid = Pid::from_raw(pid)?;
    rustix::process::getpgid(Some(pid))
        .ok()
        .map(|p| p.as_raw_nonzero().get())
}

/// Send SIGKILL to process group `pgid`; `Ok(false)` if it has no member.
pub fn killpg(pgid: i32) -> io::Result<bool> {
    let Some(pgid) = Pid::from_raw(pgid) else {
        return Ok(false);
    };
    match rustix::process::kill_process_group(pgid, Signal::KILL) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::SRCH) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Does process group `pgid` have a member (zombies count until reaped)?
pub fn group_alive(pgid: i32) -> bool {
    pgid > 1
        && Pid::from_raw(pgid).is_some_and(|p| rustix::process::test_kill_process_group(p).is_ok())
}

/// Members of process group `pgid`, from `/proc` (the container's own `/proc`).
pub fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| stat_pgrp(*pid) == Some(pgid))
        .collect()
}

fn stat_pgrp(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    f.next()?; // state
    f.next()?; // ppid
    f.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_cgroup_when_the_machine_offers_it() {
        assert_eq!(
            choose_mode(KillMode::Auto, true, true, true),
            (KillMode::Cgroup, vec![])
        );
    }

    #[test]
    fn every_degradation_is_reported() {
        let rows = [
            (
                KillMode::Auto,
                false,
                true,
                true,
                KillMode::ProcessGroup,
                "not root",
            ),
            (
                KillMode::Auto,
                true,
                false,
                false,
                KillMode::ProcessGroup,
                "no cgroup v2",
            ),
            (
                KillMode::Cgroup,
                true,
                true,
                false,
                KillMode::ProcessGroup,
                "cgroup.kill",
            ),
            (
                KillMode::ProcessGroup,
                true,
                true,
                true,
                KillMode::ProcessGroup,
                "configured",
            ),
            (
                KillMode::Single,
                true,
                true,
                true,
                KillMode::Single,
                "leader",
            ),
        ];
        for (req, root, v2, kill, want, says) in rows {
            let (mode, why) = choose_mode(req, root, v2, kill);
            assert_eq!(mode, want, "{req:?} root={root} v2={v2} kill={kill}");
            assert_eq!(why.len(), 1);
            assert!(why[0].contains(says), "{why:?}");
        }
    }

    #[test]
    fn a_group_is_signalled_only_when_it_is_the_leaders_own() {
        // live leader that is its group's leader
        assert!(group_kill_allowed(50, Some(50), false, &[]));
        // live leader in someone else's group: never signal that group
        assert!(!group_kill_allowed(50, Some(7), false, &[]));
        // leader gone: its group id is reserved while members remain...
        assert!(group_kill_allowed(50, None, true, &[60]));
        // ...unless the number now belongs to another tracked leader
        assert!(!group_kill_allowed(50, None, true, &[50]));
        // never pid 1 (the supervisor) or 0 (our own group)
        assert!(!group_kill_allowed(1, Some(1), false, &[]));
        assert!(!group_kill_allowed(0, Some(0), false, &[]));
    }
}
