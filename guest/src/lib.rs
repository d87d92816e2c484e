//! The Stockade component.
//!
//! Every fence and detached-process decision lives in [`decide`] as a pure function
//! over plain data, unit-tested natively. [`facade`] is the thin glue that calls the
//! imports around them. The component does no I/O of its own.

// Decision tables are tuples of a row's columns; naming each tuple type would hide the
// table's shape from the reader.
#![cfg_attr(test, allow(clippy::type_complexity))]

wit_bindgen::generate!({
    path: "../wit",
    world: "stockade",
    additional_derives: [PartialEq],
});

pub mod decide;
mod facade;

struct Component;

// Exported only in the component: a native build (the decision tables' tests) has no
// component model to export to.
#[cfg(target_arch = "wasm32")]
export!(Component);
