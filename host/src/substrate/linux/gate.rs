//! The ticket gate (DESIGN §4): at most `substrate.ceiling` live containers, a key
//! waiting up to `substrate.admission_timeout_ms` for a ticket (then over capacity),
//! and one lock per key so that two calls for one key never build two containers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::substrate::{Result, SubstrateError};

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

#[cfg(test)]
mod tests {
    use super::*;

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
