//! The workload child's steps between the clone and the exec, and the Landlock
//! domain it enters (only async-signal-safe calls on data prepared before the fork).

use super::ChildArgs;
use crate::clone;
use crate::stage::{self, Stage};

/// `LANDLOCK_ACCESS_FS_MAKE_BLOCK` (Landlock ABI 1).
const LANDLOCK_ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
/// `LANDLOCK_ACCESS_FS_REFER` (Landlock ABI 2): linking or renaming a file into
/// another directory.
const LANDLOCK_ACCESS_FS_REFER: u64 = 1 << 13;
/// `LANDLOCK_RULE_PATH_BENEATH`.
const LANDLOCK_RULE_PATH_BENEATH: u32 = 1;

/// `struct landlock_path_beneath_attr` (packed, as the kernel declares it).
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI this kernel offers (0: none).
pub fn landlock_abi() -> i64 {
    // SAFETY: the version query reads no memory (a null attribute, size 0). Raw: a
    // workload child asks too, and its `errno` is not its own (`clone::raw_syscall`).
    let v = unsafe {
        clone::raw_syscall(
            libc::SYS_landlock_create_ruleset,
            &[0, 0, 1], // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    v.map_or(0, |v| v as i64)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The workload child: its session and cgroup, its stdio, then the identity switch
/// (groups, gid, uid: every capability goes with uid 0), `no_new_privs`, its working
/// directory (resolved as the workload: never as the container's root, who could enter
/// the supervisor's `/proc/1/fd/*`), only fds 0-2 across the exec, the seccomp filter,
/// exec.
///
/// # Safety
/// Runs in the child of the multi-threaded supervisor between `fork` and `execve`: only
/// async-signal-safe calls on data prepared before the fork.
pub(super) unsafe fn child(a: &ChildArgs) -> ! {
    use clone::raw_syscall as sys;
    // SAFETY: raw syscalls on prepared data only, which the caller keeps (`fork`);
    // every failure reports and _exits. Their errors come back in their return values
    // (`raw_syscall`): `errno` is the forking thread's too.
    unsafe {
        let ChildArgs {
            p,
            stdio,
            place,
            joined,
            handlers,
            err_w,
        } = *a;
        let (p, stdio, place) = (&*p, &*stdio, &*place);
        let fail = |stage: Stage, errno: i32| -> ! { stage::fail_with(err_w, stage, errno) };
        let cstr = |s: &std::ffi::CStr| s.as_ptr() as usize;
        // Born with every signal blocked (a `CLONE_VM` child: `fork_vm`), and with no
        // handler of the supervisor's (`CLONE_CLEAR_SIGHAND`, there): every disposition
        // back to its default, the ignored ones too, then the empty mask. A workload
        // starts the same whatever ignored what above it: Rust's runtime ignores
        // SIGPIPE, and a server started by `nohup` or from a shell's background job
        // ignores SIGHUP or SIGINT, which would otherwise reach every command (a
        // terminal's hang-up and Ctrl-C would not).
        clone::default_signals(handlers, clone::Ignored::Reset(place.ignored));
        // Its own session: the degraded kill signals this group, and a terminal
        // signal for the supervisor never reaches it.
        let _ = sys(libc::SYS_setsid, &[]);
        if !joined && let Some(dir) = place.cgroup_dir {
            let flags = (libc::O_WRONLY | libc::O_CLOEXEC) as usize;
            let procs = sys(
                libc::SYS_openat,
                &[dir as usize, cstr(c"cgroup.procs"), flags],
            )
            .unwrap_or_else(|e| fail(Stage::JoinCgroup, e));
            match sys(libc::SYS_write, &[procs, b"0".as_ptr() as usize, 1]) {
                Ok(1) => {}
                Ok(_) => fail(Stage::JoinCgroup, libc::EIO),
                Err(e) => fail(Stage::JoinCgroup, e),
            }
            let _ = sys(libc::SYS_close, &[procs]);
        }
        for (from, to) in [(stdio.stdin, 0), (stdio.stdout, 1), (stdio.stderr, 2)] {
            let done = if from == to {
                // Already in place: it only must not close at the exec.
                sys(libc::SYS_fcntl, &[to as usize, libc::F_SETFD as usize, 0])
            } else {
                sys(libc::SYS_dup3, &[from as usize, to as usize, 0])
            };
            if let Err(e) = done {
                fail(Stage::Stdio, e);
            }
        }
        // A terminal session: the child leads a new session (above), and its terminal
        // becomes the session's controlling one, so the line discipline signals its
        // foreground group (Ctrl-C, a resize) and a hang-up reaches it.
        if stdio.ctty
            && let Err(e) = sys(libc::SYS_ioctl, &[0, libc::TIOCSCTTY as usize, 0])
        {
            fail(Stage::Stdio, e);
        }
        if let Some((uid, gid)) = place.identity {
            // No `oom_score_adj` here: this child shares the supervisor's memory, and
            // the kernel gives a score written now to every process sharing it, the
            // supervisor included. The supervisor raises the workload's once it has
            // exec'd (`pid1`'s `raise_oom_score`).
            // The bounding set needs CAP_SETPCAP: empty it while still root (unless
            // the forking thread's already is, and this child inherited it so). The
            // kernel's capabilities are numbered from 0 without a gap, and past its
            // last one the drop is refused (EINVAL): the loop ends there.
            if !place.bounding_empty {
                for cap in 0..64usize {
                    let drop = sys(libc::SYS_prctl, &[libc::PR_CAPBSET_DROP as usize, cap]);
                    if drop == Err(libc::EINVAL) {
                        break;
                    }
                }
            }
            // Raw syscalls: glibc's setresuid & co. broadcast to every thread glibc
            // believes exists (a child of a raw clone3 has one) and would wait forever.
            let (uid, gid) = (uid as usize, gid as usize);
            if let Err(e) = sys(libc::SYS_setgroups, &[0, 0])
                .and_then(|_| sys(libc::SYS_setresgid, &[gid, gid, gid]))
                .and_then(|_| sys(libc::SYS_setresuid, &[uid, uid, uid]))
            {
                fail(Stage::Identity, e);
            }
            // Until its exec this child's memory is the supervisor's: from here no
            // process of the workload's uid, which it now has, may trace it or open its
            // `/proc` entries, whatever the host's `fs.suid_dumpable`. Right after the
            // switch, not before: the switch itself sets the flag to that sysctl (0, or
            // 1 where the host allows tracing). The flag is the memory's, so the
            // supervisor is marked too; the exec gives the workload a memory of its
            // own, dumpable as its credentials say.
            let _ = sys(libc::SYS_prctl, &[libc::PR_SET_DUMPABLE as usize, 0]);
            let _ = sys(
                libc::SYS_prctl,
                &[
                    libc::PR_CAP_AMBIENT as usize,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL as usize,
                ],
            );
            let mut hdr = CapHeader {
                version: 0x2008_0522,
                pid: 0,
            };
            let data = [CapData {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            }; 2];
            if let Err(e) = sys(
                libc::SYS_capset,
                &[&mut hdr as *mut CapHeader as usize, data.as_ptr() as usize],
            )
            .and_then(|_| sys(libc::SYS_prctl, &[libc::PR_SET_NO_NEW_PRIVS as usize, 1]))
            {
                fail(Stage::DropCapabilities, e);
            }
        }
        if let Err(e) = sys(libc::SYS_chdir, &[p.cwd.as_ptr() as usize]) {
            fail(Stage::Cwd, e);
        }
        // fds 0-2 only: everything else closes at exec (err_w too, which tells the
        // supervisor the exec happened).
        let _ = sys(
            libc::SYS_close_range,
            &[3, u32::MAX as usize, libc::CLOSE_RANGE_CLOEXEC as usize],
        );
        if place.landlock && place.identity.is_some() {
            // A domain that denies nothing a workload can do: the ptrace scoping comes
            // with any domain. It handles creating block devices (which a workload in a
            // user namespace cannot do anyway), granted nowhere. Since ABI 2 a domain
            // refuses every link or rename into another directory (EXDEV) unless it
            // handles REFER and grants it: handled here and granted beneath `/`, so
            // `mv a/x b/x`, `ln`, package managers and git behave as outside (a red team
            // found uploads and tools failing with EXDEV).
            let refer = if landlock_abi() >= 2 {
                LANDLOCK_ACCESS_FS_REFER
            } else {
                0
            };
            let attr: u64 = LANDLOCK_ACCESS_FS_MAKE_BLOCK | refer;
            let fd = sys(
                libc::SYS_landlock_create_ruleset,
                &[&attr as *const u64 as usize, std::mem::size_of::<u64>(), 0],
            )
            .unwrap_or_else(|e| fail(Stage::Landlock, e));
            if refer != 0 {
                let flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as usize;
                let root = sys(
                    libc::SYS_openat,
                    &[libc::AT_FDCWD as usize, cstr(c"/"), flags],
                )
                .unwrap_or_else(|e| fail(Stage::Landlock, e));
                let rule = PathBeneath {
                    allowed_access: refer,
                    parent_fd: root as i32,
                };
                if let Err(e) = sys(
                    libc::SYS_landlock_add_rule,
                    &[
                        fd,
                        LANDLOCK_RULE_PATH_BENEATH as usize,
                        &rule as *const PathBeneath as usize,
                        0,
                    ],
                ) {
                    fail(Stage::Landlock, e);
                }
                let _ = sys(libc::SYS_close, &[root]);
            }
            if let Err(e) = sys(libc::SYS_landlock_restrict_self, &[fd, 0]) {
                fail(Stage::Landlock, e);
            }
            let _ = sys(libc::SYS_close, &[fd]);
        }
        if let Some(filter) = place.seccomp
            && let Err(e) = filter.install()
        {
            fail(Stage::Seccomp, e.raw_os_error().unwrap_or(libc::EPERM));
        }
        let mut last = libc::ENOENT;
        for path in &p.paths {
            let tried = sys(
                libc::SYS_execve,
                &[
                    path.as_ptr() as usize,
                    p.argv_ptrs.as_ptr() as usize,
                    p.envp_ptrs.as_ptr() as usize,
                ],
            );
            if let Err(e) = tried
                && e != libc::ENOENT
                && e != libc::ENOTDIR
            {
                last = e;
            }
        }
        fail(Stage::Exec, last)
    }
}
