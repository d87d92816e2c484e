//! `[egress]` in `wasmtime.toml`: the proxy's own configuration. The host's `Config`
//! holds it as its `egress` section and checks what needs the filesystem
//! (`Config::validate`); the types live here because the proxy is what reads them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[egress]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// TLS interception where a rule needs to see inside HTTPS (method, path,
    /// credentials): a CA per container that its clients trust (docs/EGRESS.md).
    pub interception: bool,
    /// Admit loopback and private-range targets (tests need loopback servers).
    pub allow_private_targets: bool,
    /// PEM files of CAs the proxy trusts upstream besides this machine's roots.
    pub extra_ca_files: Vec<PathBuf>,
    /// Secrets read from files: name → path (read when a fence that names it opens).
    pub secret_files: BTreeMap<String, PathBuf>,
    /// Where each file secret may go: name → host[:port], methods, path
    /// prefix. A file secret without one is unbound: no rule may name it.
    pub secret_bindings: BTreeMap<String, SecretBindingConfig>,
    /// `ask = true` grants (docs/EGRESS.md): how many requests one container may have held
    /// for the approver at once; past it one is refused `ask-full` at once.
    pub ask_pending_per_container: usize,
    /// How many requests the server holds for the approver at once, in all.
    pub ask_pending_total: usize,
    /// Seconds a held request waits for the approver before it is refused
    /// `ask-timeout`.
    pub ask_timeout_s: u64,
}

impl EgressConfig {
    /// The bounds on pending decisions, checked ([`crate::ask::AskLimits::validate`]).
    pub fn ask_limits(&self) -> Result<crate::ask::AskLimits, String> {
        let limits = crate::ask::AskLimits {
            per_container: self.ask_pending_per_container,
            total: self.ask_pending_total,
            timeout: std::time::Duration::from_secs(self.ask_timeout_s),
        };
        limits.validate().map(|()| limits)
    }
}

/// `[egress.secret_bindings.NAME]`: where the file secret NAME may be sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretBindingConfig {
    /// One exact host, optionally `:port` (443 when none).
    pub host: String,
    /// The methods a rule naming it may admit (standard ones, not TRACE/TRACK/CONNECT).
    pub methods: Vec<String>,
    /// The path prefix a rule naming it must sit under (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
}

impl SecretBindingConfig {
    /// The binding, parsed by the grammar.
    pub fn parse(
        &self,
    ) -> Result<stockade_grammar::binding::Binding, stockade_grammar::binding::BindingError> {
        stockade_grammar::binding::parse(&self.host, &self.methods, self.path_prefix.as_deref())
    }
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            interception: true,
            allow_private_targets: false,
            extra_ca_files: Vec::new(),
            secret_files: BTreeMap::new(),
            secret_bindings: BTreeMap::new(),
            ask_pending_per_container: crate::ask::AskLimits::default().per_container,
            ask_pending_total: crate::ask::AskLimits::default().total,
            ask_timeout_s: crate::ask::AskLimits::default().timeout.as_secs(),
        }
    }
}
