//! Tree kill (invariant 6): the mechanisms and the kill modes are the supervisor
//! crate's ([`stockade_supervisor::kill`], re-exported here); the host logs the
//! degradations they imply.

use std::collections::HashSet;
use std::sync::Mutex;

pub use stockade_supervisor::kill::*;

/// One canonical line per degradation, once per process.
pub fn log_degradation(what: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(what.to_string())
    {
        tracing::warn!(target: "stockade::degradation", degradation = what, "DEGRADATION {what}");
    }
}

/// The canonical line for a degradation a container's supervisor met. The supervisor
/// (PID 1 in the container) has no log of its own (no subscriber, stdio `/dev/null`):
/// it reports each degradation once, in the answer to the request that degraded or in
/// its `ready` line, and the host logs it here with the container's id.
pub fn log_supervisor_degradation(container: &str, what: &str) {
    tracing::warn!(target: "stockade::degradation", container, degradation = what, "DEGRADATION {what}");
}
