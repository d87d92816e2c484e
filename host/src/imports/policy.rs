//! `policy`: the floor rules from `wasmtime.toml` and approvals from the store.

use crate::bindings::stockade::sandbox::policy::{FloorRule, Host};
use crate::imports::Ctx;

impl Host for Ctx {
    async fn floor_rules(&mut self) -> wasmtime::Result<Vec<FloorRule>> {
        // The floor cannot fail by contract (it is configuration); a host that cannot
        // state it admits nothing: an injected fault of any kind traps the call.
        if let Some(e) = self.substrate.injected("policy.floor-rules") {
            return Err(wasmtime::Error::msg(format!(
                "injected into policy.floor-rules: {e}"
            )));
        }
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
        match self.substrate.injected("policy.approval") {
            Some(crate::substrate::SubstrateError::Trap(why)) => {
                return Err(wasmtime::Error::msg(format!("injected trap: {why}")));
            }
            Some(e) => {
                tracing::error!(target: "stockade::store", error = %e, "approval lookup failed; floor stays closed");
                return Ok(None);
            }
            None => {}
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        // Single use: a token that admits a command is spent (the guest asks only for
        // a floor command that carries one).
        Ok(self.store.take_approval(&key, &token, now).unwrap_or_else(|e| {
            tracing::error!(target: "stockade::store", error = %e, "approval lookup failed; floor stays closed");
            None
        }))
    }
}
