//! The ADR's decisions, each in one named pure function with a table test.
//!
//! | decision | function |
//! |---|---|
//! | is the input acceptable (invariant 10) | [`validate`] |
//! | is this a floor command, is it approved (invariant 4) | [`floor::check`] |
//! | which processes a teardown kills (invariants 2, 7) | [`teardown::start`], [`teardown::after_listing`], [`teardown::after_failed_kill`] |
//! | what a status answer is (invariant 5) | [`status::answer`] |
//! | what stop does after its kill | [`status::after_stop_kill`] |
//! | which declarations abort/checkpoint/on-stop clear (invariant 8) | [`lifecycle::after`], [`declarations::for_container`] |

pub mod declarations;
pub mod floor;
pub mod lifecycle;
pub mod status;
pub mod teardown;
pub mod validate;
