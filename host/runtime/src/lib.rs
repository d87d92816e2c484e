//! The Stockade runtime: a wasmtime host ("Worker-style": one compiled component, a
//! fresh instance per call, state in the durable store) for the Stockade component,
//! the imports it calls (one module per WIT interface), the [`substrate::Substrate`]
//! trait every substrate implements with the in-memory [`substrate::mock`] beside it,
//! the configuration every layer reads (`wasmtime.toml`), the data directory, and the
//! preview doors a substrate serves (docs/ARCHITECTURE.md).

pub mod bindings;
pub mod config;
pub mod datadir;
pub mod finish;
pub mod imports;
pub mod preview;
pub mod runtime;
pub mod signals;
pub mod substrate;
