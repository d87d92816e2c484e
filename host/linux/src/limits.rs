//! Per-container resource limits (invariant 11): pids, memory and cpu
//! for every process of a container together, on cgroup v2 controllers where the v2
//! hierarchy has them and on the v1 hierarchies where it does not (a hybrid machine
//! binds `pids`, `memory` and `cpu` to v1 mounts; the v2 hierarchy there has none).
//!
//! * v2: the limits are files of the container's own v2 cgroup (`pids.max`,
//!   `memory.max`, `cpu.max`); the supervisor is born in it (`CLONE_INTO_CGROUP`), so
//!   every process of the container is inside.
//! * v1: one directory per container in each v1 hierarchy,
//!   `<mount>/<root>/<container-id>`, which the host joins the supervisor to before
//!   the supervisor starts anything; its processes inherit the membership.
//!
//! Either way the supervisor is counted with its workloads. It protects itself: its
//! threads exist before any workload (a fork bomb cannot starve it of pids), and every
//! workload gets `oom_score_adj` 1000 right after its exec (the OOM killer picks a workload first;
//! raising a score needs no privilege, lowering the supervisor's would need
//! CAP_SYS_RESOURCE). A workload may lower its own score back to 0: then the OOM
//! killer weighs it and the supervisor by size, and at worst kills the supervisor,
//! which stops that container only.
//!
//! A limit that was hit during a run is reported with the run
//! ([`limits_hit`]): `pids` when a fork failed at `pids.max` (`pids.events max`),
//! `memory` when the OOM killer killed a process (`oom_kill`).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stockade_runtime::config::LimitsConfig;
use stockade_runtime::substrate::ResourceLimit;

use super::cgroup::CgroupDir;

/// A resource a limit applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    /// Processes and threads.
    Pids,
    /// RAM.
    Memory,
    /// CPU time.
    Cpu,
}

impl Controller {
    /// All of them, in the order `doctor` prints them.
    pub const ALL: [Controller; 3] = [Controller::Pids, Controller::Memory, Controller::Cpu];

    /// The kernel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Pids => "pids",
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
        }
    }
}

/// How one controller is reached on this machine.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// A cgroup v2 controller.
    V2,
    /// A cgroup v1 hierarchy mounted here.
    V1(PathBuf),
    /// Neither: the limit cannot be applied.
    Missing,
}

/// Which mechanism each controller gets (pure): v2 when the v2 hierarchy offers it,
/// else a v1 mount that carries it, else missing.
pub fn choose(
    controller: Controller,
    v2_controllers: &[&str],
    v1_mounts: &[(Vec<String>, PathBuf)],
) -> Mechanism {
    if v2_controllers.contains(&controller.name()) {
        return Mechanism::V2;
    }
    v1_mounts
        .iter()
        .find(|(names, _)| names.iter().any(|n| n == controller.name()))
        .map_or(Mechanism::Missing, |(_, p)| Mechanism::V1(p.clone()))
}

/// cgroup v1 mounts in a `/proc/self/mountinfo` text: (controllers, mount point)
/// (pure). Only the three controllers Stockade limits are named.
pub fn v1_mounts(mountinfo: &str) -> Vec<(Vec<String>, PathBuf)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let mut post = post.split_whitespace();
        if post.next() != Some("cgroup") {
            continue;
        }
        let opts = post.nth(1).unwrap_or("");
        let names: Vec<String> = opts
            .split(',')
            .filter(|o| Controller::ALL.iter().any(|c| c.name() == *o))
            .map(str::to_string)
            .collect();
        let Some(mount) = pre.split_whitespace().nth(4) else {
            continue;
        };
        if !names.is_empty() {
            out.push((names, PathBuf::from(mount)));
        }
    }
    out
}

/// The machine's plan: one mechanism per controller.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// `pids`.
    pub pids: Mechanism,
    /// `memory`.
    pub memory: Mechanism,
    /// `cpu`.
    pub cpu: Mechanism,
}

impl Plan {
    /// Probe this machine: the v2 mount's `cgroup.controllers` and the v1 mounts.
    pub fn detect(v2: Option<&Path>) -> Plan {
        let v2_text = v2
            .and_then(|p| std::fs::read_to_string(p.join("cgroup.controllers")).ok())
            .unwrap_or_default();
        let v2_names: Vec<&str> = v2_text.split_whitespace().collect();
        let v1 = v1_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
        Plan {
            pids: choose(Controller::Pids, &v2_names, &v1),
            memory: choose(Controller::Memory, &v2_names, &v1),
            cpu: choose(Controller::Cpu, &v2_names, &v1),
        }
    }

    /// The mechanism of `c`.
    pub fn of(&self, c: Controller) -> &Mechanism {
        match c {
            Controller::Pids => &self.pids,
            Controller::Memory => &self.memory,
            Controller::Cpu => &self.cpu,
        }
    }

    /// Controllers without a mechanism.
    pub fn missing(&self) -> Vec<Controller> {
        Controller::ALL
            .into_iter()
            .filter(|c| *self.of(*c) == Mechanism::Missing)
            .collect()
    }

    /// Controllers on v2.
    fn v2(&self) -> Vec<Controller> {
        Controller::ALL
            .into_iter()
            .filter(|c| *self.of(*c) == Mechanism::V2)
            .collect()
    }
}

/// The files and values that set `limits` for one controller (pure). Values of 0 mean
/// no limit and write nothing.
pub fn settings(c: Controller, v2: bool, l: &LimitsConfig) -> Vec<(&'static str, String)> {
    match (c, v2) {
        (Controller::Pids, _) if l.pids > 0 => vec![("pids.max", l.pids.to_string())],
        (Controller::Memory, true) if l.memory_mib > 0 => vec![
            ("memory.max", (l.memory_mib << 20).to_string()),
            // No swap beyond the limit: memory.max alone lets a hog swap.
            ("memory.swap.max", "0".into()),
        ],
        (Controller::Memory, false) if l.memory_mib > 0 => vec![
            ("memory.limit_in_bytes", (l.memory_mib << 20).to_string()),
            (
                "memory.memsw.limit_in_bytes",
                (l.memory_mib << 20).to_string(),
            ),
        ],
        (Controller::Cpu, true) if l.cpus > 0.0 => {
            vec![("cpu.max", format!("{} 100000", cpu_quota_us(l.cpus)))]
        }
        (Controller::Cpu, false) if l.cpus > 0.0 => vec![
            ("cpu.cfs_period_us", "100000".into()),
            ("cpu.cfs_quota_us", cpu_quota_us(l.cpus).to_string()),
        ],
        _ => Vec::new(),
    }
}

/// CFS quota per 100 ms period for `cpus` CPUs (at least the kernel's 1 ms minimum).
pub fn cpu_quota_us(cpus: f64) -> u64 {
    ((cpus * 100_000.0).round() as u64).max(1000)
}

/// Counters that say a limit was hit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Forks refused at `pids.max`.
    pub pids_max: u64,
    /// Processes the OOM killer killed.
    pub oom_kills: u64,
}

/// The value of `key` in a flat-keyed cgroup file (`max 3`, `oom_kill 1`) (pure).
pub fn flat_key(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The limits hit between two readings (pure). `disk_full` is the container's
/// storage having no room left after the run.
pub fn limits_hit(before: Counters, after: Counters, disk_full: bool) -> Vec<ResourceLimit> {
    let mut hit = Vec::new();
    if after.pids_max > before.pids_max {
        hit.push(ResourceLimit::Pids);
    }
    if after.oom_kills > before.oom_kills {
        hit.push(ResourceLimit::Memory);
    }
    if disk_full {
        hit.push(ResourceLimit::Disk);
    }
    hit
}

/// Prepare the machine for `plan`: enable every v2 controller the plan uses on the
/// path from the v2 mount down to the containers' parent `root`.
pub fn enable_v2(plan: &Plan, v2_mount: &Path, root: &Path) -> io::Result<()> {
    let wanted = plan.v2();
    if wanted.is_empty() {
        return Ok(());
    }
    let rel = root.strip_prefix(v2_mount).map_err(io::Error::other)?;
    let mut dir = v2_mount.to_path_buf();
    let mut chain = vec![dir.clone()];
    for part in rel.components() {
        dir.push(part);
        chain.push(dir.clone());
    }
    // Every cgroup above a container's must pass the controllers down.
    for d in chain {
        let line: Vec<String> = wanted.iter().map(|c| format!("+{}", c.name())).collect();
        std::fs::write(d.join("cgroup.subtree_control"), line.join(" "))?;
    }
    Ok(())
}

/// One container's limits.
#[derive(Debug)]
pub struct ContainerLimits {
    /// The v1 directories, per controller.
    v1: Vec<(Controller, PathBuf)>,
    /// Whether `pids` / `memory` live in the container's v2 cgroup.
    v2_pids: bool,
    v2_memory: bool,
    /// The container's v2 cgroup directory (v2 counters).
    v2_dir: Option<PathBuf>,
    /// The counter files, opened at the first reading and kept: a run reads them
    /// before and after, and a reading is then a `pread` each, not a path walk through
    /// the cgroup file systems and five system calls.
    counter_files: std::sync::OnceLock<Vec<(Counter, std::fs::File)>>,
}

/// Which counter a file holds.
#[derive(Debug, Clone, Copy)]
enum Counter {
    /// `pids.events` `max`.
    PidsMax,
    /// `memory.oom_control` (v1) or `memory.events` (v2) `oom_kill`.
    OomKills,
}

impl ContainerLimits {
    /// Create the container's limits: v1 directories `<mount>/<root_name>/<id>` with
    /// their values, and the values in its v2 cgroup `v2` (already created).
    pub fn create(
        plan: &Plan,
        l: &LimitsConfig,
        root_name: &str,
        id: &str,
        v2: Option<(&CgroupDir, &Path)>,
    ) -> io::Result<ContainerLimits> {
        let mut out = ContainerLimits {
            v1: Vec::new(),
            v2_pids: false,
            v2_memory: false,
            v2_dir: v2.map(|(_, p)| p.to_path_buf()),
            counter_files: std::sync::OnceLock::new(),
        };
        for c in Controller::ALL {
            match plan.of(c) {
                Mechanism::V1(mount) => {
                    let dir = mount.join(root_name).join(id);
                    std::fs::create_dir_all(&dir)?;
                    out.v1.push((c, dir.clone()));
                    for (file, value) in settings(c, false, l) {
                        write_optional(&dir.join(file), &value)?;
                    }
                }
                Mechanism::V2 => {
                    let Some((cg, _)) = v2 else { continue };
                    for (file, value) in settings(c, true, l) {
                        match cg.open_file(file, true) {
                            Ok(mut f) => io::Write::write_all(&mut f, value.as_bytes())?,
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => return Err(e),
                        }
                    }
                    out.v2_pids |= c == Controller::Pids;
                    out.v2_memory |= c == Controller::Memory;
                }
                Mechanism::Missing => {}
            }
        }
        Ok(out)
    }

    /// Put `pid` (the supervisor, before it starts anything) into the v1 directories.
    pub fn join(&self, pid: i32) -> io::Result<()> {
        for (_, dir) in &self.v1 {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(())
    }

    /// The counters now (a file that cannot be opened or read counts 0).
    pub fn counters(&self) -> Counters {
        if let Some(files) = self.counter_files.get() {
            return read_counters(files);
        }
        let (files, all) = self.open_counters();
        if !all {
            // Kept only once every file opened: one that failed now (descriptors short
            // for a moment) is tried again at the next reading, not missed for the
            // container's life.
            return read_counters(&files);
        }
        read_counters(self.counter_files.get_or_init(|| files))
    }

    /// The counter files this container has, in reading order (v2 after v1: where both
    /// hold one, the v2 one wins, as before), and whether every one of them opened.
    fn open_counters(&self) -> (Vec<(Counter, std::fs::File)>, bool) {
        let mut paths = Vec::new();
        for (ctl, dir) in &self.v1 {
            match ctl {
                Controller::Pids => paths.push((Counter::PidsMax, dir.join("pids.events"))),
                Controller::Memory => {
                    paths.push((Counter::OomKills, dir.join("memory.oom_control")))
                }
                Controller::Cpu => {}
            }
        }
        if let Some(dir) = &self.v2_dir {
            if self.v2_pids {
                paths.push((Counter::PidsMax, dir.join("pids.events")));
            }
            if self.v2_memory {
                paths.push((Counter::OomKills, dir.join("memory.events")));
            }
        }
        let wanted = paths.len();
        let files: Vec<_> = paths
            .into_iter()
            .filter_map(|(which, p)| std::fs::File::open(p).ok().map(|f| (which, f)))
            .collect();
        let all = files.len() == wanted;
        (files, all)
    }

    /// The v1 directories (tests, sweeps).
    pub fn v1_dirs(&self) -> impl Iterator<Item = &Path> {
        self.v1.iter().map(|(_, p)| p.as_path())
    }

    /// Remove the v1 directories once the container's processes are gone (an exiting
    /// task leaves its v1 cgroup a moment after its parent reaps it: `EBUSY` is
    /// retried until `deadline`).
    pub fn destroy(&self, deadline: Instant) -> io::Result<()> {
        for (_, dir) in &self.v1 {
            remove_v1_dir(dir, deadline)?;
        }
        Ok(())
    }
}

/// Read each counter file from offset 0 (a cgroup file is made afresh at each read).
fn read_counters(files: &[(Counter, std::fs::File)]) -> Counters {
    let mut c = Counters::default();
    let mut buf = [0u8; 512];
    for (which, f) in files {
        let n = rustix::io::pread(f, &mut buf, 0).unwrap_or(0);
        let text = std::str::from_utf8(&buf[..n]).unwrap_or_default();
        match which {
            Counter::PidsMax => c.pids_max = flat_key(text, "max"),
            Counter::OomKills => c.oom_kills = flat_key(text, "oom_kill"),
        }
    }
    c
}

/// Write a limit file that may not exist on this kernel (`memory.memsw.*` without swap
/// accounting, `memory.swap.max` without swap).
fn write_optional(path: &Path, value: &str) -> io::Result<()> {
    match std::fs::write(path, value) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// `rmdir` a v1 cgroup directory, retrying `EBUSY` until `deadline`; a missing one is
/// fine.
pub fn remove_v1_dir(dir: &Path, deadline: Instant) -> io::Result<()> {
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                // No event tells when a reaped task has left a v1 cgroup.
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The v1 directories of `root_name` (every container's parent) in this plan.
pub fn v1_roots(plan: &Plan, root_name: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Controller::ALL
        .into_iter()
        .filter_map(|c| match plan.of(c) {
            Mechanism::V1(m) => Some(m.join(root_name)),
            _ => None,
        })
        .collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
30 29 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
31 29 0:27 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 29 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 29 0:32 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
37 29 0:33 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
38 29 0:34 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
40 29 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn v1_mounts_are_read_from_mountinfo() {
        let m = v1_mounts(HYBRID);
        assert!(m.contains(&(vec!["pids".into()], "/sys/fs/cgroup/pids".into())));
        assert!(m.contains(&(vec!["memory".into()], "/sys/fs/cgroup/memory".into())));
        assert!(m.contains(&(vec!["cpu".into()], "/sys/fs/cgroup/cpu,cpuacct".into())));
        assert!(
            !m.iter()
                .any(|(_, p)| p.ends_with("systemd") || p.ends_with("unified"))
        );
    }

    #[test]
    fn each_controller_takes_v2_then_v1_then_nothing() {
        let v1 = v1_mounts(HYBRID);
        type Mounts = [(Vec<String>, PathBuf)];
        let rows: &[(Controller, &[&str], &Mounts, Mechanism)] = &[
            // a hybrid machine whose v2 hierarchy has no controllers: v1
            (
                Controller::Pids,
                &["hugetlb"],
                &v1,
                Mechanism::V1("/sys/fs/cgroup/pids".into()),
            ),
            (
                Controller::Memory,
                &[],
                &v1,
                Mechanism::V1("/sys/fs/cgroup/memory".into()),
            ),
            // a unified machine: v2, even with a v1 mount around
            (
                Controller::Memory,
                &["cpu", "memory", "pids"],
                &v1,
                Mechanism::V2,
            ),
            (Controller::Cpu, &["cpu"], &[], Mechanism::V2),
            // neither
            (Controller::Pids, &["memory"], &[], Mechanism::Missing),
        ];
        for (c, v2, v1, want) in rows {
            assert_eq!(&choose(*c, v2, v1), want, "{c:?} v2={v2:?}");
        }
    }

    #[test]
    fn settings_name_the_files_of_each_hierarchy() {
        let l = LimitsConfig {
            pids: 128,
            memory_mib: 256,
            cpus: 0.5,
            disk_mib: 64,
        };
        assert_eq!(
            settings(Controller::Pids, false, &l),
            [("pids.max", "128".to_string())]
        );
        assert_eq!(
            settings(Controller::Memory, false, &l)[0],
            ("memory.limit_in_bytes", (256u64 << 20).to_string())
        );
        assert_eq!(
            settings(Controller::Cpu, true, &l),
            [("cpu.max", "50000 100000".to_string())]
        );
        assert_eq!(
            settings(Controller::Cpu, false, &l)[1],
            ("cpu.cfs_quota_us", "50000".to_string())
        );
        let none = LimitsConfig {
            pids: 0,
            memory_mib: 0,
            cpus: 0.0,
            disk_mib: 1,
        };
        for c in Controller::ALL {
            assert!(
                settings(c, true, &none).is_empty(),
                "0 means no limit: {c:?}"
            );
        }
        assert_eq!(cpu_quota_us(0.001), 1000, "the kernel's minimum quota");
    }

    /// The counter files are kept open once all of them opened; one missing at a
    /// reading is looked for again at the next, never taken as absent for good.
    #[test]
    fn a_counter_file_that_did_not_open_is_tried_again() {
        let dir = std::env::temp_dir().join(format!("stockade-counters-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let l = ContainerLimits {
            v1: Vec::new(),
            v2_pids: true,
            v2_memory: true,
            v2_dir: Some(dir.clone()),
            counter_files: std::sync::OnceLock::new(),
        };
        std::fs::write(dir.join("memory.events"), "oom_kill 1\n").unwrap();
        assert_eq!((l.counters().pids_max, l.counters().oom_kills), (0, 1));
        std::fs::write(dir.join("pids.events"), "max 3\n").unwrap();
        assert_eq!((l.counters().pids_max, l.counters().oom_kills), (3, 1));
        // Kept now: read through the open files.
        std::fs::write(dir.join("pids.events"), "max 4\n").unwrap();
        assert_eq!(l.counters().pids_max, 4);
        assert!(l.counter_files.get().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_limit_counts_as_hit_when_its_counter_moved() {
        assert_eq!(flat_key("max 3\n", "max"), 3);
        assert_eq!(flat_key("oom 2\noom_kill 1\n", "oom_kill"), 1);
        assert_eq!(flat_key("", "max"), 0);
        let c = |p, o| Counters {
            pids_max: p,
            oom_kills: o,
        };
        let rows = [
            (c(0, 0), c(0, 0), false, vec![]),
            (c(2, 0), c(5, 0), false, vec![ResourceLimit::Pids]),
            (c(0, 1), c(0, 2), false, vec![ResourceLimit::Memory]),
            (c(0, 0), c(0, 0), true, vec![ResourceLimit::Disk]),
            (
                c(1, 1),
                c(2, 2),
                true,
                vec![
                    ResourceLimit::Pids,
                    ResourceLimit::Memory,
                    ResourceLimit::Disk,
                ],
            ),
        ];
        for (before, after, disk, want) in rows {
            assert_eq!(
                limits_hit(before, after, disk),
                want,
                "{before:?} -> {after:?}"
            );
        }
    }
}
