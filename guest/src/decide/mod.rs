//! The decisions of docs/DESIGN.md §2-§3, each in one named pure function with a table
//! test.
//!
//! | decision | function |
//! |---|---|
//! | is the input acceptable (invariant 10) | [`validate`] |
//! | is the approval looked up, is it spent (invariant 4) | [`floor::lookup`], [`floor::to_spend`] |
//! | is this a floor command, is it approved (invariant 4) | [`floor::check`] |
//! | is a credential rule inside its secret's binding (invariant 3) | [`credentials::check`] |
//! | is a started process declared or killed (invariant 5) | [`declare::after_start`], [`declare::after_record`] |
//! | which processes a teardown kills (invariants 2, 7) | [`teardown::start`], [`teardown::after_listing`], [`teardown::after_failed_kill`] |
//! | what a status answer is (invariant 5), on every poll | [`status::answer`], [`tombstone::reason`] |
//! | which tombstones a key keeps | [`tombstone::evict`] |
//! | what stop does after its kill | [`status::after_stop_kill`] |
//! | what abort/checkpoint do (invariant 8) | [`lifecycle::plan`], [`lifecycle::after`] |
//! | which declarations abort/checkpoint/on-stop clear (invariant 8) | [`declarations::for_container`] |
//! | may a preview door open, is it the open one (docs/PREVIEW.md) | [`preview::port`], [`preview::expose`] |
//! | which calls a fence batches (docs/NODE.md) | [`batch::whole_fence`], [`batch::apply_run`], [`batch::closing`] |
//! | what a batch's answers made (docs/NODE.md) | [`batch::opened`], [`batch::closed`] |
//! | may a named snapshot be saved, may a key be forked from one | [`snapshots::admit`], [`snapshots::fork`] |
//! | may this metadata be recorded, which lifetimes ended | [`lifetime::metadata`], [`lifetime::ended`] |
//! | which grant a fenced command runs under (its own, the key's network, none) | [`network::choose`] |

pub mod batch;
pub mod credentials;
pub mod declarations;
pub mod declare;
pub mod floor;
pub mod lifecycle;
pub mod lifetime;
pub mod network;
pub mod preview;
pub mod snapshots;
pub mod status;
pub mod teardown;
pub mod tombstone;
pub mod validate;
