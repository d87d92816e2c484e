//! A Stockade container's PID 1, and what the host shares with it (docs/DESIGN.md
//! §4, docs/LINUX.md).
//!
//! The supervisor is its own executable, `stockade-supervisor` ([`pid1::main`]): it
//! links this library and no wasmtime, tokio, axum, hyper or rustls, so what runs as
//! PID 1 in every container is small, and what it can do is what this crate says.
//! The host (`stockade-host`) depends on this library for the shared half: the
//! process protocol, the descriptor numbers and hand-off, the clone that starts a
//! supervisor, the kill modes, the cgroup files; never the reverse.
//!
//! Container side: [`pid1`] (the process API's server and reaper), [`exec`] (a
//! workload's fork and exec: Landlock, seccomp, its cgroup leaf), [`mounts`] and
//! [`rootfs`] (the container's filesystem), [`storage`] (the size-capped disk),
//! [`seccomp`] (the workloads' syscall filter). Shared: [`protocol`] (the
//! process API's lines), [`process`] (what it answers), [`handoff`] (descriptors over
//! the socket), [`namespaces`] (the host's clone of a supervisor, and the
//! descriptor numbers it finds), [`cgroup`] (cgroup v2 files), [`kill`] (tree-kill
//! modes). The thin syscall layer under both children: [`clone`] (the one `clone3`) and
//! [`stage`] (the child-step protocol: which step between clone and exec failed).

#![deny(missing_docs)]

pub mod cgroup;
pub mod clone;
pub mod exec;
pub mod handoff;
pub mod kill;
pub mod mounts;
pub mod namespaces;
pub mod pid1;
pub mod process;
pub mod protocol;
pub mod rootfs;
pub mod seccomp;
pub mod stage;
pub mod storage;

pub use kill::KillMode;
pub use pid1::Args;
pub use process::{ProcessInfo, ResourceLimit, RunResult};
