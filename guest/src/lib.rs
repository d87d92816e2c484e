//! The Stockade component.
//!
//! Every fence and detached-process decision lives in [`decide`] as a pure function
//! over plain data, unit-tested natively. [`facade`] is the thin glue that calls the
//! imports around them. The component does no I/O of its own.

// Decision tables are tuples of a row's columns; naming each tuple type would hide the
// table's shape from the reader.
#![cfg_attr(test, allow(clippy::type_complexity))]
#![deny(unsafe_code)]

/// The one `bindgen`: the world's types, its imports and the export glue. The canonical
/// ABI's generated code needs `unsafe` (raw pointers, `export_name`); the crate's own
/// code may not use it, so only this module is allowed.
#[allow(unsafe_code)]
mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "stockade",
        additional_derives: [PartialEq],
    });

    // Exported only in the component: a native build (the decision tables' tests) has no
    // component model to export to.
    #[cfg(target_arch = "wasm32")]
    use super::Component;
    #[cfg(target_arch = "wasm32")]
    export!(Component);
}
pub use bindings::{exports, stockade};

pub mod decide;
mod facade;

struct Component;
