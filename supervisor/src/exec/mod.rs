//! The supervisor's fork+exec: a process in its own leaf cgroup and session, without
//! capabilities, with a CLOEXEC error pipe so a failed exec is an error, not an exit code.
//!
//! Why not `std::process::Command`: the supervisor is PID 1 and reaps with
//! `waitpid(-1)`; `Command` waits on its own pid and would race the reaper. Everything
//! the child touches is prepared before `fork` (the supervisor is multi-threaded: between
//! fork and exec only async-signal-safe calls are allowed, so no allocation).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::clone::{self, Clone, Cloned};
use super::protocol::Spec;
use super::stage;

mod child;
mod env;

use self::child::child;
pub use self::child::landlock_abi;
use self::env::PATH;
pub use self::env::{PROXY_PORT, WORKLOAD_ID, candidates, default_env, merge_env, resolve_cwd};

/// A command ready for `fork`: every byte the child needs, allocated.
pub struct Prepared {
    paths: Vec<CString>,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: CString,
}

fn cs(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

impl Prepared {
    /// Prepare `spec` with the default environment for `proxy_port`.
    pub fn new(spec: &Spec, proxy_port: u16, trusts_ca: bool) -> Result<Prepared, String> {
        if spec.argv.is_empty() || spec.argv[0].is_empty() {
            return Err("empty argv".into());
        }
        let env = merge_env(default_env(proxy_port, trusts_ca), &spec.env);
        if env.iter().any(|(k, _)| k.is_empty() || k.contains('=')) {
            return Err("an environment name is empty or contains '='".into());
        }
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or(PATH);
        let paths = candidates(&spec.argv[0], path)
            .iter()
            .map(|p| cs(p))
            .collect::<Result<Vec<_>, _>>()?;
        let argv = spec
            .argv
            .iter()
            .map(|a| cs(a))
            .collect::<Result<Vec<_>, _>>()?;
        let envp = env
            .iter()
            .map(|(k, v)| cs(&format!("{k}={v}")))
            .collect::<Result<Vec<_>, _>>()?;
        let mut argv_ptrs: Vec<_> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut envp_ptrs: Vec<_> = envp.iter().map(|a| a.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        Ok(Prepared {
            paths,
            _argv: argv,
            argv_ptrs,
            _envp: envp,
            envp_ptrs,
            cwd: cs(&resolve_cwd(&spec.cwd))?,
        })
    }
}

/// Where the child's tree lives and how it is isolated.
pub struct Placement<'a> {
    /// The tree's leaf cgroup directory (cgroup mode): the child is born in it
    /// (`CLONE_INTO_CGROUP`). Where the kernel cannot (before 5.7) the child joins it
    /// by writing its `cgroup.procs`, which takes the global threadgroup rwsem for
    /// writing, an RCU grace period: milliseconds per spawn; it opens the file itself,
    /// so the common spawn opens none.
    pub cgroup_dir: Option<RawFd>,
    /// Run as this (uid, gid) inside the container, with no capability, no_new_privs,
    /// and the OOM killer's highest score (it dies before its supervisor); `None` when the
    /// host could not isolate (the workload keeps the supervisor's identity).
    pub identity: Option<(u32, u32)>,
    /// The seccomp filter, installed last before the exec.
    pub seccomp: Option<&'a super::seccomp::Filter>,
    /// Put the tree in a Landlock domain of its own (with an identity only: it needs
    /// `no_new_privs`). Landlock lets a process ptrace, or open `/proc/<pid>/mem` of,
    /// only processes in its own domain or one nested in it: sibling trees (a detached
    /// process and the fenced run) cannot reach into each other, while a tree can still
    /// trace its own children (strace, gdb). A red team's finding (docs/SECURITY.md,
    /// grant sharing): a detached process ptraced a fenced process into sending its
    /// request with a credential.
    pub landlock: bool,
    /// The forking thread's capability bounding set is already empty
    /// ([`drop_bounding_set`] succeeded there): the child inherits it so, and skips
    /// its own drop (one `prctl` per capability, each under the seccomp filter).
    pub bounding_empty: bool,
    /// The signals the supervisor ignores ([`clone::Signals::ignored`], asked once at
    /// its start): the child resets these to their defaults.
    pub ignored: clone::Signals,
}

/// Empty the calling thread's capability bounding set (it needs `CAP_SETPCAP`): every
/// process it forks from now on inherits it empty. True if it is empty now. The
/// kernel's capabilities are numbered from 0 without a gap, and past its last one the
/// drop is refused (`EINVAL`): the loop ends there.
pub fn drop_bounding_set() -> bool {
    for cap in 0..64usize {
        // SAFETY: prctl(2) with integer arguments, on this thread's credentials.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r != 0 {
            return io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) && cap > 0;
        }
    }
    true
}

/// The child's stdio fds.
pub struct Stdio {
    /// fd 0.
    pub stdin: RawFd,
    /// fd 1.
    pub stdout: RawFd,
    /// fd 2.
    pub stderr: RawFd,
    /// fd 0 is a terminal that becomes the child's controlling terminal (an
    /// interactive session: `TIOCSCTTY` after `setsid`).
    pub ctty: bool,
}

/// A forked child whose exec outcome is not known yet.
pub struct Forked {
    /// Its pid.
    pub pid: i32,
    err_r: OwnedFd,
    /// What a `CLONE_VM` child runs on until its exec; freed only once the child has
    /// left it (`wait_gone`).
    #[cfg(target_arch = "x86_64")]
    launch: Option<Box<Launch>>,
}

/// A pipe, both ends CLOEXEC: (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// The stack a workload child runs on until its exec ([`clone::Clone::clone3_vm`]): its
/// steps need a few KiB (only the pages it touches are ever backed).
#[cfg(target_arch = "x86_64")]
const CHILD_STACK: usize = 256 << 10;

/// Stacks whose child has left them, for the next ones: a fresh mapping per spawn
/// costs its page faults and, at its unmap, a TLB shootdown on every core the
/// supervisor's threads run on. At most [`SPARE_STACKS`] are kept.
#[cfg(target_arch = "x86_64")]
static STACKS: std::sync::Mutex<Vec<clone::Stack>> = std::sync::Mutex::new(Vec::new());

/// How many free stacks [`STACKS`] keeps (spawns at once, in practice one or two).
#[cfg(target_arch = "x86_64")]
const SPARE_STACKS: usize = 4;

/// A `CLONE_VM` child's own memory until its exec: its stack, and what it reads.
#[cfg(target_arch = "x86_64")]
struct Launch {
    stack: clone::Stack,
    args: ChildArgs,
}

// SAFETY: only the child dereferences `args`' pointers; a `Launch` is boxed, so moving
// the box to another thread moves neither the stack nor the arguments the child reads.
#[cfg(target_arch = "x86_64")]
unsafe impl Send for Launch {}

/// What the child reads: pointers to the caller's data, which outlives the child's
/// exec (`fork`'s contract).
#[derive(Clone, Copy)]
struct ChildArgs {
    p: *const Prepared,
    stdio: *const Stdio,
    place: *const Placement<'static>,
    joined: bool,
    /// Whether the clone left the supervisor's handlers to the child.
    handlers: clone::Handlers,
    err_w: RawFd,
}

/// Fork the child. The caller holds the registry lock across this call and the
/// registration of `pid`, so the reaper never sees an exit it cannot attribute.
///
/// The child shares the supervisor's memory until its exec (`CLONE_VM`, as
/// `posix_spawn`): a fork-like clone copied the supervisor's page tables for the exec to
/// tear down, and left every page the supervisor then wrote to fault once
/// (copy-on-write); the 16-key throughput bench measured it (docs/BENCHMARKS.md).
/// Not `CLONE_VFORK`: the calling thread does not sleep until the exec. Between its uid
/// switch and its exec the child can be stopped by any process of the workload's uid (a
/// `SIGSTOP` cannot be blocked); a vfork's parent would then sleep for good, here with
/// the registry lock held, and the whole supervisor with it. The child's stack and
/// arguments live in [`Forked`] instead, until the child has left them.
///
/// The child has no exit signal (`Clone::quiet`): its exit is seen through its pidfd,
/// and it is waited for with `__WALL`; PID 1's orphan reaper, which sleeps on
/// `SIGCHLD`, is not woken by it. (The plain `fork` of a kernel before 5.7 signals
/// `SIGCHLD`: a wake of the reaper for nothing, which reaps only its own children.)
///
/// # Safety
/// `p`, `stdio` and `place` must outlive the returned [`Forked`] (whose
/// [`Forked::wait_exec`] and drop wait until the child has exec'd or died).
pub unsafe fn fork(p: &Prepared, stdio: &Stdio, place: &Placement<'_>) -> io::Result<Forked> {
    let (err_r, err_w) = pipe()?;
    let args = ChildArgs {
        p,
        stdio,
        place: (place as *const Placement<'_>).cast(),
        joined: place.cgroup_dir.is_some(),
        handlers: clone::Handlers::Cleared,
        err_w: err_w.as_raw_fd(),
    };
    #[cfg(target_arch = "x86_64")]
    if let Some((pid, launch)) = fork_vm(args, place.cgroup_dir)? {
        drop(err_w);
        return Ok(Forked {
            pid,
            err_r,
            launch: Some(launch),
        });
    }
    let mut cloned = None;
    if let Some(dir) = place.cgroup_dir {
        let into_cgroup = Clone {
            cgroup: Some(dir),
            quiet: true,
            ..Clone::default()
        };
        // SAFETY: the child only makes async-signal-safe calls on prepared data
        // (`child`).
        match unsafe { into_cgroup.clone3() } {
            Ok(c) => cloned = Some(c),
            // Older kernels: fork, then join by writing cgroup.procs.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL)
                ) => {}
            Err(e) => return Err(e),
        }
    }
    let joined = cloned.is_some();
    let cloned = match cloned {
        Some(c) => c,
        // SAFETY: as above.
        None => unsafe { clone::fork() }?,
    };
    match cloned {
        // SAFETY: in the child (a copy of this memory); never returns.
        Cloned::Child => unsafe {
            child(&ChildArgs {
                joined,
                handlers: clone::Handlers::Inherited,
                ..args
            })
        },
        Cloned::Parent { pid, .. } => {
            drop(err_w);
            Ok(Forked {
                pid,
                err_r,
                #[cfg(target_arch = "x86_64")]
                launch: None,
            })
        }
    }
}

/// The shared-memory clone: the child's pid and what it runs on, or `None` where the
/// kernel refuses it (before 5.3 no `clone3`, before 5.7 no `CLONE_INTO_CGROUP`), for
/// the fork-like one.
#[cfg(target_arch = "x86_64")]
fn fork_vm(args: ChildArgs, cgroup: Option<RawFd>) -> io::Result<Option<(i32, Box<Launch>)>> {
    /// The child's entry on its own stack.
    ///
    /// # Safety
    /// `arg` is a `ChildArgs` that outlives the child's exec.
    unsafe extern "C" fn entry(arg: *const std::os::raw::c_void) -> ! {
        // SAFETY: the caller's contract: `arg` is a live `ChildArgs`.
        unsafe { child(&*(arg as *const ChildArgs)) }
    }
    let spare = STACKS.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let stack = match spare {
        Some(s) => s,
        None => clone::Stack::new(CHILD_STACK)?,
    };
    let launch = Box::new(Launch { stack, args });
    let vm = Clone {
        cgroup,
        quiet: true,
        ..Clone::default()
    };
    // Blocked until the child has reset the handlers: none of the supervisor's may run
    // on the shared memory.
    let blocked = clone::BlockedSignals::all();
    // SAFETY: `child` makes async-signal-safe calls only, on `launch.args` and what it
    // points to; `launch` (its stack too) goes to the `Forked`, which keeps it until the
    // child has exec'd or died, and the caller keeps the rest as long (`fork`).
    let cloned = unsafe {
        vm.clone3_vm(
            &launch.stack,
            entry,
            &launch.args as *const ChildArgs as *const _,
        )
    };
    drop(blocked);
    match cloned {
        Ok((pid, _)) => Ok(Some((pid, launch))),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// How long a child may take from its clone to its exec. Its steps are a few dozen
/// system calls; one that is not past its exec by then was stopped (any process of the
/// workload's uid may `SIGSTOP` it once it has that uid) or is stuck, and is killed, so
/// that it never holds a connection thread of the supervisor for good.
pub const EXEC_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

impl Forked {
    /// Wait for the exec: `Ok` once the program runs, the child's error otherwise; a
    /// child not past its exec within [`EXEC_DEADLINE`] is killed (`TimedOut`).
    pub fn wait_exec(self) -> io::Result<i32> {
        self.wait_exec_within(EXEC_DEADLINE)
    }

    /// [`Forked::wait_exec`] with this deadline.
    pub fn wait_exec_within(self, within: std::time::Duration) -> io::Result<i32> {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                // Our unreaped child: its pid is still its own. SIGKILL ends a stopped
                // process too; its exit closes the pipe (drop waits for that).
                // SAFETY: kill(2) of our own child.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the child was not past its exec within {within:?}; killed"),
                ));
            }
            let timeout = Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&self.err_r, PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(n) if n > 0 => break,
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        match stage::outcome(&self.err_r)? {
            None => Ok(self.pid),
            Some(failed) => Err(failed.into()),
        }
    }

    /// Wait until the child has left what it shares with this process: the step pipe's
    /// last writer is gone when it exec'd (close-on-exec runs after the exec has left
    /// the old memory) or died (its memory goes before its descriptors).
    #[cfg(target_arch = "x86_64")]
    fn wait_gone(&self) {
        let mut buf = [0u8; 64];
        loop {
            match rustix::io::read(&self.err_r, &mut buf) {
                Ok(0) => return,
                Ok(_) | Err(rustix::io::Errno::INTR) => continue,
                // Nothing more can be read; the pipe is ours, so this does not happen.
                Err(_) => return,
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Forked {
    fn drop(&mut self) {
        if let Some(launch) = self.launch.take() {
            self.wait_gone();
            // The child has left it: the next spawn may run on it.
            let mut spare = STACKS.lock().unwrap_or_else(|p| p.into_inner());
            if spare.len() < SPARE_STACKS {
                spare.push(launch.stack);
            }
        }
    }
}

/// Decode a `waitpid` status: the exit code, or minus the signal.
pub fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        -libc::WTERMSIG(status)
    } else {
        -1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spawner empties its own bounding set once, for the workers it starts and
    /// what they fork; the rest of the process keeps its own.
    #[test]
    fn the_bounding_set_is_emptied_for_the_calling_thread_and_what_it_starts() {
        // SAFETY: geteuid(2) has no failure mode.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test needs root (CAP_SETPCAP): run the suite as root"
        );
        let held = || {
            (0..64)
                .filter(|c| {
                    // SAFETY: prctl(2) reads with integer arguments.
                    let r = unsafe { libc::prctl(libc::PR_CAPBSET_READ, *c, 0, 0, 0) };
                    r == 1
                })
                .count()
        };
        let (emptied, own, started) = std::thread::spawn(move || {
            let emptied = drop_bounding_set();
            let started = std::thread::spawn(held).join().unwrap();
            (emptied, held(), started)
        })
        .join()
        .unwrap();
        assert!(emptied);
        assert_eq!((own, started), (0, 0), "emptied, and inherited");
        assert!(held() > 30, "this thread keeps its own: {}", held());
    }

    /// A plain child for the fork tests: `argv` with `env`, from `/`, with no cgroup,
    /// identity, filter or domain.
    fn plain(argv: &[&str], env: &[(&str, &str)]) -> (Prepared, Placement<'static>) {
        let spec: Spec = serde_json::from_value(serde_json::json!({
            "argv": argv, "cwd": "/", "env": env
        }))
        .unwrap();
        let place = Placement {
            cgroup_dir: None,
            identity: None,
            seccomp: None,
            landlock: false,
            bounding_empty: false,
            ignored: clone::Signals::ignored(),
        };
        (Prepared::new(&spec, PROXY_PORT, false).unwrap(), place)
    }

    /// `/dev/null` as stdin and stderr, `stdout` (or `/dev/null` too) as stdout; the
    /// file is returned to stay open while the child needs it.
    fn null_stdio(stdout: Option<RawFd>) -> (Stdio, std::fs::File) {
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd = null.as_raw_fd();
        let stdio = Stdio {
            stdin: fd,
            stdout: stdout.unwrap_or(fd),
            stderr: fd,
            ctty: false,
        };
        (stdio, null)
    }

    /// The workload child shares the supervisor's memory until its exec (`fork_vm`), so
    /// the child marks that memory undumpable right after its uid switch: no process of
    /// the workload's uid can trace it in the window, whatever the host's
    /// `fs.suid_dumpable` (the kernel marks it at a uid switch only when that is 0).
    /// Here the identity is the test's own (root), so the kernel's switch marks
    /// nothing and only the child's own `PR_SET_DUMPABLE` does: red without it. The
    /// child's exec is reported (`wait_exec`) and its exit reaped.
    #[test]
    fn a_workload_child_leaves_the_memory_it_shares_undumpable() {
        let (p, mut place) = plain(&["/bin/true"], &[]);
        // SAFETY: getuid/getgid read this process's ids.
        place.identity = Some(unsafe { (libc::getuid(), libc::getgid()) });
        let (stdio, _null) = null_stdio(None);
        // SAFETY: prctl on this process.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
        // SAFETY: `p`, `stdio` and `place` outlive `forked`.
        let forked = unsafe { fork(&p, &stdio, &place) }.unwrap();
        let pid = forked.wait_exec().unwrap();
        let mut status = 0;
        // SAFETY: our own child.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        assert_eq!(reaped, pid);
        assert_eq!(exit_code(status), 0);
        // SAFETY: prctl on this process.
        let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
        #[cfg(target_arch = "x86_64")]
        assert_eq!(dumpable, 0, "the shared memory stayed dumpable");
        #[cfg(not(target_arch = "x86_64"))]
        assert_eq!(dumpable, 1, "a fork-like child marks only its copy");
    }

    /// A workload starts with no signal ignored or blocked, whatever its supervisor
    /// ignored or blocked: a server started by `nohup` (SIGHUP) or as a shell's
    /// background job (SIGINT) passed those on to every command, and a terminal's
    /// hang-up and Ctrl-C then never reached it. Here the test process ignores SIGHUP
    /// (and, as Rust's runtime does, SIGPIPE), and the forking thread blocks SIGUSR1.
    /// Red with the ignored dispositions kept (`Ignored::Keep`), and with the
    /// placement's set empty (the child resets what the supervisor's start found).
    #[test]
    fn a_workload_child_starts_with_no_signal_ignored_or_blocked() {
        let _held = clone::tests::DISPOSITIONS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // SAFETY: SIG_IGN runs no code (left so: other tests' children reset it).
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        let (p, place) = plain(&["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"], &[]);
        let (out_r, out_w) = pipe().unwrap();
        let (stdio, _null) = null_stdio(Some(out_w.as_raw_fd()));
        // SAFETY: the mask is this thread's, restored below; `p`, `stdio` and `place`
        // outlive `forked`.
        let forked = unsafe {
            let mut usr1: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut usr1);
            libc::sigaddset(&mut usr1, libc::SIGUSR1);
            libc::pthread_sigmask(libc::SIG_BLOCK, &usr1, std::ptr::null_mut());
            let forked = fork(&p, &stdio, &place);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &usr1, std::ptr::null_mut());
            forked
        };
        let pid = forked.unwrap().wait_exec().unwrap();
        drop(out_w);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(out_r), &mut text).unwrap();
        let mut status = 0;
        // SAFETY: our own child.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        assert_eq!(reaped, pid);
        assert_eq!(exit_code(status), 0, "{text}");
        for field in ["SigIgn", "SigBlk"] {
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{field}:")))
                .unwrap_or_else(|| panic!("{field}:\n{text}"));
            assert_eq!(u64::from_str_radix(value.trim(), 16), Ok(0), "{text}");
        }
    }

    /// A child stopped before its exec (a workload process may `SIGSTOP` it once it
    /// has the workload's uid) does not hold its caller for good: past the deadline it
    /// is killed and the wait answers `TimedOut`. The child is kept before its exec
    /// deterministically by a search path of 20 000 directories that do not exist (an
    /// `execve` each), stopped as soon as the clone returns. Without the deadline the
    /// wait never returns (the test fails after 10 s instead).
    #[test]
    fn a_child_stopped_before_its_exec_is_killed_past_the_deadline() {
        let path: Vec<String> = (0..20_000).map(|i| format!("/nonexistent/{i}")).collect();
        let (p, place) = plain(&["true"], &[("PATH", &path.join(":"))]);
        let (stdio, _null) = null_stdio(None);
        // SAFETY: `p`, `stdio` and `place` outlive `forked` (the scope below joins).
        let forked = unsafe { fork(&p, &stdio, &place) }.unwrap();
        let pid = forked.pid;
        // SAFETY: kill(2) of our own, unreaped child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            scope.spawn(move || {
                let _ = tx.send(forked.wait_exec_within(std::time::Duration::from_millis(300)));
            });
            let r = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap_or_else(|_| {
                    // SAFETY: our own child: free the waiting thread, then fail.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    panic!("the wait never returned");
                });
            assert_eq!(
                r.map_err(|e| e.kind()),
                Err(io::ErrorKind::TimedOut),
                "a stopped child"
            );
        });
        let mut status = 0;
        // SAFETY: our own child.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        assert_eq!(reaped, pid);
        assert_eq!(exit_code(status), -libc::SIGKILL);
    }
}
