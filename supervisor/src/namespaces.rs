//! Starting a container's supervisor: `clone3` into new user, PID, mount, network, UTS
//! and IPC namespaces, straight into the container's cgroup (`CLONE_INTO_CGROUP`: no
//! window in which it runs outside), with a pidfd (`CLONE_PIDFD`) the host watches.
//!
//! The user namespace maps the container's ids `0..n` onto its leased host range
//! ([`super::idmap`]). The child waits on a pipe until the host has written its
//! `uid_map` and `gid_map`; meanwhile it is still the host's root (kuid 0) inside new
//! namespaces, which it uses for one thing: opening, `O_PATH`, the host directories the
//! supervisor needs but whose parents only root may traverse (the data directory is
//! 0700). Then it becomes the container's root (an unprivileged host uid), places its
//! descriptors at fixed numbers, marks every other one close-on-exec, and `execveat`s
//! the supervisor binary from a descriptor (its path may not be traversable either).
//!
//! The clone shares the host's memory (`CLONE_VM`, on a stack of its own: see
//! [`super::clone`]) where the architecture has it (x86_64): no copy of the host's page
//! tables, no teardown of them at the exec. The child then uses this process's memory
//! until its exec, so the spawner keeps what it reads (and its stack) until the step
//! pipe's last write end closes: the exec closed it, or the child died. Elsewhere, or
//! if the kernel refuses it, the clone is fork-like.
//!
//! Every clone happens on ONE long-lived "spawner" thread: the child's
//! `PR_SET_PDEATHSIG(SIGKILL)` fires when the *thread* that cloned it exits, so a
//! short-lived thread would kill containers at random; a thread that lives as long as
//! the host makes containers die with the host.
//!
//! The spawner thread has a descriptor table of its own (`unshare(CLONE_FILES)`,
//! everything but its socket closed in it), and a request's descriptors cross into it,
//! and the new supervisor's pidfd and step pipe back, by `SCM_RIGHTS` over a socket
//! pair: a clone copies its parent thread's table and the exec closes the
//! copy, and the host's table holds about 9 descriptors per live container (~2 ms of
//! every cold start at 1000 live, `dnotify_flush` and `filp_close` per descriptor).
//! The clone now copies the handful of descriptors the spawner holds.
//!
//! The spawner thread has a mount namespace of its own too (`unshare(CLONE_NEWNS)`, made
//! a slave of the host's: the host's mounts and unmounts still reach it, nothing of its
//! own reaches the host), made before the first container. A clone copies its parent's
//! mount namespace, mount by mount, and the supervisor detaches that copy again after its
//! `pivot_root`: in the host's namespace that was one storage mount per live container
//! (2-3 ms of every start at 1000 live, and ~200 KiB of kernel memory per container, the
//! copy each supervisor's descriptors kept alive). The storage reaches the child as a
//! detached tree instead ([`SpawnRequest::attach_in_child`], `open_tree(OPEN_TREE_CLONE)`
//! by the host), which it attaches on its storage directory in its own namespace before
//! it opens it. Where the host's mounts are shared (systemd makes `/` shared) and the
//! data directory sits under one, each storage mount still propagates into the spawner's
//! namespace: the clone works the same and copies them, as before; `mount --make-private`
//! on the data directory's mount keeps them out. Where they are private (this project's
//! machines), a mount the host makes later does not reach the spawner's namespace at all:
//! each spawn names the directories its child opens, as the host sees them (device and
//! inode), and a spawner that sees another directory there makes its namespace again from
//! the host's (a data directory mounted after the first container; each test of a suite
//! mounts its own). A spawn without namespaces (a host without root) clones from the
//! host's namespace. Without a namespace of its own (`unshare` refused) the thread clones
//! from the host's.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use rustix::io::Errno;
use rustix::process::{Signal, WaitId, WaitIdOptions};

use super::clone::{Clone, Cloned};
use super::stage::{self, Stage};

use super::handoff::FIRST_FREE;
/// The numbers the supervisor finds its descriptors on ([`super::handoff`]).
pub use super::handoff::{CGROUP_FD, IMAGE_FD, READY_FD, ROOT_FD, SOCK_FD, STORAGE_FD};
/// Where prepared fds wait before they are moved onto their numbers.
const HIGH: RawFd = 100;
/// `move_mount`'s flag: the source is the descriptor itself (linux/mount.h).
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;

/// What to start.
pub struct SpawnRequest {
    /// The supervisor executable, opened by the host (`execveat(AT_EMPTY_PATH)`).
    pub exe: OwnedFd,
    /// Its argv (argv\[0\] included).
    pub argv: Vec<CString>,
    /// Its environment.
    pub envp: Vec<CString>,
    /// Descriptors the host opened, and the number each gets in the supervisor.
    pub fds: Vec<(OwnedFd, RawFd)>,
    /// Paths the child opens `O_PATH` as the host's root, in its new mount namespace,
    /// and the number each gets.
    pub open_in_child: Vec<(CString, RawFd)>,
    /// Detached mount trees (`open_tree(OPEN_TREE_CLONE)`) and the path the child
    /// attaches each on, in its new mount namespace, before its `open_in_child`: mounts
    /// the host made after the spawner's namespace was (the container's storage).
    pub attach_in_child: Vec<(OwnedFd, CString)>,
    /// The container's cgroup directory (the clone target).
    pub cgroup: Option<OwnedFd>,
    /// Create the namespaces (and the user namespace, if `id_map` is set).
    pub namespaces: bool,
    /// `/proc/<pid>/uid_map` and `gid_map` for a user namespace: `0 <base> <n>`.
    pub id_map: Option<String>,
    /// `cgroup.procs` files (v1 hierarchies) the child joins before it may go on: its
    /// limits hold from its first instruction, and its cgroup namespace (made after
    /// go) is rooted in them.
    pub join: Vec<std::path::PathBuf>,
}

/// A started supervisor.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid in the host's PID namespace.
    pub pid: i32,
    /// Its pidfd.
    pub pidfd: OwnedFd,
    /// The read end of its clone child's step pipe ([`stage::outcome`]): empty once
    /// the supervisor executable runs, the failed [`Stage`] if the child died before.
    pub steps: OwnedFd,
}

/// A request without its descriptors (they cross on the socket), and where the answer
/// goes: the pid, the pidfd and the step pipe following on the socket.
type Job = (Plan, mpsc::Sender<io::Result<i32>>);

/// [`SpawnRequest`] less its descriptors, and the number its descriptors' message
/// carries.
struct Plan {
    seq: u64,
    argv: Vec<CString>,
    envp: Vec<CString>,
    targets: Vec<RawFd>,
    has_cgroup: bool,
    open_in_child: Vec<(CString, RawFd)>,
    attach_at: Vec<CString>,
    /// The directories the child reaches by path, and what the host finds there.
    landmarks: Vec<(CString, Landmark)>,
    namespaces: bool,
    id_map: Option<String>,
    join: Vec<std::path::PathBuf>,
}

/// The host's side of the spawner thread.
struct Spawner {
    jobs: mpsc::Sender<Job>,
    /// The host's end of the socket pair the descriptors cross by.
    sock: OwnedFd,
    /// The number of the next request.
    seq: u64,
}

/// Most descriptors one message carries: the executable, the cgroup and the request's
/// own (the host passes 6).
const MAX_PASSED: usize = 16;

fn spawner() -> io::Result<std::sync::MutexGuard<'static, Spawner>> {
    static SPAWNER: OnceLock<io::Result<Mutex<Spawner>>> = OnceLock::new();
    let s = SPAWNER.get_or_init(|| {
        let (host_end, thread_end) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel::<bool>();
        let theirs = thread_end.as_raw_fd();
        std::thread::Builder::new()
            .name("stockade-spawner".into())
            .spawn(move || serve_spawns(thread_end, rx, ready_tx))?;
        // Once the thread has its own table, its end of the pair is its own: the
        // entry this table still has goes (so the host sees the thread's end close).
        if ready.recv() == Ok(true) {
            // SAFETY: `theirs` is the number of the socket moved to the thread; in this
            // table nothing owns it any more (the thread's copy is in its own table).
            unsafe { libc::close(theirs) };
        }
        Ok(Mutex::new(Spawner {
            jobs: tx,
            sock: host_end,
            seq: 0,
        }))
    });
    match s {
        Ok(m) => Ok(m.lock().unwrap_or_else(|p| p.into_inner())),
        Err(e) => Err(io::Error::new(e.kind(), format!("the spawner thread: {e}"))),
    }
}

/// The spawner thread: its own descriptor table, then one clone per request. Without
/// its own table (`unshare` refused) it works on the process's, as it did before:
/// slower at scale, nothing else.
fn serve_spawns(sock: OwnedFd, jobs: mpsc::Receiver<Job>, ready: mpsc::Sender<bool>) {
    // A signal sent to the process is never handled on this thread: a handler writes
    // to descriptor numbers of the process's table, which are not this thread's (tokio's
    // signal pipe: a SIGTERM caught here was lost, and `serve` never shut down; a stray
    // byte could land in a descriptor of a spawn in flight). The kernel gives the signal
    // to another thread. A clone child resets its mask (`default_signals`).
    let _blocked = super::clone::BlockedSignals::all();
    let own = own_table(sock.as_raw_fd()).is_ok();
    // Before the host goes on: its next mounts are not in it.
    let mut mounts = MountNs::own().ok();
    let _ = ready.send(own);
    for (plan, reply) in jobs {
        if let Some(m) = &mut mounts
            && plan.namespaces
            && !plan
                .landmarks
                .iter()
                .all(|(path, seen)| landmark(path) == Some(*seen))
            && m.remake().is_err()
        {
            // Back in the host's namespace (`remake` returns there when it fails): the
            // spawner clones from it from now on.
            mounts = None;
        }
        let _ = reply.send(spawn_here(&sock, plan, mounts.as_ref()));
    }
}

/// `path` from the working directory of the calling thread if it is relative.
fn absolute(path: CString) -> CString {
    use std::os::unix::ffi::OsStringExt;
    let p = as_path(&path);
    let made = p
        .is_relative()
        .then(|| std::path::absolute(p).ok())
        .flatten()
        .and_then(|a| CString::new(a.into_os_string().into_vec()).ok());
    made.unwrap_or(path)
}

fn as_path(path: &CString) -> &std::path::Path {
    std::path::Path::new(std::ffi::OsStr::from_bytes(path.as_bytes()))
}

/// A directory as a mount namespace shows it: its device and inode.
type Landmark = (u64, u64);

/// What `path` is in this thread's mount namespace (`None`: nothing there).
fn landmark(path: &CString) -> Option<Landmark> {
    rustix::fs::stat(path.as_c_str())
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// The directories a child reaches by path: what it opens, and where it attaches a tree
/// (the directory above it: the attach point itself is a mount the host has).
fn landmarks(open_in_child: &[(CString, RawFd)], attach_at: &[CString]) -> Vec<CString> {
    let parent = |at: &CString| {
        as_path(at)
            .parent()
            .and_then(|d| CString::new(d.as_os_str().as_bytes()).ok())
    };
    open_in_child
        .iter()
        .map(|(path, _)| path)
        .filter(|path| !attach_at.contains(path))
        .cloned()
        .chain(attach_at.iter().filter_map(parent))
        .collect()
}

/// The spawner thread's mount namespace and the host's (module doc).
struct MountNs {
    host: OwnedFd,
    own: OwnedFd,
}

impl MountNs {
    /// Give this thread a mount namespace of its own, a slave of the host's.
    fn own() -> io::Result<MountNs> {
        let host = this_mount_ns()?;
        let own = Self::fresh(&host)?;
        Ok(MountNs { host, own })
    }

    /// Make this thread's namespace again, from the host's as it is now.
    fn remake(&mut self) -> io::Result<()> {
        enter(&self.host)?;
        self.own = Self::fresh(&self.host)?;
        Ok(())
    }

    /// A new namespace for this thread (in the host's now), a slave of the host's; on
    /// an error the thread is in the host's.
    fn fresh(host: &OwnedFd) -> io::Result<OwnedFd> {
        // SAFETY: CLONE_NEWNS (with the CLONE_FS it implies) changes only this thread's
        // mount namespace, root and working directory; this thread holds no path.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
        let made = rustix::mount::mount_change(
            "/",
            rustix::mount::MountPropagationFlags::DOWNSTREAM
                | rustix::mount::MountPropagationFlags::REC,
        )
        .map_err(io::Error::from)
        .and_then(|()| this_mount_ns());
        if made.is_err() {
            // A namespace whose mounts may still propagate to the host's is not one to
            // clone from.
            let _ = enter(host);
        }
        made
    }

    /// Clone from the host's namespace until the guard drops (a spawn without
    /// namespaces: its child lives in the mount namespace it is cloned in).
    fn host_for_now(&self) -> io::Result<impl Drop + '_> {
        struct Back<'a>(&'a OwnedFd);
        impl Drop for Back<'_> {
            fn drop(&mut self) {
                // Staying in the host's namespace only costs the cut (module doc).
                let back = enter(self.0);
                debug_assert!(back.is_ok(), "back to the spawner's namespace: {back:?}");
            }
        }
        enter(&self.host)?;
        Ok(Back(&self.own))
    }
}

/// This thread's mount namespace.
fn this_mount_ns() -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        "/proc/thread-self/ns/mnt",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// Move this thread into the mount namespace `ns`.
fn enter(ns: &OwnedFd) -> io::Result<()> {
    rustix::thread::move_into_link_name_space(
        ns.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Mount),
    )?;
    Ok(())
}

/// Give this thread a descriptor table of its own, holding only stdio and `keep`.
fn own_table(keep: RawFd) -> io::Result<()> {
    // SAFETY: CLONE_FILES gives this thread a copy of the process's table; the other
    // threads keep theirs. Nothing on this thread holds a descriptor of the process's
    // but `keep` (the thread was just started), so closing the rest of the copy
    // closes nothing anyone here uses; the other threads' descriptors stay open in
    // their table.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FILES) }?;
    let close = |from: RawFd, to: u32| {
        if from as u32 <= to {
            // SAFETY: close_range(2) on this thread's own table (above).
            unsafe { libc::syscall(libc::SYS_close_range, from as u32, to, 0u32) };
        }
    };
    close(3, (keep as u32).saturating_sub(1));
    close(keep + 1, u32::MAX);
    Ok(())
}

/// On the spawner thread: receive `plan`'s descriptors, clone, send the supervisor's
/// pidfd and step pipe back (its pid in the message).
fn spawn_here(sock: &OwnedFd, plan: Plan, mounts: Option<&MountNs>) -> io::Result<i32> {
    let mut fds = receive(sock, plan.seq)?.into_iter();
    let mut next = || {
        fds.next()
            .ok_or_else(|| io::Error::other("a descriptor is missing"))
    };
    let exe = next()?;
    let cgroup = if plan.has_cgroup { Some(next()?) } else { None };
    let mut passed = Vec::with_capacity(plan.targets.len());
    for target in &plan.targets {
        passed.push((next()?, *target));
    }
    let mut attach = Vec::with_capacity(plan.attach_at.len());
    for at in plan.attach_at {
        attach.push((next()?, at));
    }
    let _host = match mounts {
        Some(m) if !plan.namespaces => Some(m.host_for_now()?),
        _ => None,
    };
    let spawned = clone_supervisor(SpawnRequest {
        exe,
        argv: plan.argv,
        envp: plan.envp,
        fds: passed,
        open_in_child: plan.open_in_child,
        attach_in_child: attach,
        cgroup,
        namespaces: plan.namespaces,
        id_map: plan.id_map,
        join: plan.join,
    })?;
    let sent = send(
        sock,
        plan.seq,
        &[spawned.pidfd.as_fd(), spawned.steps.as_fd()],
    );
    if let Err(e) = sent {
        // The host cannot have it: it must not live.
        let _ = kill_pidfd(&spawned.pidfd);
        let _ = reap_blocking(&spawned.pidfd);
        return Err(e);
    }
    Ok(spawned.pid)
}

/// Send `fds` in one message tagged `seq` (one message: all of them cross, or none).
fn send(sock: &OwnedFd, seq: u64, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_PASSED))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_PASSED || !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let bytes = seq.to_ne_bytes();
    rustix::net::sendmsg(
        sock,
        &[std::io::IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receive the message tagged `seq`, in order; a stale one (a request whose other end
/// gave up) is dropped, its descriptors with it.
fn receive(sock: &OwnedFd, seq: u64) -> io::Result<Vec<OwnedFd>> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    loop {
        let mut space =
            [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_PASSED))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut bytes = [0u8; 8];
        let got = match rustix::net::recvmsg(
            sock,
            &mut [std::io::IoSliceMut::new(&mut bytes)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(Errno::INTR) => continue,
            r => r?,
        };
        if got.bytes == 0 {
            return Err(io::Error::other("the spawner's socket closed"));
        }
        let mut fds = Vec::new();
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = msg {
                fds.extend(rights);
            }
        }
        if got.bytes == bytes.len() && u64::from_ne_bytes(bytes) == seq {
            return Ok(fds);
        }
    }
}

/// The spawner thread's `/proc/self/task/<tid>` directory, once it runs: where its
/// descriptor table, mount namespace and signal mask can be read.
pub fn spawner_task() -> Option<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "stockade-spawne")
        })
        .map(|t| t.path())
}

/// Start the spawner thread if it is not running (the first [`spawn`] does too): a
/// host starts it before it holds containers' descriptors, and the socket pair it
/// keeps for its lifetime is there from the start.
pub fn start_spawner() -> io::Result<()> {
    spawner().map(drop)
}

/// Start a supervisor on the spawner thread (blocking: call it from `spawn_blocking`).
pub fn spawn(req: SpawnRequest) -> io::Result<Spawned> {
    let mut sp = spawner()?;
    sp.seq += 1;
    let seq = sp.seq;
    let SpawnRequest {
        exe,
        argv,
        envp,
        fds,
        open_in_child,
        attach_in_child,
        cgroup,
        namespaces,
        id_map,
        join,
    } = req;
    // The spawner's working directory is its own (module doc): a relative path is
    // this thread's.
    let open_in_child: Vec<_> = open_in_child
        .into_iter()
        .map(|(path, target)| (absolute(path), target))
        .collect();
    let attach_in_child: Vec<_> = attach_in_child
        .into_iter()
        .map(|(tree, at)| (tree, absolute(at)))
        .collect();
    let mut passed = vec![exe.as_fd()];
    passed.extend(cgroup.as_ref().map(|c| c.as_fd()));
    passed.extend(fds.iter().map(|(fd, _)| fd.as_fd()));
    passed.extend(attach_in_child.iter().map(|(fd, _)| fd.as_fd()));
    send(&sp.sock, seq, &passed)?;
    let attach_at: Vec<CString> = attach_in_child.iter().map(|(_, at)| at.clone()).collect();
    // As this (host) thread's namespace shows them.
    let landmarks = landmarks(&open_in_child, &attach_at)
        .into_iter()
        .filter_map(|path| landmark(&path).map(|seen| (path, seen)))
        .collect();
    let plan = Plan {
        seq,
        argv,
        envp,
        targets: fds.iter().map(|(_, t)| *t).collect(),
        has_cgroup: cgroup.is_some(),
        open_in_child,
        attach_at,
        landmarks,
        namespaces,
        id_map,
        join,
    };
    // The spawner holds its own copies now.
    drop((exe, cgroup, fds, attach_in_child));
    let (tx, rx) = mpsc::channel();
    sp.jobs
        .send((plan, tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    let pid = rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))??;
    let mut back = receive(&sp.sock, seq)?.into_iter();
    match (back.next(), back.next()) {
        (Some(pidfd), Some(steps)) => Ok(Spawned { pid, pidfd, steps }),
        _ => Err(io::Error::other("the spawner sent no pidfd")),
    }
}

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
            unsafe { child(&*(arg as *const Prepared), super::clone::Handlers::Cleared) }
        }
        let stack = super::clone::Stack::new(CHILD_STACK)?;
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
        Cloned::Child => unsafe { child(p, super::clone::Handlers::Inherited) },
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

fn clone_supervisor(req: SpawnRequest) -> io::Result<Spawned> {
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
    let blocked = super::clone::BlockedSignals::all();
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
unsafe fn child(p: &Prepared, handlers: super::clone::Handlers) -> ! {
    use super::clone::raw_syscall as sys;
    // SAFETY: raw syscalls on prepared data only; every failure ends in `_exit`. Their
    // errors come back in their return values (`raw_syscall`): `errno` is the host's
    // spawner thread's too.
    unsafe {
        // Signals arrive blocked (`BlockedSignals`): a handler of the host's must not
        // run here. Back to the default dispositions (the kernel's work already for a
        // shared clone, `CLONE_CLEAR_SIGHAND`; an ignored one stays ignored, as across
        // exec), then the empty mask the supervisor expects.
        super::clone::default_signals(handlers, super::clone::Ignored::Keep);
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

/// `pidfd_send_signal(SIGKILL)`: no pid-reuse race. A process already gone is fine.
pub fn kill_pidfd(pidfd: impl AsFd) -> io::Result<()> {
    match rustix::process::pidfd_send_signal(pidfd, Signal::KILL) {
        Ok(()) | Err(Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reap the process behind `pidfd` if it exited (`waitid(P_PIDFD, WNOHANG)`): its
/// status.
pub fn try_reap(pidfd: impl AsFd) -> io::Result<Option<i32>> {
    let r = rustix::process::waitid(
        WaitId::PidFd(pidfd.as_fd()),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    )?;
    Ok(r.map(|s| {
        s.exit_status()
            .or_else(|| s.terminating_signal().map(|n| -n))
            .unwrap_or(-1)
    }))
}

/// Wait until the process behind `pidfd` exits and reap it: its status.
pub fn reap_blocking(pidfd: impl AsFd) -> io::Result<i32> {
    let s = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED)?;
    Ok(s.map_or(-1, |s| {
        s.exit_status()
            .or_else(|| s.terminating_signal().map(|n| -n))
            .unwrap_or(-1)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/bin/true` as a supervisor, without namespaces (no privilege needed), opening
    /// `open` in the child.
    fn spawn_true(open: Option<&str>) -> Spawned {
        let exe = rustix::fs::open(
            "/bin/true",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        spawn(SpawnRequest {
            exe,
            argv: vec![CString::new("true").unwrap()],
            envp: Vec::new(),
            fds: Vec::new(),
            open_in_child: open
                .map(|p| (CString::new(p).unwrap(), ROOT_FD))
                .into_iter()
                .collect(),
            attach_in_child: Vec::new(),
            cgroup: None,
            namespaces: false,
            id_map: None,
            join: Vec::new(),
        })
        .unwrap()
    }

    /// A clone child that fails a step says which, and the host can read it (it used to
    /// `_exit(125)`, a number the host never decoded: "exited during set-up").
    #[test]
    fn a_supervisor_child_that_fails_a_step_names_it() {
        let s = spawn_true(Some("/nonexistent-stockade-host-directory"));
        let failed = stage::outcome(&s.steps).unwrap().expect("a failed step");
        assert_eq!(failed.stage, Stage::OpenHostDirs);
        assert_eq!(failed.errno, libc::ENOENT);
        assert_eq!(reap_blocking(&s.pidfd).unwrap(), stage::FAILED_EXIT);
        let e = io::Error::from(failed);
        assert!(
            e.to_string()
                .starts_with("opening the container's host directories: "),
            "{e}"
        );
    }

    /// The spawner thread's descriptor table is its own: a clone copies that one, not
    /// the host's, however many descriptors the host holds (~9 per live container).
    #[test]
    fn the_spawner_thread_has_a_descriptor_table_of_its_own() {
        let held: Vec<std::fs::File> = (0..300)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        start_spawner().unwrap();
        let count = |dir: &str| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
        let spawner = spawner_task().expect("the spawner thread runs");
        let own = count(&format!("{}/fd", spawner.display()));
        let process = count("/proc/self/fd");
        assert!(process > 300, "{process}");
        // Stdio and its socket; a spawn in flight (another test) holds a few more.
        assert!(own <= 24, "the spawner's table holds {own} descriptors");
        drop(held);
        // It still spawns.
        let s = spawn_true(None);
        assert_eq!(stage::outcome(&s.steps).unwrap(), None);
        assert_eq!(reap_blocking(&s.pidfd).unwrap(), 0);
    }

    /// A mount the host makes after the spawner's namespace is not in it, so a
    /// container's clone does not copy it (each live container's storage);
    /// and a spawn whose child opens a directory the spawner sees otherwise than the
    /// host (a data directory mounted later) remakes the namespace from the host's.
    #[test]
    fn a_later_host_mount_is_copied_only_by_a_spawn_that_reaches_it() {
        // SAFETY: geteuid(2) has no failure mode.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test needs root (mounts, namespaces): run the suite as root"
        );
        start_spawner().unwrap();
        let dir = std::env::temp_dir().join(format!(
            "stockade-later-mount-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir(&dir).unwrap();
        rustix::mount::mount(
            "tmpfs",
            &dir,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            c"size=1m",
        )
        .unwrap();
        struct Gone(std::path::PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
                // Removing the directory detaches the copies other namespaces hold.
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let gone = Gone(dir.clone());
        // Exits 0 when the mount on `dir` is in its mount namespace.
        let mounted_in_child = |open: bool| {
            let exe = rustix::fs::open(
                "/bin/sh",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            let script = format!("grep -q ' {} ' /proc/self/mountinfo", dir.display());
            let path = CString::new(dir.as_os_str().as_bytes()).unwrap();
            let s = spawn(SpawnRequest {
                exe,
                argv: ["sh", "-c", &script]
                    .map(|a| CString::new(a).unwrap())
                    .to_vec(),
                envp: Vec::new(),
                fds: Vec::new(),
                open_in_child: if open { vec![(path, ROOT_FD)] } else { vec![] },
                attach_in_child: Vec::new(),
                cgroup: None,
                namespaces: true,
                id_map: None,
                join: Vec::new(),
            })
            .unwrap();
            assert_eq!(stage::outcome(&s.steps).unwrap(), None);
            reap_blocking(&s.pidfd).unwrap() == 0
        };
        let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            host.contains(&format!(" {} ", dir.display())),
            "the host has the mount"
        );
        assert!(
            !mounted_in_child(false),
            "a container's clone copied a mount the host made after the spawner's namespace"
        );
        assert!(
            mounted_in_child(true),
            "a child that opens the mounted directory got the spawner's stale view of it"
        );
        drop(gone);
    }

    /// No signal sent to the process is handled on the spawner thread (its descriptor
    /// table is its own: a handler's writes to the process's descriptors would miss).
    #[test]
    fn the_spawner_thread_blocks_every_signal() {
        start_spawner().unwrap();
        let spawner = spawner_task().expect("the spawner thread runs");
        let status = std::fs::read_to_string(spawner.join("status")).unwrap();
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
            .expect("SigBlk");
        for sig in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGCHLD,
            libc::SIGHUP,
            libc::SIGUSR1,
        ] {
            assert_ne!(
                blocked & (1 << (sig - 1)),
                0,
                "signal {sig} is not blocked: {blocked:x}"
            );
        }
    }

    /// What a spawn's child reaches by path: what it opens, and the directory above
    /// each attach point (the attach point is a mount the spawner need not have).
    #[test]
    fn a_childs_landmarks_are_its_opens_and_the_parents_of_its_attach_points() {
        let c = |s: &str| CString::new(s).unwrap();
        // (why, opens, attach points, landmarks)
        type Row<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
        let rows: &[Row] = &[
            ("nothing", &[], &[], &[]),
            (
                "opens alone",
                &["/d/c/root", "/img"],
                &[],
                &["/d/c/root", "/img"],
            ),
            (
                "an attach point opened too is its parent",
                &["/d/c/root", "/d/c/fs"],
                &["/d/c/fs"],
                &["/d/c/root", "/d/c"],
            ),
        ];
        for (why, opens, attach, want) in rows {
            let opens: Vec<_> = opens.iter().map(|p| (c(p), 3)).collect();
            let attach: Vec<_> = attach.iter().map(|p| c(p)).collect();
            let want: Vec<_> = want.iter().map(|p| c(p)).collect();
            assert_eq!(landmarks(&opens, &attach), want, "{why}");
        }
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(absolute(c("/a/b")), c("/a/b"), "an absolute path stays");
        assert_eq!(
            absolute(c("a/b")),
            c(cwd.join("a/b").to_str().unwrap()),
            "a relative one is the caller's"
        );
    }

    /// One that execs reports nothing: its step pipe closes with the exec.
    #[test]
    fn a_supervisor_child_that_execs_reports_nothing() {
        let s = spawn_true(None);
        assert_eq!(stage::outcome(&s.steps).unwrap(), None);
        assert_eq!(reap_blocking(&s.pidfd).unwrap(), 0);
    }
}
