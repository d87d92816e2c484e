//! What the supervisor knows of its trees, and their kill: liveness by kill mode,
//! listing, status, the kill of one tree or all, verified before a tree is forgotten.

use super::*;

impl Supervisor {
    /// Does `e`'s tree still have a live process?
    pub(super) fn running(&self, e: &Entry) -> bool {
        match self.mode {
            KillMode::Single => e.exit.is_none(),
            // A leader reaped at its exit had no other member in its group; one kept
            // as a zombie keeps the group's id the tree's, so its members are looked
            // up by that id.
            KillMode::ProcessGroup => {
                e.exit.is_none() || (e.zombie && kill::group_has_others(e.leader))
            }
            // A leader not yet reaped is a live member: only once it has exited does
            // the tree's liveness need `cgroup.events` (the status path is hot).
            KillMode::Auto | KillMode::Cgroup => {
                e.exit.is_none()
                    || e.leaf
                        .as_ref()
                        .is_some_and(|l| l.populated().unwrap_or(false))
            }
        }
    }

    /// May `e`'s process group be signalled? Only while its leader is unreaped (the
    /// caller holds the state lock, which every reap of a leader takes).
    pub(super) fn group_allowed(&self, e: &Entry) -> bool {
        let reaped = e.exit.is_some() && !e.zombie;
        kill::group_kill_allowed(e.leader, kill::getpgid(e.leader), reaped)
    }

    /// Is the tree `id` led by `leader` still alive after its group was signalled: its
    /// leader not exited, or kept as a zombie while its group has other members?
    pub(super) fn group_live(&self, id: &str, leader: i32, st: &State) -> bool {
        if st.by_pid.contains_key(&leader) {
            return true;
        }
        st.entries
            .get(id)
            .is_some_and(|e| e.leader == leader && e.zombie)
            && kill::group_has_others(leader)
    }

    pub(super) fn info(&self, id: &str, e: &Entry) -> ProcessInfo {
        ProcessInfo {
            id: id.to_string(),
            running: self.running(e),
            exit_code: e.exit,
        }
    }

    pub(super) fn list(&self) -> Vec<ProcessInfo> {
        let mut st = self.lock();
        let mut out = Vec::new();
        let mut finished_runs = Vec::new();
        for (id, e) in &st.entries {
            let info = self.info(id, e);
            if e.kind == Kind::Run && !info.running {
                finished_runs.push(id.clone());
            } else {
                out.push(info);
            }
        }
        for id in &finished_runs {
            Self::forget(&mut st, id);
        }
        drop(st);
        for id in finished_runs {
            self.forget_leaf(&id);
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    pub(super) fn status(&self, id: &str) -> Option<ProcessInfo> {
        let st = self.lock();
        st.entries.get(id).map(|e| self.info(id, e))
    }

    /// Kill one tree, wait until it is gone, forget it: processes that died, and the
    /// degradations met (said once). The entry is forgotten only once its death is
    /// verified (`populated 0`, the group empty, the leader exited): a kill that fails
    /// or times out leaves the tree tracked, so a kill-all still reaches it and a
    /// retried stop does not answer success while it may live.
    pub(super) fn kill(&self, id: &str) -> io::Result<(u32, Vec<String>)> {
        let deadline = Instant::now() + KILL_DEADLINE;
        let timed_out =
            || io::Error::new(io::ErrorKind::TimedOut, format!("tree {id} did not die"));
        let mut degraded = Vec::new();
        let st = self.lock();
        let Some(e) = st.entries.get(id) else {
            return Ok((0, degraded));
        };
        let leader = e.leader;
        let count = match (self.mode, &self.cgroup) {
            (KillMode::Auto | KillMode::Cgroup, Some(c)) if e.leaf.is_some() => {
                drop(st);
                c.destroy_child_as_pid1(id, deadline)?
            }
            (KillMode::ProcessGroup, _) if self.group_allowed(e) => {
                // Checked and sent under the lock every reap of a leader takes: the
                // leader's pid, the group's id, cannot be freed (and reused) between.
                let n = kill::group_members(leader)
                    .iter()
                    .filter(|p| **p != leader || e.exit.is_none())
                    .count() as u32;
                kill::killpg(leader)?;
                drop(st);
                // Members are reparented to the main thread and reaped; each reap, and
                // the leader's exit, signals `changed`.
                self.changed.notify_all();
                if !self.wait_until(deadline, |st| !self.group_live(id, leader, st)) {
                    return Err(timed_out());
                }
                n
            }
            (mode, _) => {
                if mode == KillMode::Single {
                    self.degraded(
                        &mut degraded,
                        "kill mode single: a kill reaches only a tree's leader; what the leader started survives until the container stops",
                    );
                } else if mode == KillMode::ProcessGroup && e.exit.is_none() {
                    self.degraded(
                        &mut degraded,
                        "process-group kill refused: the group is not the leader's own; killing the leader only",
                    );
                }
                // A leader reaped at its exit left no group member behind: nothing to
                // kill. One not exited is signalled through its pidfd.
                let pidfd = st.by_pid.get(&leader).map(|l| l.pidfd.clone());
                drop(st);
                match pidfd {
                    Some(fd) => {
                        rustix::process::pidfd_send_signal(&*fd, rustix::process::Signal::KILL)?;
                        if !self.wait_until(deadline, |st| !st.by_pid.contains_key(&leader)) {
                            return Err(timed_out());
                        }
                        1
                    }
                    None => 0,
                }
            }
        };
        // Verified dead: now it may be forgotten.
        Self::forget(&mut self.lock(), id);
        Ok((count, degraded))
    }

    /// Wait until `done` holds (each reap and spawn signals `changed`) or the deadline:
    /// whether it holds.
    pub(super) fn wait_until(&self, deadline: Instant, done: impl Fn(&State) -> bool) -> bool {
        let mut st = self.lock();
        while !done(&st) {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    pub(super) fn kill_all(&self, tree: Option<&str>) -> io::Result<(u32, Vec<String>)> {
        let ids: Vec<String> = {
            let mut st = self.lock();
            // A named tree not here: its run has not come yet; it is refused when it
            // does (`spawn`). Under the lock `spawn` registers a tree with, so the
            // run is either here to be killed or refused.
            let here = tree.is_some_and(|t| st.entries.contains_key(t));
            record_torn(&mut st.torn, tree, here);
            st.entries.keys().cloned().collect()
        };
        let mut total = 0;
        let mut degraded = Vec::new();
        let mut first_err = None;
        for id in ids {
            match self.kill(&id) {
                Ok((n, d)) => {
                    total += n;
                    degraded.extend(d);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok((total, degraded)),
        }
    }
}

/// A kill named `tree` (a fenced run the host began): if its run is not `here`, the
/// kill overtook it, and it is remembered to be refused when it comes (pure; at most
/// [`super::TORN`], oldest out first).
pub(super) fn record_torn(
    torn: &mut std::collections::VecDeque<String>,
    tree: Option<&str>,
    here: bool,
) {
    if let Some(t) = tree
        && !here
    {
        if torn.len() >= super::TORN {
            torn.pop_front();
        }
        torn.push_back(t.to_owned());
    }
}

/// Is a run of `tree` one a kill overtook (pure)? Then it is not started, and the
/// name is forgotten (refused once).
pub(super) fn claim_torn(torn: &mut std::collections::VecDeque<String>, tree: &str) -> bool {
    match torn.iter().position(|x| x == tree) {
        Some(i) => {
            torn.remove(i);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod torn_tests {
    use super::*;

    #[test]
    fn a_run_a_kill_overtook_is_refused_once_and_one_already_here_is_killed() {
        let mut torn = std::collections::VecDeque::new();
        // The run is here: the kill kills it, nothing is remembered.
        record_torn(&mut torn, Some("a"), true);
        assert!(torn.is_empty());
        // No tree named: an ordinary kill.
        record_torn(&mut torn, None, false);
        assert!(torn.is_empty());
        // The kill came first: its run is refused when it comes, once.
        record_torn(&mut torn, Some("b"), false);
        assert!(!claim_torn(&mut torn, "a"));
        assert!(claim_torn(&mut torn, "b"));
        assert!(!claim_torn(&mut torn, "b"), "refused once");
        // Bounded, oldest out first.
        for i in 0..super::super::TORN + 3 {
            record_torn(&mut torn, Some(&format!("t{i}")), false);
        }
        assert_eq!(torn.len(), super::super::TORN);
        assert!(!claim_torn(&mut torn, "t0"));
        assert!(claim_torn(
            &mut torn,
            &format!("t{}", super::super::TORN + 2)
        ));
    }
}
