//! The one `clone3(2)`: both the host's clone of a supervisor ([`super::namespaces`])
//! and the supervisor's spawn of a workload ([`super::exec`]) are made here; they differ
//! only in their flags. What a child then does, and how it reports a failed step, is
//! [`super::stage`]'s protocol.
//!
//! Both take [`Clone::clone3_vm`] where the kernel offers it (issue 25): the child shares
//! the caller's memory (`CLONE_VM`) and runs on a [`Stack`] of its own until it execs, as
//! `posix_spawn` does, with every signal blocked across the call ([`BlockedSignals`],
//! [`default_signals`]). A fork-like clone copies the caller's page tables for the exec
//! to tear down, and leaves every page the caller writes next to fault once
//! (copy-on-write): ~5 ms of a cold start's CPU for the host, and a fifth of the time
//! of a workload's run from 16 keys at once in the supervisor (docs/BENCHMARKS.md).
//! The fork-like [`Clone::clone3`] and [`fork`] remain for kernels that refuse the
//! shared clone.

use std::io;
use std::os::fd::RawFd;
#[cfg(target_arch = "x86_64")]
use std::os::raw::c_void;

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
    /// No exit signal: the parent learns of the child's exit through its pidfd (and
    /// waits for it with `__WALL`), and no `SIGCHLD` is sent. A workload's leader is
    /// such a child, so its exit does not wake PID 1's orphan reaper, which sleeps on
    /// `SIGCHLD` (an orphan's is always `SIGCHLD`: the kernel resets it at reparenting).
    pub quiet: bool,
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
    /// The child's exit signal: none when `quiet`, else `SIGCHLD`.
    fn exit_signal(&self) -> u64 {
        if self.quiet { 0 } else { libc::SIGCHLD as u64 }
    }

    /// `clone3` with these flags, and `SIGCHLD` as the exit signal unless `quiet`.
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
            exit_signal: self.exit_signal(),
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

/// A child's stack for [`Clone::clone3_vm`]: an anonymous mapping whose lowest page is
/// a guard (an overflow faults instead of writing the host's memory).
#[cfg(target_arch = "x86_64")]
pub struct Stack {
    base: *mut c_void,
    len: usize,
}

#[cfg(target_arch = "x86_64")]
impl Stack {
    /// A stack of `len` bytes (a multiple of the page size), its first page the guard.
    pub fn new(len: usize) -> io::Result<Stack> {
        // SAFETY: a fresh anonymous mapping at an address the kernel picks; nothing
        // else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the first page of the mapping made above.
        if unsafe { libc::mprotect(base, 4096, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }
}

// SAFETY: a private anonymous mapping owned by value: any thread may hand it on or
// unmap it; its owner's contract (no child runs on it) moves with it.
#[cfg(target_arch = "x86_64")]
unsafe impl Send for Stack {}

#[cfg(target_arch = "x86_64")]
impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made; its owner guarantees no child runs on it.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

#[cfg(target_arch = "x86_64")]
impl Clone {
    /// `clone3` with `CLONE_VM`: the child shares this process's memory and runs
    /// `entry(arg)` on `stack`; it never returns here. In the parent: the child's pid
    /// and pidfd (if asked for).
    ///
    /// # Safety
    /// The child runs on this process's memory, beside its other threads: `entry` may
    /// only make async-signal-safe calls on memory prepared before the call (its
    /// `errno` is the calling thread's), must exec or `_exit`, and `stack` and
    /// everything `arg` reaches must outlive it, until it exec'd or exited.
    pub unsafe fn clone3_vm(
        &self,
        stack: &Stack,
        entry: unsafe extern "C" fn(*const c_void) -> !,
        arg: *const c_void,
    ) -> io::Result<(i32, Option<RawFd>)> {
        const CLONE_VM: u64 = 0x100;
        let mut pidfd: RawFd = -1;
        let mut args = CloneArgs {
            flags: self.namespaces as u64 | CLONE_VM,
            exit_signal: self.exit_signal(),
            stack: stack.base as u64,
            stack_size: stack.len as u64,
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
        let ret: i64;
        // SAFETY: `args` is a valid `clone_args` of the size passed. In the parent the
        // syscall returns like any other (the kernel keeps every register but rax, rcx
        // and r11). In the child (rax 0) the kernel has set rsp to the top of `stack`
        // (page-aligned: 16-byte aligned at the call, as the ABI asks); it calls
        // `entry(arg)`, which never returns (`ud2` if it did), and never touches this
        // frame. The caller's contract covers what `entry` does.
        unsafe {
            std::arch::asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r12",
                "call r13",
                "ud2",
                "2:",
                inlateout("rax") libc::SYS_clone3 => ret,
                in("rdi") &mut args as *mut CloneArgs,
                in("rsi") std::mem::size_of::<CloneArgs>(),
                in("r12") arg,
                in("r13") entry,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        if ret < 0 {
            return Err(io::Error::from_raw_os_error(-ret as i32));
        }
        Ok((ret as i32, self.pidfd.then_some(pidfd)))
    }
}

/// One system call, its error in its return value (`Err(errno)`), never in `errno`: a
/// `CLONE_VM` child runs on its parent thread's thread-local storage, so `errno` is
/// that thread's too, which may write it meanwhile. Up to six arguments (`args`).
///
/// # Safety
/// As the call it makes: its arguments must be what that call expects.
pub unsafe fn raw_syscall(n: libc::c_long, args: &[usize]) -> Result<usize, i32> {
    let mut a = [0usize; 6];
    a[..args.len()].copy_from_slice(args);
    #[cfg(target_arch = "x86_64")]
    {
        let ret: isize;
        // SAFETY: the `syscall` instruction with the kernel's x86_64 convention (number
        // in rax, arguments in rdi, rsi, rdx, r10, r8, r9; rcx and r11 clobbered); the
        // caller's contract covers what the call does with its arguments.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") n as isize => ret,
                in("rdi") a[0],
                in("rsi") a[1],
                in("rdx") a[2],
                in("r10") a[3],
                in("r8") a[4],
                in("r9") a[5],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        if (-4095..0).contains(&ret) {
            Err(-ret as i32)
        } else {
            Ok(ret as usize)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // Elsewhere every child is fork-like: its `errno` is its own copy.
        // SAFETY: the caller's contract.
        let ret = unsafe { libc::syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]) };
        if ret < 0 {
            // SAFETY: the calling thread's errno, always valid.
            Err(unsafe { *libc::__errno_location() })
        } else {
            Ok(ret as usize)
        }
    }
}

/// Every signal blocked on this thread while it lives; the old mask back on drop. A
/// `CLONE_VM` child is born with it: no handler of the parent's may run on the shared
/// memory before the child has reset them ([`default_signals`]).
pub struct BlockedSignals(libc::sigset_t);

impl BlockedSignals {
    /// Block every signal on the calling thread.
    pub fn all() -> BlockedSignals {
        // SAFETY: plain sigset operations on local values.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            BlockedSignals(old)
        }
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask `all` saved.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// What [`default_signals`] does with a signal the parent ignores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// It stays ignored, as across an exec (the host's clone of a supervisor).
    Keep,
    /// Back to its default too (a workload: it starts the same whatever its
    /// supervisor's parent ignored).
    Reset,
}

/// In a child born with every signal blocked ([`BlockedSignals`]): every handled signal
/// back to its default disposition (and every ignored one, with [`Ignored::Reset`]),
/// then the empty mask.
///
/// # Safety
/// In a clone child before its exec: async-signal-safe calls only.
pub unsafe fn default_signals(ignored: Ignored) {
    /// The kernel's `struct sigaction` (`rt_sigaction(2)`), all zero: `SIG_DFL`.
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    // SAFETY: sigaction and sigprocmask on local values.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        let kernel_dfl = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        for sig in 1..=libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            match ignored {
                // No need to ask: one call per signal, and the raw call, since glibc
                // refuses its own two (32 and 33), which an ignoring parent may have
                // passed on too.
                Ignored::Reset => {
                    let _ = raw_syscall(
                        libc::SYS_rt_sigaction,
                        &[
                            sig as usize,
                            &kernel_dfl as *const KernelSigaction as usize,
                            0,
                            8,
                        ],
                    );
                }
                Ignored::Keep => {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                        && old.sa_sigaction != libc::SIG_IGN
                        && old.sa_sigaction != libc::SIG_DFL
                    {
                        libc::sigaction(sig, &dfl, std::ptr::null_mut());
                    }
                }
            }
        }
        // The kernel's 64-bit mask, all clear.
        let none = 0u64;
        let _ = raw_syscall(
            libc::SYS_rt_sigprocmask,
            &[
                libc::SIG_SETMASK as usize,
                &none as *const u64 as usize,
                0,
                8,
            ],
        );
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
