//! `policy`: the floor rules from `wasmtime.toml`, approvals from the store, and the
//! bindings of the server's secrets.

use crate::bindings::stockade::sandbox::policy::{Binding, FloorRule, Host};
use crate::imports::Ctx;
use crate::substrate::SubstrateError;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Ctx {
    /// An injected fault on a policy lookup: a trap traps the call; any other fault is
    /// a store that cannot be read, which admits nothing (`Err(())`: fail closed).
    fn policy_fault(&self, op: &str) -> wasmtime::Result<Result<(), ()>> {
        match self.substrate.injected(op) {
            Some(SubstrateError::Trap(why)) => {
                Err(wasmtime::Error::msg(format!("injected trap: {why}")))
            }
            Some(e) => {
                tracing::error!(target: "stockade::store", op, error = %e, "policy lookup failed; the floor stays closed");
                Ok(Err(()))
            }
            None => Ok(Ok(())),
        }
    }
}

impl Host for Ctx {
    async fn floor_rules(&mut self) -> wasmtime::Result<Vec<FloorRule>> {
        // The floor cannot fail by contract (it is configuration); a host that cannot
        // state it admits nothing: an injected fault of any kind traps the call.
        if let Some(e) = self.substrate.injected("policy.floor-rules") {
            return Err(wasmtime::Error::msg(format!(
                "injected into policy.floor-rules: {e}"
            )));
        }
        Ok(self.floor.iter().map(FloorRule::from).collect())
    }

    async fn approval(
        &mut self,
        key: String,
        token: String,
    ) -> wasmtime::Result<Option<Vec<String>>> {
        // A store that cannot be read admits nothing: the floor fails closed.
        if self.policy_fault("policy.approval")?.is_err() {
            return Ok(None);
        }
        // Looking spends nothing: the guest spends the token once the command is
        // admitted (`spend-approval`).
        Ok(self
            .store
            .peek_approval(&key, &token, now_ms())
            .unwrap_or_else(|e| {
                tracing::error!(target: "stockade::store", error = %e, "approval lookup failed; floor stays closed");
                None
            }))
    }

    async fn spend_approval(&mut self, key: String, token: String) -> wasmtime::Result<bool> {
        // A store that cannot spend the approval does not admit the command on it.
        if self.policy_fault("policy.spend-approval")?.is_err() {
            return Ok(false);
        }
        Ok(self
            .store
            .take_approval(&key, &token, now_ms())
            .map(|argv| argv.is_some())
            .unwrap_or_else(|e| {
                tracing::error!(target: "stockade::store", error = %e, "approval not spent; the command is not admitted");
                false
            }))
    }

    async fn secret_binding(&mut self, name: String) -> wasmtime::Result<Option<Binding>> {
        // A binding that cannot be read binds nothing: the rule is refused.
        if self.policy_fault("policy.secret-binding")?.is_err() {
            return Ok(None);
        }
        Ok(self.secrets.binding(&name).map(Binding::from))
    }
}
