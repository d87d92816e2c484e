//! The supervisor: PID 1 of a container. It builds the container's filesystem, reaps
//! every zombie, and serves the process API ([`super::protocol`]) on the Unix socket the
//! host bound and passed in. Synchronous std code: a thread per connection, one reaper.
//!
//! Every tree (a started process, a fenced run) gets its own leaf cgroup
//! `<container>/<uuid>` and its own session; killing it is [`super::kill`]'s business.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::KillMode;
use crate::substrate::{ProcessInfo, RunResult};

use super::cgroup::CgroupDir;
use super::exec::{self, Placement, Prepared, Stdio};
use super::kill;
use super::mounts;
use super::protocol::{Request, Response, Spec};

/// How long a kill waits for a tree to empty.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

/// The supervisor's command line (after `__supervisor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The container's host directory (`workspace`, `artifacts`, `root`).
    pub dir: PathBuf,
    /// The data directory (masked inside the container).
    pub data_dir: PathBuf,
    /// The container id (for the hostname).
    pub id: String,
    /// How trees are killed.
    pub kill_mode: KillMode,
    /// Build the mount namespace (false when the host could not create namespaces).
    pub isolate: bool,
    /// The inherited listening socket.
    pub sock_fd: RawFd,
    /// The inherited container cgroup directory (cgroup mode).
    pub cgroup_fd: Option<RawFd>,
    /// The egress proxy's port on the container's loopback.
    pub proxy_port: u16,
}

impl Args {
    /// The command line for these arguments.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--dir".into(),
            self.dir.display().to_string(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--id".into(),
            self.id.clone(),
            "--kill-mode".into(),
            kill::mode_arg(self.kill_mode).into(),
            "--isolate".into(),
            if self.isolate { "1" } else { "0" }.into(),
            "--sock-fd".into(),
            self.sock_fd.to_string(),
            "--proxy-port".into(),
            self.proxy_port.to_string(),
        ];
        if let Some(fd) = self.cgroup_fd {
            v.extend(["--cgroup-fd".into(), fd.to_string()]);
        }
        v
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
        let num = |k: &str| -> Result<i32, String> {
            get(k)?
                .parse()
                .map_err(|_| format!("--{k} is not a number"))
        };
        Ok(Args {
            dir: get("dir")?.into(),
            data_dir: get("data-dir")?.into(),
            id: get("id")?,
            kill_mode: kill::parse_mode(&get("kill-mode")?).ok_or("bad --kill-mode")?,
            isolate: get("isolate")? == "1",
            sock_fd: num("sock-fd")?,
            cgroup_fd: m
                .contains_key("cgroup-fd")
                .then(|| num("cgroup-fd"))
                .transpose()?,
            proxy_port: get("proxy-port")?.parse().map_err(|_| "bad --proxy-port")?,
        })
    }
}

/// `stockade __supervisor ARGS…`: returns the process exit code.
pub fn main(args: Vec<OsString>) -> i32 {
    let args = match Args::parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("stockade supervisor: {e}");
            return 2;
        }
    };
    match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("stockade supervisor: {e}");
            1
        }
    }
}

fn run(args: Args) -> io::Result<()> {
    if args.isolate {
        mounts::setup(&args.dir, &args.data_dir)?;
        let short: String = args.id.chars().take(12).collect();
        mounts::set_hostname(&format!("stockade-{short}"))?;
    }
    // SAFETY: the host passed these fds for us to own.
    let listener = unsafe { UnixListener::from_raw_fd(args.sock_fd) };
    let cgroup = args.cgroup_fd.map(|fd| unsafe { CgroupDir::from_raw(fd) });
    let devnull = OwnedFd::from(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")?,
    );
    let sup = Arc::new(Supervisor {
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
        mode: if cgroup.is_some() {
            args.kill_mode
        } else {
            degrade(args.kill_mode)
        },
        cgroup,
        devnull,
        proxy_port: args.proxy_port,
        drop_caps: args.isolate,
    });
    {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || sup.reap_forever())?;
    }
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("conn".into())
            .spawn(move || sup.serve(conn))?;
    }
    Ok(())
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
    leaf: Option<CgroupDir>,
    /// Closed by the reaper when the leader is reaped: a run polls its read end.
    exited_w: Option<OwnedFd>,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    by_pid: HashMap<i32, String>,
}

struct Supervisor {
    state: Mutex<State>,
    /// Signalled on every reap and every spawn.
    changed: Condvar,
    mode: KillMode,
    cgroup: Option<CgroupDir>,
    devnull: OwnedFd,
    proxy_port: u16,
    drop_caps: bool,
}

impl Supervisor {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// PID 1's duty: reap every child, attributing each tracked leader's status.
    fn reap_forever(&self) {
        loop {
            let mut status = 0;
            // SAFETY: valid status pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
            if pid > 0 {
                let mut st = self.lock();
                if let Some(id) = st.by_pid.remove(&pid)
                    && let Some(e) = st.entries.get_mut(&id)
                {
                    e.exit = Some(exec::exit_code(status));
                    e.exited_w = None;
                }
                drop(st);
                self.changed.notify_all();
                continue;
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ECHILD) {
                // No child yet: a spawn signals `changed` (the timeout is a backstop).
                let st = self.lock();
                let _ = self.changed.wait_timeout(st, Duration::from_secs(1));
            }
        }
    }

    fn serve(&self, conn: UnixStream) {
        let Ok(mut w) = conn.try_clone() else { return };
        let r = BufReader::new(conn);
        for line in r.lines() {
            let Ok(line) = line else { return };
            let resp = match serde_json::from_str::<Request>(&line) {
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
            } => match self.run_fenced(&spec, Duration::from_millis(timeout_ms), output_limit) {
                Ok(result) => Response::Ran { result },
                Err(e) => e,
            },
            Request::List => Response::Processes {
                processes: self.list(),
            },
            Request::Status { id } => Response::Process {
                process: self.status(&id),
            },
            Request::Kill { id } => match self.kill(&id) {
                Ok(count) => Response::Killed { count },
                Err(e) => Response::Failed {
                    message: e.to_string(),
                },
            },
            Request::KillAll => match self.kill_all() {
                Ok(count) => Response::Killed { count },
                Err(e) => Response::Failed {
                    message: e.to_string(),
                },
            },
        }
    }

    /// Fork `spec` into a fresh tree and register it; returns (id, leader pid).
    fn spawn(
        &self,
        spec: &Spec,
        kind: Kind,
        stdout: RawFd,
        stderr: RawFd,
        exited_w: Option<OwnedFd>,
    ) -> Result<(String, i32), Response> {
        let prepared = Prepared::new(spec, self.proxy_port)
            .map_err(|message| Response::Invalid { message })?;
        let id = uuid::Uuid::new_v4().to_string();
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
        let stdio = Stdio {
            stdin: self.devnull.as_raw_fd(),
            stdout,
            stderr,
        };
        let place = Placement {
            cgroup_procs: procs.as_ref().map(|f| f.as_raw_fd()),
            cgroup_dir: leaf.as_ref().map(|l| l.fd().as_raw_fd()),
            drop_caps: self.drop_caps,
        };
        let forked = {
            let mut st = self.lock();
            let forked = match exec::fork(&prepared, &stdio, &place) {
                Ok(f) => f,
                Err(e) => {
                    drop(st);
                    self.forget_leaf(&id);
                    return Err(failed(e));
                }
            };
            st.by_pid.insert(forked.pid, id.clone());
            st.entries.insert(
                id.clone(),
                Entry {
                    kind,
                    leader: forked.pid,
                    exit: None,
                    leaf,
                    exited_w,
                },
            );
            forked
        };
        self.changed.notify_all();
        match forked.wait_exec() {
            Ok(pid) => Ok((id, pid)),
            Err(e) => {
                self.lock().entries.remove(&id);
                self.forget_leaf(&id);
                let message = e.to_string();
                // A program that does not exist is the caller's mistake.
                if e.kind() == io::ErrorKind::NotFound
                    || e.kind() == io::ErrorKind::PermissionDenied
                {
                    Err(Response::Invalid {
                        message: format!("{}: {message}", spec.argv[0]),
                    })
                } else {
                    Err(Response::Failed { message })
                }
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
        self.spawn(spec, Kind::Started, null, null, None)
            .map(|(id, _)| id)
    }

    fn run_fenced(
        &self,
        spec: &Spec,
        timeout: Duration,
        limit: u64,
    ) -> Result<RunResult, Response> {
        let failed = |e: io::Error| Response::Failed {
            message: e.to_string(),
        };
        let (out_r, out_w) = exec::pipe().map_err(failed)?;
        let (err_r, err_w) = exec::pipe().map_err(failed)?;
        let (exited_r, exited_w) = exec::pipe().map_err(failed)?;
        let deadline = Instant::now() + timeout;
        let (id, _) = self.spawn(
            spec,
            Kind::Run,
            out_w.as_raw_fd(),
            err_w.as_raw_fd(),
            Some(exited_w),
        )?;
        drop((out_w, err_w));
        for fd in [&out_r, &err_r] {
            set_nonblocking(fd.as_raw_fd()).map_err(failed)?;
        }
        let mut out = Capture::new(limit);
        let mut err = Capture::new(limit);
        let mut timed_out = false;
        // Capture until the leader exits (not until EOF: a backgrounded grandchild may
        // hold the pipe forever), or the deadline.
        loop {
            let now = Instant::now();
            if now >= deadline && !timed_out {
                timed_out = true;
                // The tree dies; its leader's reap closes `exited`.
                let _ = self.kill(&id);
            }
            let wait = if timed_out {
                KILL_DEADLINE
            } else {
                deadline - now
            };
            let mut fds = [
                libc::pollfd {
                    fd: exited_r.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: if out.open { out_r.as_raw_fd() } else { -1 },
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: if err.open { err_r.as_raw_fd() } else { -1 },
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: three valid pollfds.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 3, ms) };
            if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return Err(failed(io::Error::last_os_error()));
            }
            if fds[1].revents != 0 {
                out.drain(out_r.as_raw_fd());
            }
            if fds[2].revents != 0 {
                err.drain(err_r.as_raw_fd());
            }
            if fds[0].revents != 0 {
                break;
            }
            if timed_out && Instant::now() >= deadline + KILL_DEADLINE {
                break;
            }
        }
        // What the leader wrote before exiting is in the pipes now.
        out.drain(out_r.as_raw_fd());
        err.drain(err_r.as_raw_fd());
        let exit = {
            let mut st = self.lock();
            let exit = st.entries.get(&id).and_then(|e| e.exit);
            // The run's tree stays tracked while something it backgrounded lives, so
            // the fence's teardown kills it (invariant 7).
            if let Some(e) = st.entries.get(&id)
                && !self.running(e, &st)
            {
                st.entries.remove(&id);
                drop(st);
                self.forget_leaf(&id);
            }
            exit
        };
        Ok(RunResult {
            exit_code: if timed_out {
                -1
            } else {
                exit.unwrap_or(-libc::SIGKILL)
            },
            stdout: out.buf,
            stderr: err.buf,
            timed_out,
            truncated: out.truncated || err.truncated,
        })
    }

    /// Does `e`'s tree still have a live process?
    fn running(&self, e: &Entry, st: &State) -> bool {
        match self.mode {
            KillMode::Single => e.exit.is_none(),
            KillMode::ProcessGroup => {
                e.exit.is_none() || (self.group_allowed(e, st) && kill::group_alive(e.leader))
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

    fn group_allowed(&self, e: &Entry, st: &State) -> bool {
        let others: Vec<i32> = st
            .entries
            .values()
            .filter(|o| o.leader != e.leader && o.exit.is_none())
            .map(|o| o.leader)
            .collect();
        kill::group_kill_allowed(e.leader, kill::getpgid(e.leader), e.exit.is_some(), &others)
    }

    fn info(&self, id: &str, e: &Entry, st: &State) -> ProcessInfo {
        ProcessInfo {
            id: id.to_string(),
            running: self.running(e, st),
            exit_code: e.exit,
        }
    }

    fn list(&self) -> Vec<ProcessInfo> {
        let mut st = self.lock();
        let mut out = Vec::new();
        let mut finished_runs = Vec::new();
        for (id, e) in &st.entries {
            let info = self.info(id, e, &st);
            if e.kind == Kind::Run && !info.running {
                finished_runs.push(id.clone());
            } else {
                out.push(info);
            }
        }
        for id in &finished_runs {
            st.entries.remove(id);
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
        st.entries.get(id).map(|e| self.info(id, e, &st))
    }

    /// Kill one tree, wait until it is gone, forget it: processes that died.
    fn kill(&self, id: &str) -> io::Result<u32> {
        let (entry, group_ok) = {
            let mut st = self.lock();
            let group_ok = st.entries.get(id).map(|e| self.group_allowed(e, &st));
            match st.entries.remove(id) {
                Some(e) => (e, group_ok.unwrap_or(false)),
                None => return Ok(0),
            }
        };
        let deadline = Instant::now() + KILL_DEADLINE;
        let count = match (self.mode, &self.cgroup) {
            (KillMode::Auto | KillMode::Cgroup, Some(c)) if entry.leaf.is_some() => {
                c.destroy_child(id, deadline)?
            }
            (KillMode::ProcessGroup, _) if group_ok => {
                let n = kill::group_members(entry.leader).len() as u32;
                kill::killpg(entry.leader)?;
                // Members are reparented to us and reaped; each reap signals `changed`.
                self.wait_until(deadline, |_| !kill::group_alive(entry.leader));
                n
            }
            (mode, _) => {
                if mode == KillMode::ProcessGroup {
                    kill::log_degradation(
                        "process-group kill refused: the group is not the leader's own; killing the leader only",
                    );
                }
                if entry.exit.is_none() {
                    // SAFETY: the leader is unreaped, so its pid is still ours.
                    unsafe { libc::kill(entry.leader, libc::SIGKILL) };
                    self.wait_until(deadline, |st| !st.by_pid.contains_key(&entry.leader));
                    1
                } else {
                    0
                }
            }
        };
        drop(entry);
        Ok(count)
    }

    fn wait_until(&self, deadline: Instant, done: impl Fn(&State) -> bool) {
        let mut st = self.lock();
        while !done(&st) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn kill_all(&self) -> io::Result<u32> {
        let ids: Vec<String> = self.lock().entries.keys().cloned().collect();
        let mut total = 0;
        let mut first_err = None;
        for id in ids {
            match self.kill(&id) {
                Ok(n) => total += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain fcntl on a valid fd.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A bounded capture: keeps the first `limit` bytes, drains and discards the rest.
struct Capture {
    buf: Vec<u8>,
    limit: usize,
    truncated: bool,
    open: bool,
}

impl Capture {
    fn new(limit: u64) -> Capture {
        Capture {
            buf: Vec::new(),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            truncated: false,
            open: true,
        }
    }

    /// Read what is in the pipe now (non-blocking), until it would block or EOF.
    fn drain(&mut self, fd: RawFd) {
        let mut chunk = [0u8; 64 * 1024];
        while self.open {
            // SAFETY: valid fd and buffer.
            let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
            if n == 0 {
                self.open = false;
            } else if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            } else {
                self.push(&chunk[..n as usize]);
            }
        }
    }

    fn push(&mut self, data: &[u8]) {
        let room = self.limit.saturating_sub(self.buf.len());
        let keep = room.min(data.len());
        self.buf.extend_from_slice(&data[..keep]);
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
    }

    #[test]
    fn arguments_round_trip() {
        let a = Args {
            dir: "/d/c/x".into(),
            data_dir: "/d".into(),
            id: "x".into(),
            kill_mode: KillMode::ProcessGroup,
            isolate: true,
            sock_fd: 3,
            cgroup_fd: Some(4),
            proxy_port: 3128,
        };
        let argv: Vec<OsString> = a.to_args().into_iter().map(OsString::from).collect();
        assert_eq!(Args::parse(&argv).unwrap(), a);
    }
}
