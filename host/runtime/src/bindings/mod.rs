//! The single `bindgen!` for the Stockade world, and the embedded component.
//!
//! Imports are async (a `run` waits for a process) and trappable (the host can abort
//! a guest call); exports are async. Every conversion between these types and the
//! host's own lives in [`convert`].

pub mod convert;

// No `with:` for records. In wasmtime 48 `with:` replaces a whole interface (or
// package, or namespace) with bindings generated elsewhere, or names the Rust type of
// a resource; `bindgen!` never looks a record up in it (`type_record` always emits
// its own struct, and a key it did not use is an error). Mapping `types` or
// `substrate` as a whole would mean hand-writing their `ComponentType`/`Lift`/`Lower`
// records and `add_to_linker`: a copy of the contract checked only at instantiation.
// So the records are generated here, from the WIT; where the host's record is the
// contract's field for field (`process-info`, `artifact`) the substrate uses the
// generated type itself, and where it differs on purpose (see `convert`) the two meet
// in one module of `From` impls.
wasmtime::component::bindgen!({
    path: "../../wit",
    world: "stockade",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [serde::Serialize, serde::Deserialize, PartialEq, Eq],
});

pub use exports::stockade::sandbox::facade::{
    EndAction, Error as FacadeError, ExecOutcome, Lifetime, SandboxInfo,
};
pub use stockade::sandbox::types::{
    Artifact, CredentialHeader, Denial, DenialReason, DetachedInput, DetachedState, ExecInput,
    GoneReason, Grant, Preview, ResourceLimit, Rule, SnapshotInfo,
};

/// The guest component built by `build.rs`, embedded in the binary.
pub const EMBEDDED_GUEST: &[u8] = include_bytes!(env!("STOCKADE_GUEST_WASM"));

/// Where `build.rs` left the same guest as the linker made it, std's WASI imported
/// (the benches' "before"; not embedded).
pub const GUEST_WITH_WASI_PATH: &str = env!("STOCKADE_GUEST_WASM_WITH_WASI");
