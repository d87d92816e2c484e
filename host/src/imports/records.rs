//! `records`: the guest's durable key-value store, in SQLite.

use crate::bindings::stockade::sandbox::records::{Entry, Host};
use crate::imports::Ctx;

impl Host for Ctx {
    async fn put(
        &mut self,
        scope: String,
        name: String,
        value: String,
    ) -> wasmtime::Result<Result<(), String>> {
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
        Ok(self.store.get(&scope, &name).map_err(|e| e.to_string()))
    }

    async fn remove(
        &mut self,
        scope: String,
        name: String,
    ) -> wasmtime::Result<Result<bool, String>> {
        Ok(self.store.remove(&scope, &name).map_err(|e| e.to_string()))
    }

    async fn list(
        &mut self,
        scope: String,
        prefix: String,
    ) -> wasmtime::Result<Result<Vec<Entry>, String>> {
        Ok(self
            .store
            .list(&scope, &prefix)
            .map(|v| {
                v.into_iter()
                    .map(|(name, value)| Entry { name, value })
                    .collect()
            })
            .map_err(|e| e.to_string()))
    }

    async fn find(
        &mut self,
        prefix: String,
        value: String,
    ) -> wasmtime::Result<Result<Vec<(String, String)>, String>> {
        Ok(self.store.find(&prefix, &value).map_err(|e| e.to_string()))
    }
}
