//! The compiled filter: the policy's rows as one BPF program per errno, stacked, and
//! their installation (async-signal-safe, between `fork` and `execve`).

use std::collections::BTreeMap;
use std::fmt;
use std::io;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule};

use super::FilterError;
use super::policy::{
    ENOSYS, EPERM, GUARD_END, POLICY, REVIEWED_THROUGH, Rule, TARGET, X32_ONLY_TWINS, abi_numbers,
};

/// The compiled workload seccomp policy: one BPF program per errno, ready to install.
///
/// Build it once with [`Filter::workload`] before forking. Install it in each child with
/// [`Filter::install`].
#[derive(Clone)]
pub struct Filter {
    pub(super) programs: Vec<Program>,
}

/// One compiled BPF program and its length, already checked to fit `sock_fprog.len`.
#[derive(Clone)]
pub(super) struct Program {
    insns: BpfProgram,
    len: u16,
}

impl fmt::Debug for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filter")
            .field(
                "program_lengths",
                &self.programs.iter().map(|p| p.len).collect::<Vec<_>>(),
            )
            .finish()
    }
}

// `install` hands seccompiler's instructions to the kernel as `libc::sock_filter`. Both
// are `#[repr(C)] { u16, u8, u8, u32 }`; this keeps that true at compile time.
const _: () = {
    assert!(
        size_of::<seccompiler::sock_filter>() == size_of::<libc::sock_filter>()
            && align_of::<seccompiler::sock_filter>() == align_of::<libc::sock_filter>()
    );
};

impl Filter {
    /// Compiles the workload policy for the architecture this binary targets.
    ///
    /// Allocates. Call it once, before forking, and share the result with every child.
    pub fn workload() -> Result<Self, FilterError> {
        Self::compile(|_| true, true)
    }

    /// The workload policy without its `clone3` row, for the supervisor's spawner
    /// thread and the connection workers it starts. Attaching a filter costs the kernel
    /// a pass over the program for every syscall number (its constant-action cache):
    /// about a millisecond for the whole policy, per process. The spawner thread
    /// attaches this once, the workers inherit it; each workload a worker forks
    /// inherits it for free and adds only [`Filter::clone3_guard`] (the worker itself
    /// needs `clone3` for `CLONE_INTO_CGROUP`). The two stacked equal
    /// [`Filter::workload`].
    pub fn spawner() -> Result<Self, FilterError> {
        Self::compile(|row| row.nr != libc::SYS_clone3, true)
    }

    /// `clone3` → `ENOSYS`, alone: what a workload forked by a filtered worker adds.
    pub fn clone3_guard() -> Result<Self, FilterError> {
        Self::compile(|row| row.nr == libc::SYS_clone3, false)
    }

    fn compile(keep: impl Fn(&Rule) -> bool, everything_else: bool) -> Result<Self, FilterError> {
        let Some(arch) = TARGET else {
            return Err(FilterError::UnsupportedArch(std::env::consts::ARCH));
        };
        // errno -> (syscall nr -> OR-ed argument rules; empty means "always").
        let mut groups: BTreeMap<u32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
        for row in POLICY.iter().filter(|r| keep(r)) {
            for nr in abi_numbers(row.nr) {
                insert(&mut groups, row.errno, nr, row.name, row.args.rules()?)?;
            }
        }
        if everything_else {
            for &(nr, name) in X32_ONLY_TWINS {
                insert(&mut groups, EPERM, nr, name, Vec::new())?;
            }
            for native in (REVIEWED_THROUGH + 1)..=GUARD_END {
                for nr in abi_numbers(native) {
                    insert(&mut groups, ENOSYS, nr, "<unreviewed>", Vec::new())?;
                }
            }
        }

        let mut programs = Vec::with_capacity(groups.len());
        for (errno, rules) in groups {
            let filter = SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(errno),
                arch,
            )?;
            let insns = BpfProgram::try_from(filter)?;
            let len =
                u16::try_from(insns.len()).map_err(|_| FilterError::ProgramTooLong(insns.len()))?;
            programs.push(Program { insns, len });
        }
        Ok(Self { programs })
    }

    /// Installs the filter on the calling thread. The filter is irrevocable and is
    /// inherited by children and across `execve`.
    ///
    /// Async-signal-safe: it doesn't allocate, lock or panic. It only reads `self` and
    /// calls `seccomp(SECCOMP_SET_MODE_FILTER, 0, ..)` once per program, so it may run
    /// between `fork` and `execve` in a child of a multi-threaded process.
    ///
    /// The caller must have set `PR_SET_NO_NEW_PRIVS` (or hold `CAP_SYS_ADMIN` in its
    /// user namespace). Otherwise the kernel returns `EACCES`. Call it in a
    /// single-threaded process (a freshly forked child): other threads are not
    /// filtered. On error, some of the programs may already be installed. Treat any
    /// error as fatal and `_exit` without `execve`.
    pub fn install(&self) -> io::Result<()> {
        for program in &self.programs {
            let fprog = libc::sock_fprog {
                len: program.len,
                // Layout equality is asserted above. The kernel only reads the program.
                filter: program
                    .insns
                    .as_ptr()
                    .cast::<libc::sock_filter>()
                    .cast_mut(),
            };
            // SAFETY: `fprog` points at `program.len` valid, initialised instructions
            // owned by `self`, which outlives the call. The kernel copies the program
            // (copy_from_user) and keeps no pointer to it. The syscall touches no Rust
            // state.
            // The error comes back in the return value, not `errno` (a `CLONE_VM`
            // child shares its parent thread's); an `Os` error does not allocate.
            let rc = unsafe {
                crate::clone::raw_syscall(
                    libc::SYS_seccomp,
                    &[
                        libc::SECCOMP_SET_MODE_FILTER as usize,
                        0,
                        &raw const fprog as usize,
                    ],
                )
            };
            if let Err(e) = rc {
                return Err(io::Error::from_raw_os_error(e));
            }
        }
        Ok(())
    }

    /// Total number of BPF instructions across the stacked programs, for logging.
    pub fn instruction_count(&self) -> usize {
        self.programs.iter().map(|p| p.insns.len()).sum()
    }
}

fn insert(
    groups: &mut BTreeMap<u32, BTreeMap<i64, Vec<SeccompRule>>>,
    errno: u32,
    nr: i64,
    name: &'static str,
    rules: Vec<SeccompRule>,
) -> Result<(), FilterError> {
    // A number may appear in only one group: two programs that disagree on a syscall
    // would make the verdict depend on precedence, not on the table.
    if groups.values().any(|g| g.contains_key(&nr)) {
        return Err(FilterError::DuplicateRule { name, nr });
    }
    groups.entry(errno).or_default().insert(nr, rules);
    Ok(())
}
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    //! These tests run the filter for real. Each forks a child that installs it and
    //! tries syscalls. The child only makes raw syscalls (no allocation: the parent
    //! is the multi-threaded test harness) and reports back through a pipe.
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::seccomp::policy::X32_SYSCALL_BIT;
    use crate::seccomp::policy::{Args, SYS_OPEN_TREE_ATTR};

    use std::ffi::CString;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const MAX_PROBES: usize = 64;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Expect {
        /// Fails with exactly this errno.
        Errno(i32),
        /// Returns >= 0.
        Success,
        /// Anything but this errno (the kernel decides, not the filter).
        NotErrno(i32),
    }

    #[derive(Clone, Copy, Debug)]
    struct Probe {
        what: &'static str,
        nr: i64,
        args: [u64; 6],
        /// The syscall may create a process: a 0 return means "I am the new child".
        forks: bool,
        expect: Expect,
    }

    const fn probe(what: &'static str, nr: i64, args: [u64; 6], expect: Expect) -> Probe {
        Probe {
            what,
            nr,
            args,
            forks: false,
            expect,
        }
    }

    const fn forking(what: &'static str, nr: i64, args: [u64; 6], expect: Expect) -> Probe {
        Probe {
            what,
            nr,
            args,
            forks: true,
            expect,
        }
    }

    const SIGCHLD: u64 = libc::SIGCHLD as u64;
    const NULL: u64 = 0;
    const NEG1: u64 = u64::MAX;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0, "pipe2: {}", io::Error::last_os_error());
        // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn wait(pid: libc::pid_t) -> libc::c_int {
        let mut status = 0;
        loop {
            // SAFETY: plain waitpid on our own child with a valid status pointer.
            let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
            if rc == pid {
                return status;
            }
            let err = io::Error::last_os_error();
            assert_eq!(err.kind(), io::ErrorKind::Interrupted, "waitpid: {err}");
        }
    }

    fn errno() -> i64 {
        i64::from(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// Child side: async-signal-safe only. Never returns.
    fn child_run_probes(filters: &[&Filter], probes: &[Probe], out: libc::c_int) -> ! {
        let mut results = [0i64; MAX_PROBES];
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            // SAFETY: _exit is async-signal-safe and ends the child.
            unsafe { libc::_exit(100) };
        }
        for filter in filters {
            if filter.install().is_err() {
                // SAFETY: as above.
                unsafe { libc::_exit(101) };
            }
        }
        for (slot, p) in results.iter_mut().zip(probes) {
            let [a, b, c, d, e, f] = p.args;
            // SAFETY: every probe passes either plain integers or pointers to memory
            // that stays valid in this child (statics, or parent stack copied by fork).
            let rc = unsafe { libc::syscall(p.nr, a, b, c, d, e, f) };
            if p.forks && rc == 0 {
                // We are a process created by a probe that should have been denied
                // (or the plain-fork probe): leave at once.
                // SAFETY: as above.
                unsafe { libc::_exit(0) };
            }
            if p.forks && rc > 0 {
                let mut status = 0;
                // SAFETY: reaping the process the probe just created.
                unsafe { libc::waitpid(rc as libc::pid_t, &mut status, libc::__WALL) };
            }
            *slot = if rc == -1 { -errno() } else { rc };
        }
        let bytes = size_of_val(&results);
        // SAFETY: writes from a live stack array of exactly `bytes` bytes.
        let n = unsafe { libc::write(out, results.as_ptr().cast(), bytes) };
        let code = if usize::try_from(n) == Ok(bytes) {
            0
        } else {
            102
        };
        // SAFETY: as above.
        unsafe { libc::_exit(code) }
    }

    /// Forks, runs `probes` in the child under `filter`, and returns each raw result
    /// (value, or `-errno`).
    fn run_probes(filters: &[&Filter], probes: &[Probe]) -> Vec<i64> {
        assert!(probes.len() <= MAX_PROBES);
        let (rd, wr) = pipe();
        // SAFETY: the child runs only async-signal-safe code (child_run_probes) and
        // leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            child_run_probes(filters, probes, wr.as_raw_fd());
        }
        drop(wr);
        let mut buf = Vec::new();
        std::fs::File::from(rd)
            .read_to_end(&mut buf)
            .expect("read probe results");
        let status = wait(pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "probe child failed: status {status:#x} (100 = prctl, 101 = install, 102 = write)"
        );
        assert_eq!(buf.len(), MAX_PROBES * 8);
        buf.chunks_exact(8)
            .take(probes.len())
            .map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }

    fn check(probes: &[Probe], results: &[i64]) {
        let mut failures = Vec::new();
        for (p, &r) in probes.iter().zip(results) {
            let ok = match p.expect {
                Expect::Errno(e) => r == -i64::from(e),
                Expect::Success => r >= 0,
                Expect::NotErrno(e) => r != -i64::from(e),
            };
            if !ok {
                failures.push(format!("{}: expected {:?}, got {r}", p.what, p.expect));
            }
        }
        assert!(
            failures.is_empty(),
            "probe mismatches:\n{}",
            failures.join("\n")
        );
    }

    fn workload() -> Filter {
        Filter::workload().expect("policy compiles")
    }

    const EPERM_: Expect = Expect::Errno(libc::EPERM);
    const ENOSYS_: Expect = Expect::Errno(libc::ENOSYS);

    /// `struct clone_args` (v0, 64 bytes) for a plain fork: flags 0, exit_signal SIGCHLD.
    static CLONE3_PLAIN_FORK: [u64; 8] = [0, 0, 0, 0, SIGCHLD, 0, 0, 0];

    #[test]
    fn denied_syscalls_fail_with_policy_errno() {
        let filter = workload();
        let probes = denial_probes();
        let results = run_probes(&[&filter], &probes);
        check(&probes, &results);
    }

    /// The spawner thread's filter plus the guard each workload adds equal the
    /// workload filter: every denial holds, `clone3` included.
    #[test]
    fn the_spawner_filter_and_the_guard_stacked_deny_what_the_workload_filter_denies() {
        let spawner = Filter::spawner().expect("compiles");
        let guard = Filter::clone3_guard().expect("compiles");
        let probes = denial_probes();
        let results = run_probes(&[&spawner, &guard], &probes);
        check(&probes, &results);
        // Alone, the spawner's filter lets clone3 through (its thread needs it).
        let clone3 = &raw const CLONE3_PLAIN_FORK as u64;
        let plain = [forking(
            "clone3(plain fork)",
            libc::SYS_clone3,
            [clone3, 64, 0, 0, 0, 0],
            Expect::Success,
        )];
        let results = run_probes(&[&spawner], &plain);
        check(&plain, &results);
        assert!(
            guard.instruction_count() < 64,
            "the guard is tiny: {}",
            guard.instruction_count()
        );
    }

    fn denial_probes() -> Vec<Probe> {
        let ns = |f: libc::c_int| f as u64 | SIGCHLD;
        let clone3 = &raw const CLONE3_PLAIN_FORK as u64;
        // Arguments are chosen so that, without the filter, the call either fails with
        // another errno (NULL pointers, bad fds) or is harmless (creates a namespace
        // inside a throwaway process). None of them can change the host.
        #[rustfmt::skip]
        let probes = [
            probe("keyctl(GET_KEYRING_ID, session)", libc::SYS_keyctl, [0, -3i64 as u64, 0, 0, 0, 0], EPERM_),
            probe("add_key(NULL..)", libc::SYS_add_key, [NULL; 6], EPERM_),
            probe("request_key(NULL..)", libc::SYS_request_key, [NULL; 6], EPERM_),
            probe("bpf(MAP_CREATE, NULL, 0)", libc::SYS_bpf, [0, NULL, 0, 0, 0, 0], EPERM_),
            probe("perf_event_open(NULL..)", libc::SYS_perf_event_open, [NULL, 0, NEG1, NEG1, 0, 0], EPERM_),
            probe("setns(-1, 0)", libc::SYS_setns, [NEG1, 0, 0, 0, 0, 0], EPERM_),
            forking("clone(NEWUSER)", libc::SYS_clone, [ns(libc::CLONE_NEWUSER), 0, 0, 0, 0, 0], EPERM_),
            forking("clone(NEWNS)", libc::SYS_clone, [ns(libc::CLONE_NEWNS), 0, 0, 0, 0, 0], EPERM_),
            forking("clone(NEWUTS)", libc::SYS_clone, [ns(libc::CLONE_NEWUTS), 0, 0, 0, 0, 0], EPERM_),
            forking("clone(NEWIPC)", libc::SYS_clone, [ns(libc::CLONE_NEWIPC), 0, 0, 0, 0, 0], EPERM_),
            forking("clone(NEWPID)", libc::SYS_clone, [ns(libc::CLONE_NEWPID), 0, 0, 0, 0, 0], EPERM_),
            forking("clone(NEWNET)", libc::SYS_clone, [ns(libc::CLONE_NEWNET), 0, 0, 0, 0, 0], EPERM_),
            forking("clone(NEWCGROUP)", libc::SYS_clone, [ns(libc::CLONE_NEWCGROUP), 0, 0, 0, 0, 0], EPERM_),
            forking("clone(NEWUSER|NEWNET, high bits set)", libc::SYS_clone, [ns(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) | 0xffff_0000_0000_0000, 0, 0, 0, 0, 0], EPERM_),
            forking("clone3(plain fork)", libc::SYS_clone3, [clone3, 64, 0, 0, 0, 0], ENOSYS_),
            probe("clone3(NULL, 0)", libc::SYS_clone3, [NULL, 0, 0, 0, 0, 0], ENOSYS_),
            probe("mount(NULL..)", libc::SYS_mount, [NULL; 6], EPERM_),
            probe("umount2(NULL, 0)", libc::SYS_umount2, [NULL; 6], EPERM_),
            probe("pivot_root(NULL, NULL)", libc::SYS_pivot_root, [NULL; 6], EPERM_),
            probe("fsopen(NULL, 0)", libc::SYS_fsopen, [NULL; 6], EPERM_),
            probe("open_tree_attr(-1, NULL..)", SYS_OPEN_TREE_ATTR, [NEG1, NULL, 0, NULL, 0, 0], EPERM_),
            probe("io_uring_setup(1, NULL)", libc::SYS_io_uring_setup, [1, NULL, 0, 0, 0, 0], EPERM_),
            probe("userfaultfd(0)", libc::SYS_userfaultfd, [0; 6], EPERM_),
            probe("settimeofday(NULL, NULL)", libc::SYS_settimeofday, [NULL; 6], EPERM_),
            probe("clock_settime(REALTIME, NULL)", libc::SYS_clock_settime, [0, NULL, 0, 0, 0, 0], EPERM_),
            probe("process_vm_readv(0, NULL..)", libc::SYS_process_vm_readv, [0, NULL, 0, NULL, 0, 0], EPERM_),
            probe("pidfd_getfd(-1, -1, 0)", libc::SYS_pidfd_getfd, [NEG1, NEG1, 0, 0, 0, 0], EPERM_),
            probe("socket(AF_VSOCK)", libc::SYS_socket, [libc::AF_VSOCK as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0], EPERM_),
            probe("personality(0x0200)", libc::SYS_personality, [0x0200, 0, 0, 0, 0, 0], EPERM_),
            probe("personality(ADDR_NO_RANDOMIZE)", libc::SYS_personality, [0x004_0000, 0, 0, 0, 0, 0], EPERM_),
            probe("personality(READ_IMPLIES_EXEC)", libc::SYS_personality, [0x040_0000, 0, 0, 0, 0, 0], EPERM_),
            probe("unreviewed nr REVIEWED_THROUGH+1", REVIEWED_THROUGH + 1, [0; 6], ENOSYS_),
            probe("unreviewed nr GUARD_END", GUARD_END, [0; 6], ENOSYS_),
            // Last: without the filter it would succeed and change later results.
            probe("unshare(CLONE_NEWUSER)", libc::SYS_unshare, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0], EPERM_),
        ];
        probes.to_vec()
    }

    #[test]
    fn allowed_syscalls_still_work() {
        let filter = workload();
        let path = c"/proc/self/status";
        // adjtimex/clock_adjtime read-only (modes = 0). The kernel writes into the
        // child's copy of this struct.
        // SAFETY: `timex` is plain old data; all-zero is a valid value.
        let mut timex: libc::timex = unsafe { std::mem::zeroed() };
        let tx = &raw mut timex as u64;
        #[rustfmt::skip]
        let probes = [
            probe("getpid", libc::SYS_getpid, [0; 6], Expect::Success),
            probe("openat(/proc/self/status)", libc::SYS_openat, [libc::AT_FDCWD as u64, path.as_ptr() as u64, (libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0, 0, 0], Expect::Success),
            forking("clone(SIGCHLD) = fork", libc::SYS_clone, [SIGCHLD, 0, 0, 0, 0, 0], Expect::Success),
            probe("personality(0xffffffff) query", libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0], Expect::Success),
            probe("personality(PER_LINUX32)", libc::SYS_personality, [8, 0, 0, 0, 0, 0], Expect::Success),
            probe("personality(PER_LINUX)", libc::SYS_personality, [0, 0, 0, 0, 0, 0], Expect::Success),
            probe("socket(AF_UNIX)", libc::SYS_socket, [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0], Expect::Success),
            probe("adjtimex(modes=0)", libc::SYS_adjtimex, [tx, 0, 0, 0, 0, 0], Expect::Success),
            probe("clock_adjtime(REALTIME, modes=0)", libc::SYS_clock_adjtime, [libc::CLOCK_REALTIME as u64, tx, 0, 0, 0, 0], Expect::Success),
            // The kernel answers ESRCH: the filter lets ptrace through.
            probe("ptrace(PEEKDATA, pid -1)", libc::SYS_ptrace, [libc::PTRACE_PEEKDATA as u64, NEG1, 0, 0, 0, 0], Expect::NotErrno(libc::EPERM)),
            probe("seccomp(GET_ACTION_AVAIL)", libc::SYS_seccomp, [2, 0, NULL, 0, 0, 0], Expect::NotErrno(libc::EPERM)),
            probe("file_setattr = REVIEWED_THROUGH", REVIEWED_THROUGH, [NEG1, NULL, 0, NULL, 0, 0], Expect::NotErrno(libc::ENOSYS)),
        ];
        let results = run_probes(&[&filter], &probes);
        check(&probes, &results);
    }

    /// The x32 twins: on x86_64, `nr | 0x4000_0000` passes the arch check.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_twins_are_denied_too() {
        let filter = workload();
        let x = |nr: i64| nr | X32_SYSCALL_BIT;
        #[rustfmt::skip]
        let probes = [
            probe("x32 keyctl", x(libc::SYS_keyctl), [0, -3i64 as u64, 0, 0, 0, 0], EPERM_),
            probe("x32 unshare(NEWUSER)", x(libc::SYS_unshare), [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0], EPERM_),
            forking("x32 clone(NEWUSER)", x(libc::SYS_clone), [libc::CLONE_NEWUSER as u64 | SIGCHLD, 0, 0, 0, 0, 0], EPERM_),
            probe("x32 clone3", x(libc::SYS_clone3), [NULL, 0, 0, 0, 0, 0], ENOSYS_),
            probe("x32 process_vm_readv (539)", x(539), [0, NULL, 0, NULL, 0, 0], EPERM_),
            probe("x32 personality(0x0200)", x(libc::SYS_personality), [0x0200, 0, 0, 0, 0, 0], EPERM_),
            // Allowed through the filter; the kernel answers (ENOSYS where x32 is off).
            probe("x32 getpid", x(libc::SYS_getpid), [0; 6], Expect::NotErrno(libc::EPERM)),
        ];
        let results = run_probes(&[&filter], &probes);
        check(&probes, &results);
    }

    /// Issues i386 `getpid` (20) through `int 0x80` in a forked child and returns its
    /// wait status.
    #[cfg(target_arch = "x86_64")]
    fn int80_getpid_status(filter: Option<&Filter>) -> libc::c_int {
        // SAFETY: the child runs only async-signal-safe code and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: raw syscalls in the child; `no_core` is a valid rlimit.
            unsafe {
                libc::setrlimit(libc::RLIMIT_CORE, &no_core);
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            }
            if let Some(f) = filter
                && f.install().is_err()
            {
                // SAFETY: leaves the child.
                unsafe { libc::_exit(101) };
            }
            let mut eax: u32 = 20;
            // SAFETY: i386 getpid takes no arguments and touches no memory. r8-r11 are
            // declared clobbered in case the compat entry zeroes them.
            unsafe {
                std::arch::asm!(
                    "int 0x80",
                    inout("eax") eax,
                    out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                    options(nostack),
                );
            }
            // SAFETY: raw getpid.
            let me = unsafe { libc::getpid() };
            // SAFETY: leaves the child.
            unsafe { libc::_exit(if eax as i32 == me { 0 } else { 1 }) };
        }
        wait(pid)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn foreign_arch_syscall_kills_the_process() {
        let unfiltered = int80_getpid_status(None);
        let filtered = int80_getpid_status(Some(&workload()));
        let ia32_works = libc::WIFEXITED(unfiltered) && libc::WEXITSTATUS(unfiltered) == 0;
        if ia32_works {
            assert!(
                libc::WIFSIGNALED(filtered) && libc::WTERMSIG(filtered) == libc::SIGSYS,
                "int 0x80 under the filter should die of SIGSYS, status {filtered:#x}"
            );
        } else {
            // Kernel without IA32 emulation: int 0x80 never reaches seccomp.
            assert!(libc::WIFSIGNALED(filtered), "status {filtered:#x}");
        }
    }

    const PROBE_ENV: &str = "STOCKADE_SECCOMP_EXEC_PROBE";

    /// Entry point for `threads_and_spawn_work_after_exec`. It does nothing unless that
    /// test re-executes this test binary with `PROBE_ENV` set.
    #[test]
    fn exec_probe_entry() {
        if std::env::var_os(PROBE_ENV).is_none() {
            return;
        }
        let status = std::fs::read_to_string("/proc/self/status").expect("read status");
        let filters: u32 = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp_filters:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("Seccomp_filters in /proc/self/status");
        assert!(
            filters >= 2,
            "filter must survive execve ({filters} filters)"
        );
        // glibc's pthread_create tries clone3 first; ENOSYS makes it use clone.
        let answer = std::thread::spawn(|| 6 * 7).join().expect("thread");
        assert_eq!(answer, 42);
        // posix_spawn (clone3 -> clone(CLONE_VM|CLONE_VFORK)) plus execve.
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", "echo ok"])
            .output()
            .expect("spawn /bin/sh");
        assert_eq!(out.stdout, b"ok\n");
        // Denials still hold after exec, in the grandchild too.
        assert_eq!(
            // SAFETY: unshare with an integer flag.
            unsafe { libc::unshare(libc::CLONE_NEWUSER) },
            -1
        );
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
        let denied = std::process::Command::new("/bin/sh")
            .args(["-c", "exec unshare -U true 2>/dev/null; exit 7"])
            .status()
            .expect("spawn /bin/sh");
        assert_ne!(
            denied.code(),
            Some(0),
            "unshare -U must fail under the filter"
        );
    }

    /// The filter survives `execve`. Under it, a normal Rust program can spawn threads
    /// and processes (clone3 -> ENOSYS -> clone fallback).
    #[test]
    fn threads_and_spawn_work_after_exec() {
        let filter = workload();
        let exe = CString::new(
            std::env::current_exe()
                .expect("current_exe")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .expect("exe path");
        // Test names omit the crate name that module_path! starts with.
        let module = module_path!().split_once("::").map_or("", |(_, rest)| rest);
        let name = CString::new(format!("{module}::exec_probe_entry")).expect("name");
        let args = [c"--exact", c"--nocapture", c"--test-threads=1"];
        let mut argv: Vec<*const libc::c_char> = vec![exe.as_ptr(), name.as_ptr()];
        argv.extend(args.iter().map(|a| a.as_ptr()));
        argv.push(std::ptr::null());
        let env = CString::new(format!("{PROBE_ENV}=1")).expect("env");
        let path = CString::new("PATH=/usr/local/bin:/usr/bin:/bin").expect("env");
        let envp = [env.as_ptr(), path.as_ptr(), std::ptr::null()];

        let (rd, wr) = pipe();
        // SAFETY: the child runs only async-signal-safe code (dup2, prctl, install,
        // execve, _exit) on data prepared before the fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: raw syscalls on fds and pointers that are valid in the child.
            unsafe {
                libc::dup2(wr.as_raw_fd(), 1);
                libc::dup2(wr.as_raw_fd(), 2);
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if filter.install().is_err() {
                    libc::_exit(101);
                }
                libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
                libc::_exit(102);
            }
        }
        drop(wr);
        let mut output = String::new();
        std::fs::File::from(rd)
            .read_to_string(&mut output)
            .expect("read child output");
        let status = wait(pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "exec probe failed, status {status:#x}:\n{output}"
        );
        assert!(output.contains("1 passed"), "probe did not run:\n{output}");
    }

    // -----------------------------------------------------------------------------
    // Static checks on the compiled programs (no kernel involved).
    // -----------------------------------------------------------------------------

    /// (native, compat) audit arch: AUDIT_ARCH_X86_64 and AUDIT_ARCH_I386.
    #[cfg(target_arch = "x86_64")]
    const ARCHES: (u32, u32) = (0xC000_003E, 0x4000_0003);
    /// (native, compat) audit arch: AUDIT_ARCH_AARCH64 and AUDIT_ARCH_ARM.
    #[cfg(target_arch = "aarch64")]
    const ARCHES: (u32, u32) = (0xC000_00B7, 0x4000_0028);
    const NATIVE: u32 = ARCHES.0;

    /// Runs a seccompiler program for (arch, nr) the way the kernel's action cache
    /// does (`seccomp_is_const_allow`). Returns `None` if the verdict depends on the
    /// syscall arguments.
    fn emulate(prog: &[seccompiler::sock_filter], arch: u32, nr: u32) -> Option<u32> {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let ins = &prog[pc];
            pc += 1;
            match ins.code {
                0x20 => match ins.k {
                    0 => acc = nr,
                    4 => acc = arch,
                    _ => return None,
                },
                0x54 => acc &= ins.k,
                0x05 => pc += ins.k as usize,
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let taken = match ins.code {
                        0x15 => acc == ins.k,
                        0x25 => acc > ins.k,
                        0x35 => acc >= ins.k,
                        _ => acc & ins.k != 0,
                    };
                    pc += usize::from(if taken { ins.jt } else { ins.jf });
                }
                0x06 => return Some(ins.k),
                code => panic!("unexpected BPF opcode {code:#x} at {pc}"),
            }
        }
    }

    /// The kernel's verdict across stacked filters: the most restrictive action wins
    /// (lowest action value, compared as signed).
    fn combined(filter: &Filter, arch: u32, nr: u32) -> Option<u32> {
        let mut verdict = libc::SECCOMP_RET_ALLOW;
        for p in &filter.programs {
            let r = emulate(&p.insns, arch, nr)?;
            let action = |v: u32| (v & libc::SECCOMP_RET_ACTION_FULL) as i32;
            if action(r) < action(verdict) {
                verdict = r;
            }
        }
        Some(verdict)
    }

    /// The "cheap" property: every syscall the policy allows is a constant ALLOW
    /// (never reads arguments). The kernel then skips the BPF for it entirely. Only
    /// the rows with argument rules are evaluated per call.
    #[test]
    fn allowed_syscalls_are_constant_allow() {
        let filter = workload();
        let errno = |e: u32| libc::SECCOMP_RET_ERRNO | e;
        let row = |nr: i64| POLICY.iter().find(|r| r.nr == nr);
        for nr in 0..=GUARD_END + 100 {
            let got = combined(&filter, NATIVE, nr as u32);
            let want = match row(nr) {
                Some(r) if matches!(r.args, Args::Any) => Some(errno(r.errno)),
                Some(_) => None,
                None if nr > REVIEWED_THROUGH && nr <= GUARD_END => Some(errno(ENOSYS)),
                None => Some(libc::SECCOMP_RET_ALLOW),
            };
            assert_eq!(got, want, "nr {nr}");
        }
        #[cfg(target_arch = "x86_64")]
        for nr in 0..=GUARD_END {
            let native = combined(&filter, NATIVE, nr as u32);
            let x32 = combined(&filter, NATIVE, (nr | X32_SYSCALL_BIT) as u32);
            assert_eq!(native, x32, "x32 twin of nr {nr}");
        }
        // Only three syscalls look at their arguments at all.
        let mut arg_dependent: Vec<&str> = POLICY
            .iter()
            .filter(|r| combined(&filter, NATIVE, r.nr as u32).is_none())
            .map(|r| r.name)
            .collect();
        arg_dependent.sort_unstable();
        assert_eq!(arg_dependent, ["clone", "personality", "socket"]);
        // Foreign architectures are killed whatever the number.
        for nr in [0, 1, 20, 120, 400] {
            assert_eq!(
                combined(&filter, ARCHES.1, nr),
                Some(libc::SECCOMP_RET_KILL_PROCESS)
            );
        }
        // Well inside the kernel's 4096-instruction limit.
        assert!(
            filter.instruction_count() < 2500,
            "{}",
            filter.instruction_count()
        );
    }
}
