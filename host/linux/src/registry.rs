//! The live containers: by id, and each key's current one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::container::Container;
use stockade_runtime::substrate::{ContainerId, Result, SubstrateError};

/// Live containers and which one each key has.
#[derive(Default)]
pub struct Registry {
    containers: Mutex<HashMap<ContainerId, Arc<Container>>>,
    keys: Mutex<HashMap<String, ContainerId>>,
}

impl Registry {
    /// A live container; not live: unreachable.
    pub fn get(&self, id: &str) -> Result<Arc<Container>> {
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| SubstrateError::Unreachable(format!("no live container {id}")))
    }

    /// Whether `id` is live.
    pub fn contains(&self, id: &str) -> bool {
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(id)
    }

    /// Every live container.
    pub fn live(&self) -> Vec<Arc<Container>> {
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The key's container, if it has one.
    pub fn of_key(&self, key: &str) -> Option<ContainerId> {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// `c` is live, and its key's container.
    pub fn insert(&self, c: &Arc<Container>) {
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(c.id.clone(), c.clone());
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(c.key.clone(), c.id.clone());
    }

    /// `c` is gone; its key has no container unless another replaced it.
    pub fn remove(&self, c: &Container) {
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&c.id);
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if keys.get(&c.key) == Some(&c.id) {
            keys.remove(&c.key);
        }
    }
}
