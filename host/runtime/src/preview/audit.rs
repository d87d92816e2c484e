//! The preview listener's record of inbound requests: the last [`Audit::CAPACITY`]
//! (time, token, port, method, path, status), oldest first. Kept apart from the
//! listener so the door table, which owns one, and the listener, which writes it, do
//! not import each other.

use std::collections::VecDeque;
use std::sync::Mutex;

/// One inbound request, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditEntry {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The token the request named (bounded to 64 bytes; empty when it named none).
    pub token: String,
    /// The door's port (0 when no door answered).
    pub port: u16,
    /// The request method.
    pub method: String,
    /// The request target as received (bounded to 256 bytes).
    pub path: String,
    /// The status answered.
    pub status: u16,
}

/// The last [`Audit::CAPACITY`] inbound requests.
#[derive(Debug, Default)]
pub struct Audit(Mutex<VecDeque<AuditEntry>>);

impl Audit {
    /// Entries kept.
    pub const CAPACITY: usize = 4096;

    pub(super) fn push(&self, e: AuditEntry) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == Self::CAPACITY {
            q.pop_front();
        }
        q.push_back(e);
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> Vec<AuditEntry> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}
