//! Starting a container's supervisor: `clone3` into new user, PID, mount, network, UTS
//! and IPC namespaces, straight into the container's cgroup (`CLONE_INTO_CGROUP`: no
//! window in which it runs outside), with a pidfd (`CLONE_PIDFD`) the host watches.
//!
//! The user namespace maps the container's ids `0..n` onto its leased host range
//! ([`super::idmap`]). The child waits on a pipe until the host has written its
//! `uid_map` and `gid_map`; meanwhile it is still the host's root (kuid 0) inside new
//! namespaces, which it uses for one thing: opening, `O_PATH`, the host directories the
//! supervisor needs but whose parents only root may traverse (the data directory is
//! 0700). Then it becomes the container's root (an unprivileged host uid), places its
//! descriptors at fixed numbers, marks every other one close-on-exec, and `execveat`s
//! the supervisor binary from a descriptor (its path may not be traversable either).
//!
//! The clone shares the host's memory (`CLONE_VM`, on a stack of its own: see
//! [`super::clone`]) where the architecture has it (x86_64): no copy of the host's page
//! tables, no teardown of them at the exec. The child then uses this process's memory
//! until its exec, so the spawner keeps what it reads (and its stack) until the step
//! pipe's last write end closes: the exec closed it, or the child died. Elsewhere, or
//! if the kernel refuses it, the clone is fork-like.
//!
//! Every clone happens on ONE long-lived "spawner" thread: the child's
//! `PR_SET_PDEATHSIG(SIGKILL)` fires when the *thread* that cloned it exits, so a
//! short-lived thread would kill containers at random; a thread that lives as long as
//! the host makes containers die with the host.
//!
//! The spawner thread has a descriptor table of its own (`unshare(CLONE_FILES)`,
//! everything but its socket closed in it), and a request's descriptors cross into it,
//! and the new supervisor's pidfd and step pipe back, by `SCM_RIGHTS` over a socket
//! pair: a clone copies its parent thread's table and the exec closes the
//! copy, and the host's table holds about 9 descriptors per live container (~2 ms of
//! every cold start at 1000 live, `dnotify_flush` and `filp_close` per descriptor).
//! The clone now copies the handful of descriptors the spawner holds.
//!
//! The spawner thread has a mount namespace of its own too (`unshare(CLONE_NEWNS)`, made
//! a slave of the host's: the host's mounts and unmounts still reach it, nothing of its
//! own reaches the host), made before the first container. A clone copies its parent's
//! mount namespace, mount by mount, and the supervisor detaches that copy again after its
//! `pivot_root`: in the host's namespace that was one storage mount per live container
//! (2-3 ms of every start at 1000 live, and ~200 KiB of kernel memory per container, the
//! copy each supervisor's descriptors kept alive). The storage reaches the child as a
//! detached tree instead ([`SpawnRequest::attach_in_child`], `open_tree(OPEN_TREE_CLONE)`
//! by the host), which it attaches on its storage directory in its own namespace before
//! it opens it. Where the host's mounts are shared (systemd makes `/` shared) and the
//! data directory sits under one, each storage mount still propagates into the spawner's
//! namespace: the clone works the same and copies them, as before; `mount --make-private`
//! on the data directory's mount keeps them out. Where they are private (this project's
//! machines), a mount the host makes later does not reach the spawner's namespace at all:
//! each spawn names the directories its child opens, as the host sees them (device and
//! inode), and a spawner that sees another directory there makes its namespace again from
//! the host's (a data directory mounted after the first container; each test of a suite
//! mounts its own). A spawn without namespaces (a host without root) clones from the
//! host's namespace. Without a namespace of its own (`unshare` refused) the thread clones
//! from the host's.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};

use rustix::io::Errno;
use rustix::process::{Signal, WaitId, WaitIdOptions};

mod child;
mod mount_ns;
mod spawner;

pub use spawner::{spawn, spawner_task, start_spawner};

/// The numbers the supervisor finds its descriptors on ([`super::handoff`]).
pub use super::handoff::{CGROUP_FD, IMAGE_FD, READY_FD, ROOT_FD, SOCK_FD, STORAGE_FD};

/// What to start.
pub struct SpawnRequest {
    /// The supervisor executable, opened by the host (`execveat(AT_EMPTY_PATH)`).
    pub exe: OwnedFd,
    /// Its argv (argv\[0\] included).
    pub argv: Vec<CString>,
    /// Its environment.
    pub envp: Vec<CString>,
    /// Descriptors the host opened, and the number each gets in the supervisor.
    pub fds: Vec<(OwnedFd, RawFd)>,
    /// Paths the child opens `O_PATH` as the host's root, in its new mount namespace,
    /// and the number each gets.
    pub open_in_child: Vec<(CString, RawFd)>,
    /// Detached mount trees (`open_tree(OPEN_TREE_CLONE)`) and the path the child
    /// attaches each on, in its new mount namespace, before its `open_in_child`: mounts
    /// the host made after the spawner's namespace was (the container's storage).
    pub attach_in_child: Vec<(OwnedFd, CString)>,
    /// The container's cgroup directory (the clone target).
    pub cgroup: Option<OwnedFd>,
    /// Create the namespaces (and the user namespace, if `id_map` is set).
    pub namespaces: bool,
    /// `/proc/<pid>/uid_map` and `gid_map` for a user namespace: `0 <base> <n>`.
    pub id_map: Option<String>,
    /// `cgroup.procs` files (v1 hierarchies) the child joins before it may go on: its
    /// limits hold from its first instruction, and its cgroup namespace (made after
    /// go) is rooted in them.
    pub join: Vec<std::path::PathBuf>,
}

/// A started supervisor.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid in the host's PID namespace.
    pub pid: i32,
    /// Its pidfd.
    pub pidfd: OwnedFd,
    /// The read end of its clone child's step pipe ([`stage::outcome`](crate::stage::outcome)): empty once
    /// the supervisor executable runs, the failed [`Stage`](crate::stage::Stage) if the child died before.
    pub steps: OwnedFd,
}

/// `pidfd_send_signal(SIGKILL)`: no pid-reuse race. A process already gone is fine.
pub fn kill_pidfd(pidfd: impl AsFd) -> io::Result<()> {
    match rustix::process::pidfd_send_signal(pidfd, Signal::KILL) {
        Ok(()) | Err(Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reap the process behind `pidfd` if it exited (`waitid(P_PIDFD, WNOHANG)`): its
/// status.
pub fn try_reap(pidfd: impl AsFd) -> io::Result<Option<i32>> {
    let r = rustix::process::waitid(
        WaitId::PidFd(pidfd.as_fd()),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    )?;
    Ok(r.map(|s| {
        s.exit_status()
            .or_else(|| s.terminating_signal().map(|n| -n))
            .unwrap_or(-1)
    }))
}

/// Wait until the process behind `pidfd` exits and reap it: its status.
pub fn reap_blocking(pidfd: impl AsFd) -> io::Result<i32> {
    let s = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED)?;
    Ok(s.map_or(-1, |s| {
        s.exit_status()
            .or_else(|| s.terminating_signal().map(|n| -n))
            .unwrap_or(-1)
    }))
}

#[cfg(test)]
mod tests {
    use super::super::stage::{self, Stage};
    use super::*;

    /// `/bin/true` as a supervisor, without namespaces (no privilege needed), opening
    /// `open` in the child.
    pub(super) fn spawn_true(open: Option<&str>) -> Spawned {
        let exe = rustix::fs::open(
            "/bin/true",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        spawn(SpawnRequest {
            exe,
            argv: vec![CString::new("true").unwrap()],
            envp: Vec::new(),
            fds: Vec::new(),
            open_in_child: open
                .map(|p| (CString::new(p).unwrap(), ROOT_FD))
                .into_iter()
                .collect(),
            attach_in_child: Vec::new(),
            cgroup: None,
            namespaces: false,
            id_map: None,
            join: Vec::new(),
        })
        .unwrap()
    }

    /// A clone child that fails a step says which, and the host can read it (it used to
    /// `_exit(125)`, a number the host never decoded: "exited during set-up").
    #[test]
    fn a_supervisor_child_that_fails_a_step_names_it() {
        let s = spawn_true(Some("/nonexistent-stockade-host-directory"));
        let failed = stage::outcome(&s.steps).unwrap().expect("a failed step");
        assert_eq!(failed.stage, Stage::OpenHostDirs);
        assert_eq!(failed.errno, libc::ENOENT);
        assert_eq!(reap_blocking(&s.pidfd).unwrap(), stage::FAILED_EXIT);
        let e = io::Error::from(failed);
        assert!(
            e.to_string()
                .starts_with("opening the container's host directories: "),
            "{e}"
        );
    }

    /// One that execs reports nothing: its step pipe closes with the exec.
    #[test]
    fn a_supervisor_child_that_execs_reports_nothing() {
        let s = spawn_true(None);
        assert_eq!(stage::outcome(&s.steps).unwrap(), None);
        assert_eq!(reap_blocking(&s.pidfd).unwrap(), 0);
    }
}
