//! `log`: the guest's structured lines, as `tracing` events. The guest's
//! `CANONICAL-FENCE` line is the one line per fence (STYLE.md).

use crate::bindings::stockade::sandbox::log::{Host, Level};
use crate::imports::Ctx;

impl Host for Ctx {
    async fn emit(
        &mut self,
        level: Level,
        event: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let fields = fields
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        match level {
            Level::Debug => tracing::debug!(target: "stockade::guest", %fields, "{event}"),
            Level::Info => tracing::info!(target: "stockade::guest", %fields, "{event}"),
            Level::Warn => tracing::warn!(target: "stockade::guest", %fields, "{event}"),
            Level::Error => tracing::error!(target: "stockade::guest", %fields, "{event}"),
        }
        Ok(())
    }
}
