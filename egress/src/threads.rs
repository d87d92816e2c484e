//! The egress proxies' own threads: one key's flood must not slow another key's calls
//! (docs/SECURITY.md, the red team's findings).
//!
//! Every container's proxy (parsing, TLS, upstream sockets, attribution) runs on one
//! runtime of its own, whose threads run at a lower CPU priority (nice
//! [`EGRESS_NICE`]) than the API, the runtime and the fence path. A container that
//! floods its proxy makes the server work on its behalf, outside the container's own
//! CPU limit; here that work takes only the cycles the other keys' calls leave over.
//! The per-container budgets (`egress::budget`) bound how much of it there can be; the
//! priority decides who waits when there is too much.

use std::sync::OnceLock;

/// The niceness of the egress threads (the API's threads keep the process's own).
pub const EGRESS_NICE: i32 = 10;

/// The egress runtime's handle: spawn a proxy under `handle().enter()` and every task
/// it spawns stays on these threads.
pub fn handle() -> tokio::runtime::Handle {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .thread_name("stockade-egress")
                .on_thread_start(lower_priority)
                .enable_all()
                .build()
                .expect("the egress runtime's threads start")
        })
        .handle()
        .clone()
}

/// Lower the calling thread's priority (on Linux a thread has a nice value of its
/// own). A failure leaves the thread at the process's priority: logged, not fatal.
fn lower_priority() {
    let current = rustix::process::getpriority_process(None).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(None, current.max(EGRESS_NICE)) {
        tracing::warn!(target: "stockade::degradation", error = %e, "egress threads run at the API's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_tasks_run_on_lower_priority_threads() {
        let mine = rustix::process::getpriority_process(None).unwrap();
        let nice = handle().block_on(async {
            tokio::spawn(async { rustix::process::getpriority_process(None).unwrap() })
                .await
                .unwrap()
        });
        assert!(nice >= EGRESS_NICE, "an egress task ran at nice {nice}");
        assert_eq!(
            rustix::process::getpriority_process(None).unwrap(),
            mine,
            "the caller's own thread keeps its priority"
        );
    }
}
