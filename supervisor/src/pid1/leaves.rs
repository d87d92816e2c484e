//! A tree's leaf cgroup, and the leaves kept for the next run (issue 25).
//!
//! A new cgroup and its first process cost this machine 60-120 µs of CPU per run
//! (`mkdir`, the kernel's first placement into it, `rmdir`), more than the rest of
//! the supervisor's share of a run (docs/BENCHMARKS.md, "A fenced run's leaf kept").
//! So the leaf of a run the host named (a fenced run: the proxy knows its tree by that
//! name) is not removed when the run ends with its tree empty: it is kept under its
//! name, at most [`KEPT`] of them, and the run's answer says so (`kept`). The host may
//! then name its next run the same, and that run starts in the kept leaf.
//!
//! What keeps a kept leaf from carrying anything into the next run's grant:
//! * it is kept only once `cgroup.events` said `populated 0` after the run's leader
//!   exited, i.e. no process of the run, or of its descendants, lives;
//! * nothing but the supervisor can place a process in it: a workload cannot write a
//!   `cgroup.procs` (the boundary suite's `attack_a_workload_cannot_leave_its_cgroup`),
//!   and an empty cgroup has no member to fork into it;
//! * and it is read again when it is taken: a leaf that holds a process then (or one by
//!   that name that was never kept: a tree a kill could not empty) is killed, waited
//!   for and made again before anything is placed in it. A run's leaf is empty when
//!   its leader is placed there, whichever way it was found.
//!
//! A detached process's leaf and an unnamed run's are always new: their ids are the
//! supervisor's own, and a detached process's id is never given twice.

use super::*;

/// How many run leaves a container keeps: the host names its runs one after another
/// (one grant at a time); a second covers a run that starts before the last one's
/// answer was read.
pub(super) const KEPT: usize = 2;

/// The kept leaves, by name.
#[derive(Default)]
pub(super) struct Kept(Mutex<Vec<(String, CgroupDir)>>);

impl Kept {
    fn take(&self, id: &str) -> Option<CgroupDir> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let i = kept.iter().position(|(n, _)| n == id)?;
        Some(kept.swap_remove(i).1)
    }

    /// Keep `leaf` as `id` if there is room: false if not (the caller removes it).
    fn put(&self, id: &str, leaf: CgroupDir) -> bool {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() >= KEPT || kept.iter().any(|(n, _)| n == id) {
            return false;
        }
        kept.push((id.to_owned(), leaf));
        true
    }
}

impl Supervisor {
    /// The leaf of tree `id` under the container's cgroup `c`, empty: the kept leaf of
    /// that name, else a new one. A leaf that exists and holds a process is emptied
    /// (killed, waited for, made again) first; one that cannot be emptied fails the
    /// spawn.
    pub(super) fn leaf(&self, c: &CgroupDir, id: &str) -> io::Result<CgroupDir> {
        let found = match self.kept.take(id) {
            Some(leaf) => leaf,
            None => match c.create_child(id) {
                Ok(new) => return Ok(new),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => c.open_child(id)?,
                Err(e) => return Err(e),
            },
        };
        if !found.populated()? {
            return Ok(found);
        }
        drop(found);
        c.destroy_child(id, Instant::now() + KILL_DEADLINE)?;
        c.create_child(id)
    }

    /// The run `id` ended with its tree empty (its leaf read `populated 0`): keep its
    /// leaf for the host's next run of that name if the host named it and there is
    /// room, else remove it. True if kept.
    pub(super) fn retire_leaf(&self, id: &str, leaf: Option<CgroupDir>, named: bool) -> bool {
        let kept = named && leaf.is_some_and(|l| self.kept.put(id, l));
        if !kept {
            self.forget_leaf(id);
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> CgroupDir {
        CgroupDir::from_fd(
            rustix::fs::open(
                "/",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap(),
        )
    }

    #[test]
    fn a_leaf_is_kept_once_by_name_up_to_the_bound_and_taken_once() {
        let kept = Kept::default();
        assert!(kept.put("a", dir()));
        assert!(!kept.put("a", dir()), "one leaf per name");
        assert!(kept.put("b", dir()));
        assert!(!kept.put("c", dir()), "at most {KEPT}");
        assert!(kept.take("c").is_none(), "never kept");
        assert!(kept.take("a").is_some());
        assert!(kept.take("a").is_none(), "taken once");
        assert!(kept.put("c", dir()), "room again");
    }
}
