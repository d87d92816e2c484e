//! The Stockade runtime: a wasmtime host ("Worker-style": one compiled component, a
//! fresh instance per call, state in the durable store) for the Stockade component,
//! plus the substrates it drives, the egress proxy, the records store, the HTTP API
//! and the CLI.

pub mod answers;
pub mod api;
pub mod bindings;
pub mod cli;
pub mod config;
pub mod datadir;
pub mod demo;
pub mod doctor;
pub mod finish;
/// The egress proxy, its own crate (`egress/`); kept at this path for the host's
/// callers and the tests.
pub use stockade_egress as egress;
pub mod imports;
pub mod mcp;
pub mod node;
pub mod preview;
pub mod record_cache;
pub mod render;
pub mod runtime;
pub mod serve;
pub mod store;
pub mod store_writer;
pub mod stream;
pub mod substrate;
pub mod upload;
