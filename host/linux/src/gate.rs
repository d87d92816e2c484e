//! The ticket gate (DESIGN §4): at most `substrate.ceiling` live containers, a key
//! waiting up to `substrate.admission_timeout_ms` for a ticket (then over capacity),
//! and one lock per key so that two calls for one key never build two containers.
//!
//! The gate's size is the configured ceiling capped by what this machine can hold
//! ([`capacity`]; docs/SCALE.md): every live container holds a few tasks (its supervisor's
//! threads), host descriptors, a user and a network namespace, an id range and some
//! memory, and a ceiling past what the machine has of any of them would fail at the
//! container that finds it exhausted (a `failed`, half-built) instead of answering
//! `over-capacity` before anything is built. The cap is logged once at start with the
//! resource that set it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use stockade_runtime::substrate::{Result, SubstrateError};

/// The gate: tickets and the per-key locks.
pub struct Gate {
    tickets: Arc<Semaphore>,
    /// How long a key waits for a ticket (zero: not at all).
    wait: Duration,
    key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Gate {
    /// A gate of `ceiling` tickets, a key waiting up to `wait` for one.
    pub fn new(ceiling: usize, wait: Duration) -> Self {
        Self {
            tickets: Arc::new(Semaphore::new(ceiling)),
            wait,
            key_locks: Mutex::new(HashMap::new()),
        }
    }

    /// The key's lock (made on first use; held while its container is found or built).
    pub fn key_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.key_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    /// Tickets nobody holds now (the warm pool sizes itself within them).
    pub fn free(&self) -> usize {
        self.tickets.available_permits()
    }

    /// A ticket, held by the container for its life; none within the wait: over
    /// capacity.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit> {
        if self.wait.is_zero() {
            return self
                .tickets
                .clone()
                .try_acquire_owned()
                .map_err(|_| SubstrateError::OverCapacity);
        }
        match tokio::time::timeout(self.wait, self.tickets.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(SubstrateError::OverCapacity),
        }
    }
}

/// What this machine has of each resource a live container holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    /// `MemTotal`, KiB.
    pub memory_kib: u64,
    /// `kernel.pid_max` less the tasks alive now (pids are machine-wide).
    pub free_pids: u64,
    /// The host process's descriptor limit (its soft `RLIMIT_NOFILE`) less those open now.
    pub free_descriptors: u64,
    /// `user.max_user_namespaces` and `user.max_net_namespaces`: the fewer.
    pub namespaces: u64,
    /// Id ranges in the pool less the warm pool's (`substrate.ids`; unbounded without
    /// user namespaces).
    pub id_ranges: u64,
}

/// What one live container holds, at least (measured by the scale bench, with margin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerContainer {
    /// Host memory budgeted per live container, KiB: an idle one costs ~1.5 MiB
    /// (docs/BENCHMARKS.md, scale), the rest is room for its work.
    pub memory_kib: u64,
    /// Tasks: the supervisor's threads (12) and room for a workload.
    pub pids: u64,
    /// Host descriptors: the supervisor's socket and pidfd, pooled connections, the
    /// egress listener and a few of its connections.
    pub descriptors: u64,
}

/// The budget [`capacity`] uses.
pub const PER_CONTAINER: PerContainer = PerContainer {
    memory_kib: 16 * 1024,
    pids: 16,
    descriptors: 16,
};

/// Kept back from the machine for the host itself: a quarter of memory, 1024 pids, 256
/// descriptors.
const RESERVE_PIDS: u64 = 1024;
const RESERVE_DESCRIPTORS: u64 = 256;

/// The gate's size and what set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Tickets: live containers at most (at least 1).
    pub ceiling: usize,
    /// `configured` when the configuration's ceiling fits, else the resource that caps
    /// it: `memory`, `pids`, `descriptors`, `namespaces` or `ids`.
    pub bound_by: &'static str,
}

/// The ceiling this machine can hold (pure): the configured one, capped by each
/// resource's room ÷ what a container holds of it; at least 1 (a machine that cannot
/// hold one container says so at that container).
pub fn capacity(configured: u32, m: &Machine, per: &PerContainer) -> Capacity {
    let room = [
        ("memory", m.memory_kib / 4 * 3 / per.memory_kib.max(1)),
        (
            "pids",
            m.free_pids.saturating_sub(RESERVE_PIDS) / per.pids.max(1),
        ),
        (
            "descriptors",
            m.free_descriptors.saturating_sub(RESERVE_DESCRIPTORS) / per.descriptors.max(1),
        ),
        ("namespaces", m.namespaces),
        ("ids", m.id_ranges),
    ];
    let mut cap = Capacity {
        ceiling: configured as usize,
        bound_by: "configured",
    };
    for (name, n) in room {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if n < cap.ceiling {
            cap = Capacity {
                ceiling: n,
                bound_by: name,
            };
        }
    }
    cap.ceiling = cap.ceiling.max(1);
    cap
}

impl Machine {
    /// Read this machine (a value that cannot be read does not bound: the kernel's
    /// own limit then answers at the container that meets it).
    pub fn read(id_ranges: u64) -> Machine {
        let num =
            |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
        let memory_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(u64::MAX);
        // The fourth field of loadavg: runnable/total tasks.
        let tasks = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok())
            .unwrap_or(0u64);
        let free_pids =
            num("/proc/sys/kernel/pid_max").map_or(u64::MAX, |m| m.saturating_sub(tasks));
        let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        let free_descriptors = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .map_or(u64::MAX, |l| l.saturating_sub(open));
        let namespaces = num("/proc/sys/user/max_user_namespaces")
            .unwrap_or(u64::MAX)
            .min(num("/proc/sys/user/max_net_namespaces").unwrap_or(u64::MAX));
        Machine {
            memory_kib,
            free_pids,
            free_descriptors,
            namespaces,
            id_ranges,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This VM: 24 GiB, pid_max 32768 with ~1200 tasks, 20000 descriptors.
    const VM: Machine = Machine {
        memory_kib: 24 * 1024 * 1024,
        free_pids: 32768 - 1200,
        free_descriptors: 20000 - 50,
        namespaces: 96362,
        id_ranges: 4094,
    };

    #[test]
    fn the_ceiling_is_the_configured_one_capped_by_each_resource() {
        let with = |f: fn(&mut Machine)| {
            let mut m = VM;
            f(&mut m);
            m
        };
        let rows: &[(&str, u32, Machine, usize, &str)] = &[
            ("fits", 16, VM, 16, "configured"),
            ("this VM: memory first", 4096, VM, 1152, "memory"),
            (
                "a default soft descriptor limit",
                4096,
                with(|m| m.free_descriptors = 1024 - 20),
                46,
                "descriptors",
            ),
            (
                "pid_max 32768 with 30000 tasks",
                4096,
                with(|m| m.free_pids = 2768),
                109,
                "pids",
            ),
            (
                "a 2 GiB machine",
                4096,
                with(|m| m.memory_kib = 2 << 20),
                96,
                "memory",
            ),
            (
                "few namespaces",
                4096,
                with(|m| m.namespaces = 10),
                10,
                "namespaces",
            ),
            ("the id pool", 4096, with(|m| m.id_ranges = 62), 62, "ids"),
            (
                "nothing left: still one",
                4096,
                with(|m| m.free_pids = 0),
                1,
                "pids",
            ),
            (
                "unreadable values do not bound",
                300,
                Machine {
                    memory_kib: u64::MAX,
                    free_pids: u64::MAX,
                    free_descriptors: u64::MAX,
                    namespaces: u64::MAX,
                    id_ranges: u64::MAX,
                },
                300,
                "configured",
            ),
        ];
        for (what, configured, m, ceiling, by) in rows {
            let c = capacity(*configured, m, &PER_CONTAINER);
            assert_eq!((c.ceiling, c.bound_by), (*ceiling, *by), "{what}");
        }
    }

    #[test]
    fn this_machine_reads() {
        let m = Machine::read(10);
        assert!(m.memory_kib > 0 && m.memory_kib < u64::MAX, "{m:?}");
        assert!(m.free_pids > 0 && m.free_pids < u64::MAX, "{m:?}");
        assert_eq!(m.id_ranges, 10);
    }

    #[tokio::test]
    async fn a_full_gate_refuses_after_its_wait_and_a_returned_ticket_admits() {
        for wait in [Duration::ZERO, Duration::from_millis(20)] {
            let gate = Gate::new(1, wait);
            let held = gate.admit().await.unwrap();
            assert_eq!(
                gate.admit().await.unwrap_err(),
                SubstrateError::OverCapacity
            );
            drop(held);
            assert!(gate.admit().await.is_ok(), "wait {wait:?}");
        }
    }

    #[tokio::test]
    async fn a_key_has_one_lock() {
        let gate = Gate::new(1, Duration::ZERO);
        assert!(Arc::ptr_eq(&gate.key_lock("a"), &gate.key_lock("a")));
        assert!(!Arc::ptr_eq(&gate.key_lock("a"), &gate.key_lock("b")));
    }
}
