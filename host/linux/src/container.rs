//! One container's life on the host: building it (directories, an id range, storage,
//! cgroups and limits, the supervisor's clone, the egress listener), watching it, and
//! tearing it down. Every resource a build acquires is recorded in [`Build`], so a
//! failure at any step undoes exactly what was done (invariant 10: a failed ensure
//! leaves no process, mount, cgroup or lease behind).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rustix::fs::{Mode, OFlags};
use tokio::io::unix::AsyncFd;
use tokio::sync::{OwnedSemaphorePermit, watch};

use stockade_egress::tls::Authority;

use super::cgroup::CgroupDir;
use super::client::{Client, Peer};
use super::idmap::{self, Lease};
use super::limits::ContainerLimits;
use super::storage::{self, Storage};
use super::wiring::{Plan, Wiring};
use super::{
    CALL_TIMEOUT, Inner, LATEST_SCOPE, STOP_DEADLINE, exec, kill, namespaces, netns, protocol,
    snapshot,
};
use stockade_runtime::substrate::{ContainerId, Event, Result, SubstrateError};
use stockade_supervisor::stage;

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

    /// The host side of a container, before its supervisor: directories, an id range,
    /// the storage, the cgroups and their limits. Nothing here depends on a key: a
    /// warm container is prepared before it has one.
    fn prepare(&self, b: &mut Build) -> Result<()> {
        let mk = |p: &Path, mode: u32| {
            std::fs::create_dir(p)
                .and_then(|()| {
                    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
                })
                .map_err(|e| failed("container directory", e))
        };
        mk(&b.dir, 0o700)?;
        mk(&b.dir.join("root"), 0o755)?;
        if self.caps.userns {
            b.lease = Some(
                idmap::lease(&self.cfg.ids)
                    .map_err(|e| failed("leasing an id range", e))?
                    .ok_or_else(|| {
                        SubstrateError::Failed(
                            "every id range of substrate.ids is leased (raise substrate.ids.containers)"
                                .into(),
                        )
                    })?,
            );
        }
        let (root_ids, work_ids) = self.host_ids(b.lease.as_ref());
        let fs = b.dir.join("fs");
        if self.caps.disk {
            b.storage = Some(
                Storage::create(&fs, self.cfg.limits.disk_mib, work_ids, root_ids)
                    .map_err(|e| failed("container storage", e))?,
            );
        } else {
            for sub in [storage::WORKSPACE, storage::ARTIFACTS, storage::TMP] {
                std::fs::create_dir_all(fs.join(sub))
                    .map_err(|e| failed("container storage", e))?;
            }
        }
        if let Some(root) = &self.cgroup_root {
            let cg = root
                .child(&b.id)
                .map_err(|e| failed("container cgroup", e))?;
            if let Some(l) = &b.lease {
                cg.delegate(l.base, l.base)
                    .map_err(|e| failed("delegating the container cgroup", e))?;
            }
            b.cgroup = Some(cg);
        }
        if self.caps.root {
            let v2 = self
                .caps
                .cgroup_root
                .as_ref()
                .map(|p| p.join(&b.id))
                .filter(|_| b.cgroup.is_some());
            b.limits = Some(
                ContainerLimits::create(
                    &self.caps.limits,
                    &self.cfg.limits,
                    &self.root_name,
                    &b.id,
                    b.cgroup.as_ref().zip(v2.as_deref()),
                )
                .map_err(|e| failed("container limits", e))?,
            );
        }
        Ok(())
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

    /// Start the supervisor, its egress listener, and wait until it is ready.
    async fn launch(self: &Arc<Self>, b: &mut Build) -> Result<Up> {
        let dir_fd = OwnedFd::from(
            std::fs::File::open(&b.dir).map_err(|e| failed("container directory", e))?,
        );
        let sock_path = PathBuf::from(format!("/proc/self/fd/{}/sup.sock", dir_fd.as_raw_fd()));
        // Bound here, listened on by the supervisor: SO_PEERCRED then names it.
        let sock = rustix::net::socket_with(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| failed("supervisor socket", e))?;
        rustix::net::bind(
            &sock,
            &rustix::net::SocketAddrUnix::new(&sock_path)
                .map_err(|e| failed("supervisor socket", e))?,
        )
        .map_err(|e| failed("supervisor socket", e))?;
        let (ready_r, ready_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| failed("ready pipe", e))?;

        let isolate = self.caps.namespaces;
        // Without a network namespace the proxy cannot own 3128: take any free port.
        let host_listener = if isolate {
            None
        } else {
            Some(
                std::net::TcpListener::bind("127.0.0.1:0")
                    .map_err(|e| failed("egress listener", e))?,
            )
        };
        let proxy_port = match &host_listener {
            Some(l) => l
                .local_addr()
                .map_err(|e| failed("egress listener", e))?
                .port(),
            None => exec::PROXY_PORT,
        };
        let image = match super::rootfs::Source::from_config(&self.cfg.rootfs) {
            super::rootfs::Source::Image(p) => Some(p),
            super::rootfs::Source::Host => None,
        };
        // A CA only where the container can be made to trust it (its own /etc).
        if isolate && self.upstream_tls.is_some() {
            b.authority = Some(Arc::new(
                Authority::generate(&b.id).map_err(|e| failed("the container's egress CA", e))?,
            ));
        }
        let args = stockade_supervisor::Args {
            id: b.id.clone(),
            kill_mode: self.mode,
            isolate,
            image: image.is_some(),
            proxy_port,
            cgroup: b.cgroup.is_some(),
            ca_pem: b.authority.as_ref().map(|a| a.cert_pem().to_owned()),
        };
        let cs = |s: &[u8]| CString::new(s).map_err(|_| failed("a path", "NUL byte"));
        // argv[0] names no host path (a workload reads /proc/1/cmdline); the binary
        // is exec'd from a descriptor.
        let mut argv = vec![cs(b"stockade-supervisor")?];
        for a in args.to_args() {
            argv.push(cs(a.as_bytes())?);
        }
        let mut fds = vec![(sock, namespaces::SOCK_FD), (ready_w, namespaces::READY_FD)];
        if let Some(cg) = &b.cgroup {
            fds.push((
                cg.try_clone_fd()
                    .map_err(|e| failed("container cgroup", e))?,
                namespaces::CGROUP_FD,
            ));
        }
        let mut open_in_child = Vec::new();
        if isolate {
            open_in_child.push((
                cs(b.dir.join("root").as_os_str().as_bytes())?,
                namespaces::ROOT_FD,
            ));
            open_in_child.push((
                cs(b.dir.join("fs").as_os_str().as_bytes())?,
                namespaces::STORAGE_FD,
            ));
            if let Some(img) = &image {
                open_in_child.push((cs(img.as_os_str().as_bytes())?, namespaces::IMAGE_FD));
            }
        }
        // The storage mount is the host's alone: the spawner's mount namespace, which
        // the clone copies, was made before it (supervisor `namespaces`). The child
        // attaches a detached copy of it where the host has it.
        let mut attach_in_child = Vec::new();
        if isolate && b.storage.is_some() {
            let fs = b.dir.join("fs");
            let tree = rustix::mount::open_tree(
                rustix::fs::CWD,
                &fs,
                rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
                    | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
            )
            .map_err(|e| failed("a detached copy of the container storage", e))?;
            attach_in_child.push((tree, cs(fs.as_os_str().as_bytes())?));
        }
        let exe = rustix::fs::open(
            &self.supervisor_exe,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| failed("the supervisor executable", e))?;
        let req = namespaces::SpawnRequest {
            exe,
            argv,
            envp: vec![cs(
                b"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )?],
            fds,
            open_in_child,
            attach_in_child,
            cgroup: b
                .cgroup
                .as_ref()
                .map(|c| c.try_clone_fd())
                .transpose()
                .map_err(|e| failed("container cgroup", e))?,
            namespaces: isolate,
            id_map: b.lease.as_ref().map(Lease::map_line),
            join: b
                .limits
                .as_ref()
                .map(|l| l.v1_dirs().map(|d| d.join("cgroup.procs")).collect())
                .unwrap_or_default(),
        };
        let spawn_began = Instant::now();
        let spawned = tokio::task::spawn_blocking(move || namespaces::spawn(req))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
            .map_err(|e| failed("starting the supervisor", e))?;
        let pid = spawned.pid;
        let steps = Arc::new(spawned.steps);
        let pidfd = Arc::new(spawned.pidfd);
        b.spawned = Some(pidfd.clone());

        // While the supervisor builds its root: the egress listener in its network
        // namespace.
        let pfd = pidfd.clone();
        let child_steps = steps.clone();
        let listener = tokio::task::spawn_blocking(move || match host_listener {
            Some(l) => Ok(l),
            None => netns::listen_in(pfd.as_raw_fd(), exec::PROXY_PORT).map_err(|e| {
                // A supervisor whose clone child died has no netns to enter: say which
                // step it failed (its step pipe is closed by then: no wait).
                match stage::outcome(&*child_steps) {
                    Ok(Some(step)) => failed("the supervisor did not start", step),
                    _ => failed("egress listener in the container's netns", e),
                }
            }),
        })
        .await
        .map_err(|e| SubstrateError::Failed(e.to_string()))??;
        listener
            .set_nonblocking(true)
            .map_err(|e| failed("egress listener", e))?;

        let (setup_us, degraded) = wait_ready(ready_r, steps).await?;
        for what in &degraded {
            kill::log_supervisor_degradation(&b.id, what);
        }
        let launch_us = spawn_began.elapsed().as_micros() as u64;

        Ok(Up {
            pid,
            pidfd,
            dir_fd,
            sock_path,
            listener,
            setup_us,
            launch_us,
        })
    }

    /// Watch the supervisor's pidfd: reap it when it exits; if nobody asked it to stop,
    /// say so (`Event::Stopped`) and tear the container down.
    fn watch(
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
    pub(super) async fn kill_container(self: &Arc<Self>, c: &Arc<Container>) {
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

    pub(super) fn remove_cgroup(&self, id: &str) {
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
    pub(super) async fn teardown(self: &Arc<Self>, c: &Arc<Container>) {
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
            super::remove_all_but_artifacts(&c2.dir);
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

/// Wait for the supervisor's `ready` line (or its reason, or EOF when it died): the
/// microseconds its set-up took, and the degradations it met starting.
/// Wait for the supervisor's `ready` line. A supervisor gone without one either never
/// ran (its clone child failed a step, read from `steps`: the error names it) or died
/// during its set-up.
async fn wait_ready(ready: OwnedFd, steps: Arc<OwnedFd>) -> Result<(u64, Vec<String>)> {
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = Vec::new();
        let deadline = Instant::now() + CALL_TIMEOUT;
        let mut chunk = [0u8; 512];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(failed("the supervisor", "not ready within 30 s"));
            }
            let timeout = rustix::event::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [rustix::event::PollFd::new(
                &ready,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(failed("ready pipe", e)),
            }
            match rustix::io::read(&ready, &mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(e) => return Err(failed("ready pipe", e)),
            }
            if buf.contains(&b'\n') {
                break;
            }
        }
        let line = String::from_utf8_lossy(&buf).trim().to_string();
        // No line: the pipe closed. Both ends of `steps` are closed by then (at the
        // exec, or with the child), so reading it does not block.
        let failed = if line.is_empty() {
            stage::outcome(&*steps).map_err(|e| failed("the supervisor's step pipe", e))?
        } else {
            None
        };
        Ok((line, failed))
    })
    .await
    .map_err(|e| SubstrateError::Failed(e.to_string()))??;
    match (read.0.as_str(), read.1) {
        (r, _) if r.starts_with("ready") => {
            Ok(protocol::parse_ready(r.trim_start_matches("ready")))
        }
        ("", Some(step)) => Err(failed("the supervisor did not start", step)),
        ("", None) => Err(failed("the supervisor", "exited during set-up")),
        (why, _) => Err(failed(
            "the supervisor could not build the container",
            why.trim_start_matches("error: "),
        )),
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

/// A shared pidfd, for [`AsyncFd`].
struct PidFd(Arc<OwnedFd>);

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
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
