//! The E2B layer's sandboxes (docs/E2B.md): which id names which key, and whose it is
//! (the SHA-256 of the token that made it, never the token), so a restart keeps them;
//! and the killed ones whose named snapshots outlive them (their snapshots' sources).

use rusqlite::params;

use crate::{Result, Store};

/// One E2B sandbox as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSandboxRow {
    /// The sandbox id.
    pub id: String,
    /// Its Stockade key.
    pub key: String,
    /// SHA-256 of the token that made it.
    pub owner: Vec<u8>,
    /// The template asked for.
    pub template: String,
    /// When it was made.
    pub started_ms: u64,
    /// Its E2B timeout, seconds.
    pub timeout_s: u64,
    /// Its metadata, a JSON object.
    pub metadata: String,
    /// Its network policy, as `e2b::network::Policy` stores it (JSON).
    pub network: String,
    /// When it ends (ms since the epoch; 0: never).
    pub end_ms: u64,
    /// It pauses at its end instead of being killed.
    pub auto_pause: bool,
    /// It is paused (checkpointed) now.
    pub paused: bool,
    /// The environment every command of it gets (a JSON object of strings).
    pub envs: String,
}

/// A killed sandbox whose named snapshots outlive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSourceRow {
    /// The sandbox id (its snapshots' ids start with it).
    pub id: String,
    /// Its Stockade key, which holds the snapshots.
    pub key: String,
    /// SHA-256 of the token that made it.
    pub owner: Vec<u8>,
}

impl Store {
    /// Record a killed sandbox's snapshots' source (again: replaced).
    pub fn put_e2b_source(&self, s: &E2bSourceRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "INSERT OR REPLACE INTO e2b_snapshot_sources (id, key, owner) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![s.id, s.key, s.owner])
            .map(|_| ())
        })
    }

    /// Every killed sandbox whose snapshots outlive it, by id.
    pub fn e2b_sources(&self) -> Result<Vec<E2bSourceRow>> {
        self.with(|c| {
            let mut st =
                c.prepare_cached("SELECT id, key, owner FROM e2b_snapshot_sources ORDER BY id")?;
            st.query_map([], |r| {
                Ok(E2bSourceRow {
                    id: r.get(0)?,
                    key: r.get(1)?,
                    owner: r.get(2)?,
                })
            })?
            .collect()
        })
    }

    /// Forget a killed sandbox's snapshots' source: `false` if there was none.
    pub fn remove_e2b_source(&self, id: &str) -> Result<bool> {
        self.with(|c| {
            c.prepare_cached("DELETE FROM e2b_snapshot_sources WHERE id = ?1")?
                .execute(params![id])
                .map(|n| n > 0)
        })
    }

    /// Record a sandbox (an id is one sandbox: a second put of it is an error).
    pub fn put_e2b_sandbox(&self, s: &E2bSandboxRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO e2b_sandboxes
                 (id, key, owner, template, started_ms, timeout_s, metadata, network, end_ms, auto_pause, paused, envs)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )?
            .execute(params![
                s.id,
                s.key,
                s.owner,
                s.template,
                s.started_ms as i64,
                s.timeout_s as i64,
                s.metadata,
                s.network,
                s.end_ms as i64,
                s.auto_pause,
                s.paused,
                s.envs
            ])
            .map(|_| ())
        })
    }

    /// Every sandbox, oldest first.
    pub fn e2b_sandboxes(&self) -> Result<Vec<E2bSandboxRow>> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT id, key, owner, template, started_ms, timeout_s, metadata, network, end_ms, auto_pause, paused, envs
                 FROM e2b_sandboxes ORDER BY started_ms, id",
            )?;
            st.query_map([], |r| {
                Ok(E2bSandboxRow {
                    id: r.get(0)?,
                    key: r.get(1)?,
                    owner: r.get(2)?,
                    template: r.get(3)?,
                    started_ms: r.get::<_, i64>(4)? as u64,
                    timeout_s: r.get::<_, i64>(5)? as u64,
                    metadata: r.get(6)?,
                    network: r.get(7)?,
                    end_ms: r.get::<_, i64>(8)? as u64,
                    auto_pause: r.get(9)?,
                    paused: r.get(10)?,
                    envs: r.get(11)?,
                })
            })?
            .collect()
        })
    }

    /// A sandbox's changing state: its end, and whether it is paused; `false` if
    /// there is none by that id.
    pub fn set_e2b_state(&self, id: &str, end_ms: u64, paused: bool) -> Result<bool> {
        self.with(|c| {
            c.prepare_cached("UPDATE e2b_sandboxes SET end_ms = ?2, paused = ?3 WHERE id = ?1")?
                .execute(params![id, end_ms as i64, paused])
                .map(|n| n > 0)
        })
    }

    /// A sandbox's network policy replaced (`update_network`): `false` if there was none
    /// by that id.
    pub fn set_e2b_network(&self, id: &str, network: &str) -> Result<bool> {
        self.with(|c| {
            c.prepare_cached("UPDATE e2b_sandboxes SET network = ?2 WHERE id = ?1")?
                .execute(params![id, network])
                .map(|n| n > 0)
        })
    }

    /// Forget a sandbox: `false` if there was none by that id.
    pub fn remove_e2b_sandbox(&self, id: &str) -> Result<bool> {
        self.with(|c| {
            c.prepare_cached("DELETE FROM e2b_sandboxes WHERE id = ?1")?
                .execute(params![id])
                .map(|n| n > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_is_stored_listed_and_forgotten() {
        let (dir, s) = crate::tests::temp();
        let row = |id: &str, at| E2bSandboxRow {
            id: id.into(),
            key: format!("e2b-{id}"),
            owner: vec![7; 32],
            template: "base".into(),
            started_ms: at,
            timeout_s: 300,
            metadata: "{}".into(),
            network: r#"{"hosts":["a.test"],"public":true}"#.into(),
            end_ms: at + 300_000,
            auto_pause: true,
            paused: false,
            envs: r#"{"A":"1"}"#.into(),
        };
        s.put_e2b_sandbox(&row("b", 20)).unwrap();
        s.put_e2b_sandbox(&row("a", 10)).unwrap();
        assert!(
            s.put_e2b_sandbox(&row("a", 30)).is_err(),
            "an id is one sandbox"
        );
        assert_eq!(s.e2b_sandboxes().unwrap(), vec![row("a", 10), row("b", 20)]);
        assert!(s.set_e2b_state("a", 99, true).unwrap());
        assert!(!s.set_e2b_state("zz", 99, true).unwrap());
        let a = s.e2b_sandboxes().unwrap().remove(0);
        assert_eq!((a.end_ms, a.paused), (99, true));
        assert!(
            s.set_e2b_network("a", r#"{"hosts":[],"public":true}"#)
                .unwrap()
        );
        assert!(!s.set_e2b_network("zz", "{}").unwrap());
        let a = s.e2b_sandboxes().unwrap().remove(0);
        assert_eq!(a.network, r#"{"hosts":[],"public":true}"#);
        assert!(s.remove_e2b_sandbox("a").unwrap());
        assert!(!s.remove_e2b_sandbox("a").unwrap());
        drop(s);
        let s = Store::open_in(&dir).unwrap();
        assert_eq!(
            s.e2b_sandboxes().unwrap(),
            vec![row("b", 20)],
            "kept across a restart"
        );
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_killed_sandboxs_snapshots_source_is_stored_listed_and_forgotten() {
        let (dir, s) = crate::tests::temp();
        let row = |id: &str, owner| E2bSourceRow {
            id: id.into(),
            key: format!("e2b-{id}"),
            owner: vec![owner; 32],
        };
        s.put_e2b_source(&row("b", 1)).unwrap();
        s.put_e2b_source(&row("a", 1)).unwrap();
        s.put_e2b_source(&row("a", 2)).unwrap();
        assert_eq!(
            s.e2b_sources().unwrap(),
            vec![row("a", 2), row("b", 1)],
            "by id; a second put replaces"
        );
        assert!(s.remove_e2b_source("a").unwrap());
        assert!(!s.remove_e2b_source("a").unwrap());
        drop(s);
        let s = Store::open_in(&dir).unwrap();
        assert_eq!(
            s.e2b_sources().unwrap(),
            vec![row("b", 1)],
            "kept across a restart"
        );
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
