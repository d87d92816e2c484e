//! `policy`: the floor rules from `wasmtime.toml` and approvals from the store.

use crate::bindings::stockade::sandbox::policy::{FloorRule, Host};
use crate::imports::Ctx;

impl Host for Ctx {
    async fn floor_rules(&mut self) -> wasmtime::Result<Vec<FloorRule>> {
        Ok(self
            .floor
            .iter()
            .map(|p| FloorRule { pattern: p.clone() })
            .collect())
    }

    async fn approval(
        &mut self,
        key: String,
        token: String,
    ) -> wasmtime::Result<Option<Vec<String>>> {
        // A store that cannot be read admits nothing: the floor fails closed.
        Ok(self.store.approval(&key, &token).unwrap_or_else(|e| {
            tracing::error!(target: "stockade::store", error = %e, "approval lookup failed; floor stays closed");
            None
        }))
    }
}
