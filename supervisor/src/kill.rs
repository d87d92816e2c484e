//! Tree kill (invariant 6): which mechanism the machine offers, and the degraded ones.
//!
//! * `Cgroup`: one cgroup v2 per tree, `cgroup.kill`, wait for `populated 0`
//!   (see [`super::cgroup`]). Nothing escapes it: not `setsid`, not a double fork, not a
//!   fork storm.
//! * `ProcessGroup`: the tree's leader starts its own session; the kill is
//!   `killpg(SIGKILL)`, guarded so only a group whose pgid is the leader's pid is ever
//!   signalled. A grandchild that calls `setsid` escapes it (documented by a test).
//! * `Single`: the leader only.
//!
//! A process group's id is its leader's pid, and a pid is free for reuse once its
//! process is reaped and nothing else holds the number (a group's members hold it as
//! their pgid, but only while there are members). So a `killpg(leader)` sent after the
//! leader was reaped may reach a stranger: the tree's group emptied, the number was
//! reused, and the new process made itself a group leader (`setsid`). A pidfd of the
//! leader does not help: it names the process, not the group, and a group has no
//! descriptor. What does help is the rule that a zombie's pid is never reused: the
//! supervisor (PID 1, which reaps) keeps a tree's leader a zombie while its group has
//! other members, and reaps it only once the group is dead (after a kill) or the tree
//! is forgotten. A leader is reaped at once only when its group had no other member at
//! its exit, and then there is nothing left to signal. So `killpg` is sent only while
//! the leader is unreaped ([`group_kill_allowed`]), and the check and the signal are
//! made under the lock every reap takes.

use std::io;

use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

/// How a process tree is killed (`substrate.kill_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KillMode {
    /// The best the machine offers: cgroup v2, else process group, else single.
    #[default]
    Auto,
    /// One cgroup v2 per tree, `cgroup.kill`, wait for `populated 0`.
    Cgroup,
    /// Own session, guarded `killpg(SIGKILL)` (degraded: a `setsid` escaper survives).
    ProcessGroup,
    /// The leader only (degraded further).
    Single,
}

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

/// May `killpg(leader)` be sent for a tree whose leader is `leader`? Only while the
/// leader is unreaped (alive, or a zombie the supervisor keeps): then its pid cannot
/// be reused, and `getpgid(leader) == leader` proves the group is the tree's own. Once
/// the leader is reaped the number may belong to anyone: never (the supervisor reaps a
/// leader early only when its group had no other member, see the module's comment).
pub fn group_kill_allowed(leader: i32, leader_pgid: Option<i32>, leader_reaped: bool) -> bool {
    leader > 1 && !leader_reaped && leader_pgid == Some(leader)
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

/// Does process group `pgid` have a member other than `pgid` itself (its leader, which
/// the supervisor may keep as a zombie)?
pub fn group_has_others(pgid: i32) -> bool {
    group_alive(pgid) && group_members(pgid).iter().any(|p| *p != pgid)
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
    fn a_group_is_signalled_only_while_its_leader_is_unreaped() {
        // (leader, getpgid(leader), leader reaped, may killpg)
        let rows = [
            // a live (or zombie) leader that leads its own group: its group
            (50, Some(50), false, true),
            // a leader in someone else's group: never signal that group
            (50, Some(7), false, false),
            // getpgid failed: nothing proves the group is the tree's
            (50, None, false, false),
            // reaped: the number may be reused by a stranger that called setsid
            (50, Some(50), true, false),
            (50, None, true, false),
            // never pid 1 (the supervisor) or 0 (our own group)
            (1, Some(1), false, false),
            (0, Some(0), false, false),
        ];
        for (leader, pgid, reaped, want) in rows {
            assert_eq!(
                group_kill_allowed(leader, pgid, reaped),
                want,
                "leader {leader} pgid {pgid:?} reaped {reaped}"
            );
        }
    }

    /// A real leader: its own session and group, exits, and stays a zombie; the guard
    /// allows its group while it is unreaped (getpgid works on a zombie) and refuses it
    /// once it is reaped, when the pid is free for anyone to take.
    #[test]
    fn a_reaped_leaders_group_is_never_signalled() {
        // SAFETY: the child only calls async-signal-safe functions, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: in the child.
            unsafe {
                libc::setsid();
                libc::_exit(0);
            }
        }
        let p = Pid::from_raw(pid).unwrap();
        // The exit, without reaping: the leader is a zombie.
        let st = rustix::process::waitid(
            rustix::process::WaitId::Pid(p),
            rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
        )
        .unwrap();
        assert!(st.is_some());
        assert_eq!(getpgid(pid), Some(pid), "a zombie keeps its group");
        assert!(group_kill_allowed(pid, getpgid(pid), false));
        assert!(!group_has_others(pid), "only the zombie leader is left");
        rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty()).unwrap();
        assert_eq!(getpgid(pid), None, "the pid is free");
        assert!(!group_kill_allowed(pid, getpgid(pid), true));
    }
}
