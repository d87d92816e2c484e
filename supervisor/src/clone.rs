//! The one `clone3(2)`: both the host's clone of a supervisor ([`super::namespaces`])
//! and the supervisor's spawn of a workload ([`super::exec`]) are fork-like `clone3`
//! calls (no `CLONE_VM`, no new stack) made here; they differ only in their flags.
//! What a child then does, and how it reports a failed step, is
//! [`super::stage`]'s protocol.

use std::io;
use std::os::fd::RawFd;

/// `struct clone_args` of `clone3(2)` (the kernel's `CLONE_ARGS_SIZE_VER2` layout).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_PIDFD`: the kernel writes a pidfd of the child.
const CLONE_PIDFD: u64 = 0x1000;
/// `CLONE_INTO_CGROUP` (Linux 5.7): the child starts in the cgroup [`Clone::cgroup`].
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// One fork-like clone: what the child gets besides a copy of the calling thread.
#[derive(Debug, Default, Clone, Copy)]
pub struct Clone {
    /// `CLONE_NEW*` flags: the namespaces the child is born in.
    pub namespaces: libc::c_int,
    /// The cgroup directory the child is born in (`CLONE_INTO_CGROUP`: no window in
    /// which it runs outside).
    pub cgroup: Option<RawFd>,
    /// Ask for a pidfd of the child (`CLONE_PIDFD`).
    pub pidfd: bool,
}

/// What a clone returned in the parent.
#[derive(Debug)]
pub enum Cloned {
    /// In the parent: the child's pid, and its pidfd if asked for (the caller owns it).
    Parent {
        /// The child's pid.
        pid: i32,
        /// Its pidfd, a raw descriptor the caller takes ownership of.
        pidfd: Option<RawFd>,
    },
    /// In the child.
    Child,
}

impl Clone {
    /// `clone3` with these flags and `SIGCHLD` as the exit signal.
    ///
    /// # Safety
    /// Like `fork` in a multi-threaded process: in the child ([`Cloned::Child`]) only
    /// async-signal-safe calls on memory prepared before the call are allowed, until
    /// it execs or `_exit`s (the copy has one thread; locks other threads held stay
    /// held; allocation may deadlock).
    pub unsafe fn clone3(&self) -> io::Result<Cloned> {
        let mut pidfd: RawFd = -1;
        let mut args = CloneArgs {
            flags: self.namespaces as u64,
            exit_signal: libc::SIGCHLD as u64,
            ..Default::default()
        };
        if self.pidfd {
            args.flags |= CLONE_PIDFD;
            args.pidfd = &mut pidfd as *mut RawFd as u64;
        }
        if let Some(dir) = self.cgroup {
            args.flags |= CLONE_INTO_CGROUP;
            args.cgroup = dir as u64;
        }
        // SAFETY: `args` is a valid `clone_args` of the size passed, and `pidfd`, the
        // one pointer in it, outlives the call. No CLONE_VM and no stack: the child
        // runs on a copy of this thread's memory, and the caller's contract (this
        // function's `# Safety`) covers what it does there.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &mut args as *mut CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        match pid {
            p if p < 0 => Err(io::Error::last_os_error()),
            0 => Ok(Cloned::Child),
            p => Ok(Cloned::Parent {
                pid: p as i32,
                pidfd: self.pidfd.then_some(pidfd),
            }),
        }
    }
}

/// Plain `fork(2)`: a kernel without `clone3` (before 5.3) or without
/// `CLONE_INTO_CGROUP` (before 5.7).
///
/// # Safety
/// As [`Clone::clone3`].
pub unsafe fn fork() -> io::Result<Cloned> {
    // SAFETY: the caller's contract covers the child; the parent gets a pid.
    match unsafe { libc::fork() } {
        p if p < 0 => Err(io::Error::last_os_error()),
        0 => Ok(Cloned::Child),
        pid => Ok(Cloned::Parent { pid, pidfd: None }),
    }
}
