//! The supervisor: PID 1 of a container. It builds the container's filesystem, reaps
//! every zombie, and serves the process API ([`super::protocol`]) on the Unix socket the
//! host bound and passed in. Synchronous std code: a pool of connection threads; the
//! main thread reaps orphans; one thread watches the trees' leaders.
//!
//! Every tree (a started process, a fenced run) gets its own leaf cgroup
//! `<container>/<uuid>` and its own session; killing it is [`super::kill`]'s business.
//! A run's leaf may be one an earlier run of the same name left empty ([`leaves`]).
//!
//! Who reaps whom: a tree's leader is a child of the thread that forked it (a
//! connection worker), never of the main thread; an orphan is reparented
//! to the namespace's child reaper, the main thread. So the main thread reaps with
//! `__WNOTHREAD` (orphans only), and the leaders are watched through their pidfds and
//! reaped one by one, each under the state lock (a fenced run's leader by the run's own
//! thread, which polls its pidfd beside its output; every other by the leader watcher,
//! which also takes over a run's leader when the run kills it): a leader may then be kept a zombie
//! while its process group lives (process-group mode), so that its pid, the group's
//! id, cannot be reused before the group is killed (see [`super::kill`]).
//!
//! The supervisor has no log (no subscriber, stdio `/dev/null`): each degradation it
//! meets is said once, in its `ready` line or in the answer to the request that
//! degraded, and the host logs it.
//!
//! Here: `main`, the set-up, the reapers and the request loop. [`args`] is the command
//! line, [`spawner`] the thread that starts the filtered workers (they fork the
//! workloads), [`run`] a tree's start and a
//! fenced run, [`leaves`] a tree's leaf cgroup (and the run leaves kept for the next
//! run), [`trees`] the trees' liveness, listing and kill.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::kill::KillMode;
use crate::process::{ProcessInfo, RunResult};

use super::cgroup::CgroupDir;
use super::clone;
use super::exec::{self, Placement, Prepared, Stdio};
use super::handoff;
use super::kill;
use super::mounts;
use super::protocol::{self, OutStream, Request, Response, Spec};
use super::seccomp;

mod args;
mod leaves;
mod run;
mod spawner;
mod trees;

pub use args::Args;
use spawner::Spawner;

/// How long a kill waits for a tree to empty.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

/// How many trees a kill named before their run came are remembered (`State::torn`):
/// far more than the runs that can be on their way at once.
const TORN: usize = 64;

/// How many connections the supervisor serves at once. The threads exist before any
/// workload does: a fork bomb at the pids limit cannot keep the host from being
/// answered (a further connection waits in the listen backlog). A worker serves one
/// connection until the host closes it, so the connections the host keeps idle hold
/// workers too: the host keeps fewer than this many (its `client::POOL`), and a call
/// waiting in the backlog gets a worker once a busy connection ends or is dropped.
/// Four, with two idle, cut 150 KiB per container and ~0.5 ms of a start at 1000 live,
/// but a container would then serve four calls at once: a status behind four long runs
/// or terminals waits for one to end. Eight it is (the memory goal holds with them;
/// the detached processes once lost with four were the tests misreading a process
/// in the middle of an `execve`, docs/BENCHMARKS.md).
pub const WORKERS: usize = 8;

/// The longest request line read (a run's stdin rides in it as base64, at most the
/// guest's 16 MiB; an upload comes as a descriptor instead).
const MAX_REQUEST_LINE: usize = 64 << 20;

/// `stockade-supervisor ARGS…` (argv[0] left out): returns the process exit code.
pub fn main(args: Vec<OsString>) -> i32 {
    let args = match Args::parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("stockade supervisor: {e}");
            return 2;
        }
    };
    let began = Instant::now();
    // SAFETY: first thing in `main`, nothing has opened a descriptor yet; the command
    // line says which numbers the clone child placed.
    let (ready, fds) = unsafe { handoff::Inherited::adopt(args.cgroup, args.isolate, args.image) };
    // SIGCHLD stays pending for the orphan reaper, which waits for it: blocked here,
    // before any thread exists, so every thread inherits the mask (a thread that did
    // not block it would take it, and discard it: its default action is to ignore).
    if let Err(e) = block_sigchld() {
        let _ = rustix::io::write(&ready, format!("error: block SIGCHLD: {e}\n").as_bytes());
        return 1;
    }
    match start(&args, fds) {
        Ok((sup, degraded)) => {
            // The host waits for this line (or EOF) before its first request; the
            // set-up time goes into its log line for the container, the degradations
            // into the host's log.
            let line = protocol::ready_line(began.elapsed().as_micros(), &degraded);
            let _ = rustix::io::write(&ready, line.as_bytes());
            drop(ready);
            // The main thread is the namespace's child reaper: orphans are its
            // children, and it reaps them (the leaders are the watcher's).
            sup.reap_orphans_forever();
            0
        }
        Err(e) => {
            let _ = rustix::io::write(&ready, format!("error: {e}\n").as_bytes());
            1
        }
    }
}

/// Build the container with the inherited descriptors, listen, start the leader
/// watcher, the workers and the accepting thread; the degradations met.
fn start(args: &Args, fds: handoff::Inherited) -> io::Result<(Arc<Supervisor>, Vec<String>)> {
    let handoff::Inherited {
        sock,
        cgroup: cgroup_fd,
        root,
        storage,
        image,
    } = fds;
    let mut spawner: Option<(Spawner, std::sync::mpsc::Receiver<io::Result<()>>)> = None;
    if args.isolate {
        // The cgroup namespace's root becomes the container's cgroup (no host paths
        // in /proc/self/cgroup). Single-threaded here.
        // SAFETY: a new cgroup namespace changes no memory, descriptor table or thread
        // state of this process (what `unshare_unsafe` warns about is CLONE_FILES/FS).
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) }
            .map_err(|e| {
                io::Error::new(io::Error::from(e).kind(), format!("cgroup namespace: {e}"))
            })?;
        let (Some(root), Some(storage)) = (&root, &storage) else {
            return Err(io::Error::other("isolation without its descriptors"));
        };
        // The spawner thread attaches its filter (a millisecond of the kernel's time)
        // while this thread builds the root; it then starts the workers.
        spawner = Some(Spawner::start(
            seccomp::Filter::spawner().map_err(io::Error::other)?,
        )?);
        mounts::setup(
            &mounts::Fds {
                mountpoint: root.as_fd(),
                storage: storage.as_fd(),
                image: image.as_ref().map(|f| f.as_fd()),
            },
            &args.hostname(),
            args.ca_pem.as_deref(),
        )?;
        mounts::set_hostname(&args.hostname())?;
    }
    // The host paths are not needed again, and a supervisor must not hold them.
    drop((root, storage, image));
    // /proc/1/* stays root's (the container's root): workloads, another uid, cannot
    // open the supervisor's descriptors through it.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    rustix::net::listen(&sock, 128)?;
    let listener = UnixListener::from(sock);
    let cgroup = cgroup_fd.map(CgroupDir::from_fd);
    let devnull = OwnedFd::from(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")?,
    );
    let seccomp = if args.isolate {
        Some(seccomp::Filter::clone3_guard().map_err(io::Error::other)?)
    } else {
        None
    };
    let spawner = match spawner {
        Some((s, attached)) => {
            attached
                .recv()
                .map_err(|_| io::Error::other("the spawner thread died"))?
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("the spawner's seccomp filter: {e}"))
                })?;
            Some(s)
        }
        None => None,
    };
    let mode = if cgroup.is_some() {
        args.kill_mode
    } else {
        degrade(args.kill_mode)
    };
    let mut degraded = Vec::new();
    if mode != args.kill_mode {
        degraded.push(format!(
            "kill mode {}: the supervisor was given no cgroup; a process that calls setsid escapes a kill",
            kill::mode_arg(mode)
        ));
    }
    let sup = Arc::new(Supervisor {
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
        wake: rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?,
        reported: Mutex::new(degraded.iter().cloned().collect()),
        mode,
        cgroup,
        devnull,
        proxy_port: args.proxy_port,
        trusts_ca: args.isolate && args.ca_pem.is_some(),
        landlock: args.isolate && exec::landlock_abi() >= 1,
        isolate: args.isolate,
        seccomp,
        conns: Mutex::new(None),
        kept: leaves::Kept::default(),
        ignored: clone::Signals::ignored(),
    });
    {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("leaders".into())
            .spawn(move || sup.watch_leaders_forever())?;
    }
    let (tx, rx) = std::sync::mpsc::channel::<UnixStream>();
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<(String, Box<dyn FnOnce() + Send>)> = (0..WORKERS)
        .map(|_| {
            let (sup, rx) = (sup.clone(), rx.clone());
            let body: Box<dyn FnOnce() + Send> = Box::new(move || {
                loop {
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(conn) = next else { return };
                    sup.serve(conn);
                }
            });
            ("conn".to_string(), body)
        })
        .collect();
    match &spawner {
        // Isolated: the workers carry the workload policy and fork the workloads.
        Some(s) => s.start_threads(workers)?,
        None => {
            for (name, body) in workers {
                std::thread::Builder::new().name(name).spawn(body)?;
            }
        }
    }
    // Its work is done: its thread ends.
    drop(spawner);
    *sup.conns.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || sup.accept_forever(listener))?;
    }
    Ok((sup, degraded))
}

fn degrade(mode: KillMode) -> KillMode {
    match mode {
        KillMode::Auto | KillMode::Cgroup => KillMode::ProcessGroup,
        m => m,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Started,
    Run,
}

struct Entry {
    kind: Kind,
    leader: i32,
    exit: Option<i32>,
    /// The leader exited but is kept a zombie (process-group mode, its group had other
    /// members): its pid, the group's id, stays the tree's until [`Supervisor::forget`]
    /// reaps it.
    zombie: bool,
    leaf: Option<CgroupDir>,
}

/// A leader that has not exited yet.
struct Leader {
    /// Its tree.
    id: String,
    /// Watched for its exit; signalled by a single-process kill (no pid reuse race).
    pidfd: Arc<OwnedFd>,
    /// A fenced run's leader is watched by the run itself: its connection thread polls
    /// the pidfd beside the output pipes and records the exit, with no other thread
    /// woken at its start or its end. The leader watcher takes it over once the run
    /// hands it on (before a kill of its own, or a run that ends any other way).
    by_run: bool,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Trees a kill named before their run came ([`Request::KillAll`]'s `tree`): a
    /// run by one of these names is refused, once; at most [`TORN`], oldest out first.
    torn: std::collections::VecDeque<String>,
    /// Every leader not yet exited, by pid (an entry may be gone: the leader is still
    /// watched, and reaped at its exit).
    by_pid: HashMap<i32, Leader>,
}

impl State {
    /// The leader watched as `pid` through `pidfd`, if it still is: unreaped, so `pid`
    /// is still its own (a run and the watcher may both hold a run's leader, and once
    /// one of them reaped it, the number may be another's).
    fn watched(&mut self, pid: i32, pidfd: &Arc<OwnedFd>) -> Option<&mut Leader> {
        self.by_pid
            .get_mut(&pid)
            .filter(|l| Arc::ptr_eq(&l.pidfd, pidfd))
    }
}

struct Supervisor {
    state: Mutex<State>,
    /// Signalled on every reap.
    changed: Condvar,
    /// Wakes the leader watcher when a leader is added.
    wake: OwnedFd,
    /// The degradations already said (each is said once).
    reported: Mutex<HashSet<String>>,
    mode: KillMode,
    cgroup: Option<CgroupDir>,
    devnull: OwnedFd,
    proxy_port: u16,
    /// The container trusts its egress CA: clients are pointed at it by environment.
    trusts_ca: bool,
    /// Each tree gets a Landlock domain of its own (`exec::Placement::landlock`).
    landlock: bool,
    /// Workloads run as the container's unprivileged user, under the seccomp filter.
    isolate: bool,
    /// What each workload adds to the filter it inherits from its connection worker.
    seccomp: Option<seccomp::Filter>,
    /// Hands accepted connections to the workers.
    conns: Mutex<Option<std::sync::mpsc::Sender<UnixStream>>>,
    /// Run leaves kept for the host's next run of the same name ([`leaves`]).
    kept: leaves::Kept,
    /// The signals this supervisor ignores, asked once here: it ignores none after
    /// (a debug build checks at each spawn), and each workload resets these.
    ignored: clone::Signals,
}

impl Supervisor {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Accept connections and hand them to the workers (no thread is created here).
    fn accept_forever(&self, listener: UnixListener) {
        let Some(tx) = self.conns.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            if tx.send(conn).is_err() {
                return;
            }
        }
    }

    /// PID 1's duty, on the main thread: reap the orphans reparented to it. `__WNOTHREAD`:
    /// only the main thread's own children, never a leader (those are children of the
    /// threads that forked them, and [`Supervisor::leader_exited`]'s to reap).
    ///
    /// It sleeps on `SIGCHLD` (blocked in every thread, `block_sigchld`): an orphan's
    /// exit signal is always `SIGCHLD` (the kernel sets it at the reparenting, and a
    /// zombie reparented is signalled then), while a leader has none (`Clone::quiet`),
    /// so a run's end does not wake this thread. The timeout is a backstop only.
    fn reap_orphans_forever(&self) {
        let own_children = rustix::process::WaitOptions::from_bits_retain(
            libc::__WNOTHREAD as u32 | libc::WNOHANG as u32,
        );
        loop {
            match rustix::process::wait(own_children) {
                Ok(Some(_)) => {
                    // A member of a killed group may have been the last one.
                    self.changed.notify_all();
                    continue;
                }
                Err(rustix::io::Errno::INTR) => continue,
                // Children alive, none exited; or none.
                Ok(None) | Err(_) => {}
            }
            wait_sigchld(Duration::from_secs(1));
        }
    }

    /// Wait for the leaders' exits (their pidfds turn readable), and a wake-up for each
    /// new leader.
    fn watch_leaders_forever(&self) {
        use rustix::event::{PollFd, PollFlags};
        loop {
            let watched: Vec<(i32, Arc<OwnedFd>)> = self
                .lock()
                .by_pid
                .iter()
                .filter(|(_, l)| !l.by_run)
                .map(|(pid, l)| (*pid, l.pidfd.clone()))
                .collect();
            let exited: Vec<(i32, Arc<OwnedFd>)> = {
                let mut fds = Vec::with_capacity(watched.len() + 1);
                fds.push(PollFd::new(&self.wake, PollFlags::IN));
                fds.extend(
                    watched
                        .iter()
                        .map(|(_, fd)| PollFd::new(&**fd, PollFlags::IN)),
                );
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(_) => {
                        // Out of memory for the poll set: try again shortly.
                        drop(fds);
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                }
                watched
                    .iter()
                    .zip(&fds[1..])
                    .filter(|(_, f)| !f.revents().is_empty())
                    .map(|((pid, fd), _)| (*pid, fd.clone()))
                    .collect()
            };
            // The set is rebuilt on every turn: the count itself does not matter.
            let mut count = [0u8; 8];
            let _ = rustix::io::read(&self.wake, &mut count);
            for (pid, pidfd) in exited {
                self.leader_exited(pid, &pidfd);
            }
        }
    }

    /// A leader exited: record its status (the run waiting on it learns it), then reap
    /// it, or keep it a zombie while its process group has other members
    /// (process-group mode: its pid is the group's id, which must not be reused before
    /// the group is killed). Under the state lock, as every reap of a leader is. Only
    /// the leader watched through `pidfd`: a run and the watcher may both see a run's
    /// leader exit, and once one of them reaped it, its pid may be another's. Whether
    /// that leader is no longer watched (it exited, here or before).
    fn leader_exited(&self, pid: i32, pidfd: &Arc<OwnedFd>) -> bool {
        let mut st = self.lock();
        if st.watched(pid, pidfd).is_none() {
            return true;
        }
        let Some(leader) = st.by_pid.remove(&pid) else {
            return true;
        };
        let Some(p) = rustix::process::Pid::from_raw(pid) else {
            return true;
        };
        // `__WALL`: a leader has no exit signal (`Clone::quiet`).
        let peeked = rustix::process::waitid(
            rustix::process::WaitId::Pid(p),
            rustix::process::WaitIdOptions::EXITED
                | rustix::process::WaitIdOptions::NOWAIT
                | rustix::process::WaitIdOptions::from_bits_retain(libc::__WALL as u32),
        );
        let code = match peeked {
            Ok(Some(s)) => s
                .exit_status()
                .or_else(|| s.terminating_signal().map(|sig| -sig))
                .unwrap_or(-1),
            // Not exited after all (a spurious wake-up): watch it again.
            Ok(None) => {
                st.by_pid.insert(pid, leader);
                return false;
            }
            Err(_) => -1,
        };
        let tracked = st.entries.get_mut(&leader.id).filter(|e| e.leader == pid);
        let hold =
            tracked.is_some() && self.mode == KillMode::ProcessGroup && kill::group_has_others(pid);
        if let Some(e) = tracked {
            e.exit = Some(code);
            e.zombie = hold;
        }
        if !hold {
            reap(pid);
        }
        drop(st);
        self.changed.notify_all();
        true
    }

    /// A run's leader goes to the leader watcher (the run stops being the only one
    /// that watches it): before the run's own kill, which in the process-group and
    /// single modes waits for the leader's reap, and when a run ends any other way.
    fn hand_over(&self, pid: i32, pidfd: &Arc<OwnedFd>) {
        match self.lock().watched(pid, pidfd) {
            Some(l) if l.by_run => l.by_run = false,
            _ => return,
        }
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Forget tree `id`: its entry goes, and a leader kept as a zombie is reaped (its
    /// tree is dead, or its group empty).
    fn forget(st: &mut State, id: &str) {
        if let Some(e) = st.entries.remove(id)
            && e.zombie
        {
            reap(e.leader);
        }
    }

    /// `what`, added to `out` if this supervisor has not said it yet.
    fn degraded(&self, out: &mut Vec<String>, what: &str) {
        let mut said = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        if said.insert(what.to_string()) {
            out.push(what.to_string());
        }
    }

    fn serve(&self, conn: UnixStream) {
        let Ok(mut w) = conn.try_clone() else { return };
        // Read with `recvmsg`: a run's stdin may come as a descriptor (handoff).
        let mut r = handoff::Lines::new(conn);
        while let Ok(Some(line)) = r.next_line(MAX_REQUEST_LINE) {
            // A descriptor belongs to the request it came with: claimed by a run that
            // asks for one, closed otherwise.
            let stdin = r.fds.pop_front();
            r.fds.clear();
            let resp = match serde_json::from_slice::<Request>(&line) {
                Ok(req) => self.handle(req, stdin, &mut w),
                Err(e) => Response::Invalid {
                    message: format!("malformed request: {e}"),
                },
            };
            let Ok(mut out) = serde_json::to_vec(&resp) else {
                return;
            };
            out.push(b'\n');
            if w.write_all(&out).is_err() {
                return;
            }
        }
    }

    /// Answer one request. `stdin` is the descriptor that came with it: only a run
    /// whose spec asks for one (`stdin_fd`) takes it; a streaming run's output frames
    /// go to `w` before its answer.
    fn handle(&self, req: Request, stdin: Option<OwnedFd>, w: &mut UnixStream) -> Response {
        if !fd_as_asked(&req, stdin.is_some()) {
            return Response::Invalid {
                message: "a run's stdin descriptor must come with it, and only then; a started process takes none".into(),
            };
        }
        match req {
            Request::Ping => Response::Pong,
            Request::Start { spec } => match self.start(&spec) {
                Ok(id) => Response::Started { id },
                Err(e) => e,
            },
            Request::Run {
                spec,
                timeout_ms,
                output_limit,
                stream,
            } => {
                let mut emit = |stream: OutStream, data: &[u8]| -> io::Result<()> {
                    let frame = Response::Output {
                        stream,
                        data: data.to_vec(),
                    };
                    let mut out = serde_json::to_vec(&frame).map_err(io::Error::other)?;
                    out.push(b'\n');
                    w.write_all(&out)
                };
                match self.run_fenced(
                    &spec,
                    stdin,
                    Duration::from_millis(timeout_ms),
                    output_limit,
                    stream.then_some(&mut emit),
                ) {
                    Ok((result, degraded, kept)) => Response::Ran {
                        result,
                        degraded,
                        kept,
                        // After the run's own tree was forgotten (if it is empty).
                        trees: Some(self.lock().entries.len() as u32),
                    },
                    Err(e) => e,
                }
            }
            Request::List => Response::Processes {
                processes: self.list(),
            },
            Request::Status { id } => Response::Process {
                process: self.status(&id),
            },
            Request::Kill { id } => match self.kill(&id) {
                Ok((count, degraded)) => Response::Killed { count, degraded },
                Err(e) => Response::Failed {
                    message: e.to_string(),
                },
            },
            Request::KillAll { tree } => match self.kill_all(tree.as_deref()) {
                Ok((count, degraded)) => Response::Killed { count, degraded },
                Err(e) => Response::Failed {
                    message: e.to_string(),
                },
            },
        }
    }
}

/// Does a request come with a descriptor exactly when it asks for one (pure)? A run
/// asks with `stdin_fd` (an upload's pipe) or `pty` (a terminal's slave), never both;
/// a started process takes none; every other request ignores one (it is closed).
fn fd_as_asked(req: &Request, has_fd: bool) -> bool {
    match req {
        Request::Run { spec, .. } => {
            !(spec.stdin_fd && spec.pty) && (spec.stdin_fd || spec.pty) == has_fd
        }
        Request::Start { spec } => !spec.stdin_fd && !spec.pty,
        _ => true,
    }
}

/// Reap child `pid` (a zombie, or about to be one: it was killed). `__WALL`: a leader
/// has no exit signal (`Clone::quiet`), and a plain wait skips such a child.
fn reap(pid: i32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(
            Some(p),
            rustix::process::WaitOptions::from_bits_retain(libc::__WALL as u32),
        );
    }
}

/// The set holding `SIGCHLD` alone.
fn sigchld_set() -> libc::sigset_t {
    // SAFETY: a sigset on the stack, initialized by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        set
    }
}

/// Block `SIGCHLD` in the calling thread (and so in every thread it starts later).
fn block_sigchld() -> io::Result<()> {
    // SAFETY: an initialized set; the old mask is not asked for.
    match unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &sigchld_set(), std::ptr::null_mut()) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Sleep until a `SIGCHLD` is pending (and take it), or `within`.
fn wait_sigchld(within: Duration) {
    let timeout = libc::timespec {
        tv_sec: within.as_secs() as libc::time_t,
        tv_nsec: i64::from(within.subsec_nanos()),
    };
    // SAFETY: an initialized set and timespec; no siginfo is asked for.
    unsafe { libc::sigtimedwait(&sigchld_set(), std::ptr::null_mut(), &timeout) };
}

#[cfg(test)]
mod fd_tests {
    use super::*;

    #[test]
    fn a_descriptor_comes_exactly_when_a_run_asks_for_one() {
        let spec = |stdin_fd: bool, pty: bool| Spec {
            argv: vec!["sh".into()],
            cwd: String::new(),
            env: vec![],
            stdin: vec![],
            tree: None,
            stdin_fd,
            pty,
        };
        let run = |stdin_fd, pty| Request::Run {
            spec: spec(stdin_fd, pty),
            timeout_ms: 1000,
            output_limit: 1,
            stream: false,
        };
        let start = |stdin_fd, pty| Request::Start {
            spec: spec(stdin_fd, pty),
        };
        let rows: &[(&str, Request, bool, bool)] = &[
            ("a plain run, no descriptor", run(false, false), false, true),
            (
                "a plain run with a stray descriptor",
                run(false, false),
                true,
                false,
            ),
            ("an upload's pipe, sent", run(true, false), true, true),
            ("an upload's pipe, missing", run(true, false), false, false),
            ("a terminal, sent", run(false, true), true, true),
            ("a terminal, missing", run(false, true), false, false),
            (
                "a pipe and a terminal at once",
                run(true, true),
                true,
                false,
            ),
            (
                "a started process asking for a terminal",
                start(false, true),
                true,
                false,
            ),
            (
                "a started process asking for a pipe",
                start(true, false),
                true,
                false,
            ),
            ("a started process", start(false, false), false, true),
            ("a ping with a stray descriptor", Request::Ping, true, true),
        ];
        for (what, req, has_fd, ok) in rows {
            assert_eq!(fd_as_asked(req, *has_fd), *ok, "{what}");
        }
    }
}
