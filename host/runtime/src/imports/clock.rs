//! `clock`: wall time.

use crate::bindings::stockade::sandbox::clock::Host;
use crate::imports::Ctx;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Host for Ctx {
    async fn now_ms(&mut self) -> wasmtime::Result<u64> {
        Ok(now_ms())
    }
}
