//! The supervisor's clone, on the spawner thread: everything the child touches prepared
//! before it, the clone (sharing this process's memory where it can), the host's side
//! between the clone and the child's go (the id maps, the v1 cgroups), and the child's
//! steps up to its `execveat`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::clone::{Clone, Cloned};
use crate::stage::{self, Stage};

use super::{SpawnRequest, Spawned, kill_pidfd, reap_blocking};
use crate::handoff::FIRST_FREE;

/// Where prepared fds wait before they are moved onto their numbers.
const HIGH: RawFd = 100;
/// `move_mount`'s flag: the source is the descriptor itself (linux/mount.h).
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;

/// Everything the child touches, allocated before the clone (between clone and exec
/// only async-signal-safe calls on this data are allowed: the host is multi-threaded).
struct Prepared {
    exe: OwnedFd,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// (source fd ≥ HIGH, target).
    fds: Vec<(OwnedFd, RawFd)>,
    opens: Vec<(CString, RawFd)>,
    /// (detached tree ≥ HIGH, where it is attached).
    attach: Vec<(OwnedFd, CString)>,
    devnull: OwnedFd,
    sync_r: OwnedFd,
    /// The step pipe's write end ([`stage`]): the child's copy; the parent closes its
    /// own right after the clone (owned outside, so that a `CLONE_VM` child's view of
    /// this struct never changes while it runs).
    steps_w: RawFd,
    userns: bool,
}

/// How long the spawner waits for a child to be past its exec before killing it.
const CHILD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// The child's stack (`CLONE_VM`): its steps need a few KiB.
#[cfg(target_arch = "x86_64")]
const CHILD_STACK: usize = 256 << 10;

/// What a clone returned in the parent: the child's pid, its pidfd, and the stack it
/// runs on until its exec (`CLONE_VM`; `None` for a fork-like clone).
type ClonedChild = (i32, Option<RawFd>, Option<Box<dyn std::any::Any>>);

/// Clone the child: sharing this process's memory where possible (the returned stack
/// must outlive the child's exec), fork-like otherwise.
fn clone_child(clone: &Clone, p: &Prepared) -> io::Result<ClonedChild> {
    #[cfg(target_arch = "x86_64")]
    {
        /// The child's entry on its own stack.
        ///
        /// # Safety
        /// `arg` is a `&Prepared` that outlives the child's exec.
        unsafe extern "C" fn entry(arg: *const std::os::raw::c_void) -> ! {
            // SAFETY: the caller's contract: `arg` is a live `Prepared`.
            unsafe { child(&*(arg as *const Prepared), crate::clone::Handlers::Cleared) }
        }
        let stack = crate::clone::Stack::new(CHILD_STACK)?;
        // SAFETY: `child` makes async-signal-safe calls only, on `p`, which the caller
        // keeps (with `stack`) until the step pipe says the child exec'd or died.
        match unsafe { clone.clone3_vm(&stack, entry, p as *const Prepared as *const _) } {
            Ok((pid, pidfd)) => return Ok((pid, pidfd, Some(Box::new(stack)))),
            // A kernel that refuses the shared clone gets the fork-like one.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    // SAFETY: the child runs on a copy of this thread and only makes
    // async-signal-safe syscalls on `p` (`child`) until it execs or exits.
    match unsafe { clone.clone3() }? {
        // SAFETY: in the child, until execveat.
        Cloned::Child => unsafe { child(p, crate::clone::Handlers::Inherited) },
        Cloned::Parent { pid, pidfd } => Ok((pid, pidfd, None)),
    }
}

/// Wait until every write end of the child's step pipe is closed (it exec'd or died);
/// past `CHILD_DEADLINE`, kill it and wait for that.
fn wait_child_past_exec(steps: &OwnedFd, pidfd: &OwnedFd) {
    let deadline = std::time::Instant::now() + CHILD_DEADLINE;
    let mut killed = false;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() && !killed {
            let _ = kill_pidfd(pidfd);
            killed = true;
        }
        let timeout = rustix::event::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        // No events asked: only the hang-up (every writer gone) wakes it.
        let mut fds = [rustix::event::PollFd::new(
            steps,
            rustix::event::PollFlags::empty(),
        )];
        match rustix::event::poll(&mut fds, (!killed).then_some(&timeout)) {
            Ok(_)
                if fds[0]
                    .revents()
                    .intersects(rustix::event::PollFlags::HUP | rustix::event::PollFlags::ERR) =>
            {
                return;
            }
            _ => {}
        }
    }
}

fn high(fd: &OwnedFd) -> io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(fd, HIGH)?)
}

pub(super) fn clone_supervisor(req: SpawnRequest) -> io::Result<Spawned> {
    let (sync_r, sync_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let (steps_r, steps_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let cgroup = req.cgroup.as_ref().map(high).transpose()?;
    let mut fds = Vec::new();
    for (fd, target) in &req.fds {
        fds.push((high(fd)?, *target));
    }
    let mut attach = Vec::with_capacity(req.attach_in_child.len());
    for (tree, at) in &req.attach_in_child {
        attach.push((high(tree)?, at.clone()));
    }
    let devnull = OwnedFd::from(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")?,
    );
    let mut argv: Vec<*const libc::c_char> = req.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = req.envp.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let userns = req.namespaces && req.id_map.is_some();
    let steps_w_high = high(&steps_w)?;
    let p = Prepared {
        exe: high(&req.exe)?,
        argv,
        envp,
        fds,
        opens: req.open_in_child.clone(),
        attach,
        devnull: high(&devnull)?,
        sync_r: high(&sync_r)?,
        steps_w: steps_w_high.as_raw_fd(),
        userns,
    };
    drop((devnull, sync_r, steps_w));

    let mut namespaces = 0;
    if req.namespaces {
        namespaces = libc::CLONE_NEWPID
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC;
        if userns {
            namespaces |= libc::CLONE_NEWUSER;
        }
    }
    let clone = Clone {
        namespaces,
        cgroup: cgroup.as_ref().map(|c| c.as_raw_fd()),
        pidfd: true,
        // The host's own reaping of a supervisor is unchanged: SIGCHLD.
        quiet: false,
    };
    // posix_spawn's discipline: every signal blocked across the clone, so no handler of
    // the host's (tokio's SIGTERM pipe, wasmtime's trap handlers) can run in a child that
    // shares the host's memory; the child resets the handlers and then unblocks.
    let blocked = crate::clone::BlockedSignals::all();
    let cloned = clone_child(&clone, &p);
    drop(blocked);
    let (pid, pidfd, stack) = cloned?;
    // The child has its own copy: once it exec'd or died, no write end is left.
    drop(steps_w_high);
    let Some(pidfd) = pidfd.filter(|fd| *fd >= 0) else {
        // No pidfd to kill it by: it waits for a go that never comes (the sync pipe's
        // write end closes with this function) and exits; wait for that.
        drop(sync_w);
        let _ = stage::outcome(&steps_r);
        drop((p, stack));
        return Err(io::Error::other("clone3 returned no pidfd"));
    };
    // SAFETY: the kernel wrote a fresh pidfd (CLONE_PIDFD), which nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let started = go(&req, pid, &pidfd, &sync_w);
    if started.is_ok() {
        wait_child_past_exec(&steps_r, &pidfd);
    }
    // Past its exec, or dead and reaped (`go`'s failures kill and reap it): `p` and the
    // stack are this thread's again.
    drop((p, stack));
    started?;
    Ok(Spawned {
        pid,
        pidfd,
        steps: steps_r,
    })
}

/// The host's side between the clone and the child's go: the id maps, the v1
/// cgroups, then go. A failure kills and reaps the child.
fn go(req: &SpawnRequest, pid: i32, pidfd: &OwnedFd, sync_w: &OwnedFd) -> io::Result<()> {
    let userns = req.namespaces && req.id_map.is_some();
    if let Some(map) = &req.id_map
        && userns
    {
        let written = std::fs::write(format!("/proc/{pid}/uid_map"), map)
            .and_then(|()| std::fs::write(format!("/proc/{pid}/gid_map"), map));
        if let Err(e) = written {
            let _ = kill_pidfd(pidfd);
            let _ = reap_blocking(pidfd);
            return Err(io::Error::new(e.kind(), format!("writing the id map: {e}")));
        }
    }
    for procs in &req.join {
        if let Err(e) = std::fs::write(procs, pid.to_string()) {
            let _ = kill_pidfd(pidfd);
            let _ = reap_blocking(pidfd);
            return Err(io::Error::new(
                e.kind(),
                format!("joining {}: {e}", procs.display()),
            ));
        }
    }
    // Go: the maps and the cgroups are in place.
    if let Err(e) = rustix::io::write(sync_w, b"g") {
        let _ = kill_pidfd(pidfd);
        let _ = reap_blocking(pidfd);
        return Err(e.into());
    }
    Ok(())
}

/// The clone child: wait for the id maps, open what only root may reach, become the
/// container's root, place the descriptors, exec the supervisor.
///
/// # Safety
/// Runs in the child of a multi-threaded process between `clone3` and `execveat`: it
/// must only make async-signal-safe calls, on memory prepared before the clone.
unsafe fn child(p: &Prepared, handlers: crate::clone::Handlers) -> ! {
    use crate::clone::raw_syscall as sys;
    // SAFETY: raw syscalls on prepared data only; every failure ends in `_exit`. Their
    // errors come back in their return values (`raw_syscall`): `errno` is the host's
    // spawner thread's too.
    unsafe {
        // Signals arrive blocked (`BlockedSignals`): a handler of the host's must not
        // run here. Back to the default dispositions (the kernel's work already for a
        // shared clone, `CLONE_CLEAR_SIGHAND`; an ignored one stays ignored, as across
        // exec), then the empty mask the supervisor expects.
        crate::clone::default_signals(handlers, crate::clone::Ignored::Keep);
        let pdeathsig = [libc::PR_SET_PDEATHSIG as usize, libc::SIGKILL as usize];
        let _ = sys(libc::SYS_prctl, &pdeathsig);
        let steps = p.steps_w;
        let fail = |stage: Stage, errno: i32| -> ! { stage::fail_with(steps, stage, errno) };
        let mut go = [0u8; 1];
        match sys(
            libc::SYS_read,
            &[p.sync_r.as_raw_fd() as usize, go.as_mut_ptr() as usize, 1],
        ) {
            Ok(1) => {}
            // The host closed its end without a go: it gave up on this child.
            Ok(_) => fail(Stage::AwaitGo, libc::EPIPE),
            Err(e) => fail(Stage::AwaitGo, e),
        }
        // The mounts its namespace was made without (the storage), each where the
        // host has it, before the opens that reach them.
        for (tree, at) in &p.attach {
            let args = [
                tree.as_raw_fd() as usize,
                c"".as_ptr() as usize,
                libc::AT_FDCWD as usize,
                at.as_ptr() as usize,
                MOVE_MOUNT_F_EMPTY_PATH as usize,
            ];
            if let Err(e) = sys(libc::SYS_move_mount, &args) {
                fail(Stage::AttachMounts, e);
            }
        }
        // Still kuid 0: open what the container's root could not reach. Each lands
        // at HIGH + i first, so no open can take a number a later dup2 targets.
        let mut opened = [-1 as RawFd; 8];
        for (i, (path, _)) in p.opens.iter().enumerate().take(opened.len()) {
            let flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as usize;
            let fd = sys(
                libc::SYS_openat,
                &[libc::AT_FDCWD as usize, path.as_ptr() as usize, flags],
            )
            .unwrap_or_else(|e| fail(Stage::OpenHostDirs, e));
            let high = (HIGH + 50 + i as RawFd) as usize;
            let dup = sys(libc::SYS_fcntl, &[fd, libc::F_DUPFD_CLOEXEC as usize, high]);
            let _ = sys(libc::SYS_close, &[fd]);
            opened[i] = dup.unwrap_or_else(|e| fail(Stage::OpenHostDirs, e)) as RawFd;
        }
        // Raw syscalls: glibc's setresuid & co. broadcast to every thread glibc
        // believes exists (this child of a raw clone3 has one) and would wait forever.
        if p.userns
            && let Err(e) = sys(libc::SYS_setgroups, &[0, 0])
                .and_then(|_| sys(libc::SYS_setresgid, &[0, 0, 0]))
                .and_then(|_| sys(libc::SYS_setresuid, &[0, 0, 0]))
        {
            fail(Stage::BecomeRoot, e);
        }
        // A credential change clears the parent-death signal: set it again (the host's
        // spawner thread lives as long as the host; the window is these few calls).
        let _ = sys(libc::SYS_prctl, &pdeathsig);
        let null = p.devnull.as_raw_fd();
        let moves = [(null, 0), (null, 1), (null, 2)]
            .into_iter()
            .chain(p.fds.iter().map(|(fd, target)| (fd.as_raw_fd(), *target)))
            .chain(
                p.opens
                    .iter()
                    .zip(opened)
                    .map(|((_, target), fd)| (fd, *target)),
            );
        for (from, to) in moves {
            // dup2's meaning: a descriptor already in place stays as it is.
            if from != to
                && let Err(e) = sys(libc::SYS_dup3, &[from as usize, to as usize, 0])
            {
                fail(Stage::PlaceFds, e);
            }
        }
        // Nothing else of the host's crosses into the container, CLOEXEC or not.
        let _ = sys(
            libc::SYS_close_range,
            &[
                FIRST_FREE as usize,
                u32::MAX as usize,
                libc::CLOSE_RANGE_CLOEXEC as usize,
            ],
        );
        let e = sys(
            libc::SYS_execveat,
            &[
                p.exe.as_raw_fd() as usize,
                c"".as_ptr() as usize,
                p.argv.as_ptr() as usize,
                p.envp.as_ptr() as usize,
                libc::AT_EMPTY_PATH as usize,
            ],
        )
        .err()
        .unwrap_or(libc::ENOEXEC);
        fail(Stage::ExecSupervisor, e)
    }
}
