//! The durable store: one SQLite file in the data directory (invariant 9). It holds
//! the guest's records (detached declarations), approvals, egress denials, the egress
//! audit of admitted requests, server-held secrets (values never leave the server
//! but as headers the proxy adds), a remote substrate's placements (key → node), and
//! the scoped consumer tokens (digests only) with the keys each has called, and the E2B
//! layer's sandboxes (id → key, whose: a token's digest).
//! One schema; migrations are in code, applied in order, tracked by `user_version`.
//! [`writer`] is the one thread that writes the egress records; [`cache`] serves
//! records and lists from memory (this process is the table's one writer).

pub mod cache;
mod e2b;
mod rows;
mod tenants;
pub mod writer;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use crate::cache::{Known, RecordCache};
use crate::writer::{Row, Shared};
pub use e2b::{E2bSandboxRow, E2bSourceRow};
use stockade_egress::audit::Admitted;
use stockade_egress::audit::Denial;
pub use tenants::TenantRow;

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("store {path}: {source}")]
pub struct StoreError {
    path: PathBuf,
    source: rusqlite::Error,
}

/// Shorthand for store results.
pub type Result<T> = std::result::Result<T, StoreError>;

/// Migrations, in order. Migration `i` brings the schema to `user_version = i + 1`.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE records (
        scope TEXT NOT NULL,
        name  TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (scope, name)
     ) WITHOUT ROWID;
     CREATE INDEX records_by_value ON records (value, name);
     CREATE TABLE approvals (
        token TEXT PRIMARY KEY,
        key   TEXT NOT NULL,
        argv  TEXT NOT NULL,
        at_ms INTEGER NOT NULL
     );
     CREATE TABLE denials (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        key       TEXT NOT NULL,
        container TEXT NOT NULL,
        at_ms     INTEGER NOT NULL,
        host      TEXT NOT NULL,
        method    TEXT NOT NULL,
        path      TEXT NOT NULL,
        rule_set  TEXT NOT NULL,
        reason    TEXT NOT NULL
     );
     CREATE INDEX denials_by_key ON denials (key, id);",
    // Approvals expire and are used once (DESIGN §2, the approval floor): rows from
    // before this column carry 0 and count as expired.
    "ALTER TABLE approvals ADD COLUMN expires_ms INTEGER NOT NULL DEFAULT 0",
    // The egress audit and server-held secrets (DESIGN §5).
    "CREATE TABLE admitted (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        key         TEXT NOT NULL,
        container   TEXT NOT NULL,
        at_ms       INTEGER NOT NULL,
        fence       TEXT NOT NULL,
        method      TEXT NOT NULL,
        host        TEXT NOT NULL,
        port        INTEGER NOT NULL,
        path        TEXT NOT NULL,
        rule        INTEGER NOT NULL,
        via         TEXT NOT NULL,
        status      INTEGER NOT NULL,
        bytes_up    INTEGER NOT NULL,
        bytes_down  INTEGER NOT NULL,
        error       TEXT NOT NULL,
        credentials TEXT NOT NULL
     );
     CREATE INDEX admitted_by_key ON admitted (key, id);
     CREATE TABLE secrets (
        name       TEXT PRIMARY KEY,
        value      TEXT NOT NULL,
        updated_ms INTEGER NOT NULL
     ) WITHOUT ROWID;",
    // A secret is bound by its approver to host:port, methods and a path prefix
    // (DESIGN §5): rows set before carry NULL, unbound, and no rule may name them.
    "ALTER TABLE secrets ADD COLUMN bind_host TEXT;
     ALTER TABLE secrets ADD COLUMN bind_port INTEGER;
     ALTER TABLE secrets ADD COLUMN bind_methods TEXT;
     ALTER TABLE secrets ADD COLUMN bind_path TEXT",
    // A fence's summary row counts the admitted requests the rate bound left out
    // (docs/EGRESS.md, "The audit: what got out"); 0 on every other row.
    "ALTER TABLE admitted ADD COLUMN suppressed INTEGER NOT NULL DEFAULT 0",
    // The node each key's container lives on, for a `remote` substrate (DESIGN §7).
    "CREATE TABLE placements (
        key  TEXT PRIMARY KEY,
        node TEXT NOT NULL
     ) WITHOUT ROWID",
    // Scoped consumer tokens (docs/TENANTS.md): the secret's SHA-256 only, never the
    // secret; a revoked token keeps its row (listed as revoked, its id never reused).
    // `tenant_keys` is every key a tenant has called, for its share of the ceiling.
    "CREATE TABLE tenants (
        id         TEXT PRIMARY KEY,
        name       TEXT NOT NULL,
        keys       TEXT NOT NULL,
        ceiling    INTEGER NOT NULL,
        digest     BLOB NOT NULL,
        created_ms INTEGER NOT NULL,
        revoked_ms INTEGER
     ) WITHOUT ROWID;
     CREATE TABLE tenant_keys (
        tenant TEXT NOT NULL,
        key    TEXT NOT NULL,
        PRIMARY KEY (tenant, key)
     ) WITHOUT ROWID",
    // The E2B layer's sandboxes (docs/E2B.md): id → key, and the SHA-256 of the token
    // that made it (never the token).
    "CREATE TABLE e2b_sandboxes (
        id         TEXT PRIMARY KEY,
        key        TEXT NOT NULL,
        owner      BLOB NOT NULL,
        template   TEXT NOT NULL,
        started_ms INTEGER NOT NULL,
        timeout_s  INTEGER NOT NULL,
        metadata   TEXT NOT NULL
     ) WITHOUT ROWID",
    // An E2B sandbox's network policy (the hosts its commands' grant admits), its end
    // (the sandbox timeout, as extended; 0: none), whether it pauses at its end instead
    // of being killed, whether it is paused (checkpointed) now, and the environment
    // its create gave every command (`envVars`).
    "ALTER TABLE e2b_sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{}';
     ALTER TABLE e2b_sandboxes ADD COLUMN end_ms INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE e2b_sandboxes ADD COLUMN auto_pause INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE e2b_sandboxes ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE e2b_sandboxes ADD COLUMN envs TEXT NOT NULL DEFAULT '{}'",
    // A killed E2B sandbox whose named snapshots outlive it: its id, key and owner,
    // so the snapshots are still listed (and can be deleted) after the kill; gone
    // with its last snapshot (docs/E2B.md, "Snapshots").
    "CREATE TABLE e2b_snapshot_sources (
        id    TEXT PRIMARY KEY,
        key   TEXT NOT NULL,
        owner BLOB NOT NULL
     ) WITHOUT ROWID",
];

/// The SQLite store. The egress audit it is the sink of is written by a batching
/// writer thread (crate::writer); reads of the audit see every row recorded
/// before them, and [`Store::flush`] (or dropping the store) writes what is queued.
///
/// Records are read through a cache ([`RecordCache`]: the table is changed by this
/// process alone, and the cache with it).
pub struct Store {
    path: PathBuf,
    shared: Arc<Shared>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    records: RecordCache,
}

impl Store {
    /// Open (creating and migrating) the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, crate::writer::CAPACITY)
    }

    /// [`Store::open`] with an audit queue of `capacity` rows.
    pub(crate) fn open_with(path: &Path, capacity: usize) -> Result<Self> {
        let err = |source| StoreError {
            path: path.to_path_buf(),
            source,
        };
        // Created 0600 before SQLite opens it: the WAL and shared-memory files take the
        // database file's mode, and approval tokens live here (the data directory is
        // private: datadir.rs).
        if let Err(e) = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
        {
            return Err(err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(e.to_string()),
            )));
        }
        let conn = Connection::open(path).map_err(err)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000;",
        )
        .map_err(err)?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err)?;
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            conn.execute_batch(&format!(
                "BEGIN; {m}; PRAGMA user_version = {}; COMMIT;",
                i + 1
            ))
            .map_err(err)?;
        }
        let shared = Shared::new(conn, capacity);
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("stockade-audit".into())
                .spawn(move || shared.run())
                .map_err(|e| {
                    err(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                        Some(format!("start the audit writer: {e}")),
                    ))
                })?
        };
        Ok(Self {
            path: path.to_path_buf(),
            shared,
            writer: Mutex::new(Some(writer)),
            records: RecordCache::default(),
        })
    }

    /// Open the store in a data directory (`<dir>/stockade.db`).
    pub fn open_in(data_dir: &Path) -> Result<Self> {
        Self::open(&data_dir.join("stockade.db"))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let conn = self.shared.conn();
        f(&conn).map_err(|source| StoreError {
            path: self.path.clone(),
            source,
        })
    }

    /// [`Store::with`] after the queued audit rows are written (read-through: a read
    /// of the audit sees every row recorded before it).
    fn with_audit<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        self.with(|c| {
            self.shared.drain(c)?;
            f(c)
        })
    }

    /// Write every queued audit row now (serve's shutdown path: nothing recorded is
    /// lost when the process exits). Returns how many were written.
    pub fn flush(&self) -> Result<usize> {
        let n = self.with(|c| self.shared.drain(c))?;
        tracing::info!(target: "stockade::store", rows = n, "egress audit queue flushed");
        Ok(n)
    }

    /// Store or replace a record.
    pub fn put(&self, scope: &str, name: &str, value: &str) -> Result<()> {
        self.with(|c| {
            let r = c
                .prepare_cached(
                    "INSERT OR REPLACE INTO records (scope, name, value) VALUES (?1, ?2, ?3)",
                )
                .and_then(|mut st| st.execute(params![scope, name, value]));
            self.took(scope, name, &r, Some(value));
            r.map(|_| ())
        })
    }

    /// Read a record (from the cache when it knows it).
    pub fn get(&self, scope: &str, name: &str) -> Result<Option<String>> {
        if let Known::Is(v) = self.records.get(scope, name) {
            return Ok(v);
        }
        self.with(|c| {
            let v: Option<String> = c
                .prepare_cached("SELECT value FROM records WHERE scope = ?1 AND name = ?2")?
                .query_row(params![scope, name], |r| r.get(0))
                .optional()?;
            self.records.set(scope, name, v.as_deref());
            Ok(v)
        })
    }

    /// Remove a record; true if it existed.
    pub fn remove(&self, scope: &str, name: &str) -> Result<bool> {
        self.with(|c| {
            let r = c
                .prepare_cached("DELETE FROM records WHERE scope = ?1 AND name = ?2")
                .and_then(|mut st| st.execute(params![scope, name]));
            self.took(scope, name, &r, None);
            r.map(|n| n > 0)
        })
    }

    /// After a change to `scope`/`name` (the connection's lock held): the cache holds
    /// what the table now holds, or forgets the record when the change failed (it may
    /// or may not have been made; the next read asks the table).
    fn took<T>(&self, scope: &str, name: &str, r: &rusqlite::Result<T>, now: Option<&str>) {
        match r {
            Ok(_) => self.records.changed(scope, name, now),
            Err(_) => self.records.forget(scope, name),
        }
    }

    /// Records of a scope whose name starts with `prefix`, in name order (from the
    /// cache when it knows them).
    pub fn list(&self, scope: &str, prefix: &str) -> Result<Vec<(String, String)>> {
        if let Some(rows) = self.records.list(scope, prefix) {
            return Ok(rows);
        }
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT name, value FROM records WHERE scope = ?1 AND substr(name, 1, length(?2)) = ?2 ORDER BY name",
            )?;
            let rows = st
                .query_map(params![scope, prefix], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<(String, String)>>>()?;
            self.records.set_list(scope, prefix, &rows);
            Ok(rows)
        })
    }

    /// Across scopes: (scope, name) of records with this name prefix and this value.
    pub fn find(&self, prefix: &str, value: &str) -> Result<Vec<(String, String)>> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT scope, name FROM records WHERE value = ?2 AND substr(name, 1, length(?1)) = ?1 ORDER BY scope, name",
            )?;
            st.query_map(params![prefix, value], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
    }

    /// Every record (scope, name, value): for tests and `doctor`.
    pub fn all_records(&self) -> Result<Vec<(String, String, String)>> {
        self.with(|c| {
            let mut st =
                c.prepare_cached("SELECT scope, name, value FROM records ORDER BY scope, name")?;
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
    }

    /// Record an approval for `key` and exactly `argv`; returns its token.
    pub fn record_approval(
        &self,
        key: &str,
        argv: &[String],
        at_ms: u64,
        expires_ms: u64,
    ) -> Result<String> {
        let token = uuid::Uuid::new_v4().to_string();
        let argv = serde_json::to_string(argv).expect("a list of strings serializes");
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO approvals (token, key, argv, at_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![token, key, argv, at_ms as i64, expires_ms as i64])
        })?;
        Ok(token)
    }

    /// The argv an approval recorded for `key` under `token` admits, if it exists and
    /// has not expired at `now_ms`. Looking does not spend it: the guest spends it with
    /// [`Store::take_approval`] once the command is admitted (DESIGN §2: an over-capacity
    /// answer or a wrong argv must not spend it).
    pub fn peek_approval(
        &self,
        key: &str,
        token: &str,
        now_ms: u64,
    ) -> Result<Option<Vec<String>>> {
        self.approval_argv(
            "SELECT argv FROM approvals WHERE token = ?1 AND key = ?2 AND expires_ms > ?3",
            key,
            token,
            now_ms,
        )
    }

    /// Use the approval recorded for `key` under `token`: its argv, if it exists and has
    /// not expired at `now_ms`. It is gone afterwards (single use), whatever the
    /// caller does with it.
    pub fn take_approval(
        &self,
        key: &str,
        token: &str,
        now_ms: u64,
    ) -> Result<Option<Vec<String>>> {
        let argv = self.approval_argv(
            "DELETE FROM approvals WHERE token = ?1 AND key = ?2 AND expires_ms > ?3 RETURNING argv",
            key,
            token,
            now_ms,
        )?;
        // Expired ones go too.
        self.with(|c| {
            c.prepare_cached("DELETE FROM approvals WHERE expires_ms <= ?1")?
                .execute(params![now_ms as i64])
        })?;
        Ok(argv)
    }

    /// The argv `sql` (taking token, key and now) answers for one approval.
    fn approval_argv(
        &self,
        sql: &str,
        key: &str,
        token: &str,
        now_ms: u64,
    ) -> Result<Option<Vec<String>>> {
        let argv: Option<String> = self.with(|c| {
            c.prepare_cached(sql)?
                .query_row(params![token, key, now_ms as i64], |r| r.get(0))
                .optional()
        })?;
        Ok(argv.and_then(|a| serde_json::from_str(&a).ok()))
    }

    /// Record an egress denial for `key` (keeps the newest [`rows::DENIALS_KEPT`]). What the
    /// client chose (host, method, path) is kept to [`bounded::MAX_FIELD`] bytes each.
    pub fn record_denial(&self, key: &str, container: &str, d: &Denial) -> Result<()> {
        self.with_audit(|c| {
            rows::insert_denial(c, key, container, d)?;
            rows::trim_denials(c, key)
        })
    }

    /// Denials recorded for `key`, oldest first.
    pub fn denials(&self, key: &str) -> Result<Vec<Denial>> {
        self.with_audit(|c| {
            let mut st = c.prepare_cached(
                "SELECT at_ms, host, method, path, rule_set, reason FROM denials WHERE key = ?1 ORDER BY id",
            )?;
            st.query_map(params![key], |r| {
                Ok(Denial {
                    at_ms: r.get::<_, i64>(0)? as u64,
                    host: r.get(1)?,
                    method: r.get(2)?,
                    path: r.get(3)?,
                    rule_set: r.get(4)?,
                    reason: r.get(5)?,
                })
            })?
            .collect()
        })
    }
}

impl Store {
    /// Record an admitted request for `key` (keeps the newest [`rows::ADMITTED_KEPT`], and a
    /// credentialed one until [`rows::CREDENTIALED_KEPT`] newer ones exist). What
    /// the client chose is kept to [`bounded::MAX_FIELD`] bytes a field.
    pub fn record_admitted(&self, key: &str, container: &str, a: &Admitted) -> Result<()> {
        self.with_audit(|c| {
            rows::insert_admitted(c, key, container, a)?;
            rows::trim_admitted(c, key)
        })
    }

    /// Admitted requests recorded for `key`, oldest first.
    pub fn admitted(&self, key: &str) -> Result<Vec<Admitted>> {
        self.with_audit(|c| {
            let mut st = c.prepare_cached(
                "SELECT at_ms, fence, method, host, port, path, rule, via, status, bytes_up, bytes_down, error, credentials, suppressed
                 FROM admitted WHERE key = ?1 ORDER BY id",
            )?;
            st.query_map(params![key], |r| {
                let credentials: String = r.get(12)?;
                Ok(Admitted {
                    at_ms: r.get::<_, i64>(0)? as u64,
                    fence: r.get(1)?,
                    method: r.get(2)?,
                    host: r.get(3)?,
                    port: r.get(4)?,
                    path: r.get(5)?,
                    rule: r.get(6)?,
                    via: r.get(7)?,
                    status: r.get(8)?,
                    bytes_up: r.get::<_, i64>(9)? as u64,
                    bytes_down: r.get::<_, i64>(10)? as u64,
                    error: r.get(11)?,
                    credentials: credentials
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                    suppressed: r.get::<_, i64>(13)? as u64,
                })
            })?
            .collect()
        })
    }

    /// Set (or replace) a secret's value and its binding, together.
    pub fn put_secret(
        &self,
        name: &str,
        value: &str,
        binding: &stockade_grammar::binding::Binding,
        now_ms: u64,
    ) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO secrets (name, value, updated_ms, bind_host, bind_port, bind_methods, bind_path)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_ms = excluded.updated_ms,
                   bind_host = excluded.bind_host, bind_port = excluded.bind_port,
                   bind_methods = excluded.bind_methods, bind_path = excluded.bind_path",
            )?
            .execute(params![
                name,
                value,
                now_ms as i64,
                binding.host,
                binding.port,
                binding.methods.join(","),
                binding.path_prefix
            ])
            .map(|_| ())
        })
    }

    /// A stored secret's binding: `Ok(None)` when it is not set or was set before
    /// bindings existed (unbound). Read back through [`stockade_grammar::binding::parse`],
    /// so a row edited by hand cannot widen it past the grammar.
    pub fn secret_binding(&self, name: &str) -> Result<Option<stockade_grammar::binding::Binding>> {
        type Row = (Option<String>, Option<u16>, Option<String>, Option<String>);
        let row: Option<Row> =
            self.with(|c| {
                c.prepare_cached(
                "SELECT bind_host, bind_port, bind_methods, bind_path FROM secrets WHERE name = ?1",
            )?
            .query_row(params![name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .optional()
            })?;
        let Some((Some(host), Some(port), Some(methods), Some(path))) = row else {
            return Ok(None);
        };
        let methods: Vec<String> = methods.split(',').map(str::to_owned).collect();
        let host = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(stockade_grammar::binding::parse(&host, &methods, Some(&path)).ok())
    }

    /// A secret's value.
    pub fn secret(&self, name: &str) -> Result<Option<String>> {
        self.with(|c| {
            c.prepare_cached("SELECT value FROM secrets WHERE name = ?1")?
                .query_row(params![name], |r| r.get(0))
                .optional()
        })
    }

    /// Remove a secret; whether it existed.
    pub fn remove_secret(&self, name: &str) -> Result<bool> {
        self.with(|c| {
            c.prepare_cached("DELETE FROM secrets WHERE name = ?1")?
                .execute(params![name])
                .map(|n| n > 0)
        })
    }

    /// The node `key` was placed on (a `remote` substrate's placement).
    pub fn placement(&self, key: &str) -> Result<Option<String>> {
        self.with(|c| {
            c.prepare_cached("SELECT node FROM placements WHERE key = ?1")?
                .query_row(params![key], |r| r.get(0))
                .optional()
        })
    }

    /// Place `key` on `node` (replacing an earlier placement).
    pub fn place(&self, key: &str, node: &str) -> Result<()> {
        self.with(|c| {
            c.prepare_cached("INSERT OR REPLACE INTO placements (key, node) VALUES (?1, ?2)")?
                .execute(params![key, node])
                .map(|_| ())
        })
    }

    /// Every placement (key, node), in key order.
    pub fn placements(&self) -> Result<Vec<(String, String)>> {
        self.with(|c| {
            let mut st = c.prepare_cached("SELECT key, node FROM placements ORDER BY key")?;
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
        })
    }

    /// The secrets set through the API: names and when they were set, never values.
    pub fn secret_names(&self) -> Result<Vec<(String, u64)>> {
        self.with(|c| {
            let mut st = c.prepare_cached("SELECT name, updated_ms FROM secrets ORDER BY name")?;
            st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?
                .collect()
        })
    }
}

/// The proxy's audit sink: denials and admitted requests are queued for the writer
/// thread (crate::writer), which writes them in batches off the request path.
impl stockade_egress::DenialSink for Store {
    fn record(&self, key: &str, container: &str, denial: Denial) {
        // A denial that cannot be stored is still a denial: the request was refused;
        // a loss is logged (by the writer), not turned into an admit.
        self.shared.enqueue(Row::Denial {
            key: key.to_owned(),
            container: container.to_owned(),
            denial,
        });
    }

    fn record_admitted(&self, key: &str, container: &str, admitted: Admitted) {
        self.shared.enqueue(Row::Admitted {
            key: key.to_owned(),
            container: container.to_owned(),
            admitted,
        });
    }
}

/// Dropping the store writes what is queued, then ends the writer thread.
impl Drop for Store {
    fn drop(&mut self) {
        self.shared.stop();
        let writer = self
            .writer
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(w) = writer
            && w.join().is_err()
        {
            tracing::warn!(target: "stockade::store", path = %self.path.display(), "the egress audit writer panicked");
        }
    }
}

/// Where the proxy's secrets set through the API are kept.
impl stockade_egress::secrets::SecretStore for Store {
    fn put_secret(
        &self,
        name: &str,
        value: &str,
        binding: &stockade_grammar::binding::Binding,
        now_ms: u64,
    ) -> std::result::Result<(), stockade_egress::secrets::StoreError> {
        Ok(Store::put_secret(self, name, value, binding, now_ms)?)
    }

    fn secret_binding(
        &self,
        name: &str,
    ) -> std::result::Result<
        Option<stockade_grammar::binding::Binding>,
        stockade_egress::secrets::StoreError,
    > {
        Ok(Store::secret_binding(self, name)?)
    }

    fn secret(
        &self,
        name: &str,
    ) -> std::result::Result<Option<String>, stockade_egress::secrets::StoreError> {
        Ok(Store::secret(self, name)?)
    }

    fn remove_secret(
        &self,
        name: &str,
    ) -> std::result::Result<bool, stockade_egress::secrets::StoreError> {
        Ok(Store::remove_secret(self, name)?)
    }

    fn secret_names(
        &self,
    ) -> std::result::Result<Vec<(String, u64)>, stockade_egress::secrets::StoreError> {
        Ok(Store::secret_names(self)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::ADMITTED_KEPT;
    use stockade_egress::bounded;

    /// A store in a new directory of its own (the caller removes it).
    pub(crate) fn temp() -> (PathBuf, Store) {
        let dir = std::env::temp_dir().join(format!("stockade-store-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = Store::open_in(&dir).unwrap();
        (dir, s)
    }

    /// The table as SQLite holds it, read past the store's cache.
    fn table(s: &Store, scope: &str, name: &str) -> Option<String> {
        let c = Connection::open(s.path()).unwrap();
        c.query_row(
            "SELECT value FROM records WHERE scope = ?1 AND name = ?2",
            params![scope, name],
            |r| r.get(0),
        )
        .optional()
        .unwrap()
    }

    #[test]
    fn a_record_read_is_what_the_table_holds_after_every_change() {
        let (dir, s) = temp();
        let ops: &[(&str, Option<&str>)] = &[
            ("a", Some("1")),
            ("a", Some("2")),
            ("b", None),
            ("a", None),
            ("a", None),
            ("b", Some("3")),
            ("a", Some("4")),
        ];
        for (name, v) in ops {
            // Read first, so a stale entry would be there to be seen.
            let _ = s.get("k", name).unwrap();
            for prefix in ["", "a", "b"] {
                let _ = s.list("k", prefix).unwrap();
            }
            match v {
                Some(v) => s.put("k", name, v).unwrap(),
                None => drop(s.remove("k", name).unwrap()),
            }
            for n in ["a", "b"] {
                assert_eq!(
                    s.get("k", n).unwrap(),
                    table(&s, "k", n),
                    "{n} after {ops:?}"
                );
            }
            for prefix in ["", "a", "b"] {
                assert_eq!(
                    s.list("k", prefix).unwrap(),
                    table_list(&s, "k", prefix),
                    "list {prefix:?} after {name} {v:?}"
                );
            }
        }
        drop(s);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The records of `scope` under `prefix` as the table holds them (no cache).
    fn table_list(s: &Store, scope: &str, prefix: &str) -> Vec<(String, String)> {
        let c = Connection::open(s.path()).unwrap();
        let mut st = c
            .prepare("SELECT name, value FROM records WHERE scope = ?1 ORDER BY name")
            .unwrap();
        let all = st
            .query_map(params![scope], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .unwrap()
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap();
        all.into_iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .collect()
    }

    #[test]
    fn a_list_read_twice_is_read_from_the_table_once_until_a_change_in_it() {
        let (dir, s) = temp();
        s.put("k", "decl/a", "1").unwrap();
        assert_eq!(s.list("k", "decl/").unwrap().len(), 1);
        assert_eq!(s.list("k", "tomb/").unwrap().len(), 0);
        // Behind the store's back: the cached lists stand, so they were not read again.
        let c = Connection::open(s.path()).unwrap();
        c.execute_batch(
            "INSERT INTO records (scope, name, value) VALUES ('k', 'decl/b', 'x'), ('k', 'tomb/b', 'x');",
        )
        .unwrap();
        assert_eq!(s.list("k", "decl/").unwrap().len(), 1);
        assert_eq!(s.list("k", "tomb/").unwrap().len(), 0);
        // A change through the store under one prefix: that list is read again, the
        // other's stands.
        s.put("k", "decl/c", "2").unwrap();
        assert_eq!(s.list("k", "decl/").unwrap().len(), 3);
        assert_eq!(s.list("k", "tomb/").unwrap().len(), 0);
        s.remove("k", "tomb/none").unwrap();
        assert_eq!(s.list("k", "tomb/").unwrap().len(), 1);
        drop((c, s));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_record_read_twice_is_read_from_the_table_once() {
        let (dir, s) = temp();
        s.put("k", "a", "1").unwrap();
        assert_eq!(s.get("k", "missing").unwrap(), None);
        // Behind the store's back (what the data directory's lock forbids a second
        // process to do): the cached answers stand, so they were not read again.
        let c = Connection::open(s.path()).unwrap();
        c.execute_batch(
            "INSERT INTO records (scope, name, value) VALUES ('k', 'missing', 'x');
             UPDATE records SET value = '9' WHERE name = 'a';",
        )
        .unwrap();
        assert_eq!(s.get("k", "a").unwrap().as_deref(), Some("1"));
        assert_eq!(s.get("k", "missing").unwrap(), None);
        assert_eq!(
            s.get("k", "other").unwrap(),
            None,
            "a name not read before is read"
        );
        drop((c, s));
        let s = Store::open_in(&dir).unwrap();
        assert_eq!(
            s.get("k", "a").unwrap().as_deref(),
            Some("9"),
            "a new store reads the table"
        );
        drop(s);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn records_survive_reopening_the_database() {
        let (dir, s) = temp();
        s.put("k", "detached/a", "c1").unwrap();
        s.put("k", "detached/b", "c2").unwrap();
        s.put("other", "detached/c", "c1").unwrap();
        drop(s);
        let s = Store::open_in(&dir).unwrap();
        assert_eq!(s.get("k", "detached/a").unwrap().as_deref(), Some("c1"));
        assert_eq!(s.list("k", "detached/").unwrap().len(), 2);
        assert_eq!(
            s.find("detached/", "c1").unwrap(),
            vec![
                ("k".into(), "detached/a".into()),
                ("other".into(), "detached/c".into())
            ]
        );
        assert!(s.remove("k", "detached/a").unwrap());
        assert!(!s.remove("k", "detached/a").unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn prefixes_are_literal_not_like_patterns() {
        let (dir, s) = temp();
        s.put("k", "detached/a", "c").unwrap();
        s.put("k", "detachedXa", "c").unwrap();
        assert_eq!(s.list("k", "detached/").unwrap().len(), 1);
        assert_eq!(s.list("k", "%").unwrap().len(), 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_approval_is_for_one_key_and_one_argv() {
        let (dir, s) = temp();
        let argv = vec!["git".to_string(), "push".to_string()];
        let t = s.record_approval("k", &argv, 1, 1000).unwrap();
        assert_eq!(
            s.take_approval("other", &t, 10).unwrap(),
            None,
            "another key's"
        );
        assert_eq!(s.take_approval("k", "nope", 10).unwrap(), None);
        assert_eq!(
            s.peek_approval("k", &t, 10).unwrap(),
            Some(argv.clone()),
            "looking spends nothing"
        );
        assert_eq!(s.peek_approval("other", &t, 10).unwrap(), None);
        assert_eq!(s.take_approval("k", &t, 10).unwrap(), Some(argv.clone()));
        assert_eq!(s.take_approval("k", &t, 10).unwrap(), None, "used once");
        let late = s.record_approval("k", &argv, 1, 1000).unwrap();
        assert_eq!(s.take_approval("k", &late, 1000).unwrap(), None, "expired");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn denials_are_kept_per_key_oldest_first() {
        let (dir, s) = temp();
        let d = |h: &str| Denial {
            at_ms: 1,
            host: h.into(),
            method: "GET".into(),
            path: "/".into(),
            rule_set: "f".into(),
            reason: "no-rule".into(),
        };
        s.record_denial("k", "c", &d("a")).unwrap();
        s.record_denial("k", "c", &d("b")).unwrap();
        s.record_denial("j", "c", &d("z")).unwrap();
        let hosts: Vec<_> = s
            .denials("k")
            .unwrap()
            .into_iter()
            .map(|d| d.host)
            .collect();
        assert_eq!(hosts, ["a", "b"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A 30 kB host, method or path a client chose is stored cut to the bound (a client
    /// must not amplify its input into the store), in denials and in the audit; a
    /// fence's summary row keeps its count.
    #[test]
    fn client_chosen_fields_are_stored_bounded() {
        let (dir, s) = temp();
        let big = "x".repeat(30_000);
        s.record_denial(
            "k",
            "c",
            &Denial {
                at_ms: 1,
                host: big.clone(),
                method: big.clone(),
                path: big.clone(),
                rule_set: "f".into(),
                reason: "no-rule".into(),
            },
        )
        .unwrap();
        s.record_admitted(
            "k",
            "c",
            &Admitted {
                host: big.clone(),
                method: big.clone(),
                path: big.clone(),
                ..Admitted::default()
            },
        )
        .unwrap();
        s.record_admitted("k", "c", &Admitted::summary("f", 2, 91_000))
            .unwrap();
        let d = &s.denials("k").unwrap()[0];
        assert_eq!(
            (d.host.len(), d.method.len(), d.path.len()),
            (bounded::MAX_FIELD, bounded::MAX_FIELD, bounded::MAX_FIELD)
        );
        let a = s.admitted("k").unwrap();
        assert_eq!(
            (a[0].host.len(), a[0].method.len(), a[0].path.len()),
            (bounded::MAX_FIELD, bounded::MAX_FIELD, bounded::MAX_FIELD)
        );
        assert_eq!((a[1].via.as_str(), a[1].suppressed), ("summary", 91_000));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The audit never drops a credentialed record (DESIGN §5): more ordinary records
    /// than are kept do not push one (added or withheld) out; the ordinary ones stay
    /// bounded.
    #[test]
    fn a_flood_of_records_does_not_push_a_credentialed_one_out() {
        let (dir, s) = temp();
        let record = |path: &str| Admitted {
            path: path.into(),
            ..Admitted::default()
        };
        let mut with = record("/with");
        with.credentials = vec!["authorization".into()];
        let mut withheld = record("/withheld");
        withheld.error = stockade_egress::audit::CREDENTIALS_WITHHELD.into();
        s.record_admitted("k", "c", &with).unwrap();
        s.record_admitted("k", "c", &withheld).unwrap();
        for _ in 0..ADMITTED_KEPT + 10 {
            s.record_admitted("k", "c", &record("/flood")).unwrap();
        }
        let a = s.admitted("k").unwrap();
        assert_eq!(
            a.iter()
                .map(|r| r.path.as_str())
                .take(2)
                .collect::<Vec<_>>(),
            ["/with", "/withheld"]
        );
        assert!(a.len() as i64 <= ADMITTED_KEPT + 2, "{}", a.len());
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn denial(host: &str) -> Denial {
        Denial {
            at_ms: 1,
            host: host.into(),
            method: "GET".into(),
            path: "/".into(),
            rule_set: "none".into(),
            reason: "no-grant".into(),
        }
    }

    fn admitted(path: &str) -> Admitted {
        Admitted {
            fence: "f1".into(),
            path: path.into(),
            ..Admitted::default()
        }
    }

    /// The sink only queues; a read of the audit writes what is queued first,
    /// so it sees every row recorded before it (the writer thread is held off here).
    #[test]
    fn a_read_of_the_audit_sees_every_row_queued_before_it() {
        use stockade_egress::DenialSink;
        let (dir, s) = temp();
        s.shared.hold(true);
        for i in 0..100 {
            DenialSink::record(&s, "k", "c", denial(&format!("h{i}")));
            DenialSink::record_admitted(&s, "k", "c", admitted(&format!("/{i}")));
        }
        assert_eq!(s.shared.queued(), 200, "the sink wrote on the request path");
        let d = s.denials("k").unwrap();
        assert_eq!(d.len(), 100);
        assert_eq!((d[0].host.as_str(), d[99].host.as_str()), ("h0", "h99"));
        let a = s.admitted("k").unwrap();
        assert_eq!(a.len(), 100);
        assert_eq!((a[0].path.as_str(), a[99].path.as_str()), ("/0", "/99"));
        assert_eq!(s.shared.queued(), 0);
        drop(s);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Nothing queued is lost at shutdown: rows still queued when the store
    /// is flushed (serve's shutdown) or dropped are in the database when it is reopened.
    #[test]
    fn nothing_queued_is_lost_at_shutdown() {
        use stockade_egress::DenialSink;
        for flush in [true, false] {
            let (dir, s) = temp();
            s.shared.hold(true);
            for i in 0..3000 {
                let key = format!("k{}", i % 3);
                DenialSink::record_admitted(&s, &key, "c", admitted(&format!("/{i}")));
                if i % 10 == 0 {
                    DenialSink::record(&s, &key, "c", denial("h"));
                }
            }
            assert_eq!(s.shared.queued(), 3300);
            if flush {
                assert_eq!(s.flush().unwrap(), 3300);
            }
            drop(s);
            let s = Store::open_in(&dir).unwrap();
            let (mut a, mut d) = (0, 0);
            for k in ["k0", "k1", "k2"] {
                a += s.admitted(k).unwrap().len();
                d += s.denials(k).unwrap().len();
            }
            assert_eq!((a, d), (3000, 300), "flush {flush}");
            drop(s);
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    /// Rows recorded from many threads while the writer thread runs, and
    /// read meanwhile, all land once, in each thread's order.
    #[test]
    fn rows_from_many_threads_land_once_while_the_writer_runs() {
        use stockade_egress::DenialSink;
        let (dir, s) = temp();
        let s = Arc::new(s);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        DenialSink::record_admitted(
                            &*s,
                            "k",
                            &format!("c{t}"),
                            admitted(&format!("/{i}")),
                        );
                        if i % 100 == 0 {
                            s.admitted("k").unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let a = s.admitted("k").unwrap();
        assert_eq!(a.len(), 2000);
        drop(s);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A full queue drops only ordinary admitted rows, counted in a summary
    /// row `egress(key)` shows; a denial and a credentialed row are written by their
    /// caller, with the queue before them, in order.
    #[test]
    fn a_full_queue_drops_only_ordinary_rows_and_counts_them() {
        use crate::writer::QUEUE_FULL;
        use stockade_egress::DenialSink;
        let dir = std::env::temp_dir().join(format!("stockade-store-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = Store::open_with(&dir.join("stockade.db"), 4).unwrap();
        s.shared.hold(true);
        for i in 0..4 {
            DenialSink::record_admitted(&s, "k", "c", admitted(&format!("/q{i}")));
        }
        for i in 0..3 {
            DenialSink::record_admitted(&s, "k", "c", admitted(&format!("/dropped{i}")));
        }
        assert_eq!(s.shared.queued(), 4);
        let mut with = admitted("/credentialed");
        with.credentials = vec!["authorization".into()];
        DenialSink::record_admitted(&s, "k", "c", with);
        assert_eq!(
            s.shared.queued(),
            0,
            "the credentialed row was written inline"
        );
        for i in 0..4 {
            DenialSink::record_admitted(&s, "k", "c", admitted(&format!("/r{i}")));
        }
        DenialSink::record(&s, "k", "c", denial("refused"));
        let a = s.admitted("k").unwrap();
        let paths: Vec<_> = a.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/q0",
                "/q1",
                "/q2",
                "/q3",
                "/credentialed",
                "",
                "/r0",
                "/r1",
                "/r2",
                "/r3"
            ]
        );
        let summary = &a[5];
        assert_eq!(
            (
                summary.via.as_str(),
                summary.error.as_str(),
                summary.suppressed,
                summary.fence.as_str()
            ),
            (stockade_egress::audit::VIA_SUMMARY, QUEUE_FULL, 3, "f1")
        );
        assert_eq!(s.denials("k").unwrap().len(), 1);
        drop(s);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The proxy's denials reach the store through its audit sink (moved with the
    /// proxy's own crate: the store implements the sink).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_is_a_denial_sink() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (dir, store) = temp();
        let store = std::sync::Arc::new(store);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let task = stockade_egress::serve(
            listener,
            stockade_egress::Fence::new("key-s", "container-s"),
            stockade_egress::ProxyOptions::default(),
            store.clone(),
            None,
        );
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET http://example.invalid/x HTTP/1.1\r\nHost: example.invalid\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        assert!(out.contains("x-stockade-denial: no-grant"), "{out}");
        let denials = store.denials("key-s").unwrap();
        assert_eq!(denials.len(), 1);
        assert_eq!(
            (denials[0].host.as_str(), denials[0].reason.as_str()),
            ("example.invalid", "no-grant")
        );
        task.abort();
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A secret row from before bindings existed (a value, no binding) reads as
    /// unbound through the secret store: no rule may name it.
    #[test]
    fn a_secret_row_from_before_bindings_is_unbound() {
        let (dir, store) = temp();
        let conn = rusqlite::Connection::open(dir.join("stockade.db")).unwrap();
        conn.execute(
            "INSERT INTO secrets (name, value, updated_ms) VALUES ('old', 'v', 1)",
            [],
        )
        .unwrap();
        let s =
            stockade_egress::secrets::Secrets::new(std::sync::Arc::new(store), Default::default());
        assert_eq!(s.binding("old"), None, "an old secret is unbound");
        assert!(s.exists("old"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
