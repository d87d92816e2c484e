//! The linux substrate: real containers on one machine (DESIGN §4), each a security
//! boundary (invariant 11, docs/SECURITY.md).
//!
//! One module per mechanism: [`caps`] (what the machine offers), [`gate`] (the ticket
//! gate and the per-key locks), [`registry`] (the live containers), [`container`] (one
//! container's build and teardown), [`sweep`] (what a previous host left), [`cgroup`]
//! (cgroup v2 files), [`limits`] (pids, memory, cpu), [`storage`] (the size-capped
//! disk), [`idmap`] (user-namespace id ranges), [`kill`] (tree-kill modes),
//! [`wiring`] (a container's fence and egress proxy), [`namespaces`] (the
//! supervisor's `clone3`), [`rootfs`] and [`mounts`] (the container's filesystem), [`seccomp`] (the workloads' syscall filter), [`netns`]
//! (the egress listener inside the container's network namespace), [`client`] (the
//! host's side of the supervisor's process API, [`protocol`]), [`snapshot`] and
//! [`artifacts`], [`warm`] (containers built ahead of demand). PID 1 is its own
//! executable, `stockade-supervisor` (the `stockade-supervisor` crate: its server,
//! [`exec`] its fork+exec, and the modules both sides share, re-exported here:
//! [`cgroup`], [`namespaces`], [`mounts`], [`rootfs`], [`storage`], [`seccomp`],
//! [`protocol`], [`handoff`]). See `docs/LINUX.md`.

pub mod artifacts;
pub mod attribution;
pub mod caps;
pub mod client;
mod container;
mod gate;
pub mod idmap;
pub mod kill;
pub mod limits;
pub mod netns;
mod preview;
pub mod pty;
mod registry;
pub mod snapshot;
mod sweep;
pub mod warm;
mod wiring;

// The container's side, and what both sides share, is the supervisor crate's (PID 1 is
// its own executable, `stockade-supervisor`).
/// How many connections a supervisor serves at once ([`client`] keeps fewer idle).
pub use stockade_supervisor::pid1::WORKERS as SUPERVISOR_WORKERS;
pub use stockade_supervisor::{
    cgroup, exec, handoff, mounts, namespaces, protocol, rootfs, seccomp, storage,
};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::broadcast;

use stockade_egress::rules::Grant;
use stockade_egress::secrets::Secrets;
use stockade_runtime::config::{Config, EgressConfig, KillMode, SubstrateConfig};
use stockade_store::Store;

pub use self::caps::{Capabilities, capabilities};
use self::cgroup::CgroupDir;
use self::container::Container;
use self::protocol::{OutStream, Request, Response, Spec};

use stockade_runtime::substrate::{
    Artifact, Command, ContainerId, Denial, Event, FenceCounts, Housekeeping, Output, OutputSink,
    ProcessInfo, Result, RunResult, Substrate, SubstrateError,
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
    #[error(
        "supervisor executable {0} does not exist (substrate.supervisor; `cargo build -p stockade-host --bins` builds stockade-supervisor beside stockade)"
    )]
    NoSupervisor(PathBuf),
    /// The data directory cannot be made private.
    #[error(transparent)]
    DataDir(#[from] stockade_runtime::datadir::DataDirError),
    /// The id pool cannot be used.
    #[error(transparent)]
    Pool(#[from] idmap::PoolError),
    /// Interception's upstream verification cannot be built (a CA file).
    #[error("egress interception: {0}")]
    Tls(#[from] stockade_egress::tls::TlsError),
    /// `substrate.require` names mechanisms this machine lacks.
    #[error(
        "substrate.require names what this machine lacks: {missing:?}; `stockade doctor` says why; remove them from substrate.require to run degraded"
    )]
    Required {
        /// The missing mechanisms.
        missing: Vec<String>,
    },
}

/// The executable `substrate.supervisor` names: `auto` is `stockade-supervisor` in the
/// directory of the running executable (`stockade`, or a test or bench binary's target
/// directory's parent for theirs: they pass their own path to [`Linux::new`]).
pub fn supervisor_exe(cfg: &SubstrateConfig) -> std::result::Result<PathBuf, LinuxError> {
    if cfg.supervisor != "auto" {
        return Ok(PathBuf::from(&cfg.supervisor));
    }
    let exe = std::env::current_exe().map_err(io_ctx("locating the stockade executable"))?;
    Ok(exe.parent().unwrap_or(Path::new("/")).join(SUPERVISOR_EXE))
}

/// The supervisor executable's file name.
pub const SUPERVISOR_EXE: &str = "stockade-supervisor";

fn io_ctx(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LinuxError {
    let what = what.into();
    move |source| LinuxError::Io { what, source }
}

struct Inner {
    cfg: SubstrateConfig,
    /// The containers' parent cgroup's name: the same under every v1 hierarchy.
    root_name: String,
    egress: EgressConfig,
    caps: Capabilities,
    mode: KillMode,
    data_dir: PathBuf,
    cgroup_root: Option<CgroupDir>,
    store: Arc<Store>,
    supervisor_exe: PathBuf,
    gate: gate::Gate,
    registry: registry::Registry,
    events: broadcast::Sender<Event>,
    warm: warm::Warm,
    /// Upstream TLS verification, when interception is on.
    upstream_tls: Option<Arc<rustls::ClientConfig>>,
    /// The values behind the secrets a grant's headers name.
    secrets: Secrets,
    /// The pending egress decisions of every container's `ask` grants (DESIGN §5).
    asks: Arc<stockade_egress::ask::Asks>,
    /// `[preview]`, and the open preview doors (DESIGN §8; `preview.rs`).
    preview: stockade_runtime::preview::PreviewConfig,
    doors: Arc<stockade_runtime::preview::Doors>,
    /// The preview listener is bound (`Linux::serve_previews`): doors can open.
    preview_listening: std::sync::atomic::AtomicBool,
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
        // The thread every container is cloned from, with its own descriptor table:
        // started now, while the host's table is small (its copy is closed at once).
        namespaces::start_spawner().map_err(io_ctx("starting the spawner thread"))?;
        let missing = caps.missing_required(&cfg.substrate.require);
        if !missing.is_empty() {
            return Err(LinuxError::Required { missing });
        }
        if caps.userns {
            idmap::check(
                &cfg.substrate.ids,
                cfg.substrate.ceiling.saturating_add(cfg.substrate.warm),
            )?;
        }
        let mode = caps.kill_mode;
        let data_dir = cfg.substrate.data_dir.clone();
        stockade_runtime::datadir::secure(&data_dir)?;
        let data_dir = data_dir
            .canonicalize()
            .map_err(io_ctx("resolving the data directory"))?;
        for sub in ["containers", "snapshots"] {
            std::fs::create_dir_all(data_dir.join(sub))
                .map_err(io_ctx("creating the data directory"))?;
        }
        stockade_runtime::datadir::secure(&data_dir)?;
        let cgroup_root = match (&caps.cgroup_root, mode) {
            (Some(p), KillMode::Cgroup) => Some(
                CgroupDir::open(p, true)
                    .map_err(io_ctx(format!("creating cgroup {}", p.display())))?,
            ),
            _ => None,
        };
        if let (Some(v2), Some(root)) = (&caps.cgroup_v2, &caps.cgroup_root)
            && cgroup_root.is_some()
        {
            limits::enable_v2(&caps.limits, v2, root)
                .map_err(io_ctx("enabling cgroup v2 controllers"))?;
        }
        let root_name = root_name(caps.cgroup_v2.as_deref(), caps.cgroup_root.as_deref());
        tracing::info!(
            target: "stockade::substrate",
            kill_mode = kill::mode_arg(mode),
            namespaces = caps.namespaces,
            userns = caps.userns,
            seccomp = caps.seccomp,
            limits = ?caps.limits,
            cgroup_root = ?caps.cgroup_root,
            "linux substrate ready"
        );
        let upstream_tls = if cfg.egress.interception {
            Some(stockade_egress::tls::upstream_config(
                &cfg.egress.extra_ca_files,
            )?)
        } else {
            None
        };
        let secrets = Secrets::from_config(store.clone(), &cfg.egress);
        // `Config::validate` refused bounds out of range at start; a config built past
        // it gets the defaults.
        let asks = stockade_egress::ask::Asks::new(cfg.egress.ask_limits().unwrap_or_else(|e| {
            tracing::warn!(target: "stockade::substrate", error = %e, "egress ask bounds: the defaults");
            Default::default()
        }));
        // The egress threads start with the substrate, not with its first container:
        // what they hold for the process's life is there before any container is.
        stockade_egress::threads::handle();
        let doors = Arc::new(stockade_runtime::preview::Doors::new(
            stockade_runtime::preview::Urls {
                authority: cfg.preview.listen.clone(),
                domain: cfg.preview.domain(),
            },
            cfg.preview.bound(),
        ));
        // The gate: the configured ceiling, capped by what this machine can hold.
        let id_ranges = if caps.userns {
            u64::from(
                cfg.substrate
                    .ids
                    .containers
                    .saturating_sub(cfg.substrate.warm),
            )
        } else {
            u64::MAX
        };
        let capacity = gate::capacity(
            cfg.substrate.ceiling,
            &gate::Machine::read(id_ranges),
            &gate::PER_CONTAINER,
        );
        tracing::info!(target: "stockade::substrate", configured = cfg.substrate.ceiling, ceiling = capacity.ceiling, bound_by = capacity.bound_by, "ticket gate");
        let inner = Arc::new(Inner {
            preview: cfg.preview.clone(),
            doors,
            preview_listening: std::sync::atomic::AtomicBool::new(false),
            upstream_tls,
            secrets,
            asks,
            root_name,
            cfg: cfg.substrate.clone(),
            egress: cfg.egress.clone(),
            caps,
            mode,
            data_dir,
            cgroup_root,
            store,
            supervisor_exe,
            gate: gate::Gate::new(
                capacity.ceiling,
                Duration::from_millis(cfg.substrate.admission_timeout_ms),
            ),
            registry: registry::Registry::default(),
            events: broadcast::channel(64).0,
            warm: warm::Warm::new(cfg.substrate.warm),
        });
        inner.sweep();
        inner.refill();
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

    /// The containers' parent directories in the v1 hierarchies this machine's limits
    /// use (tests check nothing is left in them).
    pub fn v1_roots(&self) -> Vec<PathBuf> {
        limits::v1_roots(&self.inner.caps.limits, &self.inner.root_name)
    }

    /// Forget a container's pooled supervisor connections (diagnostics and tests: the
    /// next call connects anew).
    pub fn drop_connections(&self, container: &str) {
        if let Ok(c) = self.inner.get(container) {
            c.client.drop_idle();
        }
    }

    /// Wait until the warm pool holds `substrate.warm` containers and builds no more
    /// (tests and benchmarks measure a cold start against a full pool).
    pub async fn warm_filled(&self, within: Duration) -> bool {
        self.inner.warm_filled(within).await
    }

    /// The warm containers' ids, oldest first (the next new key gets the first).
    pub fn warm_ids(&self) -> Vec<String> {
        self.inner.warm.ids()
    }

    /// The warm pool's state.
    pub fn warm_status(&self) -> warm::WarmStatus {
        *self.inner.warm.watch().borrow()
    }

    /// The host ids of a live container's root and workload user (tests).
    pub fn host_ids(&self, container: &str) -> Option<(u32, u32)> {
        let c = self.inner.get(container).ok()?;
        Some((c.root_uid, c.root_uid + idmap::WORKLOAD_ID))
    }
}

/// The name of the containers' parent cgroup, relative to the v2 mount (the same
/// path under every v1 hierarchy).
fn root_name(v2: Option<&Path>, root: Option<&Path>) -> String {
    match (v2, root) {
        (Some(v2), Some(root)) => match root.strip_prefix(v2) {
            Ok(rel) if !rel.as_os_str().is_empty() => rel.to_string_lossy().into_owned(),
            _ => root
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "stockade".into()),
        },
        (_, Some(root)) => root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "stockade".into()),
        _ => "stockade".into(),
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
        root.child_populated(&format!("{container}/{id}"))
            .unwrap_or(false)
    }

    fn get(&self, container: &str) -> Result<Arc<Container>> {
        self.registry.get(container)
    }

    fn live(&self) -> Vec<Arc<Container>> {
        self.registry.live()
    }

    fn containers_dir(&self) -> PathBuf {
        self.data_dir.join("containers")
    }

    /// Where a container's `/artifacts` is on the host: its storage while it lives,
    /// the copy kept on disk after.
    fn artifacts_dir(&self, id: &str) -> PathBuf {
        let dir = self.containers_dir().join(id);
        if self.get(id).is_ok() {
            dir.join("fs").join(storage::ARTIFACTS)
        } else {
            dir.join("artifacts")
        }
    }

    fn latest(&self, key: &str) -> Option<String> {
        self.store.get(LATEST_SCOPE, key).ok().flatten()
    }

    async fn call(&self, container: &str, req: Request, timeout: Duration) -> Result<Response> {
        self.call_with(container, req, None, timeout, |_| {}).await
    }

    /// [`Inner::call`], with a descriptor sent along (a run's stdin pipe) and a
    /// streaming run's output frames handed to `on_output`.
    async fn call_with(
        &self,
        container: &str,
        req: Request,
        fd: Option<std::os::fd::OwnedFd>,
        timeout: Duration,
        on_output: impl FnMut(Response) + Send,
    ) -> Result<Response> {
        let c = self.get(container)?;
        c.touch();
        let sent =
            matches!(req, Request::Start { .. } | Request::Run { .. }).then(|| c.trees.sending());
        let r = c.client.call_with(&req, fd, timeout, on_output).await;
        c.touch();
        if let (Some(at), Ok(Response::Ran { trees, .. })) = (sent, &r) {
            c.trees.answered(at, *trees);
        }
        // "Gone" is decided from the container's own state, never from a failed
        // request: a slow or broken connection to a living supervisor is an error the
        // caller sees (the guest would otherwise clear the records of a container that
        // still runs, and a stop would answer success having killed nothing).
        let r = match r {
            Err(SubstrateError::Unreachable(why)) if c.alive() => Err(SubstrateError::Failed(
                format!("{why} (the container is alive: not gone)"),
            )),
            r => r,
        };
        match r? {
            Response::Invalid { message } => Err(SubstrateError::Invalid(message)),
            Response::Failed { message } => Err(SubstrateError::Failed(message)),
            other => Ok(other),
        }
    }

    /// A fenced run, its output streamed to `sink` if there is one; the limits it
    /// reached are read from the container's counters around it.
    async fn run(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        sink: Option<OutputSink>,
    ) -> Result<RunResult> {
        let c = self.get(container)?;
        // The fenced run's tree gets an id the fence knows: the proxy adds credentials
        // only to connections that tree's processes hold.
        let stream = cmd.stdin_stream.as_ref().and_then(|s| s.take());
        let mut spec = spec(cmd);
        spec.tree = c.egress.fence.begin_run();
        let tree = spec.tree.clone();
        // A streamed stdin (an upload) goes as a pipe: its read end to the supervisor
        // with the request, its write end fed here from the stream, chunk by chunk.
        let (stdin_fd, feed) = match stream {
            Some(chunks) => {
                let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                    .map_err(|e| SubstrateError::Failed(format!("stdin pipe: {e}")))?;
                spec.stdin_fd = true;
                (Some(r), Some(feed_stdin(w, chunks)?))
            }
            None => (None, None),
        };
        let req = Request::Run {
            spec,
            timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
            output_limit: self.cfg.output_limit,
            stream: sink.is_some(),
        };
        let before = c.limits.as_ref().map(|l| l.counters()).unwrap_or_default();
        let on_output = move |frame: Response| {
            if let (Some(sink), Response::Output { stream, data }) = (&sink, frame) {
                let _ = sink.send(match stream {
                    OutStream::Stdout => Output::Stdout(data),
                    OutStream::Stderr => Output::Stderr(data),
                });
            }
        };
        let answer = self
            .call_with(container, req, stdin_fd, timeout + CALL_TIMEOUT, on_output)
            .await;
        if let Some(feed) = feed {
            // The run is over: whatever its stdin had left is not for it.
            feed.abort();
        }
        let mut result = match answer? {
            Response::Ran { result, kept, .. } => {
                end_run(&c, tree.as_deref(), kept);
                result
            }
            r => return Err(unexpected(r)),
        };
        let after = c.limits.as_ref().map(|l| l.counters()).unwrap_or_default();
        let full = c.storage.as_ref().is_some_and(|s| s.full());
        result.limits = limits::limits_hit(before, after, full);
        if !result.limits.is_empty() {
            tracing::info!(target: "stockade::substrate", container, limits = ?result.limits, "a run reached the container's limits");
        }
        Ok(result)
    }
}

/// A fenced run's answer came: its tree id goes back to the fence if the supervisor
/// kept the run's leaf (the tree ended empty), so the next run starts there.
fn end_run(c: &Container, tree: Option<&str>, kept: bool) {
    if let (Some(tree), true) = (tree, kept) {
        c.egress.fence.end_run(tree);
    }
}

/// The supervisor's record of a tracked process as the contract's.
fn process_info(p: stockade_supervisor::ProcessInfo) -> ProcessInfo {
    ProcessInfo {
        id: p.id,
        running: p.running,
        exit_code: p.exit_code,
    }
}

fn unexpected(r: Response) -> SubstrateError {
    SubstrateError::Failed(format!("unexpected answer from the supervisor: {r:?}"))
}

pub(crate) fn remove_all_but_artifacts(dir: &Path) {
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
        stdin: cmd.stdin,
        tree: None,
        stdin_fd: false,
        pty: false,
    }
}

/// Write a streamed stdin's chunks into the pipe `w`, then close it (the end of
/// file); a reader that closed its end ends the copy (EPIPE: the rest is dropped,
/// and the stream's sender sees its receiver gone).
fn feed_stdin(
    w: std::os::fd::OwnedFd,
    mut chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>,
) -> Result<tokio::task::JoinHandle<()>> {
    use tokio::io::AsyncWriteExt as _;
    let mut pipe = tokio::net::unix::pipe::Sender::from_owned_fd(w)
        .map_err(|e| SubstrateError::Failed(format!("stdin pipe: {e}")))?;
    Ok(tokio::spawn(async move {
        while let Some(chunk) = chunks.recv().await {
            if pipe.write_all(&chunk).await.is_err() {
                return;
            }
        }
    }))
}

#[async_trait]
impl Substrate for Linux {
    async fn ensure(&self, key: &str) -> Result<ContainerId> {
        let inner = &self.inner;
        let lock = inner.gate.key_lock(key);
        let _guard = lock.lock().await;
        let existing = inner.registry.of_key(key);
        if let Some(id) = existing
            && let Ok(c) = inner.get(&id)
            && !*c.exited.borrow()
        {
            c.touch();
            return Ok(id);
        }
        let ticket = inner.gate.admit().await?;
        let c = match inner.take_warm().await {
            Some(built) => inner.assign(key, built, ticket, true).await?,
            None => inner.create(key, ticket).await?,
        };
        inner.registry.insert(&c);
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
        Ok(self.inner.registry.of_key(key))
    }

    async fn apply_grant(&self, container: &str, fence: &str, grant: Grant) -> Result<()> {
        let c = self.inner.get(container)?;
        c.touch();
        // Defense in depth (DESIGN §5; the guest's check is the one that decides): every
        // credential rule sits inside its secret's binding, or the fence does not open (the
        // API and the guest refused it first).
        stockade_grammar::binding::grant_within(&grant, |name| self.inner.secrets.binding(name))
            .map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        // The values of the secrets the rules name, read now: a fence whose secret is
        // not set does not open (a typed error naming it, never a value).
        let secrets = self
            .inner
            .secrets
            .resolve(&grant.secret_names())
            .map_err(SubstrateError::Invalid)?;
        c.egress.fence.apply_with_secrets(fence, grant, secrets);
        Ok(())
    }

    async fn revoke_grant(&self, container: &str) -> Result<FenceCounts> {
        let c = self.inner.get(container)?;
        c.touch();
        Ok(c.egress.fence.revoke_counts())
    }

    async fn run(&self, container: &str, cmd: Command, timeout: Duration) -> Result<RunResult> {
        self.inner.run(container, cmd, timeout, None).await
    }

    async fn run_streaming(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        sink: OutputSink,
    ) -> Result<RunResult> {
        self.inner.run(container, cmd, timeout, Some(sink)).await
    }

    async fn run_pty(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        session: stockade_runtime::substrate::pty::Session,
    ) -> Result<RunResult> {
        self.inner.run_pty(container, cmd, timeout, session).await
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
            Response::Processes { processes } => {
                Ok(processes.into_iter().map(process_info).collect())
            }
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
            Response::Process { process } => Ok(process.map(process_info)),
            r => Err(unexpected(r)),
        }
    }

    async fn kill_process(&self, container: &str, id: &str) -> Result<u32> {
        match self
            .inner
            .call(container, Request::Kill { id: id.into() }, CALL_TIMEOUT)
            .await?
        {
            Response::Killed { count, .. } => Ok(count),
            r => Err(unexpected(r)),
        }
    }

    async fn kill_all(&self, container: &str) -> Result<u32> {
        // The fence's teardown after a run whose answer said the supervisor tracks no
        // tree (its own was empty and forgotten), nothing started since: nothing to
        // kill, and no round trip (`container::Trees`).
        if self.inner.get(container)?.trees.none() {
            return Ok(0);
        }
        match self
            .inner
            .call(container, Request::KillAll, CALL_TIMEOUT)
            .await?
        {
            Response::Killed { count, .. } => Ok(count),
            r => Err(unexpected(r)),
        }
    }

    async fn snapshot(&self, container: &str) -> Result<()> {
        let c = self.inner.get(container)?;
        c.touch();
        let ws = c.workspace();
        let dest = snapshot::path(&self.inner.data_dir, &c.key);
        let cg = match &self.inner.cgroup_root {
            Some(root) => root.open_child(container).ok(),
            None => None,
        };
        let budget = self.inner.cfg.limits.disk_mib << 20;
        tokio::task::spawn_blocking(move || {
            // Nothing in the container moves while the host walks its workspace.
            let frozen = match &cg {
                Some(cg) => cg
                    .freeze(Instant::now() + STOP_DEADLINE)
                    .map_err(|e| SubstrateError::Failed(format!("freezing the container: {e}")))?,
                None => {
                    kill::log_degradation(
                        "no cgroup v2: a checkpoint walks a running container (every path is still opened without following symlinks)",
                    );
                    true
                }
            };
            let written = if frozen {
                snapshot::write(&ws, &dest, budget)
                    .map_err(|e| SubstrateError::Failed(format!("snapshot: {e}")))
            } else {
                Err(SubstrateError::Failed(
                    "the container did not freeze in time".into(),
                ))
            };
            if let Some(cg) = &cg {
                let _ = cg.thaw();
            }
            written
        })
        .await
        .map_err(|e| SubstrateError::Failed(e.to_string()))?
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
        let dir = self.inner.artifacts_dir(&id);
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
        let dir = self.inner.artifacts_dir(&id);
        let name = name.to_string();
        tokio::task::spawn_blocking(move || artifacts::read(&dir, &name, offset, length))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
    }

    async fn open_preview(
        &self,
        container: &str,
        port: u16,
    ) -> Result<stockade_runtime::substrate::Preview> {
        self.inner.open_preview(container, port)
    }

    async fn close_preview(&self, container: &str, port: u16) -> Result<bool> {
        self.inner.close_preview(container, port)
    }

    async fn list_previews(
        &self,
        container: &str,
    ) -> Result<Vec<stockade_runtime::substrate::Preview>> {
        self.inner.list_previews(container)
    }
}

#[async_trait]
impl Housekeeping for Linux {
    async fn pending(&self, key: Option<&str>) -> Result<Vec<stockade_egress::ask::Pending>> {
        Ok(self.inner.asks.pending(key))
    }

    async fn answer_pending(
        &self,
        id: &str,
        of: Option<&str>,
        answer: stockade_egress::ask::Answer,
    ) -> Result<std::result::Result<stockade_egress::ask::Pending, stockade_egress::ask::AnswerError>>
    {
        Ok(self.inner.asks.answer_of(id, of, answer))
    }

    fn kind(&self) -> &'static str {
        "linux"
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
            .filter(|c| c.egress.fence.is_open())
            .map(|c| c.id.clone())
            .collect();
        v.sort();
        v
    }

    async fn shutdown(&self) {
        self.inner.close_warm().await;
        for c in self.inner.live() {
            self.inner.kill_container(&c).await;
        }
        self.inner.remove_roots();
    }
}
