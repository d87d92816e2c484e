//! Starting a container's supervisor: `clone3` into new PID, mount, network, UTS and IPC
//! namespaces, straight into the container's cgroup (`CLONE_INTO_CGROUP`: no window in
//! which it runs outside), with a pidfd (`CLONE_PIDFD`) the host watches.
//!
//! Every clone happens on ONE long-lived "spawner" thread: the child's
//! `PR_SET_PDEATHSIG(SIGKILL)` fires when the *thread* that cloned it exits, so a
//! short-lived thread would kill containers at random; a thread that lives as long as
//! the host makes containers die with the host.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

/// The fd the supervisor finds its listening socket on.
pub const SOCK_FD: RawFd = 3;
/// The fd the supervisor finds its cgroup directory on.
pub const CGROUP_FD: RawFd = 4;

/// What to start.
pub struct SpawnRequest {
    /// The supervisor executable.
    pub exe: CString,
    /// Its argv (argv\[0\] included).
    pub argv: Vec<CString>,
    /// Its environment.
    pub envp: Vec<CString>,
    /// The listening Unix socket (becomes [`SOCK_FD`]).
    pub sock: OwnedFd,
    /// The container's cgroup directory (becomes [`CGROUP_FD`], and the clone target).
    pub cgroup: Option<OwnedFd>,
    /// Create the namespaces.
    pub namespaces: bool,
}

/// A started supervisor.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid in the host's PID namespace.
    pub pid: i32,
    /// Its pidfd.
    pub pidfd: OwnedFd,
}

type Job = (SpawnRequest, mpsc::Sender<io::Result<Spawned>>);

fn spawner() -> &'static Mutex<mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("stockade-spawner".into())
            .spawn(move || {
                for (req, reply) in rx {
                    let _ = reply.send(clone_supervisor(req));
                }
            })
            .expect("the spawner thread starts");
        Mutex::new(tx)
    })
}

/// Start a supervisor on the spawner thread (blocking: call it from `spawn_blocking`).
pub fn spawn(req: SpawnRequest) -> io::Result<Spawned> {
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((req, tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// `struct clone_args` of `clone3(2)`, shared with the supervisor's spawns (`exec.rs`).
#[repr(C)]
#[derive(Default)]
pub(crate) struct CloneArgs {
    pub(crate) flags: u64,
    pub(crate) pidfd: u64,
    pub(crate) child_tid: u64,
    pub(crate) parent_tid: u64,
    pub(crate) exit_signal: u64,
    pub(crate) stack: u64,
    pub(crate) stack_size: u64,
    pub(crate) tls: u64,
    pub(crate) set_tid: u64,
    pub(crate) set_tid_size: u64,
    pub(crate) cgroup: u64,
}

const CLONE_PIDFD: u64 = 0x1000;
pub(crate) const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

fn high_dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: dup of a valid fd to >= 10, so the child's dup2 onto 3 and 4 never
    // collides with a source.
    let r = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

fn clone_supervisor(req: SpawnRequest) -> io::Result<Spawned> {
    let sock = high_dup(req.sock.as_raw_fd())?;
    let cgroup = req
        .cgroup
        .as_ref()
        .map(|c| high_dup(c.as_raw_fd()))
        .transpose()?;
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

    let mut pidfd: RawFd = -1;
    let mut flags = CLONE_PIDFD;
    if req.namespaces {
        flags |= (libc::CLONE_NEWPID
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC) as u64;
    }
    let mut args = CloneArgs {
        flags,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    if let Some(cg) = &cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = cg.as_raw_fd() as u64;
    }
    // SAFETY: a fork-like clone3 (no CLONE_VM, no stack): the child runs on a copy of
    // this thread and only makes async-signal-safe syscalls on prepared data.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the child until execve.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            let ok = libc::dup2(devnull.as_raw_fd(), 0) >= 0
                && libc::dup2(devnull.as_raw_fd(), 1) >= 0
                && libc::dup2(sock.as_raw_fd(), SOCK_FD) >= 0
                && cgroup
                    .as_ref()
                    .is_none_or(|c| libc::dup2(c.as_raw_fd(), CGROUP_FD) >= 0);
            if ok {
                // Nothing else of the host's crosses into the container, CLOEXEC or not.
                libc::syscall(
                    libc::SYS_close_range,
                    5u32,
                    u32::MAX,
                    libc::CLOSE_RANGE_CLOEXEC,
                );
                libc::execve(req.exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
            }
            libc::_exit(127)
        }
    }
    // SAFETY: the kernel wrote a fresh pidfd.
    Ok(Spawned {
        pid: pid as i32,
        pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
    })
}

/// `pidfd_send_signal(SIGKILL)`: no pid-reuse race.
pub fn kill_pidfd(pidfd: RawFd) -> io::Result<()> {
    // SAFETY: plain syscall.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            libc::SIGKILL,
            std::ptr::null::<u8>(),
            0,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(e);
        }
    }
    Ok(())
}

/// Reap the process behind `pidfd` if it exited (`waitid(P_PIDFD, WNOHANG)`): its status.
pub fn try_reap(pidfd: RawFd) -> io::Result<Option<i32>> {
    // SAFETY: zeroed siginfo is a valid out-parameter.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    let r = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled it (pid 0 = not exited yet).
    let pid = unsafe { info.si_pid() };
    if pid == 0 {
        return Ok(None);
    }
    // SAFETY: as above.
    Ok(Some(unsafe { info.si_status() }))
}
