//! What the process API answers about processes: a tracked process ([`ProcessInfo`])
//! and a fenced run's result ([`RunResult`]). The host's substrate hands these to the
//! guest unchanged (`stockade_host::substrate` re-exports them).

use serde::{Deserialize, Serialize};

/// Bytes as base64 text in serde formats (a JSON array of numbers would be four
/// times the size, and slow to parse).
pub mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialize as base64, written straight into the output (an upload's archive is not
    /// held a second time as a base64 string: docs/SECURITY.md, "Uploads").
    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&base64::display::Base64Display::new(
            b,
            &base64::engine::general_purpose::STANDARD,
        ))
    }

    /// Deserialize from base64.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// What a fenced run produced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    /// Exit code; negative for a signal; -1 on timeout.
    pub exit_code: i32,
    /// Captured stdout, bounded.
    #[serde(default, with = "base64_bytes")]
    pub stdout: Vec<u8>,
    /// Captured stderr, bounded.
    #[serde(default, with = "base64_bytes")]
    pub stderr: Vec<u8>,
    /// The timeout killed the run.
    pub timed_out: bool,
    /// Output beyond the bound was discarded.
    pub truncated: bool,
    /// Container limits the run reached.
    #[serde(default)]
    pub limits: Vec<ResourceLimit>,
}

/// A limit of the container that a run reached (WIT `resource-limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceLimit {
    /// A fork failed at the process limit.
    Pids,
    /// The OOM killer killed a process at the memory limit.
    Memory,
    /// The container's storage is full.
    Disk,
}

/// A tracked process: a started process, or a fenced run's tree while it has members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Its UUID.
    pub id: String,
    /// Its tree still has live processes.
    pub running: bool,
    /// Its leader's exit code, once the leader exited.
    pub exit_code: Option<i32>,
}
