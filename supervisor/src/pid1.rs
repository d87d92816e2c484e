//! The supervisor: PID 1 of a container. It builds the container's filesystem, reaps
//! every zombie, and serves the process API ([`super::protocol`]) on the Unix socket the
//! host bound and passed in. Synchronous std code: a pool of connection threads; the
//! main thread reaps orphans; one thread watches the trees' leaders.
//!
//! Every tree (a started process, a fenced run) gets its own leaf cgroup
//! `<container>/<uuid>` and its own session; killing it is [`super::kill`]'s business.
//!
//! Who reaps whom: a tree's leader is a child of the thread that forked it (the spawner
//! thread, or a connection thread), never of the main thread; an orphan is reparented
//! to the namespace's child reaper, the main thread. So the main thread reaps with
//! `__WNOTHREAD` (orphans only), and the leaders are watched through their pidfds and
//! reaped one by one, each under the state lock: a leader may then be kept a zombie
//! while its process group lives (process-group mode), so that its pid, the group's
//! id, cannot be reused before the group is killed (see [`super::kill`]).
//!
//! The supervisor has no log (no subscriber, stdio `/dev/null`): each degradation it
//! meets is said once, in its `ready` line or in the answer to the request that
//! degraded, and the host logs it.

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
use super::exec::{self, Placement, Prepared, Stdio};
use super::handoff;
use super::kill;
use super::mounts;
use super::protocol::{self, OutStream, Request, Response, Spec};
use super::seccomp;

/// How long a kill waits for a tree to empty.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

/// The supervisor's command line (after argv[0]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The container id (for the hostname).
    pub id: String,
    /// How trees are killed.
    pub kill_mode: KillMode,
    /// Build the container (namespaces, mounts, an unprivileged workload identity);
    /// false when the host could not create namespaces.
    pub isolate: bool,
    /// Where the root comes from: an image directory on [`handoff::IMAGE_FD`].
    pub image: bool,
    /// The egress proxy's port on the container's loopback.
    pub proxy_port: u16,
    /// The inherited cgroup directory (cgroup mode).
    pub cgroup: bool,
    /// The container's egress CA certificate (PEM), which it is made to trust; `None`
    /// without interception. Public: the key stays with the host.
    pub ca_pem: Option<String>,
}

impl Args {
    /// The command line for these arguments.
    pub fn to_args(&self) -> Vec<String> {
        let flag = |b: bool| if b { "1" } else { "0" }.to_string();
        vec![
            "--id".into(),
            self.id.clone(),
            "--kill-mode".into(),
            kill::mode_arg(self.kill_mode).into(),
            "--isolate".into(),
            flag(self.isolate),
            "--image".into(),
            flag(self.image),
            "--proxy-port".into(),
            self.proxy_port.to_string(),
            "--cgroup".into(),
            flag(self.cgroup),
            "--ca".into(),
            self.ca_pem.clone().unwrap_or_else(|| "-".into()),
        ]
    }

    /// Parse a command line.
    pub fn parse(args: &[OsString]) -> Result<Args, String> {
        let mut m: HashMap<String, String> = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let k = k.to_str().ok_or("non-UTF-8 argument")?;
            let v = it.next().ok_or(format!("{k} needs a value"))?;
            m.insert(
                k.trim_start_matches("--").into(),
                v.to_str().ok_or("non-UTF-8 argument")?.into(),
            );
        }
        let get = |k: &str| m.get(k).cloned().ok_or(format!("--{k} is required"));
        let flag = |k: &str| -> Result<bool, String> { Ok(get(k)? == "1") };
        Ok(Args {
            id: get("id")?,
            kill_mode: kill::parse_mode(&get("kill-mode")?).ok_or("bad --kill-mode")?,
            isolate: flag("isolate")?,
            image: flag("image")?,
            proxy_port: get("proxy-port")?.parse().map_err(|_| "bad --proxy-port")?,
            cgroup: flag("cgroup")?,
            ca_pem: match get("ca")?.as_str() {
                "-" => None,
                pem if pem.starts_with("-----BEGIN CERTIFICATE-----") => Some(pem.to_owned()),
                _ => return Err("bad --ca".into()),
            },
        })
    }

    /// The container's hostname.
    pub fn hostname(&self) -> String {
        let short: String = self.id.chars().take(12).collect();
        format!("stockade-{short}")
    }
}

/// How many connections the supervisor serves at once. The threads exist before any
/// workload does: a fork bomb at the pids limit cannot keep the host from being
/// answered (a further connection waits in the listen backlog).
const WORKERS: usize = 8;

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
        // while this thread builds the root.
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
        spawner,
        conns: Mutex::new(None),
    });
    {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("leaders".into())
            .spawn(move || sup.watch_leaders_forever())?;
    }
    let (tx, rx) = std::sync::mpsc::channel::<UnixStream>();
    let rx = Arc::new(Mutex::new(rx));
    for _ in 0..WORKERS {
        let (sup, rx) = (sup.clone(), rx.clone());
        std::thread::Builder::new()
            .name("conn".into())
            .spawn(move || {
                loop {
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(conn) = next else { return };
                    sup.serve(conn);
                }
            })?;
    }
    *sup.conns.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || sup.accept_forever(listener))?;
    }
    Ok((sup, degraded))
}

/// The thread every workload is forked from. It carries the workload seccomp policy
/// (all but the `clone3` row, which it needs for `CLONE_INTO_CGROUP`), attached once
/// at start: a child inherits its forking thread's filter for free, while attaching
/// the whole policy costs the kernel about a millisecond per process (it builds the
/// filter's constant-action cache). Each child adds only the tiny `clone3` guard. The
/// supervisor's other threads are not filtered (seccomp without TSYNC is per thread).
struct Spawner {
    jobs: Mutex<std::sync::mpsc::Sender<Job>>,
}

/// One fork, described by pointers into the requester's stack frame.
struct Job {
    prepared: *const Prepared,
    stdio: *const Stdio,
    place: *const Placement<'static>,
    reply: std::sync::mpsc::Sender<io::Result<exec::Forked>>,
}

// SAFETY: a job's pointers are only dereferenced by the spawner thread while the
// requester blocks on `reply` (Spawner::fork), so they outlive every use; the
// referents are only read.
unsafe impl Send for Job {}

impl Spawner {
    /// Start the thread; it says on the receiver when its filter is attached (forks
    /// wait for it anyway: they queue behind it).
    fn start(
        filter: seccomp::Filter,
    ) -> io::Result<(Spawner, std::sync::mpsc::Receiver<io::Result<()>>)> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        std::thread::Builder::new()
            .name("spawner".into())
            .spawn(move || {
                let installed = filter.install();
                let ok = installed.is_ok();
                let _ = ready_tx.send(installed);
                if !ok {
                    return;
                }
                for job in rx {
                    // SAFETY: see `Job`: the requester waits for the reply.
                    let r = unsafe { exec::fork(&*job.prepared, &*job.stdio, &*job.place) };
                    let _ = job.reply.send(r);
                }
            })?;
        Ok((
            Spawner {
                jobs: Mutex::new(tx),
            },
            ready_rx,
        ))
    }

    /// Fork on the spawner thread and wait for it.
    fn fork(&self, p: &Prepared, stdio: &Stdio, place: &Placement<'_>) -> io::Result<exec::Forked> {
        let (reply, answer) = std::sync::mpsc::channel();
        let job = Job {
            prepared: p,
            stdio,
            place: (place as *const Placement<'_>).cast(),
            reply,
        };
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        answer
            .recv()
            .map_err(|_| io::Error::other("the spawner thread is gone"))?
    }
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
    /// Closed by the leader watcher when the leader exits: a run polls its read end.
    exited_w: Option<OwnedFd>,
}

/// A leader that has not exited yet.
struct Leader {
    /// Its tree.
    id: String,
    /// Watched for its exit; signalled by a single-process kill (no pid reuse race).
    pidfd: Arc<OwnedFd>,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Every leader not yet exited, by pid (an entry may be gone: the leader is still
    /// watched, and reaped at its exit).
    by_pid: HashMap<i32, Leader>,
}

struct Supervisor {
    state: Mutex<State>,
    /// Signalled on every reap and every spawn.
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
    /// What each workload adds to the filter it inherits from the spawner thread.
    seccomp: Option<seccomp::Filter>,
    /// The thread every workload is forked from (isolated containers).
    spawner: Option<Spawner>,
    /// Hands accepted connections to the workers.
    conns: Mutex<Option<std::sync::mpsc::Sender<UnixStream>>>,
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
    fn reap_orphans_forever(&self) {
        let own_children = rustix::process::WaitOptions::from_bits_retain(libc::__WNOTHREAD as u32);
        loop {
            match rustix::process::wait(own_children) {
                Ok(Some(_)) => {
                    // A member of a killed group may have been the last one.
                    self.changed.notify_all();
                    continue;
                }
                Ok(None) | Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {}
            }
            // No orphan now. Orphans appear without a signal to us (a reparenting); a
            // leader's exit (its children are orphaned then) and a kill signal
            // `changed`, and the timeout is the backstop.
            let st = self.lock();
            let _ = self.changed.wait_timeout(st, Duration::from_secs(1));
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
                .map(|(pid, l)| (*pid, l.pidfd.clone()))
                .collect();
            let exited: Vec<i32> = {
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
                    .map(|((pid, _), _)| *pid)
                    .collect()
            };
            // The set is rebuilt on every turn: the count itself does not matter.
            let mut count = [0u8; 8];
            let _ = rustix::io::read(&self.wake, &mut count);
            for pid in exited {
                self.leader_exited(pid);
            }
        }
    }

    /// A leader exited: record its status (the run waiting on it learns it), then reap
    /// it, or keep it a zombie while its process group has other members
    /// (process-group mode: its pid is the group's id, which must not be reused before
    /// the group is killed). Under the state lock, as every reap of a leader is.
    fn leader_exited(&self, pid: i32) {
        let mut st = self.lock();
        let Some(leader) = st.by_pid.remove(&pid) else {
            return;
        };
        let Some(p) = rustix::process::Pid::from_raw(pid) else {
            return;
        };
        let peeked = rustix::process::waitid(
            rustix::process::WaitId::Pid(p),
            rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
        );
        let code = match peeked {
            Ok(Some(s)) => s
                .exit_status()
                .or_else(|| s.terminating_signal().map(|sig| -sig))
                .unwrap_or(-1),
            // Not exited after all (a spurious wake-up): watch it again.
            Ok(None) => {
                st.by_pid.insert(pid, leader);
                return;
            }
            Err(_) => -1,
        };
        let tracked = st.entries.get_mut(&leader.id).filter(|e| e.leader == pid);
        let hold =
            tracked.is_some() && self.mode == KillMode::ProcessGroup && kill::group_has_others(pid);
        if let Some(e) = tracked {
            e.exit = Some(code);
            e.exited_w = None;
            e.zombie = hold;
        }
        if !hold {
            reap(pid);
        }
        drop(st);
        self.changed.notify_all();
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
                Ok(Request::Run { spec, .. }) if spec.stdin_fd != stdin.is_some() => {
                    Response::Invalid {
                        message: "a run's stdin descriptor must come with it, and only then".into(),
                    }
                }
                Ok(Request::Run {
                    spec,
                    timeout_ms,
                    output_limit,
                    stream,
                }) => {
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
                        Ok((result, degraded)) => Response::Ran { result, degraded },
                        Err(e) => e,
                    }
                }
                Ok(Request::Start { spec }) if spec.stdin_fd => Response::Invalid {
                    message: "a started process takes no stdin descriptor".into(),
                },
                Ok(req) => self.handle(req),
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

    fn handle(&self, req: Request) -> Response {
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
                stream: _,
            } => match self.run_fenced(
                &spec,
                None,
                Duration::from_millis(timeout_ms),
                output_limit,
                None,
            ) {
                Ok((result, degraded)) => Response::Ran { result, degraded },
                Err(e) => e,
            },
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
            Request::KillAll => match self.kill_all() {
                Ok((count, degraded)) => Response::Killed { count, degraded },
                Err(e) => Response::Failed {
                    message: e.to_string(),
                },
            },
        }
    }

    /// Fork `spec` into a fresh tree and register it; returns (id, leader pid). A
    /// stdin descriptor in `io` (an upload's pipe) is the child's, and closed here
    /// once the child has it.
    fn spawn(
        &self,
        spec: &Spec,
        kind: Kind,
        io: Io,
        exited_w: Option<OwnedFd>,
    ) -> Result<(String, i32, Option<io::Error>), Response> {
        let Io {
            stdin: stdin_fd,
            stdout,
            stderr,
        } = io;
        let prepared = Prepared::new(spec, self.proxy_port, self.trusts_ca)
            .map_err(|message| Response::Invalid { message })?;
        let id = match &spec.tree {
            None => uuid::Uuid::new_v4().to_string(),
            Some(t) => {
                stockade_grammar::names::process_id(t).map_err(|e| Response::Invalid {
                    message: e.to_string(),
                })?;
                if self.lock().entries.contains_key(t) {
                    return Err(Response::Invalid {
                        message: format!("tree {t} exists"),
                    });
                }
                t.clone()
            }
        };
        let failed = |e: io::Error| Response::Failed {
            message: e.to_string(),
        };
        let leaf = match &self.cgroup {
            Some(c) => Some(c.child(&id).map_err(failed)?),
            None => None,
        };
        let procs = leaf
            .as_ref()
            .map(|l| l.open_file("cgroup.procs", true))
            .transpose()
            .map_err(failed)?;
        // Standard input: a pipe the bytes are written into (then closed) by a thread of
        // their own, so a command that reads slowly, or writes before it reads, never
        // blocks the supervisor; no bytes: /dev/null.
        let stdin_pipe = if spec.stdin.is_empty() {
            None
        } else {
            Some(
                rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                    .map_err(|e| failed(e.into()))?,
            )
        };
        let stdio = Stdio {
            stdin: match (&stdin_fd, &stdin_pipe) {
                (Some(fd), _) => fd.as_raw_fd(),
                (None, Some((r, _))) => r.as_raw_fd(),
                (None, None) => self.devnull.as_raw_fd(),
            },
            stdout,
            stderr,
        };
        let place = Placement {
            cgroup_procs: procs.as_ref().map(|f| f.as_raw_fd()),
            cgroup_dir: leaf.as_ref().map(|l| l.fd().as_raw_fd()),
            identity: self
                .isolate
                .then_some((exec::WORKLOAD_ID, exec::WORKLOAD_ID)),
            seccomp: self.seccomp.as_ref(),
            landlock: self.landlock,
        };
        let forked = {
            let mut st = self.lock();
            let forked = match &self.spawner {
                Some(s) => s.fork(&prepared, &stdio, &place),
                None => exec::fork(&prepared, &stdio, &place),
            };
            let forked = match forked {
                Ok(f) => f,
                Err(e) => {
                    drop(st);
                    self.forget_leaf(&id);
                    return Err(failed(e));
                }
            };
            // Our unreaped child (nobody reaps a leader but the watcher, which does not
            // know it yet): its pid is still its own.
            let pid = rustix::process::Pid::from_raw(forked.pid);
            let pidfd =
                pid.map(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()));
            let pidfd = match pidfd {
                Some(Ok(fd)) => fd,
                Some(Err(e)) => {
                    // Unwatchable: it must not run untracked.
                    if let Some(p) = pid {
                        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                    }
                    reap(forked.pid);
                    drop(st);
                    self.forget_leaf(&id);
                    return Err(failed(io::Error::new(
                        io::Error::from(e).kind(),
                        format!("pidfd_open: {e}"),
                    )));
                }
                None => return Err(failed(io::Error::other("fork returned no pid"))),
            };
            st.by_pid.insert(
                forked.pid,
                Leader {
                    id: id.clone(),
                    pidfd: Arc::new(pidfd),
                },
            );
            st.entries.insert(
                id.clone(),
                Entry {
                    kind,
                    leader: forked.pid,
                    exit: None,
                    zombie: false,
                    leaf,
                    exited_w,
                },
            );
            forked
        };
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        self.changed.notify_all();
        if let Some((read, write)) = stdin_pipe {
            drop(read);
            let bytes = spec.stdin.clone();
            std::thread::spawn(move || {
                // A command that exits without reading it all: EPIPE (SIGPIPE is
                // ignored here), and the rest is dropped.
                let _ = std::fs::File::from(write).write_all(&bytes);
            });
        }
        let leader = forked.pid;
        match forked.wait_exec() {
            Ok(pid) => Ok((id, pid, None)),
            // A program that does not exist or may not be executed: as a shell does,
            // the process ran and exited (127, 126: the child `_exit`s 127 and the
            // reaper records it); a run says why on its stderr.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.kind() == io::ErrorKind::PermissionDenied =>
            {
                Ok((id, leader, Some(e)))
            }
            Err(e) => {
                Self::forget(&mut self.lock(), &id);
                self.forget_leaf(&id);
                Err(Response::Failed {
                    message: e.to_string(),
                })
            }
        }
    }

    fn forget_leaf(&self, id: &str) {
        if let Some(c) = &self.cgroup {
            let _ = c.destroy_child(id, Instant::now() + KILL_DEADLINE);
        }
    }

    fn start(&self, spec: &Spec) -> Result<String, Response> {
        let null = self.devnull.as_raw_fd();
        let io = Io {
            stdin: None,
            stdout: null,
            stderr: null,
        };
        self.spawn(spec, Kind::Started, io, None)
            .map(|(id, _, _)| id)
    }

    /// Run `spec` in its own tree until its leader exits (or the deadline kills it).
    /// With `emit`, what each stream keeps is also sent as it arrives; if sending fails
    /// (the host hung up: its client went away), the tree is killed at once and the
    /// rest is not sent.
    fn run_fenced(
        &self,
        spec: &Spec,
        stdin: Option<OwnedFd>,
        timeout: Duration,
        limit: u64,
        mut emit: Option<Emit<'_>>,
    ) -> Result<(RunResult, Vec<String>), Response> {
        let failed = |e: io::Error| Response::Failed {
            message: e.to_string(),
        };
        let (out_r, out_w) = exec::pipe().map_err(failed)?;
        let (err_r, err_w) = exec::pipe().map_err(failed)?;
        let (exited_r, exited_w) = exec::pipe().map_err(failed)?;
        let deadline = Instant::now() + timeout;
        let (id, _, not_executed) = self.spawn(
            spec,
            Kind::Run,
            Io {
                stdin,
                stdout: out_w.as_raw_fd(),
                stderr: err_w.as_raw_fd(),
            },
            Some(exited_w),
        )?;
        drop((out_w, err_w));
        for fd in [&out_r, &err_r] {
            set_nonblocking(fd).map_err(failed)?;
        }
        let mut out = Capture::new(limit);
        let mut err = Capture::new(limit);
        let mut timed_out = false;
        let mut degraded = Vec::new();
        // Capture until the leader exits (not until EOF: a backgrounded grandchild may
        // hold the pipe forever), or the deadline.
        loop {
            let now = Instant::now();
            if now >= deadline && !timed_out {
                timed_out = true;
                // The tree dies; its leader's reap closes `exited`.
                if let Ok((_, d)) = self.kill(&id) {
                    degraded.extend(d);
                }
            }
            let wait = if timed_out {
                KILL_DEADLINE
            } else {
                deadline - now
            };
            let (exited, out_ready, err_ready) = {
                use rustix::event::{PollFd, PollFlags};
                let mut fds = vec![PollFd::new(&exited_r, PollFlags::IN)];
                let out_i = out.open.then(|| {
                    fds.push(PollFd::new(&out_r, PollFlags::IN));
                    fds.len() - 1
                });
                let err_i = err.open.then(|| {
                    fds.push(PollFd::new(&err_r, PollFlags::IN));
                    fds.len() - 1
                });
                let timeout = rustix::event::Timespec {
                    tv_sec: wait.as_secs() as i64,
                    tv_nsec: i64::from(wait.subsec_nanos().max(1_000_000)),
                };
                match rustix::event::poll(&mut fds, Some(&timeout)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(failed(e.into())),
                }
                let ready = |i: Option<usize>| i.is_some_and(|i| !fds[i].revents().is_empty());
                (!fds[0].revents().is_empty(), ready(out_i), ready(err_i))
            };
            if out_ready {
                out.drain(&out_r);
            }
            if err_ready {
                err.drain(&err_r);
            }
            if !self.send_new(&mut emit, &mut out, &mut err)
                && let Ok((_, d)) = self.kill(&id)
            {
                degraded.extend(d);
            }
            if exited {
                break;
            }
            if timed_out && Instant::now() >= deadline + KILL_DEADLINE {
                break;
            }
        }
        // What the leader wrote before exiting is in the pipes now.
        out.drain(&out_r);
        err.drain(&err_r);
        let _ = self.send_new(&mut emit, &mut out, &mut err);
        let exit = {
            let mut st = self.lock();
            let exit = st.entries.get(&id).and_then(|e| e.exit);
            // The run's tree stays tracked while something it backgrounded lives, so
            // the fence's teardown kills it (invariant 7).
            if let Some(e) = st.entries.get(&id)
                && !self.running(e)
            {
                Self::forget(&mut st, &id);
                drop(st);
                self.forget_leaf(&id);
            }
            exit
        };
        let mut exit_code = if timed_out {
            -1
        } else {
            exit.unwrap_or(-libc::SIGKILL)
        };
        if let Some(e) = &not_executed {
            let denied = e.kind() == io::ErrorKind::PermissionDenied;
            exit_code = if denied { 126 } else { 127 };
            let why = format!("stockade: {}: {}\n", spec.argv[0], e);
            err.push(why.as_bytes());
            let _ = self.send_new(&mut emit, &mut out, &mut err);
        }
        let result = RunResult {
            exit_code,
            stdout: out.buf,
            stderr: err.buf,
            timed_out,
            truncated: out.truncated || err.truncated,
            limits: Vec::new(),
        };
        Ok((result, degraded))
    }

    /// Send what each capture kept since the last call. False if sending failed (then
    /// `emit` is dropped: nothing more is sent).
    fn send_new(&self, emit: &mut Option<Emit<'_>>, out: &mut Capture, err: &mut Capture) -> bool {
        let Some(f) = emit.as_mut() else {
            return true;
        };
        for (stream, cap) in [(OutStream::Stdout, out), (OutStream::Stderr, err)] {
            if !cap.buf.is_empty() {
                if f(stream, &cap.buf).is_err() {
                    *emit = None;
                    return false;
                }
                // Sent is gone: a streaming run's answer carries no output again.
                cap.buf.clear();
            }
        }
        true
    }

    /// Does `e`'s tree still have a live process?
    fn running(&self, e: &Entry) -> bool {
        match self.mode {
            KillMode::Single => e.exit.is_none(),
            // A leader reaped at its exit had no other member in its group; one kept
            // as a zombie keeps the group's id the tree's, so its members are looked
            // up by that id.
            KillMode::ProcessGroup => {
                e.exit.is_none() || (e.zombie && kill::group_has_others(e.leader))
            }
            // A leader not yet reaped is a live member: only once it has exited does
            // the tree's liveness need `cgroup.events` (the status path is hot).
            KillMode::Auto | KillMode::Cgroup => {
                e.exit.is_none()
                    || e.leaf
                        .as_ref()
                        .is_some_and(|l| l.populated().unwrap_or(false))
            }
        }
    }

    /// May `e`'s process group be signalled? Only while its leader is unreaped (the
    /// caller holds the state lock, which every reap of a leader takes).
    fn group_allowed(&self, e: &Entry) -> bool {
        let reaped = e.exit.is_some() && !e.zombie;
        kill::group_kill_allowed(e.leader, kill::getpgid(e.leader), reaped)
    }

    /// Is the tree `id` led by `leader` still alive after its group was signalled: its
    /// leader not exited, or kept as a zombie while its group has other members?
    fn group_live(&self, id: &str, leader: i32, st: &State) -> bool {
        if st.by_pid.contains_key(&leader) {
            return true;
        }
        st.entries
            .get(id)
            .is_some_and(|e| e.leader == leader && e.zombie)
            && kill::group_has_others(leader)
    }

    fn info(&self, id: &str, e: &Entry) -> ProcessInfo {
        ProcessInfo {
            id: id.to_string(),
            running: self.running(e),
            exit_code: e.exit,
        }
    }

    fn list(&self) -> Vec<ProcessInfo> {
        let mut st = self.lock();
        let mut out = Vec::new();
        let mut finished_runs = Vec::new();
        for (id, e) in &st.entries {
            let info = self.info(id, e);
            if e.kind == Kind::Run && !info.running {
                finished_runs.push(id.clone());
            } else {
                out.push(info);
            }
        }
        for id in &finished_runs {
            Self::forget(&mut st, id);
        }
        drop(st);
        for id in finished_runs {
            self.forget_leaf(&id);
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    fn status(&self, id: &str) -> Option<ProcessInfo> {
        let st = self.lock();
        st.entries.get(id).map(|e| self.info(id, e))
    }

    /// Kill one tree, wait until it is gone, forget it: processes that died, and the
    /// degradations met (said once). The entry is forgotten only once its death is
    /// verified (`populated 0`, the group empty, the leader exited): a kill that fails
    /// or times out leaves the tree tracked, so a kill-all still reaches it and a
    /// retried stop does not answer success while it may live (issue 12).
    fn kill(&self, id: &str) -> io::Result<(u32, Vec<String>)> {
        let deadline = Instant::now() + KILL_DEADLINE;
        let timed_out =
            || io::Error::new(io::ErrorKind::TimedOut, format!("tree {id} did not die"));
        let mut degraded = Vec::new();
        let st = self.lock();
        let Some(e) = st.entries.get(id) else {
            return Ok((0, degraded));
        };
        let leader = e.leader;
        let count = match (self.mode, &self.cgroup) {
            (KillMode::Auto | KillMode::Cgroup, Some(c)) if e.leaf.is_some() => {
                drop(st);
                c.destroy_child(id, deadline)?
            }
            (KillMode::ProcessGroup, _) if self.group_allowed(e) => {
                // Checked and sent under the lock every reap of a leader takes: the
                // leader's pid, the group's id, cannot be freed (and reused) between.
                let n = kill::group_members(leader)
                    .iter()
                    .filter(|p| **p != leader || e.exit.is_none())
                    .count() as u32;
                kill::killpg(leader)?;
                drop(st);
                // Members are reparented to the main thread and reaped; each reap, and
                // the leader's exit, signals `changed`.
                self.changed.notify_all();
                if !self.wait_until(deadline, |st| !self.group_live(id, leader, st)) {
                    return Err(timed_out());
                }
                n
            }
            (mode, _) => {
                if mode == KillMode::Single {
                    self.degraded(
                        &mut degraded,
                        "kill mode single: a kill reaches only a tree's leader; what the leader started survives until the container stops",
                    );
                } else if mode == KillMode::ProcessGroup && e.exit.is_none() {
                    self.degraded(
                        &mut degraded,
                        "process-group kill refused: the group is not the leader's own; killing the leader only",
                    );
                }
                // A leader reaped at its exit left no group member behind: nothing to
                // kill. One not exited is signalled through its pidfd.
                let pidfd = st.by_pid.get(&leader).map(|l| l.pidfd.clone());
                drop(st);
                match pidfd {
                    Some(fd) => {
                        rustix::process::pidfd_send_signal(&*fd, rustix::process::Signal::KILL)?;
                        if !self.wait_until(deadline, |st| !st.by_pid.contains_key(&leader)) {
                            return Err(timed_out());
                        }
                        1
                    }
                    None => 0,
                }
            }
        };
        // Verified dead: now it may be forgotten.
        Self::forget(&mut self.lock(), id);
        Ok((count, degraded))
    }

    /// Wait until `done` holds (each reap and spawn signals `changed`) or the deadline:
    /// whether it holds.
    fn wait_until(&self, deadline: Instant, done: impl Fn(&State) -> bool) -> bool {
        let mut st = self.lock();
        while !done(&st) {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    fn kill_all(&self) -> io::Result<(u32, Vec<String>)> {
        let ids: Vec<String> = self.lock().entries.keys().cloned().collect();
        let mut total = 0;
        let mut degraded = Vec::new();
        let mut first_err = None;
        for id in ids {
            match self.kill(&id) {
                Ok((n, d)) => {
                    total += n;
                    degraded.extend(d);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok((total, degraded)),
        }
    }
}

/// Reap child `pid` (a zombie, or about to be one: it was killed).
fn reap(pid: i32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
    }
}

fn set_nonblocking(fd: impl AsFd) -> io::Result<()> {
    let fl = rustix::fs::fcntl_getfl(&fd)?;
    Ok(rustix::fs::fcntl_setfl(
        &fd,
        fl | rustix::fs::OFlags::NONBLOCK,
    )?)
}

/// Where a streaming run's kept output goes, chunk by chunk (an error: the host hung
/// up).
type Emit<'a> = &'a mut dyn FnMut(OutStream, &[u8]) -> io::Result<()>;

/// A bounded capture: keeps the first `limit` bytes, drains and discards the rest.
/// A new tree's standard streams: stdin a descriptor the host sent (else the
/// spec's bytes, or `/dev/null`), stdout and stderr borrowed.
struct Io {
    stdin: Option<OwnedFd>,
    stdout: RawFd,
    stderr: RawFd,
}

struct Capture {
    buf: Vec<u8>,
    /// Bytes kept so far (a streaming run sends and clears `buf`; the limit counts
    /// them all).
    kept: usize,
    limit: usize,
    truncated: bool,
    open: bool,
}

impl Capture {
    fn new(limit: u64) -> Capture {
        Capture {
            buf: Vec::new(),
            kept: 0,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            truncated: false,
            open: true,
        }
    }

    /// Read what is in the pipe now (non-blocking), until it would block or EOF.
    fn drain(&mut self, fd: impl AsFd) {
        let mut chunk = [0u8; 64 * 1024];
        while self.open {
            match rustix::io::read(&fd, &mut chunk) {
                Ok(0) => self.open = false,
                Ok(n) => self.push(&chunk[..n]),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return, // EAGAIN: nothing more now
            }
        }
    }

    fn push(&mut self, data: &[u8]) {
        let room = self.limit.saturating_sub(self.kept);
        let keep = room.min(data.len());
        self.buf.extend_from_slice(&data[..keep]);
        self.kept += keep;
        if keep < data.len() {
            self.truncated = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_the_first_bytes_and_reports_the_rest() {
        let mut c = Capture::new(4);
        c.push(b"abc");
        assert!(!c.truncated);
        c.push(b"defg");
        assert_eq!(c.buf, b"abcd");
        assert!(c.truncated);
        // A streaming run sends and clears what it kept; the limit still counts it.
        let mut c = Capture::new(4);
        c.push(b"ab");
        c.buf.clear();
        c.push(b"cdef");
        assert_eq!((&c.buf[..], c.kept, c.truncated), (&b"cd"[..], 4, true));
    }

    #[test]
    fn arguments_round_trip() {
        let a = Args {
            id: "0123456789abcdef".into(),
            kill_mode: KillMode::ProcessGroup,
            isolate: true,
            image: false,
            proxy_port: 3128,
            cgroup: true,
            ca_pem: Some("-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n".into()),
        };
        let argv: Vec<OsString> = a.to_args().into_iter().map(OsString::from).collect();
        assert_eq!(Args::parse(&argv).unwrap(), a);
        assert_eq!(a.hostname(), "stockade-0123456789ab");
    }
}
