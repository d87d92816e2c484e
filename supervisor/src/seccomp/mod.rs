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
//! allowed except the rows of the `POLICY` table (`policy.rs`). Each row carries the errno it
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

use seccompiler::BackendError;

mod filter;
mod policy;

pub use filter::Filter;

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
