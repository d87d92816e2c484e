//! The egress records' rows (denials, admitted requests): how one is inserted and how
//! many of a key's are kept. Written by the store's direct path and by the audit
//! writer's batches, so neither imports the other for it.

use rusqlite::{Connection, params};
use stockade_egress::audit::{Admitted, Denial};
use stockade_egress::bounded;

/// Most admitted requests kept per key; older ones are dropped as new ones arrive.
pub(crate) const ADMITTED_KEPT: i64 = 10_000;

/// A record of a request that carried (or was refused) a credential outlives the
/// ordinary ones: it goes only once this many newer records of its key exist (a flood
/// of ordinary requests must not push it out of the audit: DESIGN §5).
pub(crate) const CREDENTIALED_KEPT: i64 = 10 * ADMITTED_KEPT;

/// Most denials kept per key; older ones are dropped as new ones arrive.
pub(crate) const DENIALS_KEPT: i64 = 1000;

/// Insert one denial (what the client chose kept to [`bounded::MAX_FIELD`] bytes a field).
pub(crate) fn insert_denial(
    c: &Connection,
    key: &str,
    container: &str,
    d: &Denial,
) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO denials (key, container, at_ms, host, method, path, rule_set, reason)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        key,
        container,
        d.at_ms as i64,
        bounded::field(&d.host),
        bounded::field(&d.method),
        bounded::field(&d.path),
        bounded::field(&d.rule_set),
        bounded::field(&d.reason)
    ])
    .map(|_| ())
}

/// Keep the newest [`DENIALS_KEPT`] denials of `key`.
pub(crate) fn trim_denials(c: &Connection, key: &str) -> rusqlite::Result<()> {
    c.prepare_cached(
        "DELETE FROM denials WHERE key = ?1 AND id <= (SELECT max(id) FROM denials WHERE key = ?1) - ?2",
    )?
    .execute(params![key, DENIALS_KEPT])
    .map(|_| ())
}

/// Insert one admitted request (what the client chose kept to [`bounded::MAX_FIELD`]
/// bytes a field).
pub(crate) fn insert_admitted(
    c: &Connection,
    key: &str,
    container: &str,
    a: &Admitted,
) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO admitted (key, container, at_ms, fence, method, host, port, path, rule, via, status, bytes_up, bytes_down, error, credentials, suppressed)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )?
    .execute(params![
        key,
        container,
        a.at_ms as i64,
        bounded::field(&a.fence),
        bounded::field(&a.method),
        bounded::field(&a.host),
        a.port,
        bounded::field(&a.path),
        a.rule,
        bounded::field(&a.via),
        a.status,
        a.bytes_up as i64,
        a.bytes_down as i64,
        bounded::field(&a.error),
        bounded::cut(&a.credentials.join(","), 16 * bounded::MAX_FIELD),
        a.suppressed as i64,
    ])
    .map(|_| ())
}

/// Keep the newest [`ADMITTED_KEPT`] admitted requests of `key`, and a credentialed
/// one until [`CREDENTIALED_KEPT`] newer ones exist.
pub(crate) fn trim_admitted(c: &Connection, key: &str) -> rusqlite::Result<()> {
    c.prepare_cached(
        "DELETE FROM admitted WHERE key = ?1 AND id <= (SELECT max(id) FROM admitted WHERE key = ?1) - ?2
         AND credentials = '' AND error <> 'credentials-withheld'",
    )?
    .execute(params![key, ADMITTED_KEPT])?;
    c.prepare_cached(
        "DELETE FROM admitted WHERE key = ?1 AND id <= (SELECT max(id) FROM admitted WHERE key = ?1) - ?2",
    )?
    .execute(params![key, CREDENTIALED_KEPT])
    .map(|_| ())
}
