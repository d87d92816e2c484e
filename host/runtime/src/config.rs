//! `wasmtime.toml`: the runtime's configuration. Unknown keys are an error naming the
//! key; `STOCKADE_*` environment variables and flags override the file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[engine]`: wasmtime.
    pub engine: EngineConfig,
    /// `[guest]`: which component.
    pub guest: GuestConfig,
    /// `[substrate]`: containers.
    pub substrate: SubstrateConfig,
    /// `[egress]`: the proxy.
    pub egress: EgressConfig,
    /// `[floor]`: the approval floor.
    pub floor: FloorConfig,
    /// `[api]`: the HTTP API.
    pub api: ApiConfig,
    /// `[node]`: `stockade node`, this machine's substrate served to fronts (docs/NODE.md).
    pub node: NodeConfig,
    /// `[remote]`: the nodes a `kind = "remote"` substrate drives (docs/NODE.md).
    pub remote: RemoteConfig,
    /// `[preview]`: the preview listener (DESIGN §8; docs/PREVIEW.md).
    pub preview: crate::preview::PreviewConfig,
    /// `[e2b]`: the E2B-compatible API (docs/E2B.md).
    pub e2b: E2bConfig,
}

/// `[e2b]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct E2bConfig {
    /// "The internet" of E2B's `allow_internet_access`: the hosts (allowOut's syntax:
    /// a name, `*.name`, an address) every fenced command of a sandbox that did not
    /// turn it off may reach. Empty (the default): none, Stockade's fence denies by
    /// default. Checked by the E2B layer at start (a bad entry: the server refuses to
    /// start, naming it).
    pub internet: Vec<String>,
    /// E2B's domain form (`E2B_DOMAIN`, docs/E2B.md "The domain form"): the control
    /// plane at `https://api.{domain}`, a sandbox's envd at `https://49983-{id}.{domain}`
    /// and its port P (`get_host(P)`) at `https://P-{id}.{domain}`, all on one HTTPS
    /// listener routed by `Host`. None (the default): off. All four of `domain`,
    /// `tls_listen`, `tls_cert`, `tls_key` or none (checked at start: a partial or bad
    /// set refuses to start, naming the key).
    pub domain: Option<String>,
    /// The HTTPS listener of the domain form, `ADDR:PORT` (the SDK dials 443).
    pub tls_listen: Option<String>,
    /// Its certificate chain (PEM), for `api.{domain}` and `*.{domain}`.
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub tls_key: Option<PathBuf>,
}

/// `[engine]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Use the pooling allocator (falls back to on-demand, logged, where the address
    /// space does not allow it).
    pub pooling: bool,
    /// Epoch tick in milliseconds.
    pub epoch_tick_ms: u64,
    /// Per-call deadline on guest compute, in milliseconds (time spent inside host
    /// imports, such as a run, does not count).
    pub call_deadline_ms: u64,
    /// Linear-memory limit per instance, in MiB.
    pub memory_mib: u64,
    /// Most instances alive at once (pooling).
    pub max_instances: u32,
    /// Per pooled slot, how many KiB of a released instance's linear memory and tables
    /// are reset in place (the pages it dirtied, found with `PAGEMAP_SCAN`, copied back
    /// from the image or zeroed) instead of dropped with `madvise` and faulted back in
    /// by the next call (measured: the `madvise` and its TLB shootdown were half of a
    /// `detached-status`). The next instance sees the same bytes either way. 0: always
    /// `madvise`; also what a kernel without `PAGEMAP_SCAN` (before 6.7) gets.
    pub keep_resident_kib: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            pooling: true,
            epoch_tick_ms: 10,
            call_deadline_ms: 5_000,
            memory_mib: 64,
            max_instances: 256,
            keep_resident_kib: 2048,
        }
    }
}

/// `[guest]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuestConfig {
    /// A component to load instead of the one embedded in the binary.
    pub component: Option<PathBuf>,
}

/// How a process tree is killed (the supervisor crate's type: it kills the trees).
pub use stockade_supervisor::KillMode;

/// `[substrate]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubstrateConfig {
    /// `linux` (real containers) or `mock` (in memory, for tests and demos of the contract).
    pub kind: String,
    /// Most live containers (the ticket gate).
    pub ceiling: u32,
    /// How long `ensure` waits for a ticket before `over-capacity`, in milliseconds
    /// (0: answer at once).
    pub admission_timeout_ms: u64,
    /// Containers built ahead of demand and handed to the next new key (the warm
    /// pool; 0: every new key builds its own). They hold no ticket and no key: at most
    /// `ceiling + warm` containers exist.
    pub warm: u32,
    /// Where records, snapshots, container directories and the API token live.
    pub data_dir: PathBuf,
    /// Parent cgroup of every container (`auto`: `stockade-<hash of data_dir>` under
    /// the cgroup v2 mount, `/sys/fs/cgroup` or `/sys/fs/cgroup/unified`: one per data
    /// directory).
    pub cgroup_root: String,
    /// How a process tree is killed.
    pub kill_mode: KillMode,
    /// Captured bytes per stream of a fenced run; the rest is discarded and reported.
    pub output_limit: u64,
    /// A container with no running process and no call for this long is checkpointed
    /// and stopped (0: never).
    pub idle_timeout_ms: u64,
    /// The container's root filesystem: `host` (a curated read-only view of this
    /// machine's `/usr`, its `/bin` and `/lib*` links, and an `/etc` made for the
    /// container) or the path of a directory holding an unpacked image.
    pub rootfs: String,
    /// Mechanisms whose absence refuses start-up instead of degrading:
    /// `userns`, `seccomp`, `limits`, `disk`, `cgroup-kill`.
    pub require: Vec<String>,
    /// The supervisor executable, a container's PID 1 (`auto`: `stockade-supervisor`
    /// beside the running `stockade` executable).
    pub supervisor: String,
    /// `[substrate.ids]`: the host id ranges containers' user namespaces map onto.
    pub ids: IdPoolConfig,
    /// `[substrate.limits]`: per-container resource limits.
    pub limits: LimitsConfig,
}

/// `[substrate.ids]`: `containers` ranges of `per_container` host ids from `start`; a
/// container's ids `0..per_container` map onto one range, leased for its lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdPoolConfig {
    /// The pool's first host id.
    pub start: u64,
    /// Ids per container.
    pub per_container: u64,
    /// Ranges in the pool (at least `ceiling`).
    pub containers: u32,
}

impl Default for IdPoolConfig {
    fn default() -> Self {
        Self {
            start: 2_000_000_000,
            per_container: 65_536,
            containers: 64,
        }
    }
}

/// `[substrate.limits]`: what one container (every process in it) may use. 0 means
/// no limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Most processes and threads at once.
    pub pids: u64,
    /// Memory (RAM) in MiB; the disk below is memory-backed and counts here too.
    pub memory_mib: u64,
    /// CPU time as a number of CPUs (a CFS quota: 0.5 is half of one CPU).
    pub cpus: f64,
    /// Writable storage in MiB: `/workspace`, `/artifacts` and `/tmp` together
    /// (a size-capped tmpfs per container; writes past it fail with ENOSPC).
    pub disk_mib: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            pids: 1024,
            memory_mib: 2048,
            cpus: 2.0,
            disk_mib: 1024,
        }
    }
}

impl Default for SubstrateConfig {
    fn default() -> Self {
        Self {
            kind: "linux".into(),
            ceiling: 16,
            admission_timeout_ms: 0,
            warm: 2,
            data_dir: PathBuf::from("/var/lib/stockade"),
            cgroup_root: "auto".into(),
            kill_mode: KillMode::Auto,
            output_limit: 1024 * 1024,
            idle_timeout_ms: 10 * 60 * 1000,
            rootfs: "host".into(),
            require: embedded_default().require.clone(),
            supervisor: "auto".into(),
            ids: IdPoolConfig::default(),
            limits: LimitsConfig::default(),
        }
    }
}

pub use stockade_egress::config::{EgressConfig, SecretBindingConfig};

/// `[floor]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FloorConfig {
    /// Argv patterns that mark floor commands (see the WIT `floor-rule`).
    pub rules: Vec<Vec<String>>,
    /// How long an approval is valid, in milliseconds (it is also used once).
    pub approval_ttl_ms: u64,
}

impl Default for FloorConfig {
    fn default() -> Self {
        Self {
            rules: embedded_default().floor_rules.clone(),
            approval_ttl_ms: 15 * 60 * 1000,
        }
    }
}

/// `[api]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Listen address.
    pub listen: String,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// How long shutdown lets open fences finish, in milliseconds.
    pub shutdown_deadline_ms: u64,
    /// Browser origins `/mcp` accepts beyond the server's own loopback ones
    /// (`https://agent.example.com`); any other `Origin` is a 403 (docs/MCP.md).
    pub mcp_origins: Vec<String>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8787".into(),
            // The largest stdin the guest takes (16 MiB) as base64 in JSON.
            max_body_bytes: 24 << 20,
            shutdown_deadline_ms: 10_000,
            mcp_origins: Vec::new(),
        }
    }
}

/// `[node]`: what `stockade node` serves and how (docs/NODE.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// The node API's listen address (HTTPS).
    pub listen: String,
    /// How fronts and logs name this node (`[a-z0-9-]`, at most 63).
    pub name: String,
    /// Extra subject alternative names for the node's certificate (IPs or DNS names).
    pub hostnames: Vec<String>,
    /// The front's API, which the node calls back when a container stops ("": none).
    pub front_url: String,
    /// A grant's lease beyond its run's timeout, in milliseconds.
    pub lease_grace_ms: u64,
    /// A running `run` sends a heartbeat line this often, in milliseconds.
    pub heartbeat_ms: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8788".into(),
            name: "node-1".into(),
            hostnames: Vec::new(),
            front_url: String::new(),
            lease_grace_ms: 30_000,
            heartbeat_ms: 1_000,
        }
    }
}

/// `[remote]`: the nodes of a `substrate.kind = "remote"` front.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteConfig {
    /// The nodes (`[[remote.nodes]]`), at least one for `kind = "remote"`.
    pub nodes: Vec<RemoteNode>,
    /// Deadline of one node call (a `run`: its timeout plus this), in milliseconds.
    pub call_timeout_ms: u64,
    /// A `run` that sends no line for this long is `unreachable`, in milliseconds.
    pub heartbeat_timeout_ms: u64,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            call_timeout_ms: 30_000,
            heartbeat_timeout_ms: 3_000,
        }
    }
}

/// One node a front drives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteNode {
    /// Its name (as its `node.name`; placements record it).
    pub name: String,
    /// Its API, `https://HOST:PORT`.
    pub url: String,
    /// Its certificate (PEM), pinned: the only one the front accepts from it.
    pub cert_file: PathBuf,
    /// Its request secret (the node's `<data_dir>/node/secret`).
    pub secret_file: PathBuf,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML does not parse or names an unknown key.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (it names the key).
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The largest warm pool (each warm container holds an id range, a tmpfs and a
/// supervisor).
pub const MAX_WARM: u32 = 16;

/// The mechanisms `substrate.require` can name.
pub const REQUIRABLE: &[&str] = &[
    "userns",
    "seccomp",
    "limits",
    "disk",
    "cgroup-kill",
    "attribution",
];

/// The default configuration: the repository's `wasmtime.toml`, embedded.
pub const EMBEDDED: &str = include_str!("../../../wasmtime.toml");

/// The lists with a security meaning, as the embedded file states them: what a file
/// that leaves them out gets (never an empty list: a `[floor]` left out of a custom
/// file once ran with no floor at all, and a `require` left out degraded silently).
struct SecurityLists {
    floor_rules: Vec<Vec<String>>,
    require: Vec<String>,
}

/// [`SecurityLists`] read from [`EMBEDDED`] as plain TOML (not through `Config`,
/// whose defaults are these very lists), once.
fn embedded_default() -> &'static SecurityLists {
    static LISTS: std::sync::OnceLock<SecurityLists> = std::sync::OnceLock::new();
    LISTS.get_or_init(|| {
        let t: toml::Table = toml::from_str(EMBEDDED).expect("the embedded wasmtime.toml parses");
        let list = |section: &str, key: &str| -> toml::Value {
            t.get(section)
                .and_then(|s| s.get(key))
                .cloned()
                .unwrap_or_else(|| panic!("the embedded wasmtime.toml has {section}.{key}"))
        };
        SecurityLists {
            floor_rules: list("floor", "rules")
                .try_into()
                .expect("floor.rules is a list of lists of strings"),
            require: list("substrate", "require")
                .try_into()
                .expect("substrate.require is a list of strings"),
        }
    })
}

impl Config {
    /// Parse TOML text.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(cfg)
    }

    /// The embedded defaults.
    pub fn embedded() -> Self {
        Self::parse(EMBEDDED, Path::new("<embedded wasmtime.toml>"))
            .expect("the embedded wasmtime.toml parses (tested)")
    }

    /// Read a file, or the embedded defaults when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        match path {
            None => Ok(Self::embedded()),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                Self::parse(&text, p)
            }
        }
    }

    /// Apply `STOCKADE_*` overrides from an environment (a function, for tests).
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        fn num<T: std::str::FromStr>(name: &str, v: String) -> Result<T, ConfigError> {
            v.parse()
                .map_err(|_| ConfigError::Invalid(format!("{name}={v:?} is not a number")))
        }
        if let Some(v) = get("STOCKADE_DATA_DIR") {
            self.substrate.data_dir = v.into();
        }
        if let Some(v) = get("STOCKADE_SUBSTRATE") {
            self.substrate.kind = v;
        }
        if let Some(v) = get("STOCKADE_CEILING") {
            self.substrate.ceiling = num("STOCKADE_CEILING", v)?;
        }
        if let Some(v) = get("STOCKADE_CGROUP_ROOT") {
            self.substrate.cgroup_root = v;
        }
        if let Some(v) = get("STOCKADE_IDLE_TIMEOUT_MS") {
            self.substrate.idle_timeout_ms = num("STOCKADE_IDLE_TIMEOUT_MS", v)?;
        }
        if let Some(v) = get("STOCKADE_LISTEN") {
            self.api.listen = v;
        }
        if let Some(v) = get("STOCKADE_ALLOW_PRIVATE_TARGETS") {
            self.egress.allow_private_targets = matches!(v.as_str(), "1" | "true" | "yes");
        }
        if let Some(v) = get("STOCKADE_GUEST") {
            self.guest.component = Some(v.into());
        }
        Ok(())
    }

    /// The lists with a security meaning this configuration empties on purpose (a
    /// list left out gets the embedded defaults; an explicit `[]` is honoured): one
    /// sentence each, for the warning at start and `stockade doctor` (pure).
    pub fn emptied(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.floor.rules.is_empty() {
            let defaults: Vec<String> = embedded_default()
                .floor_rules
                .iter()
                .map(|r| r.join(" "))
                .collect();
            out.push(format!(
                "floor.rules is empty: no command needs an approval (the defaults: {})",
                defaults.join(", ")
            ));
        }
        if self.substrate.require.is_empty() && self.substrate.kind == "linux" {
            out.push(format!(
                "substrate.require is empty: a machine without {} runs degraded instead of refusing to start",
                embedded_default().require.join(", ")
            ));
        }
        out
    }

    /// Log [`Config::emptied`] at start: one warning line for each.
    pub fn warn_emptied(&self) {
        for what in self.emptied() {
            tracing::warn!(target: "stockade::config", emptied = %what, "a list with a security meaning is empty in the configuration");
        }
    }

    /// Check values that parse but cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if !matches!(self.substrate.kind.as_str(), "linux" | "mock" | "remote") {
            return bad("substrate.kind must be \"linux\", \"mock\" or \"remote\"");
        }
        if self.substrate.kind == "remote" && self.remote.nodes.is_empty() {
            return bad("substrate.kind = \"remote\" needs at least one [[remote.nodes]]");
        }
        let mut names: Vec<&str> = self.remote.nodes.iter().map(|n| n.name.as_str()).collect();
        names.push(&self.node.name);
        for n in &names {
            if n.is_empty()
                || n.len() > 63
                || !n
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            {
                return Err(ConfigError::Invalid(format!(
                    "node name {n:?} must be 1-63 characters of [a-z0-9-]"
                )));
            }
        }
        names.pop();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return bad("remote.nodes names must be unique");
        }
        for n in &self.remote.nodes {
            if !n.url.starts_with("https://") {
                return Err(ConfigError::Invalid(format!(
                    "remote node {}: url must be https:// (nodes serve TLS only)",
                    n.name
                )));
            }
        }
        if self.node.lease_grace_ms == 0 || self.node.heartbeat_ms == 0 {
            return bad("node.lease_grace_ms and node.heartbeat_ms must be positive");
        }
        if self.remote.heartbeat_timeout_ms == 0 || self.remote.call_timeout_ms == 0 {
            return bad("remote.call_timeout_ms and remote.heartbeat_timeout_ms must be positive");
        }
        if self.substrate.ceiling == 0 {
            return bad("substrate.ceiling must be at least 1");
        }
        if self.substrate.warm > MAX_WARM {
            return Err(ConfigError::Invalid(format!(
                "substrate.warm must be 0..={MAX_WARM} (containers built ahead of demand)"
            )));
        }
        if self.engine.epoch_tick_ms == 0 || self.engine.call_deadline_ms == 0 {
            return bad("engine.epoch_tick_ms and engine.call_deadline_ms must be positive");
        }
        if self.engine.memory_mib == 0 || self.engine.memory_mib > 4096 {
            return bad("engine.memory_mib must be 1..=4096");
        }
        if self.engine.keep_resident_kib > self.engine.memory_mib * 1024 {
            return bad("engine.keep_resident_kib must be at most engine.memory_mib × 1024");
        }
        for path in &self.egress.extra_ca_files {
            if let Err(e) = stockade_egress::tls::read_pem_certs(path) {
                return Err(ConfigError::Invalid(format!("egress.extra_ca_files: {e}")));
            }
        }
        for (name, path) in &self.egress.secret_files {
            if let Err(e) = stockade_grammar::rules::secret_name(name) {
                return Err(ConfigError::Invalid(format!("egress.secret_files: {e}")));
            }
            if !path.is_absolute() {
                return Err(ConfigError::Invalid(format!(
                    "egress.secret_files.{name}: {} is not an absolute path",
                    path.display()
                )));
            }
        }
        if let Err(e) = self.egress.ask_limits() {
            return Err(ConfigError::Invalid(e));
        }
        for (name, b) in &self.egress.secret_bindings {
            if !self.egress.secret_files.contains_key(name) {
                return Err(ConfigError::Invalid(format!(
                    "egress.secret_bindings.{name}: no egress.secret_files entry defines {name:?} (bind secrets set through the API with `stockade secret set`)"
                )));
            }
            if let Err(e) = b.parse() {
                return Err(ConfigError::Invalid(format!(
                    "egress.secret_bindings.{name}: {e}"
                )));
            }
        }
        if let Some(r) = self
            .substrate
            .require
            .iter()
            .find(|r| !REQUIRABLE.contains(&r.as_str()))
        {
            return Err(ConfigError::Invalid(format!(
                "substrate.require: unknown mechanism {r:?} (known: {})",
                REQUIRABLE.join(", ")
            )));
        }
        let l = &self.substrate.limits;
        if !(l.cpus.is_finite() && l.cpus >= 0.0 && l.cpus <= 1024.0) {
            return bad("substrate.limits.cpus must be a number of CPUs in 0..=1024");
        }
        if l.disk_mib == 0 && self.substrate.kind == "linux" {
            return bad("substrate.limits.disk_mib must be at least 1 (the workspace lives on it)");
        }
        if self.substrate.rootfs.is_empty() {
            return bad("substrate.rootfs must be \"host\" or a directory");
        }
        if self.floor.approval_ttl_ms == 0 {
            return bad("floor.approval_ttl_ms must be positive");
        }
        if self.floor.rules.iter().any(|r| r.is_empty()) {
            return bad("floor.rules must not contain an empty pattern");
        }
        if self.api.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad("api.listen must be an address such as 127.0.0.1:8787");
        }
        self.preview.validate().map_err(ConfigError::Invalid)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_configuration_parses_and_is_valid() {
        let cfg = Config::embedded();
        cfg.validate().unwrap();
        assert_eq!(cfg.api.listen, "127.0.0.1:8787");
        assert_eq!(cfg.substrate.ceiling, 16);
        assert_eq!(cfg.substrate.warm, 2);
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_the_key() {
        let err = Config::parse("[engine]\npoolin = true\n", Path::new("x.toml")).unwrap_err();
        assert!(err.to_string().contains("poolin"), "{err}");
        let err = Config::parse("[enigne]\n", Path::new("x.toml")).unwrap_err();
        assert!(err.to_string().contains("enigne"), "{err}");
    }

    #[test]
    fn environment_overrides_the_file() {
        let mut cfg = Config::embedded();
        cfg.apply_env(|k| match k {
            "STOCKADE_CEILING" => Some("3".into()),
            "STOCKADE_LISTEN" => Some("127.0.0.1:9999".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(cfg.substrate.ceiling, 3);
        assert_eq!(cfg.api.listen, "127.0.0.1:9999");
        assert!(
            cfg.apply_env(|k| (k == "STOCKADE_CEILING").then(|| "x".into()))
                .is_err()
        );
    }

    #[test]
    fn a_security_list_left_out_is_the_embedded_ones_and_an_empty_one_is_said() {
        let embedded = Config::embedded();
        let floor = embedded.floor.rules.clone();
        let require = embedded.substrate.require.clone();
        assert_eq!(floor.len(), 4, "the embedded floor");
        assert!(!require.is_empty(), "the embedded require");
        let git_push = vec![vec!["git".to_owned(), "push".to_owned(), "**".to_owned()]];
        // (what, the file, the floor it runs with, the require list, lists said emptied)
        type Row<'a> = (&'a str, &'a str, Vec<Vec<String>>, Vec<String>, usize);
        let rows: &[Row<'_>] = &[
            ("no file content", "", floor.clone(), require.clone(), 0),
            (
                "no [floor] section, no require key",
                "[substrate]\nkind = \"linux\"\n[api]\nlisten = \"127.0.0.1:1\"\n",
                floor.clone(),
                require.clone(),
                0,
            ),
            (
                "[floor] without rules",
                "[floor]\napproval_ttl_ms = 1000\n",
                floor.clone(),
                require.clone(),
                0,
            ),
            (
                "explicit empty lists are honoured",
                "[floor]\nrules = []\n[substrate]\nrequire = []\n",
                vec![],
                vec![],
                2,
            ),
            (
                "explicit lists are taken as they are",
                "[floor]\nrules = [[\"git\", \"push\", \"**\"]]\n[substrate]\nrequire = [\"userns\"]\n",
                git_push,
                vec!["userns".to_owned()],
                0,
            ),
        ];
        for (name, text, want_floor, want_require, emptied) in rows {
            let cfg = Config::parse(text, Path::new("custom.toml")).unwrap();
            assert_eq!(&cfg.floor.rules, want_floor, "{name}: floor.rules");
            assert_eq!(&cfg.substrate.require, want_require, "{name}: require");
            assert_eq!(cfg.emptied().len(), *emptied, "{name}: {:?}", cfg.emptied());
        }
        assert_eq!(Config::default().floor.rules, floor, "Config::default");
    }

    #[test]
    fn values_that_cannot_work_are_refused() {
        let mut cfg = Config::embedded();
        cfg.substrate.ceiling = 0;
        assert!(cfg.validate().is_err());
        let mut cfg = Config::embedded();
        cfg.egress.extra_ca_files = vec!["/nonexistent/ca.pem".into()];
        assert!(cfg.validate().unwrap_err().to_string().contains("ca.pem"));
        for (field, set) in [
            ("ask_pending_per_container", (0, 64, 120)),
            ("ask_pending_per_container", (65, 64, 120)),
            ("ask_pending_total", (8, 0, 120)),
            ("ask_timeout_s", (8, 64, 0)),
            ("ask_timeout_s", (8, 64, 3601)),
        ] {
            let mut cfg = Config::embedded();
            (
                cfg.egress.ask_pending_per_container,
                cfg.egress.ask_pending_total,
                cfg.egress.ask_timeout_s,
            ) = set;
            assert!(
                cfg.validate().unwrap_err().to_string().contains(field),
                "{field} {set:?}"
            );
        }
        let mut cfg = Config::embedded();
        cfg.egress
            .secret_files
            .insert("Bad Name".into(), "/etc/token".into());
        assert!(cfg.validate().is_err());
        let mut cfg = Config::embedded();
        cfg.egress
            .secret_files
            .insert("ok".into(), "relative".into());
        assert!(cfg.validate().is_err());
        let bind = |host: &str, methods: &[&str]| SecretBindingConfig {
            host: host.into(),
            methods: methods.iter().map(|m| (*m).to_owned()).collect(),
            path_prefix: None,
        };
        let mut cfg = Config::embedded();
        cfg.egress
            .secret_bindings
            .insert("nofile".into(), bind("api.example.com", &["GET"]));
        assert!(cfg.validate().unwrap_err().to_string().contains("nofile"));
        for (what, b) in [
            ("a wildcard host", bind("*.example.com", &["GET"])),
            ("no methods", bind("api.example.com", &[])),
            ("TRACE", bind("api.example.com", &["TRACE"])),
        ] {
            let mut cfg = Config::embedded();
            cfg.egress
                .secret_files
                .insert("tok".into(), "/etc/token".into());
            cfg.egress.secret_bindings.insert("tok".into(), b);
            assert!(cfg.validate().is_err(), "{what}");
        }
        let mut cfg = Config::embedded();
        cfg.egress
            .secret_files
            .insert("tok".into(), "/etc/token".into());
        cfg.egress
            .secret_bindings
            .insert("tok".into(), bind("api.example.com:8443", &["GET"]));
        assert!(cfg.validate().is_ok());
        let known = "[egress.secret_bindings.tok]\nhost = \"a.example\"\nmethods = [\"GET\"]\n";
        assert!(toml::from_str::<Config>(known).is_ok());
        let unknown = format!("{known}port = 1\n");
        assert!(
            toml::from_str::<Config>(&unknown).is_err(),
            "unknown keys are errors"
        );
        let mut cfg = Config::embedded();
        cfg.substrate.require = vec!["userns".into(), "magic".into()];
        assert!(cfg.validate().unwrap_err().to_string().contains("magic"));
        let mut cfg = Config::embedded();
        cfg.substrate.limits.cpus = -1.0;
        assert!(cfg.validate().is_err());
        let mut cfg = Config::embedded();
        cfg.substrate.warm = MAX_WARM + 1;
        assert!(cfg.validate().unwrap_err().to_string().contains("warm"));
    }

    #[test]
    fn limits_and_ids_are_tables_under_substrate() {
        let cfg = Config::parse(
            "[substrate.limits]\npids = 64\ncpus = 0.5\n[substrate.ids]\nstart = 3000000000\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(cfg.substrate.limits.pids, 64);
        assert_eq!(
            cfg.substrate.limits.memory_mib, 2048,
            "unset keys keep their defaults"
        );
        assert_eq!(cfg.substrate.ids.start, 3_000_000_000);
        let err =
            Config::parse("[substrate.limits]\nfiles = 1\n", Path::new("x.toml")).unwrap_err();
        assert!(err.to_string().contains("files"), "{err}");
    }
}
