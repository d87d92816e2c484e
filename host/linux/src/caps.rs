//! What the machine offers the linux substrate, what it will use, and what it lacks
//! (`stockade doctor` prints it; start-up logs every degradation once and refuses
//! the ones `substrate.require` names).

use std::path::{Path, PathBuf};

use stockade_runtime::config::{KillMode, SubstrateConfig};

use super::cgroup;
use super::kill::{self, choose_mode};
use super::limits::{self, Mechanism};

/// What the machine offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    /// Running as root (effective uid 0).
    pub root: bool,
    /// Where cgroup v2 is mounted, if anywhere.
    pub cgroup_v2: Option<PathBuf>,
    /// The parent cgroup of every container (`substrate.cgroup_root` resolved).
    pub cgroup_root: Option<PathBuf>,
    /// `cgroup.kill` exists (kernel 5.14+) and the root is writable.
    pub cgroup_kill: bool,
    /// PID/mount/net/UTS/IPC namespaces can be created (root).
    pub namespaces: bool,
    /// User namespaces can be created: each container's ids map onto an unprivileged
    /// host range.
    pub userns: bool,
    /// The kernel filters syscalls (seccomp with BPF).
    pub seccomp: bool,
    /// How each resource limit is applied.
    pub limits: limits::Plan,
    /// A size-capped tmpfs per container can be mounted (root).
    pub disk: bool,
    /// The kill mechanism the substrate uses.
    pub kill_mode: KillMode,
    /// The egress proxy can tell the fenced run's connections from a detached
    /// process's (cgroup-mode trees and Landlock): an open grant is the fenced run's
    /// alone (invariant 3). Without it the grant is shared, as DESIGN §2.1 allows.
    pub attribution: bool,
    /// Every degradation, one sentence each.
    pub degradations: Vec<String>,
}

/// What `stockade doctor` prints for the default configuration.
pub fn capabilities() -> Capabilities {
    Capabilities::detect(&SubstrateConfig::default())
}

fn userns_available() -> bool {
    Path::new("/proc/self/ns/user").exists()
        && std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

impl Capabilities {
    /// Probe the machine for `cfg` (creates nothing that outlives the call).
    pub fn detect(cfg: &SubstrateConfig) -> Capabilities {
        let root = rustix::process::geteuid().is_root();
        let cgroup_v2 = cgroup::detect_v2();
        let cgroup_root = cgroup::resolve_root(&cfg.cgroup_root, &cfg.data_dir);
        let cgroup_kill = root && cgroup_v2.is_some() && probe_cgroup_kill(cgroup_root.as_deref());
        let namespaces = root && Path::new("/proc/self/ns/pid").exists();
        let userns = namespaces && userns_available();
        let seccomp = Path::new("/proc/sys/kernel/seccomp/actions_avail").exists();
        let limits = if root {
            limits::Plan::detect(cgroup_v2.as_deref())
        } else {
            limits::Plan {
                pids: Mechanism::Missing,
                memory: Mechanism::Missing,
                cpu: Mechanism::Missing,
            }
        };
        let disk = root;
        let (kill_mode, mut degradations) =
            choose_mode(cfg.kill_mode, root, cgroup_v2.is_some(), cgroup_kill);
        if !namespaces {
            degradations.push(
                "namespaces unavailable (not root): containers are plain process trees on the host; the network is not fenced".into(),
            );
        } else if !userns {
            degradations.push(
                "user namespaces unavailable: a container's root is the host's root (without capabilities) and its workloads run as host uid 1000".into(),
            );
        }
        if !seccomp {
            degradations.push(
                "seccomp unavailable: workloads reach the kernel's whole syscall interface".into(),
            );
        }
        for c in limits.missing() {
            degradations.push(format!(
                "no {} controller (neither cgroup v2 nor v1): containers have no {} limit",
                c.name(),
                c.name()
            ));
        }
        if !disk {
            degradations.push(
                "not root: no size-capped storage per container; /workspace is the host's disk"
                    .into(),
            );
        }
        let landlock = super::exec::landlock_abi() >= 1;
        let attribution = attribution_available(kill_mode, cgroup_root.is_some(), landlock);
        if namespaces && !attribution {
            degradations.push(format!(
                "egress connections cannot be attributed to the fenced run ({}): a detached process shares an open fence's grant (docs/DESIGN.md §2.1) and credentials are never added",
                if landlock {
                    "no cgroup-mode trees"
                } else {
                    "no Landlock to keep trees apart"
                }
            ));
        }
        Capabilities {
            root,
            cgroup_v2,
            cgroup_root,
            cgroup_kill,
            namespaces,
            userns,
            seccomp,
            limits,
            disk,
            kill_mode,
            attribution,
            degradations,
        }
    }

    /// Log every degradation once per process, one canonical line each.
    pub fn log(&self) {
        for d in &self.degradations {
            kill::log_degradation(d);
        }
    }

    /// The mechanisms of `require` this machine lacks.
    pub fn missing_required(&self, require: &[String]) -> Vec<String> {
        missing_required(self, require)
    }
}

/// The mechanisms of `require` that `caps` lacks (pure).
pub fn missing_required(caps: &Capabilities, require: &[String]) -> Vec<String> {
    require
        .iter()
        .filter(|r| !match r.as_str() {
            "userns" => caps.userns,
            "seccomp" => caps.seccomp,
            "limits" => caps.limits.missing().is_empty(),
            "disk" => caps.disk,
            "cgroup-kill" => caps.kill_mode == KillMode::Cgroup,
            "attribution" => caps.attribution,
            _ => false,
        })
        .cloned()
        .collect()
}

/// Can the proxy attribute connections to trees (pure)? Each tree is a leaf cgroup
/// only in cgroup mode, and Landlock keeps a detached tree from reaching into the
/// fenced one's processes (and their sockets).
pub fn attribution_available(mode: KillMode, cgroup_root: bool, landlock: bool) -> bool {
    mode == KillMode::Cgroup && cgroup_root && landlock
}

/// `cgroup.kill` exists in non-root cgroups only: look in the configured root if it
/// exists, else in a probe directory created and removed at once.
fn probe_cgroup_kill(root: Option<&Path>) -> bool {
    let Some(root) = root else { return false };
    if root.join("cgroup.kill").exists() {
        return true;
    }
    let Some(parent) = root.parent() else {
        return false;
    };
    // Unique per probe, not per process: substrates starting at once in one process
    // (parallel tests, two runtimes) must not see each other's probe and degrade.
    let probe = parent.join(format!(".stockade-probe-{}", uuid::Uuid::new_v4().simple()));
    if std::fs::create_dir(&probe).is_err() {
        return false;
    }
    let ok = probe.join("cgroup.kill").exists();
    let _ = std::fs::remove_dir(&probe);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Capabilities {
        Capabilities {
            root: true,
            cgroup_v2: Some("/sys/fs/cgroup".into()),
            cgroup_root: Some("/sys/fs/cgroup/stockade".into()),
            cgroup_kill: true,
            namespaces: true,
            userns: true,
            seccomp: true,
            limits: limits::Plan {
                pids: Mechanism::V2,
                memory: Mechanism::V1("/sys/fs/cgroup/memory".into()),
                cpu: Mechanism::V2,
            },
            disk: true,
            kill_mode: KillMode::Cgroup,
            attribution: true,
            degradations: vec![],
        }
    }

    #[test]
    fn a_required_mechanism_the_machine_lacks_is_named() {
        let all: Vec<String> = stockade_runtime::config::REQUIRABLE
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(missing_required(&full(), &all).is_empty());
        type Break = Box<dyn Fn(&mut Capabilities)>;
        let rows: Vec<(Break, &str)> = vec![
            (Box::new(|c| c.userns = false), "userns"),
            (Box::new(|c| c.seccomp = false), "seccomp"),
            (Box::new(|c| c.limits.cpu = Mechanism::Missing), "limits"),
            (Box::new(|c| c.disk = false), "disk"),
            (
                Box::new(|c| c.kill_mode = KillMode::ProcessGroup),
                "cgroup-kill",
            ),
            (Box::new(|c| c.attribution = false), "attribution"),
        ];
        for (break_it, name) in rows {
            let mut c = full();
            break_it(&mut c);
            assert_eq!(missing_required(&c, &all), [name.to_string()], "{name}");
            assert!(
                missing_required(&c, &[]).is_empty(),
                "{name}: not required, only degraded"
            );
        }
    }

    #[test]
    fn attribution_needs_cgroup_mode_trees_and_landlock() {
        assert!(attribution_available(KillMode::Cgroup, true, true));
        assert!(!attribution_available(KillMode::Cgroup, true, false));
        assert!(!attribution_available(KillMode::Cgroup, false, true));
        assert!(!attribution_available(KillMode::ProcessGroup, true, true));
    }

    #[test]
    fn concurrent_probes_do_not_degrade_each_other() {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test needs root (CI runs as root)"
        );
        let v2 = cgroup::detect_v2().expect("this test needs cgroup v2");
        // A root that does not exist yet: every probe creates a sibling directory.
        let root = v2.join(format!(
            "stockade-probe-test-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let results: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| s.spawn(|| probe_cgroup_kill(Some(&root))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            results.iter().all(|ok| *ok),
            "a concurrent probe saw no cgroup.kill: {results:?}"
        );
        assert!(!root.exists(), "probing created the root");
    }
}
