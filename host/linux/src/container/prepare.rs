//! The host side of a container, before its supervisor: directories, an id range, the
//! storage, the cgroups and their limits, each recorded in the [`Build`] as it is made.

use std::path::Path;

use stockade_runtime::substrate::{Result, SubstrateError};

use super::{Build, failed};
use crate::Inner;
use crate::idmap;
use crate::limits::ContainerLimits;
use crate::storage::{self, Storage};

impl Inner {
    /// The host side of a container, before its supervisor: directories, an id range,
    /// the storage, the cgroups and their limits. Nothing here depends on a key: a
    /// warm container is prepared before it has one.
    pub(super) fn prepare(&self, b: &mut Build) -> Result<()> {
        let mk = |p: &Path, mode: u32| {
            std::fs::create_dir(p)
                .and_then(|()| {
                    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
                })
                .map_err(|e| failed("container directory", e))
        };
        mk(&b.dir, 0o700)?;
        mk(&b.dir.join("root"), 0o755)?;
        if self.caps.userns {
            b.lease = Some(
                idmap::lease(&self.cfg.ids)
                    .map_err(|e| failed("leasing an id range", e))?
                    .ok_or_else(|| {
                        SubstrateError::Failed(
                            "every id range of substrate.ids is leased (raise substrate.ids.containers)"
                                .into(),
                        )
                    })?,
            );
        }
        let (root_ids, work_ids) = self.host_ids(b.lease.as_ref());
        let fs = b.dir.join("fs");
        if self.caps.disk {
            b.storage = Some(
                Storage::create(&fs, self.cfg.limits.disk_mib, work_ids, root_ids)
                    .map_err(|e| failed("container storage", e))?,
            );
        } else {
            for sub in [storage::WORKSPACE, storage::ARTIFACTS, storage::TMP] {
                std::fs::create_dir_all(fs.join(sub))
                    .map_err(|e| failed("container storage", e))?;
            }
        }
        if let Some(root) = &self.cgroup_root {
            let cg = root
                .child(&b.id)
                .map_err(|e| failed("container cgroup", e))?;
            if let Some(l) = &b.lease {
                cg.delegate(l.base, l.base)
                    .map_err(|e| failed("delegating the container cgroup", e))?;
            }
            b.cgroup = Some(cg);
        }
        if self.caps.root {
            let v2 = self
                .caps
                .cgroup_root
                .as_ref()
                .map(|p| p.join(&b.id))
                .filter(|_| b.cgroup.is_some());
            b.limits = Some(
                ContainerLimits::create(
                    &self.caps.limits,
                    &self.cfg.limits,
                    &self.root_name,
                    &b.id,
                    b.cgroup.as_ref().zip(v2.as_deref()),
                )
                .map_err(|e| failed("container limits", e))?,
            );
        }
        Ok(())
    }
}
