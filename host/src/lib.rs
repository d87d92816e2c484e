//! The `stockade` binary's library: the HTTP API, MCP (stdio and `/mcp`), the CLI,
//! `serve` (the runtime over a substrate, behind the API), uploads, `demo` and
//! `doctor`. The layers below are their own crates (docs/ARCHITECTURE.md):
//! `stockade-runtime` (wasmtime, the imports, the substrate trait, the mock),
//! `stockade-linux`, `stockade-node`, `stockade-remote`, `stockade-node-protocol` and
//! `stockade-store`.

pub mod answers;
pub mod api;
pub mod cli;
pub mod compare;
pub mod demo;
pub mod doctor;
pub mod e2b;
pub mod mcp;
pub mod render;
pub mod serve;
pub mod stream;
pub mod tenants;
pub mod upload;
