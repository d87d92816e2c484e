//! Stockade's one grammar for what consumers hand it: egress rules (and the pure
//! decision over them), sandbox keys, process ids, artifact names. No I/O; std and
//! `thiserror` only (every refusal is a typed error whose text is the consumer's message).
//!
//! The guest (wasm32-wasip2) validates with it before any substrate call; the host's
//! egress proxy decides with it and its API and substrates check names with it. One
//! function per check, so a rule the guest admits is a rule the proxy can apply, in
//! every host (wasmtime and workerd run the same guest).

#![forbid(unsafe_code)]

pub mod binding;
pub mod names;
pub mod rules;
pub mod shorthand;
