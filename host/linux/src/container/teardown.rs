//! A container's end: the watch on its supervisor's pidfd, the kill of everything in
//! it, and the teardown that releases what its build acquired, once.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use stockade_runtime::substrate::Event;

use super::Container;
use crate::{Inner, STOP_DEADLINE, namespaces, storage};

impl Inner {
    /// Watch the supervisor's pidfd: reap it when it exits; if nobody asked it to stop,
    /// say so (`Event::Stopped`) and tear the container down.
    pub(super) fn watch(
        self: &Arc<Self>,
        c: Arc<Container>,
        pidfd: Arc<OwnedFd>,
        exited: watch::Sender<bool>,
    ) {
        let inner = self.clone();
        tokio::spawn(async move {
            // SAFETY: the pidfd stays open (the Arc inside PidFd) for as long as the
            // AsyncFd that registered it lives.
            let registered = unsafe {
                AsyncFd::register_with_interest(PidFd(pidfd.clone()), tokio::io::Interest::READABLE)
            };
            match registered {
                Ok(afd) => {
                    while let Ok(mut g) = afd.readable().await {
                        if matches!(namespaces::try_reap(pidfd.as_fd()), Ok(Some(_)) | Err(_)) {
                            break;
                        }
                        g.clear_ready();
                    }
                }
                Err(_) => {
                    let p = pidfd.clone();
                    let _ =
                        tokio::task::spawn_blocking(move || namespaces::reap_blocking(p.as_fd()))
                            .await;
                }
            }
            let _ = exited.send(true);
            if !c.stopping.load(Ordering::SeqCst) {
                tracing::warn!(target: "stockade::substrate", key = c.key, container = c.id, "container stopped on its own");
                inner.teardown(&c).await;
                let _ = inner.events.send(Event::Stopped(c.id.clone()));
            }
        });
    }

    /// Kill everything in the container and wait for the supervisor to be reaped.
    pub(crate) async fn kill_container(self: &Arc<Self>, c: &Arc<Container>) {
        c.stopping.store(true, Ordering::SeqCst);
        // Its preview doors close before anything dies (DESIGN §8).
        self.close_doors(&c.id);
        if let Some(root) = &self.cgroup_root
            && let Ok(cg) = root.open_child(&c.id)
        {
            let _ = cg.kill();
        }
        // PID 1 dying takes its whole PID namespace with it.
        let _ = namespaces::kill_pidfd(c.pidfd.as_fd());
        let mut exited = c.exited.clone();
        let _ = tokio::time::timeout(STOP_DEADLINE, exited.wait_for(|e| *e)).await;
        self.teardown(c).await;
    }

    pub(crate) fn remove_cgroup(&self, id: &str) {
        if let Some(root) = &self.cgroup_root
            && let Err(e) = root.destroy_child(id, Instant::now() + STOP_DEADLINE)
        {
            tracing::warn!(target: "stockade::substrate", container = id, error = %e, "container cgroup not removed");
        }
    }

    /// Forget the container: its cgroups, its storage (artifacts kept on disk), its
    /// directories, its id range, its proxy, its ticket. Runs once; a caller that
    /// comes while it runs (the container's exit watcher and a kill, or shutdown, at
    /// once) waits for it to finish: a shutdown that returned while another task's
    /// teardown was half done let the process exit with the cgroup left (seen in e2e
    /// `shutdown::sigterm_during_a_fence…` under load: no "container stopped" line).
    pub(crate) async fn teardown(self: &Arc<Self>, c: &Arc<Container>) {
        c.torn_down.get_or_init(|| self.teardown_once(c)).await;
    }

    async fn teardown_once(self: &Arc<Self>, c: &Arc<Container>) {
        self.close_doors(&c.id);
        let inner = self.clone();
        let c2 = c.clone();
        let _ = tokio::task::spawn_blocking(move || {
            inner.remove_cgroup(&c2.id);
            if let Some(l) = &c2.limits
                && let Err(e) = l.destroy(Instant::now() + STOP_DEADLINE)
            {
                tracing::warn!(target: "stockade::substrate", container = c2.id, error = %e, "container limits not removed");
            }
            if let Some(s) = &c2.storage {
                match s.keep_artifacts(&c2.dir.join("artifacts"), inner.cfg.limits.disk_mib << 20) {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(target: "stockade::substrate", container = c2.id, "artifacts past the disk cap (sparse files?) were not kept")
                    }
                    Err(e) => {
                        tracing::warn!(target: "stockade::substrate", container = c2.id, error = %e, "artifacts not kept")
                    }
                }
                if let Err(e) = s.unmount() {
                    tracing::warn!(target: "stockade::substrate", container = c2.id, error = %e, "storage not unmounted");
                }
            } else {
                let _ = std::fs::rename(
                    c2.dir.join("fs").join(storage::ARTIFACTS),
                    c2.dir.join("artifacts"),
                );
            }
            crate::remove_all_but_artifacts(&c2.dir);
            // Every process of the container is dead: its ids may serve another.
            drop(c2.lease.lock().unwrap_or_else(|p| p.into_inner()).take());
        })
        .await;
        c.egress.stop();
        self.registry.remove(c);
        drop(c.ticket.lock().unwrap_or_else(|p| p.into_inner()).take());
        tracing::info!(target: "stockade::substrate", key = c.key, container = c.id, "container stopped");
        // A returned ticket may raise the warm pool's target (it holds at most the
        // floor + the free tickets): the burst that just ended is refilled before the
        // next one comes, not at its first arrival.
        self.refill();
    }
}

/// A shared pidfd, for [`AsyncFd`].
struct PidFd(Arc<OwnedFd>);

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}
