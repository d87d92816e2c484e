//! The spawner thread: every workload is forked from it, under its seccomp filter.

use super::*;

/// The thread every workload is forked from. It carries the workload seccomp policy
/// (all but the `clone3` row, which it needs for `CLONE_INTO_CGROUP`), attached once
/// at start: a child inherits its forking thread's filter for free, while attaching
/// the whole policy costs the kernel about a millisecond per process (it builds the
/// filter's constant-action cache). Each child adds only the tiny `clone3` guard. The
/// supervisor's other threads are not filtered (seccomp without TSYNC is per thread).
pub(super) struct Spawner {
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
    pub(super) fn start(
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
                    // SAFETY: see `Job`: the requester waits for the reply, and keeps
                    // the referents as long as the `Forked` (`Spawner::fork`).
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
    ///
    /// # Safety
    /// As [`exec::fork`]: `p`, `stdio` and `place` outlive the returned `Forked`.
    pub(super) unsafe fn fork(
        &self,
        p: &Prepared,
        stdio: &Stdio,
        place: &Placement<'_>,
    ) -> io::Result<exec::Forked> {
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
