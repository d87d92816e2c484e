//! What a previous host left behind (a SIGKILL, a crash): its containers' cgroups
//! (killed, waited for, removed), their v1 limit directories, their storage mounts
//! (the latest container's artifacts kept first), and their directories (all but the
//! artifacts of each key's latest container). Run once at start-up.
//!
//! Only what this data directory owns (invariant 12): a container cgroup is swept only
//! if `<data>/containers/<its id>` exists (the directory is made before the cgroup and
//! removed after it). Another instance's containers under a shared cgroup root are left
//! alone, and said so.

use std::collections::HashSet;
use std::time::Instant;

use super::storage::{self, Storage};
use super::{Inner, LATEST_SCOPE, STOP_DEADLINE, limits, remove_all_but_artifacts};

impl Inner {
    /// At a clean shutdown, once every container is gone: the parent cgroups this
    /// instance made for them go too (the v2 root and its v1 namesakes), when the root
    /// is `auto`, i.e. named after this data directory and so no one else's (a
    /// configured root may be shared by instances, or be the operator's: it stays).
    /// Only empty ones: the kernel refuses the `rmdir` of a cgroup with a child or a
    /// process, and the next start makes them again.
    pub(super) fn remove_roots(&self) {
        if !super::cgroup::is_auto_root(&self.cfg.cgroup_root) {
            return;
        }
        let roots = self.caps.cgroup_root.iter().cloned();
        for root in roots.chain(limits::v1_roots(&self.caps.limits, &self.root_name)) {
            if let Err(e) = std::fs::remove_dir(&root)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(target: "stockade::substrate", cgroup = %root.display(), error = %e, "container parent cgroup left at shutdown");
            }
        }
    }

    /// Sweep what a previous host under this configuration left.
    pub(super) fn sweep(&self) {
        let containers = self.containers_dir();
        let owned: HashSet<String> = std::fs::read_dir(&containers)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if let Some(root) = &self.cgroup_root {
            for name in root.children().unwrap_or_default() {
                if !owned.contains(&name) {
                    tracing::warn!(target: "stockade::substrate", cgroup = name, "left alone: a container cgroup this data directory does not own");
                    continue;
                }
                match root.destroy_child(&name, Instant::now() + STOP_DEADLINE) {
                    Ok(n) => {
                        tracing::warn!(target: "stockade::substrate", cgroup = name, killed = n, "swept a leftover container cgroup")
                    }
                    Err(e) => {
                        tracing::warn!(target: "stockade::substrate", cgroup = name, error = %e, "cannot sweep a leftover container cgroup")
                    }
                }
            }
        }
        // Their processes are dead now: the v1 directories can go.
        for parent in limits::v1_roots(&self.caps.limits, &self.root_name) {
            let Ok(entries) = std::fs::read_dir(&parent) else {
                continue;
            };
            for e in entries
                .flatten()
                .filter(|e| e.path().is_dir())
                .filter(|e| owned.contains(&e.file_name().to_string_lossy().into_owned()))
            {
                if let Err(err) = limits::remove_v1_dir(&e.path(), Instant::now() + STOP_DEADLINE) {
                    tracing::warn!(target: "stockade::substrate", dir = %e.path().display(), error = %err, "cannot sweep a leftover limits directory");
                }
            }
        }
        let keep: HashSet<String> = self
            .store
            .list(LATEST_SCOPE, "")
            .unwrap_or_default()
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for mount in storage::mounts_under(&mountinfo, &containers) {
            let s = Storage::existing(&mount);
            let owner = mount.parent().map(|p| p.to_path_buf());
            let kept = owner
                .as_ref()
                .and_then(|o| o.file_name())
                .is_some_and(|id| keep.contains(&id.to_string_lossy().into_owned()));
            if kept
                && mount.file_name().is_some_and(|n| n == "fs")
                && let Some(o) = &owner
            {
                let _ = s.keep_artifacts(&o.join("artifacts"), self.cfg.limits.disk_mib << 20);
            }
            if let Err(e) = s.unmount() {
                tracing::warn!(target: "stockade::substrate", mount = %mount.display(), error = %e, "cannot unmount a leftover container mount");
            }
        }
        let Ok(entries) = std::fs::read_dir(&containers) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                remove_all_but_artifacts(&entry.path());
            } else {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}
