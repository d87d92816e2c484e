//! Conformance: the real guest `.wasm` (embedded in the host) driven through the
//! runtime against the mock substrate. Exact call traces and outcomes.
//!
//! The scenarios live as data in `tests/scenarios/conformance.json` (one source for
//! both hosts: this suite and workerd in `edge/`); each named test here runs one of
//! them, so a failing invariant reads by name.
#![forbid(unsafe_code)]

mod faults;
mod fuzz;
mod preview;
mod runtime;
mod scenarios;
