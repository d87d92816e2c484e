//! The linux substrate against real containers: tree kill (invariants 6 and 7),
//! isolation, the ticket gate, lifecycle. One test binary; every test needs root and
//! cgroup v2 and FAILS (never passes silently) without them.
//!
//! The supervisor is the real `stockade-supervisor` binary next to this test binary
//! (`cargo build -p stockade-host --bins` first).
#![forbid(unsafe_code)]

mod support;

mod adr;

mod attack_egress;
mod availability;
mod boundary;
mod detached;
mod docs_walk;
mod egress;
mod facade;
mod facade_egress;
mod facade_lifecycle;
mod failure;
mod faults_remote;
mod fence_faults;
mod gate;
mod https;
mod isolation;
mod leaves;
mod lifecycle;
mod load;
mod node;
mod remote;
mod stream;
mod supervisor;
mod tree_kill;
mod warm;
