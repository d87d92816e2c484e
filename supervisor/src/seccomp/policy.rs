//! The workload policy as data: one row per denied syscall, with its errno, the
//! arguments it looks at and why it is there (the module docs of `seccomp` give the
//! reasons for the shape).

use seccompiler::{
    BackendError, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule, TargetArch,
};

pub(super) const EPERM: u32 = libc::EPERM as u32;
pub(super) const ENOSYS: u32 = libc::ENOSYS as u32;

/// Highest syscall number reviewed for this table: 469 = `file_setattr`, the last
/// syscall of Linux 6.18 (x86_64 and the generic table used by aarch64 agree from 424
/// on). Bump it only after reviewing every syscall added in between.
pub(super) const REVIEWED_THROUGH: i64 = 469;
/// Last number covered by the `ENOSYS` guard. On x86_64, 512..=547 are x32-only
/// compatibility numbers, so the guard stops below them.
pub(super) const GUARD_END: i64 = 511;

#[cfg(target_arch = "x86_64")]
pub(super) const TARGET: Option<TargetArch> = Some(TargetArch::x86_64);
#[cfg(target_arch = "aarch64")]
pub(super) const TARGET: Option<TargetArch> = Some(TargetArch::aarch64);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) const TARGET: Option<TargetArch> = None;

/// Bit that turns an x86_64 syscall number into its x32 twin.
#[cfg(target_arch = "x86_64")]
pub(super) const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// The syscall numbers under which `native` is reachable through the ABIs that pass
/// the arch check: itself and, on x86_64, its x32 twin.
pub(super) fn abi_numbers(native: i64) -> impl Iterator<Item = i64> {
    #[cfg(target_arch = "x86_64")]
    let twins = [native, native | X32_SYSCALL_BIT];
    #[cfg(not(target_arch = "x86_64"))]
    let twins = [native];
    twins.into_iter()
}

/// Which calls of a syscall a row denies.
#[derive(Clone, Copy, Debug)]
pub(super) enum Args {
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
    pub(super) fn rules(self) -> Result<Vec<SeccompRule>, BackendError> {
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
pub(super) struct Rule {
    pub(super) nr: i64,
    pub(super) name: &'static str,
    pub(super) args: Args,
    pub(super) errno: u32,
    /// Why the row exists (read by the tests; documentation otherwise).
    #[cfg_attr(not(test), allow(dead_code, reason = "documentation column"))]
    pub(super) why: &'static str,
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
pub(super) const SYS_OPEN_TREE_ATTR: libc::c_long = 467;

/// The workload policy. Everything not listed here (and at or below
/// `REVIEWED_THROUGH`) is allowed.
#[rustfmt::skip]
pub(super) const POLICY: &[Rule] = &[
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
pub(super) const X32_ONLY_TWINS: &[(i64, &str)] = &[
    (X32_SYSCALL_BIT | 528, "kexec_load (x32)"),
    (X32_SYSCALL_BIT | 533, "move_pages (x32)"),
    (X32_SYSCALL_BIT | 539, "process_vm_readv (x32)"),
    (X32_SYSCALL_BIT | 540, "process_vm_writev (x32)"),
];
#[cfg(not(target_arch = "x86_64"))]
pub(super) const X32_ONLY_TWINS: &[(i64, &str)] = &[];

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::*;
    use crate::seccomp::Filter;

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
        let filter = Filter::workload().expect("policy compiles");
        assert_eq!(filter.programs.len(), 2, "one EPERM and one ENOSYS program");
        assert!(format!("{filter:?}").contains("program_lengths"));
    }
}
