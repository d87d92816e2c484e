//! A tree's leaf cgroup, and the leaves kept for the next run.
//!
//! A new cgroup and its first process cost this machine 60-120 µs of CPU per run
//! (`mkdir`, the kernel's first placement into it, `rmdir`), more than the rest of
//! the supervisor's share of a run (docs/BENCHMARKS.md).
//! So the leaf of a run the host named (a fenced run: the proxy knows its tree by that
//! name) is not removed when the run ends with its tree empty: it is kept under its
//! name, at most [`KEPT`] of them (the oldest makes room), and the run's answer says
//! so (`kept`). The host may then name its next run the same, and that run starts in
//! the kept leaf.
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
//! An unnamed run (the substrate's `run` with no grant open) is treated alike, with ids
//! of the supervisor's: its next unnamed run starts in its kept leaf, under its id. A
//! detached process's leaf is always new: its id is never given twice.

use super::*;

/// How many run leaves a container keeps, of each kind (named by the host, named by
/// the supervisor): the host names its runs one after another (one grant at a time);
/// a second covers a run that starts before the last one's answer was read.
pub(super) const KEPT: usize = 2;

/// A kept leaf.
struct Leaf {
    id: String,
    dir: CgroupDir,
    /// Named by the host (given again only under that name), or by the supervisor
    /// (given to its next unnamed run).
    named: bool,
}

/// The kept leaves, oldest first.
#[derive(Default)]
pub(super) struct Kept(Mutex<Vec<Leaf>>);

impl Kept {
    fn lock(&self) -> MutexGuard<'_, Vec<Leaf>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The leaf the host named `id`.
    fn take(&self, id: &str) -> Option<CgroupDir> {
        let mut kept = self.lock();
        let i = kept.iter().position(|l| l.named && l.id == id)?;
        Some(kept.remove(i).dir)
    }

    /// A leaf the supervisor named, with its id.
    fn take_own(&self) -> Option<(String, CgroupDir)> {
        let mut kept = self.lock();
        let i = kept.iter().position(|l| !l.named)?;
        let l = kept.remove(i);
        Some((l.id, l.dir))
    }

    /// Keep `dir` as `id`, its kind's oldest leaf making room (returned: the caller
    /// removes it). `Err` if a leaf is already kept as `id` (`dir` is then that one's
    /// directory: it stays kept).
    fn put(&self, id: &str, dir: CgroupDir, named: bool) -> Result<Option<String>, ()> {
        let mut kept = self.lock();
        if kept.iter().any(|l| l.id == id) {
            return Err(());
        }
        let oldest = (kept.iter().filter(|l| l.named == named).count() >= KEPT)
            .then(|| kept.iter().position(|l| l.named == named))
            .flatten()
            .map(|i| kept.remove(i).id);
        kept.push(Leaf {
            id: id.to_owned(),
            dir,
            named,
        });
        Ok(oldest)
    }
}

impl Supervisor {
    /// The id of a new tree, and its leaf (cgroup mode), empty. A tree the host named:
    /// that name, in the kept leaf of that name, else a new one. An unnamed run: a leaf
    /// kept from an earlier unnamed run, with its id, else a new UUID. A detached
    /// process: a new UUID (its id is never given twice). A leaf that exists and holds
    /// a process is emptied (killed, waited for, made again) first; one that cannot be
    /// emptied fails the spawn.
    pub(super) fn tree(
        &self,
        named: Option<&str>,
        kind: Kind,
    ) -> io::Result<(String, Option<CgroupDir>)> {
        let Some(c) = &self.cgroup else {
            let id = named.map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
            return Ok((id, None));
        };
        let (id, found) = match named {
            Some(id) => (id.to_owned(), self.kept.take(id)),
            None => match (kind == Kind::Run).then(|| self.kept.take_own()).flatten() {
                Some((id, dir)) => (id, Some(dir)),
                None => (uuid::Uuid::new_v4().to_string(), None),
            },
        };
        let found = match found {
            Some(dir) => dir,
            None => match c.create_child(&id) {
                Ok(new) => return Ok((id, Some(new))),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => c.open_child(&id)?,
                Err(e) => return Err(e),
            },
        };
        // Empty, or made again: one that holds a process, or cannot be read (removed
        // under the supervisor), is killed, waited for and removed first.
        if found.populated().ok() == Some(false) {
            return Ok((id, Some(found)));
        }
        drop(found);
        c.destroy_child_as_pid1(&id, Instant::now() + KILL_DEADLINE)?;
        let new = c.create_child(&id)?;
        Ok((id, Some(new)))
    }

    /// The run `id` ended with its tree empty (its leaf read `populated 0`): keep its
    /// leaf for the next run of its kind. True if a leaf the host named was kept (the
    /// host may name its next run the same).
    pub(super) fn retire_leaf(&self, id: &str, leaf: Option<CgroupDir>, named: bool) -> bool {
        let Some(leaf) = leaf else {
            return false;
        };
        match self.kept.put(id, leaf, named) {
            // The oldest of its kind goes: a host that lost a run's answer never names
            // that leaf again, and it must not hold a place for good.
            Ok(evicted) => {
                if let Some(old) = evicted {
                    self.forget_leaf(&old);
                }
                named
            }
            // Kept already under this name (its directory is this one): as it was.
            Err(()) => false,
        }
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
    fn a_leaf_is_kept_once_by_name_the_oldest_of_its_kind_makes_room_and_each_is_taken_once() {
        let kept = Kept::default();
        assert_eq!(kept.put("a", dir(), true), Ok(None));
        assert_eq!(kept.put("a", dir(), true), Err(()), "one leaf per name");
        assert_eq!(
            kept.put("a", dir(), false),
            Err(()),
            "one per name, either kind"
        );
        assert_eq!(kept.put("b", dir(), true), Ok(None));
        assert_eq!(
            kept.put("o1", dir(), false),
            Ok(None),
            "the other kind has room"
        );
        assert_eq!(
            kept.put("c", dir(), true),
            Ok(Some("a".into())),
            "at most {KEPT} named: the oldest goes"
        );
        assert!(kept.take("a").is_none(), "gone");
        assert!(
            kept.take("o1").is_none(),
            "an unnamed run's leaf is not the host's"
        );
        assert!(kept.take("b").is_some());
        assert!(kept.take("b").is_none(), "taken once");
        assert_eq!(kept.put("d", dir(), true), Ok(None), "room again");
        let (id, _) = kept.take_own().unwrap();
        assert_eq!(id, "o1");
        assert!(
            kept.take_own().is_none(),
            "the host's leaves are not an unnamed run's"
        );
    }
}
