//! The scoped consumer tokens' rows (docs/TENANTS.md): a token is stored as the SHA-256
//! of its secret, never the secret, so the database file alone opens no sandbox.

use rusqlite::{OptionalExtension, params};

use crate::{Result, Store};

/// One scoped consumer token as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRow {
    /// The token's public id (its first part; listed, revoked by).
    pub id: String,
    /// The operator's label.
    pub name: String,
    /// The key pattern it may reach (`ci-*` or one key).
    pub keys: String,
    /// Its share of the ceiling: live containers it may hold at once.
    pub ceiling: u32,
    /// SHA-256 of the token's secret part.
    pub digest: Vec<u8>,
    /// When it was made.
    pub created_ms: u64,
    /// When it was revoked (`None`: live).
    pub revoked_ms: Option<u64>,
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TenantRow> {
    Ok(TenantRow {
        id: r.get(0)?,
        name: r.get(1)?,
        keys: r.get(2)?,
        ceiling: r.get::<_, i64>(3)? as u32,
        digest: r.get(4)?,
        created_ms: r.get::<_, i64>(5)? as u64,
        revoked_ms: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
    })
}

impl Store {
    /// Record a new token.
    pub fn put_tenant(&self, t: &TenantRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO tenants (id, name, keys, ceiling, digest, created_ms, revoked_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                t.id,
                t.name,
                t.keys,
                t.ceiling as i64,
                t.digest,
                t.created_ms as i64,
                t.revoked_ms.map(|v| v as i64)
            ])
            .map(|_| ())
        })
    }

    /// Every token, live and revoked, oldest first.
    pub fn tenants(&self) -> Result<Vec<TenantRow>> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT id, name, keys, ceiling, digest, created_ms, revoked_ms
                 FROM tenants ORDER BY created_ms, id",
            )?;
            st.query_map([], row)?.collect()
        })
    }

    /// One token by id.
    pub fn tenant(&self, id: &str) -> Result<Option<TenantRow>> {
        self.with(|c| {
            c.prepare_cached(
                "SELECT id, name, keys, ceiling, digest, created_ms, revoked_ms
                 FROM tenants WHERE id = ?1",
            )?
            .query_row(params![id], row)
            .optional()
        })
    }

    /// Revoke a live token: `false` if there is none by that id or it was revoked.
    pub fn revoke_tenant(&self, id: &str, at_ms: u64) -> Result<bool> {
        self.with(|c| {
            c.prepare_cached(
                "UPDATE tenants SET revoked_ms = ?2 WHERE id = ?1 AND revoked_ms IS NULL",
            )?
            .execute(params![id, at_ms as i64])
            .map(|n| n > 0)
        })
    }

    /// Note that `tenant` has called `key` (idempotent).
    pub fn note_tenant_key(&self, tenant: &str, key: &str) -> Result<()> {
        self.with(|c| {
            c.prepare_cached("INSERT OR IGNORE INTO tenant_keys (tenant, key) VALUES (?1, ?2)")?
                .execute(params![tenant, key])
                .map(|_| ())
        })
    }

    /// Forget that `tenant` called `key` (its container is gone: nothing to count).
    pub fn forget_tenant_key(&self, tenant: &str, key: &str) -> Result<()> {
        self.with(|c| {
            c.prepare_cached("DELETE FROM tenant_keys WHERE tenant = ?1 AND key = ?2")?
                .execute(params![tenant, key])
                .map(|_| ())
        })
    }

    /// Every key `tenant` has called, in key order.
    pub fn tenant_keys(&self, tenant: &str) -> Result<Vec<String>> {
        self.with(|c| {
            let mut st =
                c.prepare_cached("SELECT key FROM tenant_keys WHERE tenant = ?1 ORDER BY key")?;
            st.query_map(params![tenant], |r| r.get(0))?.collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_stored_listed_revoked_once_and_its_keys_noted() {
        let dir = std::env::temp_dir().join(format!("stockade-store-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = Store::open_in(&dir).unwrap();
        let t = TenantRow {
            id: "a1".into(),
            name: "ci".into(),
            keys: "ci-*".into(),
            ceiling: 4,
            digest: vec![1, 2, 3],
            created_ms: 10,
            revoked_ms: None,
        };
        s.put_tenant(&t).unwrap();
        assert_eq!(s.tenants().unwrap(), vec![t.clone()]);
        assert!(s.revoke_tenant("a1", 20).unwrap());
        assert!(!s.revoke_tenant("a1", 30).unwrap(), "revoked once");
        assert!(!s.revoke_tenant("nope", 30).unwrap());
        assert_eq!(s.tenant("a1").unwrap().unwrap().revoked_ms, Some(20));
        s.note_tenant_key("a1", "ci-2").unwrap();
        s.note_tenant_key("a1", "ci-1").unwrap();
        s.note_tenant_key("a1", "ci-1").unwrap();
        assert_eq!(s.tenant_keys("a1").unwrap(), vec!["ci-1", "ci-2"]);
        assert!(s.tenant_keys("b").unwrap().is_empty());
        s.forget_tenant_key("a1", "ci-1").unwrap();
        assert_eq!(s.tenant_keys("a1").unwrap(), vec!["ci-2"]);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
