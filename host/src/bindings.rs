//! The single `bindgen!` for the Stockade world, and the embedded component.
//!
//! Imports are async (a `run` waits for a process) and trappable (the host can abort
//! a guest call); exports are async.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "stockade",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
});

pub use exports::stockade::sandbox::facade::{Error as FacadeError, ExecOutcome};
pub use stockade::sandbox::types::{
    Artifact, CredentialHeader, Denial, DenialReason, DetachedInput, DetachedState, ExecInput,
    GoneReason, Grant, ResourceLimit, Rule,
};

/// The guest component built by `build.rs`, embedded in the binary.
pub const EMBEDDED_GUEST: &[u8] = include_bytes!(env!("STOCKADE_GUEST_WASM"));
