//! Seccomp-BPF policy installed in every workload process right before `execve`.
//!
//! # Where it sits
//!
//! The container supervisor (PID 1, root inside its own user namespace) forks each
//! workload. In the child it drops to the workload uid and sets `PR_SET_NO_NEW_PRIVS`,
//! then calls [`Filter::install`] as the **last** step before `execve`. Last, because
//! the filter also applies to the supervisor code that still runs in the child (that
//! code must not need `setns`, `mount` and the like after this point). The filter is
//! inherited across `execve`, `fork` and `clone`, and it can never be removed.
//!
//! [`Filter::workload`] compiles the BPF once, in the supervisor, before any fork,
//! because compiling allocates. [`Filter::install`] only issues `seccomp(2)` on the
//! prebuilt programs. It doesn't allocate, take locks or panic, so it is safe between
//! `fork` and `execve` in a multi-threaded parent.
//!
//! # Policy shape: default allow, a reviewed denylist, `ENOSYS` past the review
//!
//! Docker's default profile is an allowlist: about 370 names allowed, everything else
//! `EPERM`, plus capability-gated groups. This module inverts that. Every syscall is
//! allowed except the rows of the `POLICY` table below. Each row carries the errno it
//! returns and one line saying why it is there.
//!
//! * **The same for the known attack surface.** A container without capabilities
//!   (our workloads run as an unprivileged uid) gets `EPERM` from Docker for the
//!   `CAP_SYS_ADMIN` group (mount API, namespaces, `bpf`, `perf_event_open`, ...), the
//!   other capability groups (modules, `kexec`, raw I/O, clock setting, NUMA policy,
//!   `kcmp`/`pidfd_getfd`, ...) and the syscalls it simply omits (keyrings,
//!   `userfaultfd`, swap, `pivot_root`, obsolete calls). All of them are rows here, with
//!   the same errno. The argument filters are the same too: `clone` namespace flags,
//!   the `personality` allowlist and `socket(AF_VSOCK)`. For that surface the two
//!   approaches are equivalent.
//! * **Where a denylist is weaker.** An allowlist fails closed on a syscall nobody
//!   reviewed, and a denylist fails open. Two cases:
//!   1. *Syscalls added by a future kernel.* We close this gap with a guard.
//!      `REVIEWED_THROUGH` (469, `file_setattr`, the last syscall of Linux 6.18) records
//!      how far the table was reviewed. Every number above it, up to
//!      `GUARD_END` (511, the last number below the x86_64 x32 compatibility band),
//!      returns `ENOSYS`. A new kernel syscall therefore stays unavailable until someone
//!      reviews it and raises the constant. `ENOSYS` is the answer libcs already expect
//!      from an older kernel, so nothing crashes. runc answers syscalls newer than its
//!      profile the same way.
//!   2. *Existing syscalls we chose to allow that an allowlist would forget or deny.*
//!      This is the deliberate delta. We checked the whole x86_64 table up to 469
//!      against Docker's profile. Allowed here, but not in a capability-less Docker
//!      container:
//!      * `chroot`: the kernel refuses it without `CAP_SYS_CHROOT`.
//!      * `uretprobe`: the kernel accepts it only from the uprobe trampoline.
//!      * the `sys_ni` stubs (`tuxcall`, `security`, ...), which return `ENOSYS`.
//!      * syscalls newer than that profile, all of which act on the caller's own
//!        resources: `map_shadow_stack`, `cachestat`, `futex_wake`/`wait`/`requeue`,
//!        `statmount`/`listmount`, `lsm_*`, `*xattrat`, `file_getattr`/`setattr`.
//!
//!      Denied here but allowed by Docker: `io_uring_*` (recent profiles deny it too),
//!      `name_to_handle_at` and `process_vm_readv`/`writev`.
//!
//!   Neither model catches new behaviour behind an existing syscall, such as a new
//!   `ioctl`, `prctl` option, flag or socket family, unless it filters arguments, and
//!   Docker doesn't either.
//! * **Why not an allowlist.** An allowlist that lags the libc in the image breaks
//!   workloads in confusing ways. The glibc 2.33/2.34 `faccessat2` and `clone3` failures
//!   under Docker are the standard example: `EPERM` instead of `ENOSYS`, so no
//!   fallback. Our isolation boundary is the user namespace plus having no capabilities.
//!   Seccomp's job here is to shrink the kernel surface an unprivileged process can
//!   reach, and that surface sits in the listed families. The guard above gives us the
//!   allowlist's main benefit for future syscalls. What remains open is limited to
//!   syscalls that existed at review time and were judged acceptable.
//!   An allowlist would have been feasible with seccompiler: about 370 rows, doubled
//!   for x32, is roughly 3,000 instructions, under the 4,096 limit. So this is a
//!   choice, not a limitation of the tool.
//!
//! # Decisions
//!
//! * **`ptrace`: allowed.** Workloads run as an unprivileged uid in their own user and
//!   PID namespace. `PTRACE_MODE_ATTACH` needs the same uid and a dumpable target, or
//!   `CAP_SYS_PTRACE` in the target's user namespace, which a workload never has. So
//!   ptrace only reaches the container's own same-uid processes, never the root-owned
//!   supervisor. Since Linux 4.8 the kernel re-checks seccomp after a tracer rewrites
//!   a syscall, so ptrace can't be used to bypass this filter. Docker allows it too
//!   (kernel >= 4.8). This keeps `strace` and `gdb` working. Across trees it is
//!   closed by Landlock, not here: each tree is a domain of its own
//!   (`exec::Placement::landlock`), so a detached process cannot trace a fenced one.
//! * **`process_vm_readv`/`writev`, `process_madvise`, `pidfd_getfd`, `kcmp`:
//!   denied.** They pass the same ptrace access check, so with `ptrace` allowed they
//!   grant no new capability. Denying them is not a security boundary. It only shrinks
//!   kernel surface, and no common tool needs them (`gdb`/`strace` use `ptrace` and
//!   `/proc/<pid>/mem`). Docker likewise denies `pidfd_getfd`/`kcmp` without
//!   `CAP_SYS_PTRACE`. Relax the `process_vm_*` rows if a profiler such as `py-spy`
//!   must run.
//! * **`adjtimex` and `clock_adjtime`: allowed.** glibc and musl implement `adjtimex()`,
//!   `ntp_gettime()` and `ntp_adjtime()` on top of `clock_adjtime(CLOCK_REALTIME, ..)`.
//!   Allowing read-only `adjtimex` therefore means allowing `clock_adjtime`. The flag
//!   that separates reads from writes (`timex.modes`) sits behind a pointer that
//!   seccomp cannot read. Changing a clock needs `CAP_SYS_TIME` in the *initial* user
//!   namespace, and no container process can have that. Docker allows both for the
//!   same reason. `clock_settime` and `settimeofday` are denied (there is no read-only
//!   use).
//! * **`personality`:** only the personas Docker allows: `PER_LINUX` (0), `PER_LINUX32`
//!   (8), `UNAME26` (0x20000), both (0x20008) and the query `0xffffffff`. Anything else
//!   returns `EPERM`, for example `ADDR_NO_RANDOMIZE` (gdb and `setarch -R` then run
//!   with ASLR on and print a warning) or `READ_IMPLIES_EXEC`. The comparison is on the
//!   low 32 bits, because the kernel takes an `unsigned int`.
//! * **`clone`:** `EPERM` if the flags (argument 0, low 32 bits, the part the kernel
//!   reads) contain any `CLONE_NEW*` namespace flag. Plain `fork`, `vfork` and threads
//!   pass. `CLONE_NEWTIME` (0x80) is not in the mask. In `clone(2)` that bit belongs to
//!   the exit-signal byte (`CSIGNAL`), and a time namespace can only be requested
//!   through `clone3` and `unshare`, which are both blocked. `unshare` and `setns` are
//!   denied whatever their arguments, as Docker does without `CAP_SYS_ADMIN`.
//! * **`clone3`: `ENOSYS`**, as in Docker. seccomp cannot inspect the flags inside
//!   `struct clone_args`. `ENOSYS` makes glibc (>= 2.34) and other runtimes fall back
//!   to `clone`, whose flags the filter can check. `EPERM` would break
//!   `pthread_create`.
//! * **Architecture mismatch: the process is killed.** On x86_64 the i386 ABI
//!   (`int 0x80`, `sysenter`) has its own syscall numbers. On aarch64 the AArch32
//!   compat ABI has its own too. None of the rows above would apply to them.
//!   seccompiler 0.5 puts `SECCOMP_RET_KILL_PROCESS` on every foreign-arch syscall, and
//!   we keep that rather than hand-writing BPF. A 32-bit binary cannot run under this
//!   filter at all, and a 64-bit process that issues `int 0x80` dies with `SIGSYS`.
//!   Docker translates its allowlist to i386 instead. We think killing is right for a
//!   sandbox: the compat entry points have a poor CVE record, and 32-bit workloads are
//!   not a use case.
//! * **x32 (x86_64 only):** x32 syscalls are `nr | 0x4000_0000` with the x86_64 audit
//!   arch, so they get past the arch check. seccompiler matches syscall numbers only by
//!   equality, so "deny every nr >= 0x4000_0000" cannot be expressed. Instead every row
//!   is repeated at its x32 number, with the same argument rules. The x32-only
//!   compatibility numbers of denied calls (`kexec_load` 528, `move_pages` 533,
//!   `process_vm_readv`/`writev` 539/540) are added as well, and so is the x32 twin of
//!   the `ENOSYS` guard. Most distribution kernels disable x32 (this repo's CI kernel
//!   returns `ENOSYS`), but the filter must not depend on kernel configuration.
//! * **`vm86`/`vm86old`** exist only in the i386 table, which the arch check kills.
//!   `create_module`, `get_kernel_syms` and `query_module` were removed in Linux 2.6
//!   but are listed anyway.
//! * **Errno:** `EPERM` for denials. That is Docker's `defaultErrnoRet`, and it is what
//!   the kernel itself returns for a missing capability, so tools take their
//!   "not permitted" path. `ENOSYS` only where a fallback is wanted (`clone3`, guard).
//!
//! # Cost
//!
//! Since Linux 5.11 the kernel emulates each filter once, at install time, and records
//! the syscalls whose verdict is ALLOW whatever the arguments. Those syscalls skip the
//! BPF entirely. Every allowed syscall here is such a constant ALLOW except `clone`,
//! `personality` and `socket`, the only rows that look at arguments. The test
//! `allowed_syscalls_are_constant_allow` pins this property. Hot paths (`read`, `openat`,
//! `mmap`, `futex`, ...) therefore pay nothing. On older kernels every syscall walks the
//! filters linearly (a few hundred instructions).
//!
//! seccompiler gives every filter a single match action. The policy is therefore
//! compiled into one program per errno (today `EPERM` and `ENOSYS`), and the programs
//! are stacked. Their syscall sets are disjoint, so stacking order does not matter.
//! We don't pass `SECCOMP_FILTER_FLAG_SPEC_ALLOW`. The speculative-store-bypass
//! mitigation stays as the host's `spec_store_bypass_disable=` decides (the default has
//! been `prctl` since Linux 5.16, which installing a filter doesn't trigger).

use std::collections::BTreeMap;
use std::fmt;
use std::io;

use seccompiler::{
    BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// Why building the workload filter failed.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// seccompiler rejected a rule or the program exceeded the BPF size limit.
    #[error("compiling the seccomp policy: {0}")]
    Compile(#[from] BackendError),
    /// A syscall number appears in two rows of the policy (a bug in the table).
    #[error("seccomp policy lists syscall {name} (nr {nr}) twice")]
    DuplicateRule {
        /// Name of the second row.
        name: &'static str,
        /// Syscall number (including the x32 bit, if any).
        nr: i64,
    },
    /// A compiled program is longer than a `sock_fprog` can describe.
    #[error("compiled seccomp program has {0} instructions, more than the kernel accepts")]
    ProgramTooLong(usize),
    /// No policy is defined for the architecture this binary was built for.
    #[error("no seccomp policy for target architecture {0}; refusing to run workloads")]
    UnsupportedArch(&'static str),
}

/// The compiled workload seccomp policy: one BPF program per errno, ready to install.
///
/// Build it once with [`Filter::workload`] before forking. Install it in each child with
/// [`Filter::install`].
#[derive(Clone)]
pub struct Filter {
    programs: Vec<Program>,
}

/// One compiled BPF program and its length, already checked to fit `sock_fprog.len`.
#[derive(Clone)]
struct Program {
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

// ---------------------------------------------------------------------------------
// The policy.
// ---------------------------------------------------------------------------------

const EPERM: u32 = libc::EPERM as u32;
const ENOSYS: u32 = libc::ENOSYS as u32;

/// Highest syscall number reviewed for this table: 469 = `file_setattr`, the last
/// syscall of Linux 6.18 (x86_64 and the generic table used by aarch64 agree from 424
/// on). Bump it only after reviewing every syscall added in between.
const REVIEWED_THROUGH: i64 = 469;
/// Last number covered by the `ENOSYS` guard. On x86_64, 512..=547 are x32-only
/// compatibility numbers, so the guard stops below them.
const GUARD_END: i64 = 511;

#[cfg(target_arch = "x86_64")]
const TARGET: Option<TargetArch> = Some(TargetArch::x86_64);
#[cfg(target_arch = "aarch64")]
const TARGET: Option<TargetArch> = Some(TargetArch::aarch64);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const TARGET: Option<TargetArch> = None;

/// Bit that turns an x86_64 syscall number into its x32 twin.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// The syscall numbers under which `native` is reachable through the ABIs that pass
/// the arch check: itself and, on x86_64, its x32 twin.
fn abi_numbers(native: i64) -> impl Iterator<Item = i64> {
    #[cfg(target_arch = "x86_64")]
    let twins = [native, native | X32_SYSCALL_BIT];
    #[cfg(not(target_arch = "x86_64"))]
    let twins = [native];
    twins.into_iter()
}

/// Which calls of a syscall a row denies.
#[derive(Clone, Copy, Debug)]
enum Args {
    /// Every call, whatever the arguments.
    Any,
    /// `clone` whose flags (arg 0) contain any namespace flag.
    CloneNamespaceFlags,
    /// `personality` with a persona outside Docker's allowlist.
    PersonaNotAllowed,
    /// `socket` whose domain (arg 0) is the given address family.
    SocketFamily(u64),
}

/// `CLONE_NEW*` flags that `clone(2)` can request (see the module docs on `CLONE_NEWTIME`).
const CLONE_NAMESPACE_FLAGS: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// Personas Docker allows: PER_LINUX, PER_LINUX32, UNAME26, PER_LINUX32|UNAME26, query.
const ALLOWED_PERSONAS: [u64; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

impl Args {
    /// seccompiler rules for this row. An empty vector means "matches every call".
    fn rules(self) -> Result<Vec<SeccompRule>, BackendError> {
        let dword = |op, value| SeccompCondition::new(0, SeccompCmpArgLen::Dword, op, value);
        match self {
            Args::Any => Ok(Vec::new()),
            // One rule per flag, OR-ed: (flags & F) == F for any F.
            Args::CloneNamespaceFlags => CLONE_NAMESPACE_FLAGS
                .iter()
                .map(|&flag| SeccompRule::new(vec![dword(SeccompCmpOp::MaskedEq(flag), flag)?]))
                .collect(),
            // One rule, AND-ed: persona differs from every allowed value.
            Args::PersonaNotAllowed => Ok(vec![SeccompRule::new(
                ALLOWED_PERSONAS
                    .iter()
                    .map(|&p| dword(SeccompCmpOp::Ne, p))
                    .collect::<Result<_, _>>()?,
            )?]),
            Args::SocketFamily(family) => Ok(vec![SeccompRule::new(vec![dword(
                SeccompCmpOp::Eq,
                family,
            )?])?]),
        }
    }
}

/// One row of the policy.
struct Rule {
    nr: i64,
    name: &'static str,
    args: Args,
    errno: u32,
    /// Why the row exists (read by the tests; documentation otherwise).
    #[cfg_attr(not(test), allow(dead_code, reason = "documentation column"))]
    why: &'static str,
}

const fn deny(nr: libc::c_long, name: &'static str, why: &'static str) -> Rule {
    Rule {
        nr,
        name,
        args: Args::Any,
        errno: EPERM,
        why,
    }
}

const fn deny_if(nr: libc::c_long, name: &'static str, args: Args, why: &'static str) -> Rule {
    Rule {
        nr,
        name,
        args,
        errno: EPERM,
        why,
    }
}

const fn enosys(nr: libc::c_long, name: &'static str, why: &'static str) -> Rule {
    Rule {
        nr,
        name,
        args: Args::Any,
        errno: ENOSYS,
        why,
    }
}

/// `open_tree_attr` (Linux 6.15). Not yet in the `libc` crate. Same number on x86_64
/// and aarch64.
const SYS_OPEN_TREE_ATTR: libc::c_long = 467;

/// The workload policy. Everything not listed here (and at or below
/// `REVIEWED_THROUGH`) is allowed.
#[rustfmt::skip]
const POLICY: &[Rule] = &[
    // Namespaces: the gateway to privileged kernel code for an unprivileged uid.
    deny_if(libc::SYS_clone, "clone", Args::CloneNamespaceFlags, "new namespaces (esp. user ns) expose root-only kernel code"),
    enosys(libc::SYS_clone3, "clone3", "flags hidden behind a pointer; ENOSYS makes libc fall back to clone"),
    deny(libc::SYS_unshare, "unshare", "new namespaces; Docker gates it on CAP_SYS_ADMIN"),
    deny(libc::SYS_setns, "setns", "joining other namespaces"),
    // Mounts and the new mount API.
    deny(libc::SYS_mount, "mount", "filesystem mounts; kernel fs parsers are a large surface"),
    deny(libc::SYS_umount2, "umount2", "unmounting would expose what mounts hide"),
    deny(libc::SYS_pivot_root, "pivot_root", "changing the root mount"),
    deny(libc::SYS_fsopen, "fsopen", "new mount API"),
    deny(libc::SYS_fsconfig, "fsconfig", "new mount API"),
    deny(libc::SYS_fsmount, "fsmount", "new mount API"),
    deny(libc::SYS_fspick, "fspick", "new mount API"),
    deny(libc::SYS_move_mount, "move_mount", "new mount API"),
    deny(libc::SYS_open_tree, "open_tree", "new mount API: detached mount clones"),
    deny(SYS_OPEN_TREE_ATTR, "open_tree_attr", "new mount API (6.15)"),
    deny(libc::SYS_mount_setattr, "mount_setattr", "new mount API: mount flags and idmaps"),
    deny(libc::SYS_open_by_handle_at, "open_by_handle_at", "opens files by handle, bypassing paths (\"shocker\")"),
    deny(libc::SYS_name_to_handle_at, "name_to_handle_at", "file-handle half of the above; Docker allows it, nothing needs it"),
    deny(libc::SYS_quotactl, "quotactl", "disk quota administration"),
    deny(libc::SYS_quotactl_fd, "quotactl_fd", "disk quota administration"),
    deny(libc::SYS_fanotify_init, "fanotify_init", "filesystem-wide monitoring; Docker gates it on CAP_SYS_ADMIN"),
    // Kernel keyrings are not namespaced.
    deny(libc::SYS_keyctl, "keyctl", "kernel keyrings are shared with the host"),
    deny(libc::SYS_add_key, "add_key", "kernel keyrings are shared with the host"),
    deny(libc::SYS_request_key, "request_key", "kernel keyrings; can invoke host upcalls"),
    // Programmable kernel facilities with long CVE records.
    deny(libc::SYS_bpf, "bpf", "eBPF verifier and maps"),
    deny(libc::SYS_perf_event_open, "perf_event_open", "perf subsystem; host-wide profiling"),
    deny(libc::SYS_userfaultfd, "userfaultfd", "stalls kernel page faults; exploit primitive"),
    deny(libc::SYS_io_uring_setup, "io_uring_setup", "io_uring; disabled by recent container profiles"),
    deny(libc::SYS_io_uring_enter, "io_uring_enter", "io_uring"),
    deny(libc::SYS_io_uring_register, "io_uring_register", "io_uring"),
    deny_if(libc::SYS_socket, "socket", Args::SocketFamily(libc::AF_VSOCK as u64), "AF_VSOCK talks to the hypervisor/host"),
    // Modules and kernel replacement.
    deny(libc::SYS_init_module, "init_module", "loading kernel modules"),
    deny(libc::SYS_finit_module, "finit_module", "loading kernel modules"),
    deny(libc::SYS_delete_module, "delete_module", "unloading kernel modules"),
    deny(libc::SYS_kexec_load, "kexec_load", "replacing the running kernel"),
    deny(libc::SYS_kexec_file_load, "kexec_file_load", "replacing the running kernel"),
    #[cfg(target_arch = "x86_64")]
    deny(174, "create_module", "obsolete module loader (removed in 2.6)"),
    #[cfg(target_arch = "x86_64")]
    deny(177, "get_kernel_syms", "obsolete; leaks kernel symbols (removed in 2.6)"),
    #[cfg(target_arch = "x86_64")]
    deny(178, "query_module", "obsolete module query (removed in 2.6)"),
    // Host-wide system administration.
    deny(libc::SYS_reboot, "reboot", "rebooting; reboots the host if the pid ns check ever fails"),
    deny(libc::SYS_swapon, "swapon", "host swap configuration"),
    deny(libc::SYS_swapoff, "swapoff", "host swap configuration"),
    deny(libc::SYS_acct, "acct", "host process accounting"),
    deny(libc::SYS_syslog, "syslog", "reads the host kernel log (kernel addresses)"),
    deny(libc::SYS_vhangup, "vhangup", "hangs up the controlling terminal"),
    deny(libc::SYS_sethostname, "sethostname", "UTS changes; Docker gates it on CAP_SYS_ADMIN"),
    deny(libc::SYS_setdomainname, "setdomainname", "UTS changes; Docker gates it on CAP_SYS_ADMIN"),
    deny(libc::SYS_lookup_dcookie, "lookup_dcookie", "oprofile leftover; leaks paths"),
    deny(libc::SYS_nfsservctl, "nfsservctl", "obsolete kernel NFS server control"),
    #[cfg(target_arch = "x86_64")]
    deny(libc::SYS_uselib, "uselib", "obsolete a.out loader"),
    #[cfg(target_arch = "x86_64")]
    deny(libc::SYS_ustat, "ustat", "obsolete; leaks host filesystem info"),
    #[cfg(target_arch = "x86_64")]
    deny(libc::SYS_sysfs, "sysfs", "obsolete filesystem-type query"),
    #[cfg(target_arch = "x86_64")]
    deny(libc::SYS__sysctl, "_sysctl", "obsolete binary sysctl"),
    // Raw hardware access.
    #[cfg(target_arch = "x86_64")]
    deny(libc::SYS_iopl, "iopl", "raw I/O port access"),
    #[cfg(target_arch = "x86_64")]
    deny(libc::SYS_ioperm, "ioperm", "raw I/O port access"),
    // Clocks are not namespaced (adjtimex/clock_adjtime: see module docs).
    deny(libc::SYS_clock_settime, "clock_settime", "setting host clocks"),
    deny(libc::SYS_settimeofday, "settimeofday", "setting the host clock"),
    // Execution domain.
    deny_if(libc::SYS_personality, "personality", Args::PersonaNotAllowed, "e.g. ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC weaken exploits mitigations"),
    // Other processes' memory (ptrace itself is allowed: see module docs).
    deny(libc::SYS_process_vm_readv, "process_vm_readv", "cross-process memory; not needed beside ptrace"),
    deny(libc::SYS_process_vm_writev, "process_vm_writev", "cross-process memory; not needed beside ptrace"),
    deny(libc::SYS_process_madvise, "process_madvise", "cross-process memory advice; Docker gates it on CAP_SYS_PTRACE"),
    deny(libc::SYS_pidfd_getfd, "pidfd_getfd", "steals fds from other processes; Docker gates it on CAP_SYS_PTRACE"),
    deny(libc::SYS_kcmp, "kcmp", "compares kernel pointers of other processes"),
    // NUMA placement: Docker gates these on CAP_SYS_NICE.
    deny(libc::SYS_get_mempolicy, "get_mempolicy", "NUMA policy; Docker gates it on CAP_SYS_NICE"),
    deny(libc::SYS_set_mempolicy, "set_mempolicy", "NUMA policy"),
    deny(libc::SYS_set_mempolicy_home_node, "set_mempolicy_home_node", "NUMA policy"),
    deny(libc::SYS_mbind, "mbind", "NUMA policy"),
    deny(libc::SYS_move_pages, "move_pages", "moves other processes' pages between nodes"),
    deny(libc::SYS_migrate_pages, "migrate_pages", "moves other processes' pages between nodes"),
];

/// x86_64 only: x32-specific numbers (512..=547) of syscalls denied above. Their
/// `nr | 0x4000_0000` twin is a different, 64-bit-only entry.
#[cfg(target_arch = "x86_64")]
const X32_ONLY_TWINS: &[(i64, &str)] = &[
    (X32_SYSCALL_BIT | 528, "kexec_load (x32)"),
    (X32_SYSCALL_BIT | 533, "move_pages (x32)"),
    (X32_SYSCALL_BIT | 539, "process_vm_readv (x32)"),
    (X32_SYSCALL_BIT | 540, "process_vm_writev (x32)"),
];
#[cfg(not(target_arch = "x86_64"))]
const X32_ONLY_TWINS: &[(i64, &str)] = &[];

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    //! These tests run the filter for real. Each forks a child that installs it and
    //! tries syscalls. The child only makes raw syscalls (no allocation: the parent
    //! is the multi-threaded test harness) and reports back through a pipe.
    use super::*;

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

    #[test]
    fn policy_table_is_consistent() {
        let mut names: Vec<&str> = POLICY.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), POLICY.len(), "duplicate row names");
        assert!(POLICY.iter().all(|r| !r.why.is_empty()));
        assert!(POLICY.iter().all(|r| r.nr <= REVIEWED_THROUGH));
        // Every x32-only twin belongs to a denied row.
        for (_, name) in X32_ONLY_TWINS {
            let base = name.trim_end_matches(" (x32)");
            assert!(POLICY.iter().any(|r| r.name == base), "{name}");
        }
        // Decisions recorded in the module docs.
        for allowed in ["ptrace", "adjtimex", "clock_adjtime", "chroot", "seccomp"] {
            assert!(
                !names.contains(&allowed),
                "{allowed} is meant to be allowed"
            );
        }
        for denied in [
            "pidfd_getfd",
            "process_vm_readv",
            "io_uring_setup",
            "open_tree_attr",
        ] {
            assert!(names.contains(&denied), "{denied} is meant to be denied");
        }
        let filter = workload();
        assert_eq!(filter.programs.len(), 2, "one EPERM and one ENOSYS program");
        assert!(format!("{filter:?}").contains("program_lengths"));
    }
}
