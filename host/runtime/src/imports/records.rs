//! `records`: the guest's durable key-value store, in SQLite.

use crate::bindings::stockade::sandbox::records::{Entry, Host};
use crate::imports::Ctx;
use crate::substrate::SubstrateError;

/// An armed `records.OP` fault (the mock's): a trap traps the call, an error is the
/// records store failing.
fn injected(ctx: &Ctx, op: &str) -> wasmtime::Result<Option<String>> {
    match ctx.substrate.injected(op) {
        None => Ok(None),
        Some(SubstrateError::Trap(m)) => Err(wasmtime::Error::msg(m)),
        Some(e) => Ok(Some(format!("injected into {op}: {e}"))),
    }
}

impl Host for Ctx {
    async fn put(
        &mut self,
        scope: String,
        name: String,
        value: String,
    ) -> wasmtime::Result<Result<(), String>> {
        if let Some(e) = injected(self, "records.put")? {
            return Ok(Err(e));
        }
        Ok(self
            .store
            .put(&scope, &name, &value)
            .map_err(|e| e.to_string()))
    }

    async fn get(
        &mut self,
        scope: String,
        name: String,
    ) -> wasmtime::Result<Result<Option<String>, String>> {
        if let Some(e) = injected(self, "records.get")? {
            return Ok(Err(e));
        }
        Ok(self.store.get(&scope, &name).map_err(|e| e.to_string()))
    }

    async fn remove(
        &mut self,
        scope: String,
        name: String,
    ) -> wasmtime::Result<Result<bool, String>> {
        if let Some(e) = injected(self, "records.remove")? {
            return Ok(Err(e));
        }
        Ok(self.store.remove(&scope, &name).map_err(|e| e.to_string()))
    }

    async fn list(
        &mut self,
        scope: String,
        prefix: String,
    ) -> wasmtime::Result<Result<Vec<Entry>, String>> {
        if let Some(e) = injected(self, "records.list")? {
            return Ok(Err(e));
        }
        Ok(self
            .store
            .list(&scope, &prefix)
            .map(|v| v.into_iter().map(Entry::from).collect())
            .map_err(|e| e.to_string()))
    }

    async fn find(
        &mut self,
        prefix: String,
        value: String,
    ) -> wasmtime::Result<Result<Vec<(String, String)>, String>> {
        if let Some(e) = injected(self, "records.find")? {
            return Ok(Err(e));
        }
        Ok(self.store.find(&prefix, &value).map_err(|e| e.to_string()))
    }
}
