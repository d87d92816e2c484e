//! The engine and the compiled guest, built once per process: epoch interruption and
//! its ticker thread, the pooling allocator where the address space allows it, and how a
//! released slot is reset.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::component::Component;
use wasmtime::{Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::StartError;
use crate::bindings::EMBEDDED_GUEST;
use crate::config::{Config, EngineConfig};

/// How the engine allocates instances (reported by `doctor` and the benches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// The pooling allocator.
    Pooling,
    /// On-demand (configured, or the pool could not be reserved).
    OnDemand,
}

/// The epoch ticker thread; stops when the runtime is dropped.
struct Ticker(Arc<AtomicBool>);

impl Drop for Ticker {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The engine and the compiled guest, built once per process and shared by every
/// runtime (compiling the component is the expensive part of start-up).
#[derive(Clone)]
pub struct Compiled {
    pub(super) engine: Engine,
    pub(super) component: Component,
    pub(super) allocation: Allocation,
    _ticker: Arc<Ticker>,
}

impl Compiled {
    /// Build the engine and compile the guest (embedded unless `[guest] component`
    /// names a file).
    pub fn new(cfg: &Config) -> Result<Self, StartError> {
        let wasm = |e: wasmtime::Error| StartError::Wasm(format!("{e:#}"));
        let (engine, allocation) = build_engine(&cfg.engine).map_err(wasm)?;
        let bytes: std::borrow::Cow<'static, [u8]> = match &cfg.guest.component {
            None => EMBEDDED_GUEST.into(),
            Some(p) => std::fs::read(p)
                .map_err(|source| StartError::Guest {
                    path: p.clone(),
                    source,
                })?
                .into(),
        };
        let component = Component::new(&engine, &bytes).map_err(wasm)?;
        let stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = stop.clone();
            let tick = Duration::from_millis(cfg.engine.epoch_tick_ms);
            std::thread::Builder::new()
                .name("stockade-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| StartError::Wasm(format!("epoch thread: {e}")))?;
        }
        Ok(Self {
            engine,
            component,
            allocation,
            _ticker: Arc::new(Ticker(stop)),
        })
    }

    /// How instances are allocated.
    pub fn allocation(&self) -> Allocation {
        self.allocation
    }
}

/// How a released pooled slot's linear memory and tables are brought back to the
/// image's bytes (`[engine]`'s slot reset, `config.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotReset {
    /// Bytes per slot reset in place (`memset` or a copy from the image) of the pages
    /// the instance dirtied; past them, `madvise`. 0: `madvise` only.
    keep_resident: usize,
    /// Find the dirtied pages with `PAGEMAP_SCAN` (Linux 6.7).
    pagemap_scan: bool,
}

/// Reset in place only where the kernel can say which pages were dirtied: without
/// `PAGEMAP_SCAN` wasmtime would `memset` the whole kept prefix on every release
/// (2 MiB per call), slower than the `madvise` it replaces. Either way the next
/// instance sees the image's bytes, never the last call's.
fn slot_reset(keep_resident_kib: u64, pagemap_scan_available: bool) -> SlotReset {
    if keep_resident_kib == 0 || !pagemap_scan_available {
        return SlotReset {
            keep_resident: 0,
            pagemap_scan: false,
        };
    }
    SlotReset {
        keep_resident: usize::try_from(keep_resident_kib.saturating_mul(1024))
            .unwrap_or(usize::MAX),
        pagemap_scan: true,
    }
}

/// The engine: epoch interruption, component model, pooling where the address space
/// allows it (else on-demand, logged).
fn build_engine(cfg: &EngineConfig) -> wasmtime::Result<(Engine, Allocation)> {
    let mut base = wasmtime::Config::new();
    base.wasm_component_model(true).epoch_interruption(true);
    if cfg.pooling {
        let n = cfg.max_instances;
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            .total_core_instances(n * 8)
            .total_memories(n * 2)
            .total_tables(n * 8)
            .max_memory_size((cfg.memory_mib as usize) << 20)
            .max_memories_per_module(2);
        let reset = slot_reset(
            cfg.keep_resident_kib,
            PoolingAllocationConfig::is_pagemap_scan_available(),
        );
        pool.linear_memory_keep_resident(reset.keep_resident)
            .table_keep_resident(reset.keep_resident)
            .pagemap_scan(if reset.pagemap_scan {
                Enabled::Yes
            } else {
                Enabled::No
            });
        tracing::info!(
            target: "stockade::runtime",
            keep_resident = reset.keep_resident,
            pagemap_scan = reset.pagemap_scan,
            configured_kib = cfg.keep_resident_kib,
            "pooled slots: reset in place up to keep_resident bytes, madvise past it"
        );
        let mut pooled = base.clone();
        pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        match Engine::new(&pooled) {
            Ok(e) => return Ok((e, Allocation::Pooling)),
            Err(e) => tracing::warn!(
                target: "stockade::degradation",
                mechanism = "pooling-allocator",
                fallback = "on-demand",
                error = %e,
                "DEGRADED: the pooling allocator could not be set up"
            ),
        }
    }
    Ok((Engine::new(&base)?, Allocation::OnDemand))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In-place reset only with `PAGEMAP_SCAN`, and only when asked for.
    #[test]
    fn slot_reset_table() {
        let madvise = SlotReset {
            keep_resident: 0,
            pagemap_scan: false,
        };
        for (kib, available, want) in [
            (0, true, madvise),
            (0, false, madvise),
            (2048, false, madvise),
            (
                2048,
                true,
                SlotReset {
                    keep_resident: 2 << 20,
                    pagemap_scan: true,
                },
            ),
            (
                1,
                true,
                SlotReset {
                    keep_resident: 1024,
                    pagemap_scan: true,
                },
            ),
        ] {
            assert_eq!(slot_reset(kib, available), want, "{kib} KiB, {available}");
        }
    }
}
