//! The linux substrate: real containers on one machine (DESIGN §4).
//!
//! One module per mechanism: [`cgroup`] (cgroup v2 files), [`kill`] (tree-kill modes and
//! what the machine offers), [`namespaces`] (the supervisor's `clone3`), [`mounts`] (the
//! container's filesystem), [`netns`] (the egress listener inside the container's
//! network namespace), [`supervisor`] (PID 1 and its process API, [`protocol`]),
//! [`client`] (the host's side of it), [`snapshot`] and [`artifacts`].
//! See `docs/LINUX.md`.

pub mod artifacts;
pub mod cgroup;
pub mod client;
pub mod exec;
pub mod kill;
pub mod mounts;
pub mod namespaces;
pub mod netns;
pub mod protocol;
pub mod snapshot;
pub mod supervisor;

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::io::unix::AsyncFd;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, watch};

use crate::config::{Config, EgressConfig, KillMode, SubstrateConfig};
use crate::egress::proxy::{self, DenialSink, Fence, ProxyOptions};
use crate::egress::rules::Grant;
use crate::store::Store;

use self::cgroup::CgroupDir;
use self::client::Client;
pub use self::kill::{Capabilities, capabilities};
use self::protocol::{Request, Response, Spec};

use super::{
    Artifact, Command, ContainerId, Denial, Event, ProcessInfo, Result, RunResult, Substrate,
    SubstrateError,
};

/// How long a supervisor may take to come up (mounts) or to answer a plain call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stop waits for the container's processes to be gone.
const STOP_DEADLINE: Duration = Duration::from_secs(10);
/// Where container records live in the store.
const LATEST_SCOPE: &str = "linux.latest-container";

/// Why the linux substrate cannot start.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// A directory or cgroup could not be prepared.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The supervisor executable is missing.
    #[error("supervisor executable {0} does not exist")]
    NoSupervisor(PathBuf),
}

fn io_ctx(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LinuxError {
    let what = what.into();
    move |source| LinuxError::Io { what, source }
}

/// One live container.
struct Container {
    id: ContainerId,
    key: String,
    dir: PathBuf,
    /// Keeps `/proc/self/fd/N/sup.sock` valid (socket paths are limited to 108 bytes;
    /// the data directory is not).
    _dir_fd: OwnedFd,
    pid: i32,
    pidfd: Arc<OwnedFd>,
    client: Client,
    fence: Fence,
    proxy: Mutex<Option<tokio::task::JoinHandle<()>>>,
    last_call: Mutex<Instant>,
    stopping: AtomicBool,
    torn_down: AtomicBool,
    exited: watch::Receiver<bool>,
    ticket: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Container {
    fn touch(&self) {
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

struct Inner {
    cfg: SubstrateConfig,
    egress: EgressConfig,
    caps: Capabilities,
    mode: KillMode,
    data_dir: PathBuf,
    cgroup_root: Option<CgroupDir>,
    store: Arc<Store>,
    supervisor_exe: PathBuf,
    tickets: Arc<Semaphore>,
    containers: Mutex<HashMap<ContainerId, Arc<Container>>>,
    keys: Mutex<HashMap<String, ContainerId>>,
    key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    events: broadcast::Sender<Event>,
}

/// The linux substrate.
#[derive(Clone)]
pub struct Linux {
    inner: Arc<Inner>,
}

impl Linux {
    /// Probe the machine, log every degradation, sweep what a previous host left
    /// behind (container cgroups and directories), and get ready. Must be called inside
    /// a tokio runtime.
    pub async fn new(
        cfg: &Config,
        store: Arc<Store>,
        supervisor_exe: PathBuf,
    ) -> std::result::Result<Linux, LinuxError> {
        if !supervisor_exe.is_file() {
            return Err(LinuxError::NoSupervisor(supervisor_exe));
        }
        let caps = Capabilities::detect(&cfg.substrate);
        caps.log();
        let mode = caps.kill_mode;
        let data_dir = cfg.substrate.data_dir.clone();
        std::fs::create_dir_all(data_dir.join("containers"))
            .map_err(io_ctx("creating the data directory"))?;
        let data_dir = data_dir
            .canonicalize()
            .map_err(io_ctx("resolving the data directory"))?;
        let cgroup_root = match (&caps.cgroup_root, mode) {
            (Some(p), KillMode::Cgroup) => Some(
                CgroupDir::open(p, true)
                    .map_err(io_ctx(format!("creating cgroup {}", p.display())))?,
            ),
            _ => None,
        };
        tracing::info!(
            target: "stockade::substrate",
            kill_mode = kill::mode_arg(mode),
            namespaces = caps.namespaces,
            cgroup_root = ?caps.cgroup_root,
            "linux substrate ready"
        );
        let inner = Arc::new(Inner {
            cfg: cfg.substrate.clone(),
            egress: cfg.egress.clone(),
            caps,
            mode,
            data_dir,
            cgroup_root,
            store,
            supervisor_exe,
            tickets: Arc::new(Semaphore::new(cfg.substrate.ceiling as usize)),
            containers: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
            key_locks: Mutex::new(HashMap::new()),
            events: broadcast::channel(64).0,
        });
        inner.sweep();
        Ok(Linux { inner })
    }

    /// What the machine offers and what this substrate uses.
    pub fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// The supervisor's pid in the host's PID namespace (diagnostics and tests).
    pub fn supervisor_pid(&self, container: &str) -> Option<i32> {
        self.inner.get(container).ok().map(|c| c.pid)
    }

    /// The container's cgroup, if it has one.
    pub fn container_cgroup(&self, container: &str) -> Option<PathBuf> {
        Some(self.inner.caps.cgroup_root.as_ref()?.join(container))
            .filter(|_| self.inner.cgroup_root.is_some())
    }
}

impl Inner {
    /// The status path is hot: in cgroup mode a tree whose leaf cgroup is populated is
    /// running, and the host reads that itself, without a supervisor round trip. An
    /// empty or missing leaf (exited, killed, never started here) needs the
    /// supervisor's answer: the exit code, or not tracked.
    fn populated_leaf(&self, container: &str, id: &str) -> bool {
        let uuid_shaped = id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        if self.mode != KillMode::Cgroup || !uuid_shaped {
            return false;
        }
        let Some(root) = &self.cgroup_root else {
            return false;
        };
        root.open_child(container)
            .and_then(|c| c.open_child(id))
            .and_then(|leaf| leaf.populated())
            .unwrap_or(false)
    }

    fn get(&self, container: &str) -> Result<Arc<Container>> {
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(container)
            .cloned()
            .ok_or_else(|| SubstrateError::Unreachable(format!("no live container {container}")))
    }

    fn live(&self) -> Vec<Arc<Container>> {
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn containers_dir(&self) -> PathBuf {
        self.data_dir.join("containers")
    }

    fn latest(&self, key: &str) -> Option<String> {
        self.store.get(LATEST_SCOPE, key).ok().flatten()
    }

    /// After a host crash: kill and remove every container cgroup under the root, and
    /// every container directory except the artifacts of each key's latest container.
    fn sweep(&self) {
        if let Some(root) = &self.cgroup_root {
            for name in root.children().unwrap_or_default() {
                match root.destroy_child(&name, Instant::now() + STOP_DEADLINE) {
                    Ok(n) => {
                        tracing::warn!(target: "stockade::substrate", cgroup = name, killed = n, "swept a leftover container cgroup")
                    }
                    Err(e) => {
                        tracing::warn!(target: "stockade::substrate", cgroup = name, error = %e, "cannot sweep a leftover container cgroup")
                    }
                }
            }
        }
        let keep: std::collections::HashSet<String> = self
            .store
            .list(LATEST_SCOPE, "")
            .unwrap_or_default()
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        let Ok(entries) = std::fs::read_dir(self.containers_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                remove_all_but_artifacts(&entry.path());
            } else {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    fn key_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.key_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    async fn admit(&self) -> Result<OwnedSemaphorePermit> {
        let wait = Duration::from_millis(self.cfg.admission_timeout_ms);
        if wait.is_zero() {
            return self
                .tickets
                .clone()
                .try_acquire_owned()
                .map_err(|_| SubstrateError::OverCapacity);
        }
        match tokio::time::timeout(wait, self.tickets.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(SubstrateError::OverCapacity),
        }
    }

    async fn create(
        self: &Arc<Self>,
        key: &str,
        ticket: OwnedSemaphorePermit,
    ) -> Result<Arc<Container>> {
        let failed = |what: &str, e: std::io::Error| SubstrateError::Failed(format!("{what}: {e}"));
        let id = uuid::Uuid::new_v4().to_string();
        let dir = self.containers_dir().join(&id);
        // The key's previous container's artifacts are replaced by this one's.
        if let Some(prev) = self.latest(key)
            && artifacts::valid_name(&prev)
            && !self
                .containers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&prev)
        {
            let _ = std::fs::remove_dir_all(self.containers_dir().join(prev));
        }
        for sub in ["workspace", "artifacts", "root"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| failed("container directory", e))?;
        }
        let _ = std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700));
        let snap = snapshot::path(&self.data_dir, key);
        let ws = dir.join("workspace");
        tokio::task::spawn_blocking(move || snapshot::restore(&snap, &ws))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
            .map_err(|e| failed("restoring the snapshot", e))?;

        let built = self.start_supervisor(&id, &dir).await;
        let (spawned, dir_fd, listener) = match built {
            Ok(b) => b,
            Err(e) => {
                self.remove_cgroup(&id);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let pidfd = Arc::new(spawned.pidfd);
        let (exited_tx, exited_rx) = watch::channel(false);
        let fence = Fence::new(key, &id);
        let sink: Arc<dyn DenialSink> = self.store.clone();
        let proxy = proxy::serve(
            listener,
            fence.clone(),
            ProxyOptions {
                allow_private_targets: self.egress.allow_private_targets,
            },
            sink,
        );
        let c = Arc::new(Container {
            id: id.clone(),
            key: key.to_string(),
            client: Client::new(PathBuf::from(format!(
                "/proc/self/fd/{}/sup.sock",
                dir_fd.as_raw_fd()
            ))),
            dir,
            _dir_fd: dir_fd,
            pid: spawned.pid,
            pidfd: pidfd.clone(),
            fence,
            proxy: Mutex::new(Some(proxy)),
            last_call: Mutex::new(Instant::now()),
            stopping: AtomicBool::new(false),
            torn_down: AtomicBool::new(false),
            exited: exited_rx,
            ticket: Mutex::new(Some(ticket)),
        });
        self.watch(c.clone(), pidfd, exited_tx);
        // Ready when it answers: its mounts are done and it serves.
        match c.client.call(&Request::Ping, CALL_TIMEOUT).await {
            Ok(Response::Pong) => {}
            other => {
                c.stopping.store(true, Ordering::SeqCst);
                self.kill_container(&c).await;
                return Err(SubstrateError::Failed(format!(
                    "the supervisor did not come up: {other:?}"
                )));
            }
        }
        let _ = self.store.put(LATEST_SCOPE, key, &id);
        tracing::info!(target: "stockade::substrate", key, container = id, pid = spawned.pid, "container started");
        Ok(c)
    }

    async fn start_supervisor(
        &self,
        id: &str,
        dir: &Path,
    ) -> Result<(namespaces::Spawned, OwnedFd, std::net::TcpListener)> {
        let failed = |what: &str, e: std::io::Error| SubstrateError::Failed(format!("{what}: {e}"));
        let dir_fd =
            OwnedFd::from(std::fs::File::open(dir).map_err(|e| failed("container directory", e))?);
        let sock_path = format!("/proc/self/fd/{}/sup.sock", dir_fd.as_raw_fd());
        let sock = std::os::unix::net::UnixListener::bind(&sock_path)
            .map_err(|e| failed("supervisor socket", e))?;
        let cgroup = match &self.cgroup_root {
            Some(root) => Some(OwnedFd::from(
                root.child(id)
                    .map_err(|e| failed("container cgroup", e))?
                    .open_file(".", false)
                    .map_err(|e| failed("container cgroup", e))?,
            )),
            None => None,
        };
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
        let args = supervisor::Args {
            dir: dir.to_path_buf(),
            data_dir: self.data_dir.clone(),
            id: id.to_string(),
            kill_mode: self.mode,
            isolate,
            sock_fd: namespaces::SOCK_FD,
            cgroup_fd: cgroup.as_ref().map(|_| namespaces::CGROUP_FD),
            proxy_port,
        };
        let cs =
            |s: &[u8]| CString::new(s).map_err(|_| SubstrateError::Failed("NUL in a path".into()));
        let mut argv = vec![
            cs(self.supervisor_exe.as_os_str().as_bytes())?,
            cs(b"__supervisor")?,
        ];
        for a in args.to_args() {
            argv.push(cs(a.as_bytes())?);
        }
        let req = namespaces::SpawnRequest {
            exe: cs(self.supervisor_exe.as_os_str().as_bytes())?,
            argv,
            envp: vec![cs(
                b"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )?],
            sock: OwnedFd::from(sock),
            cgroup,
            namespaces: isolate,
        };
        let spawned = tokio::task::spawn_blocking(move || namespaces::spawn(req))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
            .map_err(|e| failed("starting the supervisor", e))?;
        // The host's copy of the listening socket was moved into the request and is
        // closed now: if the supervisor dies during set-up, connecting fails at once.
        let listener = match host_listener {
            Some(l) => Ok(l),
            None => netns::listen_in(spawned.pidfd.as_raw_fd(), exec::PROXY_PORT),
        };
        match listener {
            Ok(l) => {
                l.set_nonblocking(true)
                    .map_err(|e| failed("egress listener", e))?;
                Ok((spawned, dir_fd, l))
            }
            Err(e) => {
                let _ = namespaces::kill_pidfd(spawned.pidfd.as_raw_fd());
                let pidfd = spawned.pidfd;
                let _ = tokio::task::spawn_blocking(move || wait_reaped(&pidfd)).await;
                Err(failed("egress listener in the container's netns", e))
            }
        }
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
            let fd = pidfd.as_raw_fd();
            // SAFETY: the pidfd stays open (the Arc) for as long as the AsyncFd lives.
            let registered = unsafe {
                AsyncFd::register_with_interest(PidFd(pidfd.clone()), tokio::io::Interest::READABLE)
            };
            if let Ok(afd) = registered {
                while let Ok(mut g) = afd.readable().await {
                    if matches!(namespaces::try_reap(fd), Ok(Some(_)) | Err(_)) {
                        break;
                    }
                    g.clear_ready();
                }
            } else {
                let p = pidfd.clone();
                let _ = tokio::task::spawn_blocking(move || wait_reaped(&p)).await;
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
    async fn kill_container(self: &Arc<Self>, c: &Arc<Container>) {
        c.stopping.store(true, Ordering::SeqCst);
        if let Some(root) = &self.cgroup_root
            && let Ok(cg) = root.open_child(&c.id)
        {
            let _ = cg.kill();
        }
        // PID 1 dying takes its whole PID namespace with it.
        let _ = namespaces::kill_pidfd(c.pidfd.as_raw_fd());
        let mut exited = c.exited.clone();
        let _ = tokio::time::timeout(STOP_DEADLINE, exited.wait_for(|e| *e)).await;
        self.teardown(c).await;
    }

    fn remove_cgroup(&self, id: &str) {
        if let Some(root) = &self.cgroup_root
            && let Err(e) = root.destroy_child(id, Instant::now() + STOP_DEADLINE)
        {
            tracing::warn!(target: "stockade::substrate", container = id, error = %e, "container cgroup not removed");
        }
    }

    /// Forget the container: its cgroup, its proxy, its ticket, its directories (all but
    /// `artifacts`, kept until the key's next container). Runs once.
    async fn teardown(self: &Arc<Self>, c: &Arc<Container>) {
        if c.torn_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = self.clone();
        let id = c.id.clone();
        let dir = c.dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            inner.remove_cgroup(&id);
            remove_all_but_artifacts(&dir);
        })
        .await;
        if let Some(p) = c.proxy.lock().unwrap_or_else(|p| p.into_inner()).take() {
            p.abort();
        }
        c.fence.revoke();
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&c.id);
        {
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            if keys.get(&c.key) == Some(&c.id) {
                keys.remove(&c.key);
            }
        }
        drop(c.ticket.lock().unwrap_or_else(|p| p.into_inner()).take());
        tracing::info!(target: "stockade::substrate", key = c.key, container = c.id, "container stopped");
    }

    async fn call(&self, container: &str, req: Request, timeout: Duration) -> Result<Response> {
        let c = self.get(container)?;
        c.touch();
        let r = c.client.call(&req, timeout).await;
        c.touch();
        match r? {
            Response::Invalid { message } => Err(SubstrateError::Invalid(message)),
            Response::Failed { message } => Err(SubstrateError::Failed(message)),
            other => Ok(other),
        }
    }
}

/// A shared pidfd, for [`AsyncFd`].
struct PidFd(Arc<OwnedFd>);

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

fn unexpected(r: Response) -> SubstrateError {
    SubstrateError::Failed(format!("unexpected answer from the supervisor: {r:?}"))
}

fn wait_reaped(pidfd: &OwnedFd) {
    let fd = pidfd.as_raw_fd();
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a pidfd polls readable when the process exits.
    unsafe { libc::poll(&mut p, 1, STOP_DEADLINE.as_millis() as i32) };
    let _ = namespaces::try_reap(fd);
}

fn remove_all_but_artifacts(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name() == "artifacts" {
            continue;
        }
        let p = e.path();
        let is_dir = std::fs::symlink_metadata(&p)
            .map(|m| m.is_dir())
            .unwrap_or(false);
        let _ = if is_dir {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}

fn spec(cmd: Command) -> Spec {
    Spec {
        argv: cmd.argv,
        cwd: cmd.cwd,
        env: cmd.env,
    }
}

#[async_trait]
impl Substrate for Linux {
    fn kind(&self) -> &'static str {
        "linux"
    }

    async fn ensure(&self, key: &str) -> Result<ContainerId> {
        let inner = &self.inner;
        let lock = inner.key_lock(key);
        let _guard = lock.lock().await;
        let existing = inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned();
        if let Some(id) = existing
            && let Ok(c) = inner.get(&id)
            && !*c.exited.borrow()
        {
            c.touch();
            return Ok(id);
        }
        let ticket = inner.admit().await?;
        let c = inner.create(key, ticket).await?;
        inner
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(c.id.clone(), c.clone());
        inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), c.id.clone());
        if *c.exited.borrow() {
            inner.teardown(&c).await;
            return Err(SubstrateError::Unreachable(format!(
                "container {} stopped at once",
                c.id
            )));
        }
        Ok(c.id.clone())
    }

    async fn current(&self, key: &str) -> Result<Option<ContainerId>> {
        Ok(self
            .inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned())
    }

    async fn apply_grant(&self, container: &str, fence: &str, grant: Grant) -> Result<()> {
        let c = self.inner.get(container)?;
        c.touch();
        c.fence.apply(fence, grant);
        Ok(())
    }

    async fn revoke_grant(&self, container: &str) -> Result<u32> {
        let c = self.inner.get(container)?;
        c.touch();
        Ok(c.fence.revoke())
    }

    async fn run(&self, container: &str, cmd: Command, timeout: Duration) -> Result<RunResult> {
        let req = Request::Run {
            spec: spec(cmd),
            timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
            output_limit: self.inner.cfg.output_limit,
        };
        match self
            .inner
            .call(container, req, timeout + CALL_TIMEOUT)
            .await?
        {
            Response::Ran { result } => Ok(result),
            r => Err(unexpected(r)),
        }
    }

    async fn start_process(&self, container: &str, cmd: Command) -> Result<String> {
        match self
            .inner
            .call(container, Request::Start { spec: spec(cmd) }, CALL_TIMEOUT)
            .await?
        {
            Response::Started { id } => Ok(id),
            r => Err(unexpected(r)),
        }
    }

    async fn list_processes(&self, container: &str) -> Result<Vec<ProcessInfo>> {
        match self
            .inner
            .call(container, Request::List, CALL_TIMEOUT)
            .await?
        {
            Response::Processes { processes } => Ok(processes),
            r => Err(unexpected(r)),
        }
    }

    async fn process_status(&self, container: &str, id: &str) -> Result<Option<ProcessInfo>> {
        let c = self.inner.get(container)?;
        if self.inner.populated_leaf(container, id) {
            c.touch();
            return Ok(Some(ProcessInfo {
                id: id.to_string(),
                running: true,
                exit_code: None,
            }));
        }
        match self
            .inner
            .call(container, Request::Status { id: id.into() }, CALL_TIMEOUT)
            .await?
        {
            Response::Process { process } => Ok(process),
            r => Err(unexpected(r)),
        }
    }

    async fn kill_process(&self, container: &str, id: &str) -> Result<u32> {
        match self
            .inner
            .call(container, Request::Kill { id: id.into() }, CALL_TIMEOUT)
            .await?
        {
            Response::Killed { count } => Ok(count),
            r => Err(unexpected(r)),
        }
    }

    async fn kill_all(&self, container: &str) -> Result<u32> {
        match self
            .inner
            .call(container, Request::KillAll, CALL_TIMEOUT)
            .await?
        {
            Response::Killed { count } => Ok(count),
            r => Err(unexpected(r)),
        }
    }

    async fn snapshot(&self, container: &str) -> Result<()> {
        let c = self.inner.get(container)?;
        c.touch();
        let ws = c.dir.join("workspace");
        let dest = snapshot::path(&self.inner.data_dir, &c.key);
        tokio::task::spawn_blocking(move || snapshot::write(&ws, &dest))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
            .map_err(|e| SubstrateError::Failed(format!("snapshot: {e}")))
    }

    async fn stop(&self, container: &str) -> Result<()> {
        let c = self.inner.get(container)?;
        self.inner.kill_container(&c).await;
        Ok(())
    }

    async fn denials(&self, key: &str) -> Result<Vec<Denial>> {
        self.inner
            .store
            .denials(key)
            .map_err(|e| SubstrateError::Failed(e.to_string()))
    }

    async fn list_artifacts(&self, key: &str) -> Result<Vec<Artifact>> {
        let Some(id) = self.inner.latest(key) else {
            return Ok(Vec::new());
        };
        let dir = self.inner.containers_dir().join(id).join("artifacts");
        tokio::task::spawn_blocking(move || artifacts::list(&dir))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
            .map_err(|e| SubstrateError::Failed(format!("artifacts: {e}")))
    }

    async fn read_artifact(
        &self,
        key: &str,
        name: &str,
        offset: u64,
        length: u32,
    ) -> Result<Vec<u8>> {
        if !artifacts::valid_name(name) {
            return Err(SubstrateError::Invalid(format!("artifact name {name:?}")));
        }
        let Some(id) = self.inner.latest(key) else {
            return Err(SubstrateError::Invalid(format!("no artifact {name:?}")));
        };
        let dir = self.inner.containers_dir().join(id).join("artifacts");
        let name = name.to_string();
        tokio::task::spawn_blocking(move || artifacts::read(&dir, &name, offset, length))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    async fn idle(&self, idle_for: Duration) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.inner.live() {
            let last = *c.last_call.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() < idle_for {
                continue;
            }
            // Asking the supervisor is not a call: it must not reset the clock.
            let busy = match c.client.call(&Request::List, CALL_TIMEOUT).await {
                Ok(Response::Processes { processes }) => processes.iter().any(|p| p.running),
                _ => false,
            };
            if !busy {
                out.push(c.key.clone());
            }
        }
        out.sort();
        out
    }

    fn open_grants(&self) -> Vec<ContainerId> {
        let mut v: Vec<_> = self
            .inner
            .live()
            .into_iter()
            .filter(|c| c.fence.is_open())
            .map(|c| c.id.clone())
            .collect();
        v.sort();
        v
    }

    async fn shutdown(&self) {
        for c in self.inner.live() {
            self.inner.kill_container(&c).await;
        }
    }
}
