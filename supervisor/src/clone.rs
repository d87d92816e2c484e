//! The one `clone3(2)`: both the host's clone of a supervisor ([`super::namespaces`])
//! and the supervisor's spawn of a workload ([`super::exec`]) are made here; they differ
//! only in their flags. What a child then does, and how it reports a failed step, is
//! [`super::stage`]'s protocol.
//!
//! Both take [`Clone::clone3_vm`] where the kernel offers it: the child shares
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
/// `CLONE_CLEAR_SIGHAND` (Linux 5.5): the child is born with every handled signal back
/// to its default disposition (an ignored one stays ignored), so it need not ask the
/// kernel about each signal in turn ([`default_signals`], [`Handlers::Cleared`]).
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;

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
    /// and pidfd (if asked for). The child is born with no handler of this process's
    /// (`CLONE_CLEAR_SIGHAND`: its `entry` passes [`Handlers::Cleared`] to
    /// [`default_signals`]); a kernel before 5.5 refuses the flag (`EINVAL`), as it
    /// refuses `CLONE_INTO_CGROUP` before 5.7, and the caller takes the fork-like clone.
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
            flags: self.namespaces as u64 | CLONE_VM | CLONE_CLEAR_SIGHAND,
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

/// A set of signals, as the kernel's 64-bit `sigset_t` (bit `n - 1` for signal `n`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals(u64);

impl Signals {
    /// The signals this process ignores now (`SIG_IGN`): one `rt_sigaction` per
    /// signal, the raw call, since glibc refuses its own two (32 and 33), which an
    /// ignoring parent may have passed on too. A supervisor asks once, at its start,
    /// and ignores nothing after (`pid1`): each workload's child resets only these
    /// ([`Ignored::Reset`]), where it asked about every signal on every spawn.
    pub fn ignored() -> Signals {
        let set = (1..=64usize)
            .filter(|&sig| handler_of(sig) == Some(libc::SIG_IGN))
            .fold(0u64, |set, sig| set | 1 << (sig - 1));
        Signals(set)
    }

    /// Whether signal `sig` (1 to 64) is in the set.
    pub fn contains(self, sig: usize) -> bool {
        (1..=64).contains(&sig) && self.0 & (1 << (sig - 1)) != 0
    }
}

/// The kernel's `struct sigaction` (`rt_sigaction(2)`); all zero is `SIG_DFL`.
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// Signal `sig`'s disposition as the kernel holds it (`SIG_DFL`, `SIG_IGN` or a
/// handler's address), `None` for a signal it refuses. The raw call, one syscall and
/// no lock: a clone child may make it before its exec.
fn handler_of(sig: usize) -> Option<usize> {
    let mut old = KernelSigaction::default();
    // SAFETY: rt_sigaction(2) reading one disposition into a local value of the
    // kernel's layout; setting none.
    let read = unsafe {
        raw_syscall(
            libc::SYS_rt_sigaction,
            &[sig, 0, &mut old as *mut KernelSigaction as usize, 8],
        )
    };
    read.ok().map(|_| old.handler)
}

/// What the child's clone left of the parent's signal handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handlers {
    /// None: the kernel reset them at the clone (`CLONE_CLEAR_SIGHAND`,
    /// [`Clone::clone3_vm`]).
    Cleared,
    /// Every one (a fork-like clone): each signal is asked about, or reset, in turn.
    Inherited,
}

/// What [`default_signals`] does with a signal the parent ignores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// It stays ignored, as across an exec (the host's clone of a supervisor).
    Keep,
    /// Back to its default too (a workload: it starts the same whatever its
    /// supervisor's parent ignored). The set is what the parent ignores
    /// ([`Signals::ignored`]): a child whose handlers were cleared resets these alone;
    /// one that inherited them resets every signal.
    Reset(Signals),
}

/// In a child born with every signal blocked ([`BlockedSignals`]): every handled signal
/// back to its default disposition (and every ignored one, with [`Ignored::Reset`]),
/// then the empty mask. A child whose handlers the kernel cleared makes one call per
/// ignored signal to reset, where one that inherited them makes one per signal (62):
/// 12 µs of each workload spawn in the 16-key throughput profile (docs/BENCHMARKS.md).
///
/// # Safety
/// In a clone child before its exec: async-signal-safe calls only.
pub unsafe fn default_signals(handlers: Handlers, ignored: Ignored) {
    let dfl = KernelSigaction::default();
    let set_default = |sig: usize| {
        // SAFETY: rt_sigaction(2) setting `SIG_DFL` from a local value.
        let _ = unsafe {
            raw_syscall(
                libc::SYS_rt_sigaction,
                &[sig, &dfl as *const KernelSigaction as usize, 0, 8],
            )
        };
    };
    let settable = |sig: usize| sig != libc::SIGKILL as usize && sig != libc::SIGSTOP as usize;
    let last = libc::SIGRTMAX() as usize;
    match (handlers, ignored) {
        (Handlers::Cleared, Ignored::Keep) => {}
        (Handlers::Cleared, Ignored::Reset(set)) => {
            (1..=last)
                .filter(|&s| settable(s) && set.contains(s))
                .for_each(set_default);
        }
        // No need to ask: one call per signal.
        (Handlers::Inherited, Ignored::Reset(_)) => {
            (1..=last).filter(|&s| settable(s)).for_each(set_default)
        }
        (Handlers::Inherited, Ignored::Keep) => {
            (1..=last)
                .filter(|&s| {
                    settable(s)
                        && handler_of(s).is_some_and(|h| h != libc::SIG_IGN && h != libc::SIG_DFL)
                })
                .for_each(set_default);
        }
    }
    // The kernel's 64-bit mask, all clear.
    let none = 0u64;
    // SAFETY: rt_sigprocmask(2) from a local value.
    let _ = unsafe {
        raw_syscall(
            libc::SYS_rt_sigprocmask,
            &[
                libc::SIG_SETMASK as usize,
                &none as *const u64 as usize,
                0,
                8,
            ],
        )
    };
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Held by every test that changes this process's signal dispositions: a child
    /// forked meanwhile by another test would inherit the change.
    pub(crate) static DISPOSITIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The handled signal of these tests, and the ignored one (neither used elsewhere).
    const HANDLED: usize = libc::SIGUSR2 as usize;
    const IGNORED: usize = libc::SIGXFSZ as usize;

    extern "C" fn handler(_: libc::c_int) {}

    /// In the child: reset as told, then answer in the exit code: bit 0, the handled
    /// signal is back to its default; bit 1, the ignored one is still ignored.
    ///
    /// # Safety
    /// In a clone child: raw calls only.
    unsafe fn report(handlers: Handlers, ignored: Ignored) -> ! {
        // SAFETY: the caller's contract.
        unsafe {
            default_signals(handlers, ignored);
            let code = usize::from(handler_of(HANDLED) == Some(libc::SIG_DFL))
                | usize::from(handler_of(IGNORED) == Some(libc::SIG_IGN)) << 1;
            let _ = raw_syscall(libc::SYS_exit_group, &[code]);
            std::hint::unreachable_unchecked()
        }
    }

    /// The shared clone's child entry: `arg` is an `Ignored`.
    #[cfg(target_arch = "x86_64")]
    unsafe extern "C" fn entry(arg: *const c_void) -> ! {
        // SAFETY: the test passes a live `Ignored`.
        unsafe { report(Handlers::Cleared, *(arg as *const Ignored)) }
    }

    /// Clone a child (shared or fork-like) that reports; its exit code.
    fn child_reports(shared: bool, ignored: Ignored) -> i32 {
        let blocked = BlockedSignals::all();
        let pid = if shared {
            #[cfg(target_arch = "x86_64")]
            {
                let stack = Stack::new(64 << 10).unwrap();
                // SAFETY: `entry` makes raw calls only, on `ignored`, which outlives
                // the child (waited for below, with `stack`).
                let (pid, _) = unsafe {
                    Clone::default().clone3_vm(
                        &stack,
                        entry,
                        &ignored as *const Ignored as *const _,
                    )
                }
                .unwrap();
                let code = wait(pid);
                drop(stack);
                drop(blocked);
                return code;
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("no shared clone here")
        } else {
            // SAFETY: the child makes raw calls only (`report`).
            match unsafe { fork() }.unwrap() {
                // SAFETY: in the child, which only makes raw calls until it exits.
                Cloned::Child => unsafe { report(Handlers::Inherited, ignored) },
                Cloned::Parent { pid, .. } => pid,
            }
        };
        drop(blocked);
        wait(pid)
    }

    fn wait(pid: i32) -> i32 {
        let mut status = 0;
        // SAFETY: our own child.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        assert_eq!(reaped, pid);
        assert!(libc::WIFEXITED(status), "{status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// Every way a child resets its parent's dispositions, against a parent that
    /// handles one signal and ignores another: no handler survives any clone (the
    /// shared one's cleared by the kernel: red without `CLONE_CLEAR_SIGHAND`), an
    /// ignored signal stays ignored with `Keep`, and with `Reset` goes back to its
    /// default when it is in the parent's set (a shared clone) or always (a fork-like
    /// one, which resets every signal).
    #[test]
    fn a_child_keeps_no_handler_and_resets_the_ignored_signals_it_is_told_to() {
        let _held = DISPOSITIONS.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: a handler that does nothing, and SIG_IGN, put back below.
        unsafe {
            libc::signal(HANDLED as i32, handler as *const () as libc::sighandler_t);
            libc::signal(IGNORED as i32, libc::SIG_IGN);
        }
        let set = Signals::ignored();
        assert!(set.contains(IGNORED) && !set.contains(HANDLED), "{set:?}");
        let table = [
            // (shared clone, ignored, handled back to default, ignored still ignored)
            (true, Ignored::Keep, true, true),
            (true, Ignored::Reset(set), true, false),
            (true, Ignored::Reset(Signals::default()), true, true),
            (false, Ignored::Keep, true, true),
            (false, Ignored::Reset(Signals::default()), true, false),
        ];
        let rows: Vec<_> = table
            .iter()
            .filter(|row| cfg!(target_arch = "x86_64") || !row.0)
            .map(|&(shared, ignored, dfl, ign)| {
                let code = child_reports(shared, ignored);
                (
                    (shared, ignored),
                    (code & 1 != 0, code & 2 != 0),
                    (dfl, ign),
                )
            })
            .collect();
        // SAFETY: the defaults back.
        unsafe {
            libc::signal(HANDLED as i32, libc::SIG_DFL);
            libc::signal(IGNORED as i32, libc::SIG_DFL);
        }
        for (row, got, want) in rows {
            assert_eq!(
                got, want,
                "{row:?}: (handled back to default, ignored kept)"
            );
        }
        assert!(!Signals::ignored().contains(IGNORED));
    }

    #[test]
    fn a_signal_set_holds_signals_one_to_sixty_four_only() {
        let set = Signals(1 | 1 << 63);
        assert!(set.contains(1) && set.contains(64));
        assert!(!set.contains(0) && !set.contains(2) && !set.contains(65));
    }
}
