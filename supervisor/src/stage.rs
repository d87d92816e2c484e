//! The child-step protocol: what a child does between its clone and its exec, step by
//! step, and how it says which step failed.
//!
//! Both children (a supervisor the host clones, [`super::namespaces`]; a workload the
//! supervisor spawns, [`super::exec`]) run on a copy of a multi-threaded parent: they
//! may not allocate or format. Each gets the write end of a close-on-exec pipe; a step
//! that fails writes one record, its [`Stage`] and `errno` (8 bytes, native endian:
//! both ends are one build), and `_exit`s. The parent reads the pipe to its end
//! ([`outcome`]): nothing means the exec happened (the pipe closed with it), a record is
//! a [`Failed`] that names the step.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, RawFd};

/// The exit code of a child that reported a failed step (its parent reads the step
/// from the pipe; the code only says "see the pipe").
pub const FAILED_EXIT: i32 = 127;

/// One step of a child between clone and exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    /// A supervisor child: waiting for the host's go (its id maps written, its v1
    /// cgroups joined).
    AwaitGo = 1,
    /// A supervisor child: attaching the mounts the host passed (its storage), right
    /// after the go.
    AttachMounts = 6,
    /// A supervisor child: opening, still as the host's root, the host directories the
    /// supervisor needs.
    OpenHostDirs = 2,
    /// A supervisor child: becoming the container's root (`setgroups`, `setresgid`,
    /// `setresuid`).
    BecomeRoot = 3,
    /// A supervisor child: placing its descriptors at their numbers.
    PlaceFds = 4,
    /// A supervisor child: `execveat` of the supervisor executable.
    ExecSupervisor = 5,
    /// A workload: joining its leaf cgroup (`cgroup.procs`, without `CLONE_INTO_CGROUP`).
    JoinCgroup = 11,
    /// A workload: its standard streams.
    Stdio = 12,
    /// A workload: its working directory.
    Cwd = 13,
    /// A workload: dropping every capability, `no_new_privs`.
    DropCapabilities = 14,
    /// A workload: `execve` of its program.
    Exec = 15,
    /// A workload: taking the workload identity (groups, gid, uid).
    Identity = 16,
    /// A workload: installing its seccomp filter.
    Seccomp = 17,
    /// A workload: entering its Landlock domain.
    Landlock = 18,
}

impl Stage {
    const ALL: [Stage; 14] = [
        Stage::AwaitGo,
        Stage::AttachMounts,
        Stage::OpenHostDirs,
        Stage::BecomeRoot,
        Stage::PlaceFds,
        Stage::ExecSupervisor,
        Stage::JoinCgroup,
        Stage::Stdio,
        Stage::Cwd,
        Stage::DropCapabilities,
        Stage::Exec,
        Stage::Identity,
        Stage::Seccomp,
        Stage::Landlock,
    ];

    /// The stage a record names (`None`: not a stage of this build).
    pub fn from_u32(n: u32) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| *s as u32 == n)
    }

    /// What the child was doing, for an error message.
    pub fn what(self) -> &'static str {
        match self {
            Stage::AwaitGo => "waiting for the host's go (id maps, cgroups)",
            Stage::OpenHostDirs => "opening the container's host directories",
            Stage::BecomeRoot => "becoming the container's root",
            Stage::PlaceFds => "placing its descriptors",
            Stage::AttachMounts => "attaching the container's storage",
            Stage::ExecSupervisor => "executing the supervisor",
            Stage::JoinCgroup => "joining its cgroup",
            Stage::Stdio => "setting up stdio",
            Stage::Cwd => "entering its working directory",
            Stage::DropCapabilities => "dropping capabilities",
            Stage::Exec => "exec",
            Stage::Identity => "taking the workload identity",
            Stage::Seccomp => "installing the seccomp filter",
            Stage::Landlock => "entering its Landlock domain",
        }
    }
}

/// A child's failed step, as its parent read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// The step.
    pub stage: Stage,
    /// Its `errno`.
    pub errno: i32,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            self.stage.what(),
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl From<Failed> for io::Error {
    /// An error of the errno's kind, whose message names the step.
    fn from(f: Failed) -> io::Error {
        io::Error::new(io::Error::from_raw_os_error(f.errno).kind(), f.to_string())
    }
}

/// Report `stage` and `errno` on `err_w`, and exit with [`FAILED_EXIT`]. The errno is
/// the failed call's own return value (`clone::raw_syscall`), never read from `errno`:
/// a `CLONE_VM` child shares its parent thread's.
///
/// # Safety
/// Only in a child between clone and exec (it `_exit`s): async-signal-safe calls only.
pub unsafe fn fail_with(err_w: RawFd, stage: Stage, errno: i32) -> ! {
    let mut buf = [0u8; 8];
    buf[..4].copy_from_slice(&(stage as u32).to_ne_bytes());
    buf[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: `write` of a stack buffer of 8 bytes and `_exit` are async-signal-safe;
    // a failed write leaves the parent with "exited" instead of the step.
    unsafe {
        libc::write(err_w, buf.as_ptr().cast(), buf.len());
        libc::_exit(FAILED_EXIT)
    }
}

/// Read a child's pipe to its end: `None` once it closed empty (the exec happened, or
/// the child died without a word), the failed step otherwise. Blocks until every
/// write end is closed.
pub fn outcome(err_r: impl AsFd) -> io::Result<Option<Failed>> {
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(&err_r, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    if got < buf.len() {
        return Ok(None);
    }
    let [a, b, c, d, e, f, g, h] = buf;
    let stage = u32::from_ne_bytes([a, b, c, d]);
    let errno = i32::from_ne_bytes([e, f, g, h]);
    Ok(Some(Failed {
        // A number this build does not know cannot come from its own children; say
        // "exec" rather than nothing.
        stage: Stage::from_u32(stage).unwrap_or(Stage::Exec),
        errno,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_round_trips_and_says_what_it_was() {
        for s in Stage::ALL {
            assert_eq!(Stage::from_u32(s as u32), Some(s));
            assert!(!s.what().is_empty());
        }
        assert_eq!(Stage::from_u32(0), None);
    }

    /// A forked child that fails a step: its parent reads the step and the errno; one
    /// that execs: its parent reads nothing.
    #[test]
    fn a_childs_failed_step_reaches_its_parent() {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        use std::os::fd::AsRawFd;
        let raw_w = w.as_raw_fd();
        // SAFETY: the child only calls `fail_with` (a write and `_exit`).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: in the child.
            unsafe { fail_with(raw_w, Stage::Landlock, libc::EPERM) }
        }
        drop(w);
        let failed = outcome(&r).unwrap().expect("a record");
        assert_eq!(
            failed,
            Failed {
                stage: Stage::Landlock,
                errno: libc::EPERM
            }
        );
        let e = io::Error::from(failed);
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            e.to_string().starts_with("entering its Landlock domain: "),
            "{e}"
        );
        let p = rustix::process::Pid::from_raw(pid).unwrap();
        let st = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty())
            .unwrap()
            .unwrap()
            .1;
        assert_eq!(st.exit_status(), Some(FAILED_EXIT));
    }
}
