//! The linux substrate: real containers on one machine (DESIGN §4), each a security
//! boundary (invariant 11, docs/SECURITY.md).
//!
//! The `Substrate` and `Housekeeping` impls are [`substrate`]; a call to a container's
//! supervisor, and a fenced run, [`calls`].
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
mod calls;
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
mod substrate;
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
use std::time::Duration;

use tokio::sync::broadcast;

use stockade_egress::secrets::Secrets;
use stockade_runtime::config::{Config, EgressConfig, KillMode, SubstrateConfig};
use stockade_runtime::substrate::{Event, Result};
use stockade_store::Store;

pub use self::caps::{Capabilities, capabilities};
use self::cgroup::CgroupDir;
use self::container::Container;

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
