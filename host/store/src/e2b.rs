//! The E2B layer's sandboxes (docs/E2B.md): which id names which key, and whose it is
//! (the SHA-256 of the token that made it, never the token), so a restart keeps them.

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
}

impl Store {
    /// Record a sandbox.
    pub fn put_e2b_sandbox(&self, s: &E2bSandboxRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO e2b_sandboxes (id, key, owner, template, started_ms, timeout_s, metadata)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                s.id,
                s.key,
                s.owner,
                s.template,
                s.started_ms as i64,
                s.timeout_s as i64,
                s.metadata
            ])
            .map(|_| ())
        })
    }

    /// Every sandbox, oldest first.
    pub fn e2b_sandboxes(&self) -> Result<Vec<E2bSandboxRow>> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT id, key, owner, template, started_ms, timeout_s, metadata
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
                })
            })?
            .collect()
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
        let dir = std::env::temp_dir().join(format!("stockade-store-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = Store::open_in(&dir).unwrap();
        let row = |id: &str, at| E2bSandboxRow {
            id: id.into(),
            key: format!("e2b-{id}"),
            owner: vec![7; 32],
            template: "base".into(),
            started_ms: at,
            timeout_s: 300,
            metadata: "{}".into(),
        };
        s.put_e2b_sandbox(&row("b", 20)).unwrap();
        s.put_e2b_sandbox(&row("a", 10)).unwrap();
        assert!(
            s.put_e2b_sandbox(&row("a", 30)).is_err(),
            "an id is one sandbox"
        );
        assert_eq!(s.e2b_sandboxes().unwrap(), vec![row("a", 10), row("b", 20)]);
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
}
