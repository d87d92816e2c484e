//! One container's life on the host: building it (directories, an id range, storage,
//! cgroups and limits, the supervisor's clone, the egress listener), watching it, and
//! tearing it down. Every resource a build acquires is recorded in [`Build`], so a
//! failure at any step undoes exactly what was done (invariant 10: a failed ensure
//! leaves no process, mount, cgroup or lease behind).
//!
//! The steps beside this file: [`prepare`] (the host side), [`launch`] (the supervisor
//! up to its `ready`), [`teardown`] (the watch, the kill, the teardown).

mod launch;
mod prepare;
mod teardown;

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, watch};

use stockade_egress::tls::Authority;

use super::cgroup::CgroupDir;
use super::client::{Client, Peer};
use super::idmap::{self, Lease};
use super::limits::ContainerLimits;
use super::storage::{self, Storage};
use super::wiring::{Plan, Wiring};
use super::{Inner, LATEST_SCOPE, STOP_DEADLINE, namespaces, snapshot};
use stockade_runtime::substrate::{ContainerId, Result, SubstrateError};

/// One live container.
pub(super) struct Container {
    pub(super) id: ContainerId,
    pub(super) key: String,
    pub(super) dir: PathBuf,
    /// Keeps `/proc/self/fd/N/sup.sock` valid (socket paths are limited to 108 bytes;
    /// the data directory is not).
    _dir_fd: OwnedFd,
    pub(super) pid: i32,
    /// The host uid of the container's root (its supervisor).
    pub(super) root_uid: u32,
    pub(super) pidfd: Arc<OwnedFd>,
    pub(super) client: Client,
    /// Its fence and egress proxy.
    pub(super) egress: Wiring,
    pub(super) last_call: Mutex<Instant>,
    pub(super) stopping: AtomicBool,
    /// Set once its teardown finished; a second caller waits on the first.
    torn_down: tokio::sync::OnceCell<()>,
    pub(super) exited: watch::Receiver<bool>,
    ticket: Mutex<Option<OwnedSemaphorePermit>>,
    /// Released only once every process of the container is dead.
    lease: Mutex<Option<Lease>>,
    pub(super) limits: Option<ContainerLimits>,
    pub(super) storage: Option<Storage>,
    /// Whether its supervisor is known to track no tree (`Trees`): then a `kill-all`
    /// has nothing to kill, and is answered here without a round trip.
    pub(super) trees: Trees,
}

/// What the host knows of a supervisor's trees, from the requests it sent: every
/// `start` and `run` is counted before it is sent, and a run's answer that says no tree
/// is tracked any more marks the count it was sent at. The supervisor tracks none as
/// long as no `start` or `run` was sent since: trees come only from those requests,
/// and a tree, once empty and forgotten, does not come back. A run answered while
/// another request was sent after it (a terminal beside an exec) marks nothing.
#[derive(Debug)]
pub(super) struct Trees {
    sent: std::sync::atomic::AtomicU64,
    none_at: std::sync::atomic::AtomicU64,
}

impl Default for Trees {
    fn default() -> Self {
        Trees {
            sent: std::sync::atomic::AtomicU64::new(0),
            // Unknown until a run says: a container's supervisor may have trees the
            // host did not see (one adopted after a host restart).
            none_at: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }
}

impl Trees {
    /// A `start` or `run` is about to be sent: its number.
    pub(super) fn sending(&self) -> u64 {
        self.sent.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The run sent as `at` answered that `trees` are tracked now. Marked only if
    /// nothing was sent after it; one sent later still unmarks it (`none` compares
    /// the mark with the count).
    pub(super) fn answered(&self, at: u64, trees: Option<u32>) {
        if trees == Some(0) && self.sent.load(Ordering::SeqCst) == at {
            self.none_at.store(at, Ordering::SeqCst);
        }
    }

    /// Does the supervisor track no tree (as last said, and nothing sent since)?
    pub(super) fn none(&self) -> bool {
        self.none_at.load(Ordering::SeqCst) == self.sent.load(Ordering::SeqCst)
    }
}

impl Container {
    pub(super) fn touch(&self) {
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Is its supervisor alive? Read from its pidfd (readable once it exited), not
    /// from any connection.
    pub(super) fn alive(&self) -> bool {
        !*self.exited.borrow() && running(&self.pidfd)
    }

    /// The container's `/workspace` on the host.
    pub(super) fn workspace(&self) -> PathBuf {
        self.dir.join("fs").join(storage::WORKSPACE)
    }
}

/// A container built and started that belongs to no key yet (a warm one, or one
/// about to be assigned): what its build acquired, and its running supervisor.
pub(super) struct Built {
    b: Build,
    up: Up,
}

impl Built {
    /// Is its supervisor still alive (read from its pidfd)?
    pub(super) fn alive(&self) -> bool {
        running(&self.up.pidfd)
    }

    /// Its id.
    pub(super) fn id(&self) -> &str {
        &self.b.id
    }
}

/// A started supervisor: how to reach it, and the egress listener in its network
/// namespace (served once the container has a key's fence).
struct Up {
    pid: i32,
    pidfd: Arc<OwnedFd>,
    dir_fd: OwnedFd,
    sock_path: PathBuf,
    listener: std::net::TcpListener,
    setup_us: u64,
    launch_us: u64,
}

/// What a build has acquired so far; [`Build::undo`] releases it in reverse.
pub(super) struct Build {
    id: String,
    dir: PathBuf,
    lease: Option<Lease>,
    storage: Option<Storage>,
    cgroup: Option<CgroupDir>,
    limits: Option<ContainerLimits>,
    spawned: Option<Arc<OwnedFd>>,
    /// The container's egress CA (interception on, namespaces available): its key
    /// stays in this process; the container gets the certificate.
    authority: Option<Arc<Authority>>,
    /// How long the host side took (for the container's log line).
    prepare_us: u64,
}

fn failed(what: &str, e: impl std::fmt::Display) -> SubstrateError {
    SubstrateError::Failed(format!("{what}: {e}"))
}

impl Build {
    fn undo(mut self, inner: &Inner) {
        if let Some(pidfd) = self.spawned.take() {
            let _ = namespaces::kill_pidfd(pidfd.as_fd());
            let _ = namespaces::reap_blocking(pidfd.as_fd());
        }
        inner.remove_cgroup(&self.id);
        if let Some(l) = &self.limits {
            let _ = l.destroy(Instant::now() + STOP_DEADLINE);
        }
        if let Some(s) = &self.storage {
            let _ = s.unmount();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        drop(self.lease.take());
    }
}

impl Inner {
    /// The ids a container's files and processes get on the host: (its root, its
    /// workload user).
    fn host_ids(&self, lease: Option<&Lease>) -> ((u32, u32), (u32, u32)) {
        match lease {
            Some(l) => (
                (l.base, l.base),
                (l.host(idmap::WORKLOAD_ID), l.host(idmap::WORKLOAD_ID)),
            ),
            None if self.caps.namespaces => ((0, 0), (idmap::WORKLOAD_ID, idmap::WORKLOAD_ID)),
            None => {
                let (u, g) = (
                    rustix::process::geteuid().as_raw(),
                    rustix::process::getegid().as_raw(),
                );
                ((u, g), (u, g))
            }
        }
    }

    /// Build and start a container for `key` (no warm one was at hand).
    pub(super) async fn create(
        self: &Arc<Self>,
        key: &str,
        ticket: OwnedSemaphorePermit,
    ) -> Result<Arc<Container>> {
        let built = self.build().await?;
        self.assign(key, built, ticket, false).await
    }

    /// Build and start a container that belongs to no key yet: the host side
    /// ([`Inner::prepare`]), then the supervisor up to its `ready`. A failure undoes
    /// everything.
    pub(super) async fn build(self: &Arc<Self>) -> Result<Built> {
        let id = uuid::Uuid::new_v4().to_string();
        let dir = self.containers_dir().join(&id);
        let mut b = Build {
            id,
            dir,
            lease: None,
            storage: None,
            cgroup: None,
            limits: None,
            spawned: None,
            authority: None,
            prepare_us: 0,
        };
        let inner = self.clone();
        let began = Instant::now();
        let (b2, prepared) = tokio::task::spawn_blocking(move || {
            let r = inner.prepare(&mut b);
            (b, r)
        })
        .await
        .map_err(|e| SubstrateError::Failed(e.to_string()))?;
        let mut b = b2;
        b.prepare_us = began.elapsed().as_micros() as u64;
        let result = match prepared {
            Ok(()) => self.launch(&mut b).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(up) => Ok(Built { b, up }),
            Err(e) => {
                let inner = self.clone();
                let _ = tokio::task::spawn_blocking(move || b.undo(&inner)).await;
                Err(e)
            }
        }
    }

    /// Undo a built container that will not be assigned (it died while warm, or the
    /// substrate is shutting down).
    pub(super) async fn discard(self: &Arc<Self>, built: Built) {
        let inner = self.clone();
        let Built { b, up } = built;
        drop(up);
        let _ = tokio::task::spawn_blocking(move || b.undo(&inner)).await;
    }

    /// Give a built container to `key`: its snapshot restored into `/workspace`, its
    /// fence and egress proxy, its ticket, the key's latest-container record. Before
    /// this returns no process but the supervisor runs in it (the key's lock is held,
    /// so no exec can come), so the restore races nothing.
    pub(super) async fn assign(
        self: &Arc<Self>,
        key: &str,
        built: Built,
        ticket: OwnedSemaphorePermit,
        warm: bool,
    ) -> Result<Arc<Container>> {
        let began = Instant::now();
        self.forget_previous(key);
        let inner = self.clone();
        let k = key.to_string();
        let (built, restored) = tokio::task::spawn_blocking(move || {
            let r = inner.restore(&k, &built.b);
            (built, r)
        })
        .await
        .map_err(|e| SubstrateError::Failed(e.to_string()))?;
        if let Err(e) = restored {
            self.discard(built).await;
            return Err(e);
        }
        let Built { mut b, up } = built;
        let (root_ids, _) = self.host_ids(b.lease.as_ref());
        let (exited_tx, exited_rx) = watch::channel(false);
        let egress = Wiring::start(
            up.listener,
            Plan {
                key,
                container: &b.id,
                supervisor_pid: up.pid,
                cgroup_root: self.cgroup_root.as_ref(),
                authority: b.authority.take(),
                upstream_tls: self.upstream_tls.as_ref(),
                allow_private_targets: self.egress.allow_private_targets,
                sink: self.store.clone(),
                asks: self.asks.clone(),
                cpus: self.cfg.limits.cpus,
            },
        );
        let pid = up.pid;
        let c = Arc::new(Container {
            id: b.id.clone(),
            key: key.to_string(),
            client: Client::new(
                &b.id,
                up.sock_path,
                Peer {
                    pid,
                    uid: root_ids.0,
                },
            ),
            dir: b.dir.clone(),
            _dir_fd: up.dir_fd,
            pid,
            root_uid: root_ids.0,
            pidfd: up.pidfd.clone(),
            egress,
            last_call: Mutex::new(Instant::now()),
            stopping: AtomicBool::new(false),
            trees: Trees::default(),
            torn_down: tokio::sync::OnceCell::new(),
            exited: exited_rx,
            ticket: Mutex::new(Some(ticket)),
            lease: Mutex::new(b.lease.take()),
            limits: b.limits.take(),
            storage: b.storage.take(),
        });
        // From here the container owns what the build acquired.
        b.spawned = None;
        b.cgroup = None;
        self.watch(c.clone(), up.pidfd, exited_tx);
        let _ = self.store.put(LATEST_SCOPE, key, &b.id);
        let assign_us = began.elapsed().as_micros() as u64;
        tracing::info!(target: "stockade::substrate", key, container = b.id, pid, warm, prepare_us = b.prepare_us, launch_us = up.launch_us, supervisor_setup_us = up.setup_us, assign_us, "container started");
        Ok(c)
    }

    /// Restore the key's snapshot, if it has one, into a built container's workspace,
    /// owned by its workload user.
    fn restore(&self, key: &str, b: &Build) -> Result<()> {
        let ws = b.dir.join("fs").join(storage::WORKSPACE);
        let restored = snapshot::restore(&snapshot::path(&self.data_dir, key), &ws)
            .map_err(|e| failed("restoring the snapshot (larger than limits.disk_mib?)", e))?;
        if restored && b.storage.is_some() {
            let (_, work_ids) = self.host_ids(b.lease.as_ref());
            storage::chown_tree(&ws, work_ids.0, work_ids.1)
                .map_err(|e| failed("restoring the snapshot", e))?;
        }
        Ok(())
    }

    /// The key's previous container's directory (its kept artifacts) is replaced by
    /// the new one's.
    fn forget_previous(&self, key: &str) {
        if let Some(prev) = self.latest(key)
            && super::artifacts::valid_name(&prev)
            && !self.registry.contains(&prev)
        {
            let _ = std::fs::remove_dir_all(self.containers_dir().join(prev));
        }
    }
}

/// Is the process behind a pidfd still running? (A pidfd turns readable when it
/// exits.)
fn running(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
}

#[cfg(test)]
mod trees_tests {
    use super::Trees;

    /// Steps: `S` a start/run sent (its number kept), `A(i, n)` the i-th sent run
    /// answered with `n` trees (None: a supervisor that does not say), then whether a
    /// kill-all may be skipped.
    enum Step {
        S,
        A(usize, Option<u32>),
    }

    #[test]
    fn a_kill_all_is_skipped_only_while_nothing_was_sent_since_a_run_said_none() {
        use Step::*;
        let rows: &[(&[Step], bool)] = &[
            (&[], false),
            (&[S], false),
            (&[S, A(0, Some(0))], true),
            (&[S, A(0, Some(1))], false),
            (&[S, A(0, None)], false),
            // Sent after the run: that may have made a tree.
            (&[S, S, A(0, Some(0))], false),
            (&[S, A(0, Some(0)), S], false),
            (&[S, S, A(0, Some(0)), A(1, Some(0))], true),
            (&[S, S, A(1, Some(0)), A(0, Some(0))], true),
            (&[S, S, A(1, Some(0)), A(0, Some(1))], true),
        ];
        for (steps, skip) in rows {
            let t = Trees::default();
            let mut sent = Vec::new();
            for s in *steps {
                match s {
                    S => sent.push(t.sending()),
                    A(i, n) => t.answered(sent[*i], *n),
                }
            }
            assert_eq!(t.none(), *skip, "steps {}", steps.len());
        }
    }
}
