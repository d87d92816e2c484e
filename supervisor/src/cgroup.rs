//! cgroup v2: one directory per tree, `cgroup.kill`, waiting for `populated 0`,
//! freezing, and delegating a container's subtree to its supervisor.
//!
//! The kill uses only core files (`cgroup.procs`, `cgroup.kill`, `cgroup.events`), so a
//! process may sit in a non-leaf cgroup (the supervisor sits in its container's cgroup
//! above its processes' leaves). Every operation is relative to a directory fd, so the
//! supervisor works with the fd it inherited and needs no `/sys`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{AtFlags, Gid, Mode, OFlags, Uid};

/// Where cgroup v2 is mounted: `/sys/fs/cgroup` on a unified machine, else
/// `/sys/fs/cgroup/unified` on a hybrid one.
pub fn detect_v2() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.controllers").is_file())
}

/// The parent cgroup of every container: `auto` is `stockade-<data dir's hash>` under
/// the v2 mount: one per data directory, so an instance's sweep never meets another
/// instance's containers (invariant 12).
pub fn resolve_root(configured: &str, data_dir: &Path) -> Option<PathBuf> {
    if is_auto_root(configured) {
        detect_v2().map(|v2| v2.join(auto_root_name(data_dir)))
    } else {
        Some(PathBuf::from(configured))
    }
}

/// Whether `substrate.cgroup_root` names the `auto` root: one per data directory,
/// made by the instance that owns it (pure).
pub fn is_auto_root(configured: &str) -> bool {
    configured.is_empty() || configured == "auto"
}

/// `stockade-<12 hex digits of FNV-1a of the canonical data directory>` (pure but for
/// the canonicalization).
pub fn auto_root_name(data_dir: &Path) -> String {
    let canonical = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("stockade-{:012x}", h >> 16)
}

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The files a delegated cgroup's owner writes (cgroup-v2.rst, "Delegation
/// Containment"): the directory itself (to create leaves) and the files that move
/// processes. `cgroup.kill` and `cgroup.freeze` of the container's own cgroup stay
/// the host's.
const DELEGATED: &[&str] = &["cgroup.procs", "cgroup.threads", "cgroup.subtree_control"];

/// An open cgroup directory.
#[derive(Debug)]
pub struct CgroupDir {
    fd: OwnedFd,
}

impl CgroupDir {
    /// Open (creating it if `create`) the cgroup at `path`.
    pub fn open(path: &Path, create: bool) -> io::Result<CgroupDir> {
        if create {
            match std::fs::create_dir(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(CgroupDir { fd })
    }

    /// Adopt a directory descriptor (an inherited one: the supervisor's).
    pub fn from_fd(fd: OwnedFd) -> CgroupDir {
        CgroupDir { fd }
    }

    /// The directory fd (for `CLONE_INTO_CGROUP`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A new descriptor of this directory (to hand to a supervisor).
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        Ok(rustix::io::fcntl_dupfd_cloexec(&self.fd, 0)?)
    }

    /// Create (or open) the child cgroup `name`.
    pub fn child(&self, name: &str) -> io::Result<CgroupDir> {
        match self.create_child(name) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => self.open_child(name),
            r => r,
        }
    }

    /// Create the child cgroup `name`, which must not exist (`EEXIST` if it does).
    pub fn create_child(&self, name: &str) -> io::Result<CgroupDir> {
        rustix::fs::mkdirat(&self.fd, cstr(name)?.as_c_str(), Mode::from_raw_mode(0o755))?;
        self.open_child(name)
    }

    /// Open the existing child cgroup `name`.
    pub fn open_child(&self, name: &str) -> io::Result<CgroupDir> {
        let fd = rustix::fs::openat(
            &self.fd,
            cstr(name)?.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        Ok(CgroupDir { fd })
    }

    /// Open one of this cgroup's core files.
    pub fn open_file(&self, file: &str, write: bool) -> io::Result<std::fs::File> {
        let mode = if write {
            OFlags::WRONLY
        } else {
            OFlags::RDONLY
        };
        let fd = rustix::fs::openat(
            &self.fd,
            cstr(file)?.as_c_str(),
            mode | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        Ok(std::fs::File::from(fd))
    }

    fn read_file(&self, file: &str) -> io::Result<String> {
        let mut s = String::new();
        io::Read::read_to_string(&mut self.open_file(file, false)?, &mut s)?;
        Ok(s)
    }

    fn write_file(&self, file: &str, value: &str) -> io::Result<()> {
        io::Write::write_all(&mut self.open_file(file, true)?, value.as_bytes())
    }

    /// Hand this cgroup to `uid:gid` (a container's root): it may create leaves below
    /// and move its processes among them, and nothing above.
    pub fn delegate(&self, uid: u32, gid: u32) -> io::Result<()> {
        let (u, g) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
        rustix::fs::fchown(&self.fd, u, g)?;
        for f in DELEGATED {
            match rustix::fs::chownat(&self.fd, *f, u, g, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The pids in this cgroup (not its children).
    pub fn procs(&self) -> io::Result<Vec<i32>> {
        Ok(self
            .read_file("cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Pids in this cgroup and every descendant.
    pub fn procs_recursive(&self) -> io::Result<Vec<i32>> {
        let mut all = self.procs()?;
        for name in self.children()? {
            if let Ok(c) = self.open_child(&name) {
                all.extend(c.procs_recursive().unwrap_or_default());
            }
        }
        Ok(all)
    }

    /// Does this cgroup or a descendant hold a live process?
    pub fn populated(&self) -> io::Result<bool> {
        let f = self.open_file("cgroup.events", false)?;
        events_populated(f.as_fd())
    }

    /// Whether the cgroup at `path` below this one (`a/b`: names only, no `..`, no
    /// link followed) has a live process: one `openat2` and one `read`, where opening
    /// each directory in turn and `read_to_string` made nine syscalls (the linux
    /// substrate's `process_status` of a running process is this alone).
    pub fn child_populated(&self, path: &str) -> io::Result<bool> {
        if path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let fd = rustix::fs::openat2(
            &self.fd,
            format!("{path}/cgroup.events"),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            rustix::fs::ResolveFlags::BENEATH
                | rustix::fs::ResolveFlags::NO_SYMLINKS
                | rustix::fs::ResolveFlags::NO_MAGICLINKS
                | rustix::fs::ResolveFlags::NO_XDEV,
        )?;
        events_populated(fd.as_fd())
    }

    /// Kill every process in this cgroup and its descendants at once (`cgroup.kill`:
    /// a forking process cannot outrun it, a `setsid` cannot leave it).
    pub fn kill(&self) -> io::Result<()> {
        self.write_file("cgroup.kill", "1")
    }

    /// Wait until `cgroup.events` says `key` is `want`, or the deadline: the file raises
    /// POLLPRI on every change, so this sleeps on the kernel's notification.
    fn wait_event(&self, key: &str, want: bool, deadline: Instant) -> io::Result<bool> {
        let f = self.open_file("cgroup.events", false)?;
        let mut buf = [0u8; 256];
        loop {
            let n = rustix::io::pread(&f, &mut buf, 0)?;
            if events_key(&String::from_utf8_lossy(&buf[..n]), key) == want {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let left = deadline - now;
            let timeout = Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&f, PollFlags::PRI)];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Wait until `populated 0` or the deadline.
    pub fn wait_empty(&self, deadline: Instant) -> io::Result<bool> {
        self.wait_event("populated", false, deadline)
    }

    /// Freeze every process below (`cgroup.freeze`) and wait until they are
    /// (`frozen 1`): a checkpoint reads a tree nothing can change.
    pub fn freeze(&self, deadline: Instant) -> io::Result<bool> {
        self.write_file("cgroup.freeze", "1")?;
        self.wait_event("frozen", true, deadline)
    }

    /// Let the processes run again.
    pub fn thaw(&self) -> io::Result<()> {
        self.write_file("cgroup.freeze", "0")
    }

    /// Names of child cgroups.
    pub fn children(&self) -> io::Result<Vec<String>> {
        let mut dir = rustix::fs::Dir::read_from(&self.fd)?;
        let mut out = Vec::new();
        while let Some(e) = dir.read() {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type() == rustix::fs::FileType::Directory && name != "." && name != ".." {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// Remove the child cgroup `name` and every descendant (they must be empty).
    pub fn remove_child(&self, name: &str) -> io::Result<()> {
        if let Ok(c) = self.open_child(name) {
            for sub in c.children()? {
                c.remove_child(&sub)?;
            }
        }
        match rustix::fs::unlinkat(&self.fd, cstr(name)?.as_c_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Remove the child `name` if it is empty: true once it is gone (or was), false if
    /// it still holds a process or a child cgroup (the kernel refuses the `rmdir` of a
    /// populated cgroup, `EBUSY`): one syscall for a tree whose processes all exited.
    pub fn remove_empty_child(&self, name: &str) -> io::Result<bool> {
        match rustix::fs::unlinkat(&self.fd, cstr(name)?.as_c_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(true),
            Err(rustix::io::Errno::BUSY | rustix::io::Errno::NOTEMPTY) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Kill the child `name`'s tree, wait for it to empty, remove it, and wait for its
    /// processes to be reaped ([`Reaped`]) by whoever is their parent. The number of
    /// processes it held.
    pub fn destroy_child(&self, name: &str, deadline: Instant) -> io::Result<u32> {
        self.destroy(name, deadline, Orphans::LeaveToTheirParent)
    }

    /// [`destroy_child`](Self::destroy_child) from a container's PID 1: the tree's
    /// orphans (reparented to PID 1) are reaped by the killing thread itself, not
    /// waited for from PID 1's reaper ([`Orphans::Reap`]).
    pub fn destroy_child_as_pid1(&self, name: &str, deadline: Instant) -> io::Result<u32> {
        self.destroy(name, deadline, Orphans::Reap)
    }

    fn destroy(&self, name: &str, deadline: Instant, orphans: Orphans) -> io::Result<u32> {
        let c = match self.open_child(name) {
            Ok(c) => c,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(0),
            Err(e) => return Err(e),
        };
        let listed = c.procs_recursive().unwrap_or_default();
        let n = listed.len() as u32;
        let mut reaped = Reaped::watch(&c, &listed);
        // A cgroup removed meanwhile (its tree finished and its owner removed it)
        // answers ENOENT or ENODEV: it is as empty as it gets.
        let gone = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV));
        match c.kill() {
            Err(e) if gone(&e) => return Ok(n),
            r => r?,
        }
        loop {
            let empty = match c.wait_empty(deadline.min(Instant::now() + SWEEP_AFTER)) {
                Err(e) if gone(&e) => true,
                r => r?,
            };
            if empty {
                break;
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("cgroup {name} did not empty"),
                ));
            }
            // Still populated: `cgroup.kill` signals a process through its leader
            // thread, and one whose leader exited while its other threads run
            // (`pthread_exit` in `main`) is not signalled at all (kernel 6.18); what
            // such a process forks after the kill is not either, and at the pids limit
            // its forks refill every pid a kill frees. So the tree is frozen first
            // (nothing in it forks again once its tasks stop; a SIGKILL still ends a
            // frozen task), killed again, and every process it lists is signalled
            // through a pidfd (the whole thread group) and waited for with the rest.
            let _ = c.write_file("cgroup.freeze", "1");
            match c.kill() {
                Err(e) if gone(&e) => break,
                r => r?,
            }
            reaped.add(&c, &c.procs_recursive().unwrap_or_default());
            reaped.kill();
        }
        drop(c);
        self.remove_child(name)?;
        reaped.wait(orphans, deadline.min(Instant::now() + REAP_WAIT));
        Ok(n)
    }
}

/// How long a kill waits for its tree to empty before it signals each process still
/// there itself, and again after each such sweep. A tree that empties within it (1000
/// processes take 60-100 ms here) makes no sweep; one that holds a process
/// `cgroup.kill` cannot reach costs its kill this much more.
const SWEEP_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// The longest a kill waits for its dead tree to be reaped (past its own deadline it
/// never waits): a kernel whose pidfds do not wake at the reap (older than this
/// machine's 6.18) costs a kill this much, not its answer.
const REAP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Who reaps a killed tree's orphans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orphans {
    /// Their parent (the host destroying a container: its processes are not its
    /// children, and a child it has, it waits for itself).
    LeaveToTheirParent,
    /// The killing thread, for PID 1, whose children they became when their parents
    /// died. 1000 of them left to PID 1's reaper cost a kill 15-20 ms over the kill
    /// itself (the reaper and the killer's look at the pidfds after each wake-up
    /// shared the 2 cores; docs/BENCHMARKS.md).
    /// Only an orphan: `waitid` without `__WALL` never sees a leader (started with no
    /// exit signal, `Clone::quiet`), whose status is its run's and which
    /// `pid1::leader_exited` reaps under the state lock. An orphan's status is
    /// nobody's (PID 1's reaper drops it too).
    Reap,
}

/// A tree's processes, to wait for their reap after the kill.
///
/// `populated 0` says every process of the tree has left it, not that PID 1 has reaped
/// them: a zombie keeps its pid, charged to the container's `pids` limit, and a
/// container's next command right after a killed fork bomb failed to fork ("Cannot
/// fork", linux `boundary::attack_a_fork_bomb_stops_at_the_pids_limit`; 65-273 of 301
/// killed processes were still zombies when the kill answered,
/// `tree_kill::a_kill_returns_once_the_tree_is_reaped`). So the kill holds a pidfd of
/// each process it found and answers once each reads `POLLHUP` (the process is reaped:
/// no task behind the pid).
///
/// A workload can hold a zombie back: a process of another tree that ptraces one of
/// this tree's (same uid, allowed) is told of its death first, and until it waits for
/// it nobody reaps it. That costs the kill at most [`REAP_WAIT`], and the kill still
/// answers; the pid stays charged as it did before this wait.
struct Reaped(Vec<(i32, OwnedFd)>);

impl Reaped {
    /// Pidfds of the processes `listed` in `tree` ([`Reaped::add`]).
    fn watch(tree: &CgroupDir, listed: &[i32]) -> Reaped {
        let mut r = Reaped(Vec::new());
        r.add(tree, listed);
        r
    }

    /// Watch the processes `listed` in `tree` that are not watched yet: pidfds opened,
    /// then kept only for the pids the tree still lists, so none is a stranger's (a pid
    /// reaped and reused between the listing and the open). A pid already watched
    /// names the same process until that one is reaped (a pid is not reused before),
    /// so watched processes that are reaped are dropped first, and their pids, if
    /// listed again, are new processes and watched anew. A process forked after the
    /// listing is not watched.
    fn add(&mut self, tree: &CgroupDir, listed: &[i32]) {
        if !self.0.is_empty()
            && let Some(reaped) = reaped_flags(self.0.iter().map(|(_, fd)| fd))
        {
            let mut i = 0;
            self.0.retain(|_| {
                i += 1;
                !reaped[i - 1]
            });
        }
        let watched: std::collections::HashSet<i32> = self.0.iter().map(|(p, _)| *p).collect();
        let opened: Vec<(i32, OwnedFd)> = listed
            .iter()
            .filter(|pid| !watched.contains(pid))
            .filter_map(|&pid| {
                let p = rustix::process::Pid::from_raw(pid)?;
                let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty());
                Some((pid, fd.ok()?))
            })
            .collect();
        if opened.is_empty() {
            return;
        }
        let still: std::collections::HashSet<i32> = tree
            .procs_recursive()
            .unwrap_or_default()
            .into_iter()
            .collect();
        self.0
            .extend(opened.into_iter().filter(|(pid, _)| still.contains(pid)));
    }

    /// `SIGKILL` to every process (its whole thread group) through its pidfd: no
    /// stranger is signalled, whatever became of the pid.
    fn kill(&self) {
        for (_, fd) in &self.0 {
            let _ = crate::namespaces::kill_pidfd(fd);
        }
    }

    /// Wait until every process is reaped, or `until`: check them all at once (no
    /// sleep), then sleep on the first one left until its reap, and again. A process
    /// at a time woke this thread once per reap (1000 processes: +35 ms on a 70 ms
    /// kill); a look at all of them after each wake-up drops every one reaped meanwhile.
    fn wait(self, orphans: Orphans, until: Instant) {
        let mut left: Vec<OwnedFd> = self.0.into_iter().map(|(_, fd)| fd).collect();
        while !left.is_empty() {
            if orphans == Orphans::Reap {
                // Reaped here if it is an exited child of this process with an exit
                // signal: an orphan reparented to PID 1. Not a child yet (its parent
                // still dying), a leader, or reaped by another: kept, and waited for
                // below as any other.
                left.retain(|fd| !matches!(crate::namespaces::try_reap(fd), Ok(Some(_))));
            }
            let Some(reaped) = reaped_flags(left.iter()) else {
                return;
            };
            let mut i = 0;
            left.retain(|_| {
                i += 1;
                !reaped[i - 1]
            });
            let Some(first) = left.first() else {
                return;
            };
            let wait = until.saturating_duration_since(Instant::now());
            let timeout = Timespec {
                tv_sec: wait.as_secs() as i64,
                tv_nsec: i64::from(wait.subsec_nanos()),
            };
            // No events asked: a zombie's POLLIN is not one; only the hang-up of its
            // reap wakes this.
            let mut one = [PollFd::new(first, PollFlags::empty())];
            match rustix::event::poll(&mut one, Some(&timeout)) {
                Ok(0) => return,
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    }
}

/// For each pidfd, whether its process is reaped (`POLLHUP`: no task behind the pid;
/// no events are asked, so a zombie's `POLLIN` is not one), by one `poll` that does not
/// wait; `None` if the `poll` failed.
fn reaped_flags<'a>(fds: impl Iterator<Item = &'a OwnedFd>) -> Option<Vec<bool>> {
    let mut polled: Vec<PollFd<'_>> = fds.map(|fd| PollFd::new(fd, PollFlags::empty())).collect();
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut polled, Some(&now)).ok()?;
    Some(polled.iter().map(|f| !f.revents().is_empty()).collect())
}

/// `populated 1` in an open `cgroup.events` (a few dozen bytes: read whole into the
/// stack, no `statx` for a size as `read_to_string` makes).
fn events_populated(f: BorrowedFd<'_>) -> io::Result<bool> {
    let mut buf = [0u8; 256];
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::read(f, &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let text =
        std::str::from_utf8(&buf[..n]).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    Ok(events_key(text, "populated"))
}

/// `key 1` in a `cgroup.events` text (pure).
fn events_key(events: &str, key: &str) -> bool {
    events
        .lines()
        .any(|l| l.split_once(' ') == Some((key, "1")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_data_directory_gets_its_own_auto_root() {
        let a = auto_root_name(Path::new("/nonexistent/stockade-a"));
        let b = auto_root_name(Path::new("/nonexistent/stockade-b"));
        assert_ne!(a, b);
        assert_eq!(a, auto_root_name(Path::new("/nonexistent/stockade-a")));
        assert!(
            a.starts_with("stockade-") && a.len() == "stockade-".len() + 12,
            "{a}"
        );
    }

    /// `child_populated` reads `<path>/cgroup.events` below its directory and nowhere
    /// else: not through a link, not above it (a plain directory stands in for the
    /// cgroup tree: the rules are the path's, not cgroupfs's).
    #[test]
    fn a_child_is_read_below_its_directory_only() {
        let dir = std::env::temp_dir().join(format!("stockade-cg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root/c/live")).unwrap();
        std::fs::create_dir_all(dir.join("root/c/dead")).unwrap();
        std::fs::write(
            dir.join("root/c/live/cgroup.events"),
            "populated 1\nfrozen 0\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("root/c/dead/cgroup.events"),
            "populated 0\nfrozen 0\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        std::fs::write(dir.join("outside/cgroup.events"), "populated 1\n").unwrap();
        std::os::unix::fs::symlink(dir.join("root/c/live"), dir.join("root/c/link")).unwrap();
        std::os::unix::fs::symlink(dir.join("outside"), dir.join("root/c/away")).unwrap();
        let root = CgroupDir::open(&dir.join("root"), false).unwrap();
        assert!(root.child_populated("c/live").unwrap());
        assert!(!root.child_populated("c/dead").unwrap());
        assert!(root.child_populated("c/missing").is_err());
        for bad in [
            "c/link",
            "c/away",
            "../outside",
            "c/../../outside",
            "c//live",
            "/c/live",
            "",
        ] {
            assert!(root.child_populated(bad).is_err(), "{bad:?} read");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A child of this process that exits at once, with `exit_signal` (0: none, as a
    /// leader started by `Clone::quiet`), and its pidfd once it is a zombie.
    fn exited_child(exit_signal: i32) -> OwnedFd {
        // SAFETY: a fork-like clone (no CLONE_VM, no new stack); the child only calls
        // `_exit`, async-signal-safe.
        let pid =
            unsafe { libc::syscall(libc::SYS_clone, exit_signal as libc::c_long, 0, 0, 0, 0) };
        if pid == 0 {
            // SAFETY: the child ends here.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "clone: {}", io::Error::last_os_error());
        let p = rustix::process::Pid::from_raw(pid as i32).unwrap();
        let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).unwrap();
        // Wait until it exited, leaving it a zombie (`WNOWAIT`).
        rustix::process::waitid(
            rustix::process::WaitId::PidFd(fd.as_fd()),
            rustix::process::WaitIdOptions::EXITED
                | rustix::process::WaitIdOptions::NOWAIT
                | rustix::process::WaitIdOptions::from_bits_retain(libc::__WALL as u32),
        )
        .unwrap();
        fd
    }

    /// Whether the zombie of `fd` is still there to be reaped (and reap it).
    fn still_a_zombie(fd: &OwnedFd) -> bool {
        matches!(
            rustix::process::waitid(
                rustix::process::WaitId::PidFd(fd.as_fd()),
                rustix::process::WaitIdOptions::EXITED
                    | rustix::process::WaitIdOptions::NOHANG
                    | rustix::process::WaitIdOptions::from_bits_retain(libc::__WALL as u32),
            ),
            Ok(Some(_))
        )
    }

    /// The killing thread reaps an orphan (exit signal `SIGCHLD`, as the kernel sets at
    /// the reparenting) and never a leader (no exit signal): a leader's status is its
    /// run's, and `pid1::leader_exited` reaps it under the state lock, by pid, so a
    /// leader reaped behind its back would leave that pid free for reuse while still
    /// watched. Red with `__WALL` in the killer's reap.
    #[test]
    fn the_killer_reaps_an_orphan_never_a_leader() {
        let orphan = exited_child(libc::SIGCHLD);
        let leader = exited_child(0);
        let watched = Reaped(vec![
            (0, orphan.try_clone().unwrap()),
            (0, leader.try_clone().unwrap()),
        ]);
        watched.wait(
            Orphans::Reap,
            Instant::now() + std::time::Duration::from_millis(100),
        );
        let leader_left = still_a_zombie(&leader);
        assert!(
            !still_a_zombie(&orphan),
            "the orphan was reaped by the killer"
        );
        assert!(leader_left, "the leader was left to its reaper");
    }

    #[test]
    fn populated_and_frozen_are_read_from_cgroup_events() {
        assert!(events_key("populated 1\nfrozen 0\n", "populated"));
        assert!(!events_key("populated 0\nfrozen 0\n", "populated"));
        assert!(events_key("populated 1\nfrozen 1\n", "frozen"));
        assert!(!events_key("", "populated"));
    }
}
