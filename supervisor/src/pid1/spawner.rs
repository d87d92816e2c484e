//! The filtered threads: the connection workers, which fork every workload, carry the
//! workload seccomp policy, attached once.

use std::cell::Cell;

use super::*;

thread_local! {
    /// This thread was started by the [`Spawner`], after its filter was attached.
    static FILTERED: Cell<bool> = const { Cell::new(false) };
    /// This thread was started by the [`Spawner`] with its capability bounding set
    /// empty.
    static BOUNDING_EMPTY: Cell<bool> = const { Cell::new(false) };
}

/// Does this thread carry the spawner's filter (a thread the [`Spawner`] started)?
/// An isolated container forks a workload only from such a thread.
pub(super) fn filtered() -> bool {
    FILTERED.with(Cell::get)
}

/// Is this thread's capability bounding set empty (the spawner emptied its own before
/// it started this thread)? Then a workload it forks inherits it empty.
pub(super) fn bounding_empty() -> bool {
    BOUNDING_EMPTY.with(Cell::get)
}

/// The thread the connection workers are started from. It attaches the workload
/// policy (all but the `clone3` row, which a fork needs for `CLONE_INTO_CGROUP`) once,
/// at start, and every thread it starts inherits the filter: a child inherits its
/// forking thread's filter for free, while attaching the whole policy costs the kernel
/// about a millisecond per process (it builds the filter's constant-action cache). Each
/// child adds only the tiny `clone3` guard. So a worker forks a run's workload itself,
/// with no hand-off to another thread (two cross-thread wake-ups a run before); and
/// the workers, which parse every request the host sends, are bound by the same
/// denylist (no mount, `setns`, `bpf`, …). The main thread (the orphan reaper), the
/// leader watcher and the accepting thread are not filtered (seccomp without TSYNC is
/// per thread), and fork nothing.
pub(super) struct Spawner {
    jobs: std::sync::mpsc::Sender<Job>,
}

/// Threads to start (name, body), and where to say whether they started.
type Job = (
    Vec<(String, Box<dyn FnOnce() + Send>)>,
    std::sync::mpsc::Sender<io::Result<()>>,
);

impl Spawner {
    /// Start the thread; it says on the receiver when its filter is attached (starts
    /// wait for it anyway: they queue behind it).
    pub(super) fn start(
        filter: seccomp::Filter,
    ) -> io::Result<(Spawner, std::sync::mpsc::Receiver<io::Result<()>>)> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        std::thread::Builder::new()
            .name("spawner".into())
            .spawn(move || {
                // Once here, not in every workload (41 `prctl`s each): the workers and
                // what they fork inherit it. A worker forks nothing that execs with a
                // capability (every workload drops them all), so it needs none of the
                // set either.
                let bounding_empty = exec::drop_bounding_set();
                let installed = filter.install();
                let ok = installed.is_ok();
                let _ = ready_tx.send(installed);
                if !ok {
                    return;
                }
                // One job: the workers, once the supervisor is built.
                if let Ok((threads, reply)) = rx.recv() {
                    let started = threads.into_iter().try_for_each(|(name, body)| {
                        std::thread::Builder::new()
                            .name(name)
                            .spawn(move || {
                                FILTERED.with(|f| f.set(true));
                                BOUNDING_EMPTY.with(|b| b.set(bounding_empty));
                                body()
                            })
                            .map(drop)
                    });
                    let _ = reply.send(started);
                }
            })?;
        Ok((Spawner { jobs: tx }, ready_rx))
    }

    /// Start `threads` under the filter, and wait until they are.
    pub(super) fn start_threads(
        &self,
        threads: Vec<(String, Box<dyn FnOnce() + Send>)>,
    ) -> io::Result<()> {
        let (reply, answer) = std::sync::mpsc::channel();
        self.jobs
            .send((threads, reply))
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        answer
            .recv()
            .map_err(|_| io::Error::other("the spawner thread is gone"))?
    }
}
