//! Egress allow rules: the one grammar (parse, decide, pick a target) lives in
//! `stockade-grammar`, shared with the guest; the proxy uses it from here.

pub use stockade_grammar::rules::*;
