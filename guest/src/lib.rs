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
mod substrate;

/// A panic's message goes out through the `log` import, as an `error` line
/// `guest-panic` (the call then traps). The host's build (`host/build.rs`) turns the
/// WASI that std would write it with (stderr) into traps: the component imports the
/// Stockade interfaces alone. The hook is a static constructor, which the exports
/// run once per instance (wit-bindgen's `run_ctors_once`), so it is in place before
/// any of the guest's own code runs.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod panics {
    use crate::stockade::sandbox::log::{self, Level};

    // SAFETY: wasm-ld collects the function pointers of `.init_array` into
    // `__wasm_call_ctors`, which calls each once, with no arguments, before the first
    // export's body; `install` is a plain `extern "C" fn()`.
    #[used]
    #[unsafe(link_section = ".init_array")]
    static INSTALL: extern "C" fn() = install;

    extern "C" fn install() {
        std::panic::set_hook(Box::new(|info| {
            log::emit(
                Level::Error,
                "guest-panic",
                &[("message".into(), info.to_string())],
            );
        }));
    }
}

struct Component;
