//! A tree's start: the fork into its leaf (through the spawner), and a fenced run's
//! loop (bounded captures of its output, streamed or kept, its deadline).

use super::*;

impl Supervisor {
    /// Fork `spec` into a fresh tree and register it. A stdin descriptor in `io` (an
    /// upload's pipe) is the child's, and closed here once the child has it. A run's
    /// leader is the run's to watch (`Leader::by_run`): the leader watcher is not woken.
    pub(super) fn spawn(&self, spec: &Spec, kind: Kind, io: Io) -> Result<Spawned, Response> {
        let Io {
            stdin: stdin_fd,
            stdout,
            stderr,
        } = io;
        // The workload inherits its forking thread's filter: in an isolated container
        // only a worker the spawner started carries it (checked before anything is made).
        if self.isolate && !spawner::filtered() {
            return Err(Response::Failed {
                message: "a workload is forked only from a filtered thread".into(),
            });
        }
        let prepared = Prepared::new(spec, self.proxy_port, self.trusts_ca)
            .map_err(|message| Response::Invalid { message })?;
        if let Some(t) = &spec.tree {
            stockade_grammar::names::process_id(t).map_err(|e| Response::Invalid {
                message: e.to_string(),
            })?;
            if self.lock().entries.contains_key(t) {
                return Err(Response::Invalid {
                    message: format!("tree {t} exists"),
                });
            }
        }
        let failed = |e: io::Error| Response::Failed {
            message: e.to_string(),
        };
        let (id, leaf) = self.tree(spec.tree.as_deref(), kind).map_err(failed)?;
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
        let stdin_raw = stdin_fd.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1);
        if spec.pty && (stdin_raw < 0 || !spec.stdin.is_empty()) {
            return Err(Response::Invalid {
                message: "a terminal run takes its terminal as the descriptor sent with it, and no stdin bytes".into(),
            });
        }
        let stdio = Stdio {
            stdin: match (&stdin_fd, &stdin_pipe) {
                (Some(fd), _) => fd.as_raw_fd(),
                (None, Some((r, _))) => r.as_raw_fd(),
                (None, None) => self.devnull.as_raw_fd(),
            },
            stdout: if spec.pty { stdin_raw } else { stdout },
            stderr: if spec.pty { stdin_raw } else { stderr },
            ctty: spec.pty,
        };
        debug_assert_eq!(
            clone::Signals::ignored(),
            self.ignored,
            "the supervisor ignored a signal after its start: its workloads would too"
        );
        let place = Placement {
            cgroup_dir: leaf.as_ref().map(|l| l.fd().as_raw_fd()),
            identity: self
                .isolate
                .then_some((exec::WORKLOAD_ID, exec::WORKLOAD_ID)),
            seccomp: self.seccomp.as_ref(),
            landlock: self.landlock,
            bounding_empty: spawner::bounding_empty(),
            ignored: self.ignored,
        };
        let forked = {
            let mut st = self.lock();
            // A fenced run whose fence's teardown already killed (the kill overtook
            // this request): it does not start.
            if kind == Kind::Run
                && let Some(t) = &spec.tree
                && super::trees::claim_torn(&mut st.torn, t)
            {
                drop(st);
                self.forget_leaf(&id);
                return Err(Response::Failed {
                    message: format!(
                        "tree {t}: its fence's teardown killed it before it came; not started"
                    ),
                });
            }
            // SAFETY: `prepared`, `stdio` and `place` outlive `forked` (declared after
            // them in this frame; `wait_exec` below consumes it).
            let forked = unsafe { exec::fork(&prepared, &stdio, &place) };
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
            let pidfd = Arc::new(pidfd);
            let by_run = kind == Kind::Run;
            st.by_pid.insert(
                forked.pid,
                Leader {
                    id: id.clone(),
                    pidfd: pidfd.clone(),
                    by_run,
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
                },
            );
            if !by_run {
                let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
            }
            (forked, pidfd)
        };
        let (forked, pidfd) = forked;
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
        let spawned = |not_executed| Spawned {
            id: id.clone(),
            leader,
            pidfd: pidfd.clone(),
            not_executed,
        };
        match forked.wait_exec() {
            Ok(_) => {
                if self.isolate {
                    self.raise_oom_score(leader, &pidfd);
                }
                Ok(spawned(None))
            }
            // A program that does not exist or may not be executed: as a shell does,
            // the process ran and exited (127, 126: the child `_exit`s 127 and the
            // reaper records it); a run says why on its stderr.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.kind() == io::ErrorKind::PermissionDenied =>
            {
                Ok(spawned(Some(e)))
            }
            Err(e) => {
                // Killed before its exec: the watcher reaps it.
                self.hand_over(leader, &pidfd);
                Self::forget(&mut self.lock(), &id);
                self.forget_leaf(&id);
                Err(Response::Failed {
                    message: e.to_string(),
                })
            }
        }
    }

    /// Make the workload `pid`, just exec'd, the OOM killer's first choice
    /// (`oom_score_adj` 1000), before its supervisor and, on a host out of memory,
    /// before the host's own services. Raising a score needs no privilege (lowering the
    /// supervisor's would need `CAP_SYS_RESOURCE`, which a host, a sandboxed CI runner,
    /// may lack). After the exec, not in the child: until its exec the child shares the
    /// supervisor's memory, and the kernel gives a score written then to every process
    /// sharing it (`MMF_MULTIPROCESS`), the supervisor included. Under the state lock,
    /// which every reap takes: while the leader is watched its pid is its own. Its
    /// children inherit the score; one forked in the few microseconds before this write
    /// keeps the supervisor's, as a workload that lowers its own (it may) does.
    ///
    /// The file is opened first and kept only if the leader is still watched, i.e.
    /// unreaped, afterwards: its pid was then its own all along (a pid is not reused
    /// before its reap), so the file is the workload's. The state lock is held for
    /// that lookup alone, not for the open (the status path takes it too).
    fn raise_oom_score(&self, pid: i32, pidfd: &Arc<OwnedFd>) {
        let Ok(f) = rustix::fs::open(
            format!("/proc/{pid}/oom_score_adj").as_str(),
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) else {
            return;
        };
        if self.lock().watched(pid, pidfd).is_some() {
            let _ = rustix::io::write(&f, b"1000");
        }
    }

    /// Remove a forgotten tree's leaf: at once if it is empty (the common end of a run:
    /// its leader was its only process), else killed, waited for and removed.
    pub(super) fn forget_leaf(&self, id: &str) {
        if let Some(c) = &self.cgroup
            && !c.remove_empty_child(id).unwrap_or(false)
        {
            let _ = c.destroy_child_as_pid1(id, Instant::now() + KILL_DEADLINE);
        }
    }

    pub(super) fn start(&self, spec: &Spec) -> Result<String, Response> {
        let null = self.devnull.as_raw_fd();
        let io = Io {
            stdin: None,
            stdout: null,
            stderr: null,
        };
        self.spawn(spec, Kind::Started, io).map(|s| s.id)
    }

    /// Run `spec` in its own tree until its leader exits (or the deadline kills it).
    /// With `emit`, what each stream keeps is also sent as it arrives; if sending fails
    /// (the host hung up: its client went away), the tree is killed at once and the
    /// rest is not sent. Also: whether its leaf was kept for the host's next run of
    /// its name ([`super::leaves`]).
    pub(super) fn run_fenced(
        &self,
        spec: &Spec,
        stdin: Option<OwnedFd>,
        timeout: Duration,
        limit: u64,
        mut emit: Option<Emit<'_>>,
    ) -> Result<(RunResult, Vec<String>, bool), Response> {
        let failed = |e: io::Error| Response::Failed {
            message: e.to_string(),
        };
        let (out_r, out_w) = exec::pipe().map_err(failed)?;
        let (err_r, err_w) = exec::pipe().map_err(failed)?;
        let deadline = Instant::now() + timeout;
        let Spawned {
            id,
            leader,
            pidfd,
            not_executed,
        } = self.spawn(
            spec,
            Kind::Run,
            Io {
                stdin,
                stdout: out_w.as_raw_fd(),
                stderr: err_w.as_raw_fd(),
            },
        )?;
        // However this run ends (an early error included), a leader it did not see
        // exit goes to the watcher.
        let watch = Watch {
            sup: self,
            leader,
            pidfd: &pidfd,
        };
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
                // The tree dies; the kill may wait for its leader's reap (process-group
                // and single modes), which the watcher then makes.
                watch.hand_over();
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
                let mut fds = vec![PollFd::new(&*pidfd, PollFlags::IN)];
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
            if !self.send_new(&mut emit, &mut out, &mut err) {
                watch.hand_over();
                if let Ok((_, d)) = self.kill(&id) {
                    degraded.extend(d);
                }
            }
            // Its pidfd is readable once it exited: the run records the exit and reaps
            // it (or the watcher did, after a hand-over).
            if exited && self.leader_exited(leader, &pidfd) {
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
        let (exit, kept) = {
            let mut st = self.lock();
            let exit = st.entries.get(&id).and_then(|e| e.exit);
            // The run's tree stays tracked while something it backgrounded lives, so
            // the fence's teardown kills it (invariant 7). An empty one is forgotten,
            // its leaf kept for the host's next run of its name or removed.
            let mut kept = false;
            if let Some(e) = st.entries.get(&id)
                && !self.running(e)
            {
                let leaf = st.entries.get_mut(&id).and_then(|e| e.leaf.take());
                Self::forget(&mut st, &id);
                drop(st);
                kept = self.retire_leaf(&id, leaf, spec.tree.is_some());
            }
            (exit, kept)
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
        Ok((result, degraded, kept))
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
}

/// A tree just forked: its id, its leader and the leader's pidfd, and why its program
/// was not executed (it then exits 127 or 126).
pub(super) struct Spawned {
    pub(super) id: String,
    pub(super) leader: i32,
    pub(super) pidfd: Arc<OwnedFd>,
    pub(super) not_executed: Option<io::Error>,
}

/// A run's watch of its own leader; on drop (however the run ended) a leader still
/// watched goes to the leader watcher.
struct Watch<'a> {
    sup: &'a Supervisor,
    leader: i32,
    pidfd: &'a Arc<OwnedFd>,
}

impl Watch<'_> {
    fn hand_over(&self) {
        self.sup.hand_over(self.leader, self.pidfd);
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.hand_over();
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
pub(super) struct Io {
    pub(super) stdin: Option<OwnedFd>,
    pub(super) stdout: RawFd,
    pub(super) stderr: RawFd,
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
        // Uninitialized: the kernel writes what is read, and only that is looked at
        // (a zeroed 64 KiB, three times a run, was a `memset` each).
        let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
        while self.open {
            match rustix::io::read(&fd, &mut chunk) {
                Ok(([], _)) => self.open = false,
                Ok((read, _)) => self.push(read),
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
}
