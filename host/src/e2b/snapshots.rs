//! E2B's snapshots (`Sandbox.create_snapshot`, `Sandbox.list_snapshots`,
//! `Sandbox.delete_snapshot`, `Sandbox.create(snapshot_id)`) on Stockade's named
//! snapshots and forks (docs/E2B.md, "Snapshots"). Nothing is kept here: a snapshot is
//! its source sandbox's key's named snapshot, and its id says which key.
//!
//! * A snapshot id is its source sandbox's id and 12 more characters from the OS
//!   CSPRNG (32 of `[a-z0-9]`): the native snapshot's name as it is. The source key
//!   is derived from the id and the caller's scope, as a sandbox's is
//!   ([`super::ids::key_for`]), so another token's snapshot id names a key of the
//!   caller's own, which holds no such snapshot: the same 404 as an unknown one.
//! * `create_snapshot` is `POST …/snapshots` on the source's key: the container runs
//!   on (a paused sandbox is checkpointed again after, so it stays paused).
//! * `create(snapshot_id)` forks a new key from it (`POST …/fork`), then starts it.
//! * The list is the snapshots of the caller's sandboxes, and of its killed ones whose
//!   snapshots outlive them: a kill (or a timeout's end) whose key still holds some of
//!   the sandbox's snapshots keeps the sandbox as their source ([`E2b::outlive`]: its id,
//!   key and owner, in the table and the store), forgotten with its last snapshot (a
//!   delete here, or a list that finds none left).
//! * E2B's snapshot names (aliases) are not kept: `names` is empty.
//!
//! The ids (`ids::snapshot_id`, `ids::source_of`) and [`ListQuery`] are pure and
//! table-tested; a create from a snapshot is `control::make`'s.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{E2b, E2bError, Sandbox, digest, ids};

/// `GET /snapshots`' query: `sandboxID`, `name`, `limit` (1 to 100), `nextToken` (the
/// last id of the page before). Anything else, or a value that does not parse, is a
/// 400, as the sandbox list's is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub sandbox: Option<String>,
    pub name: Option<String>,
    pub limit: usize,
    pub after: Option<String>,
}

impl ListQuery {
    pub fn parse(raw: Option<&str>) -> Result<Self, String> {
        let mut q = ListQuery {
            sandbox: None,
            name: None,
            limit: super::listing::MAX_LIMIT,
            after: None,
        };
        for (k, v) in super::listing::form_pairs(raw.unwrap_or(""))? {
            match k.as_str() {
                "sandboxID" => q.sandbox = Some(v),
                "name" => q.name = Some(v),
                "limit" => {
                    q.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=super::listing::MAX_LIMIT).contains(n))
                        .ok_or_else(|| format!("limit: {v:?} is not a number from 1 to 100"))?;
                }
                "nextToken" if ids::source_of(&v).is_some() => q.after = Some(v),
                "nextToken" => return Err(format!("nextToken: {v:?} is not a snapshot id")),
                other => return Err(format!("{other:?} is not a parameter of this list")),
            }
        }
        Ok(q)
    }

    /// What the list does with its next source (the caller's sandboxes and killed
    /// sources, by id, in order), given the ids found so far (pure): ask it, skip it
    /// (the page starts after every snapshot it can hold), or stop (the page and one
    /// more are found). A later source's snapshot never comes before an earlier one's:
    /// a snapshot id starts with its source's id, and every id is as long.
    pub fn step(&self, source: &str, found: &[String]) -> Step {
        if self.name.is_some() {
            return Step::Stop;
        }
        let past = |n: &&String| self.after.as_ref().is_none_or(|a| *n > a);
        if found.iter().filter(past).count() > self.limit {
            return Step::Stop;
        }
        match self.after.as_deref().and_then(ids::source_of) {
            Some(from) if source < from => Step::Skip,
            _ => Step::Ask,
        }
    }

    /// One page of `ids` (sorted here) and the next page's token, if more remain. A
    /// name filter keeps nothing: this layer keeps no names.
    pub fn page(&self, mut ids: Vec<String>) -> (Vec<String>, Option<String>) {
        if self.name.is_some() {
            return (Vec::new(), None);
        }
        ids.sort();
        if let Some(after) = &self.after {
            ids.retain(|i| i > after);
        }
        let more = ids.len() > self.limit;
        ids.truncate(self.limit);
        let next = if more { ids.last().cloned() } else { None };
        (ids, next)
    }
}

/// [`ListQuery::step`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Ask,
    Skip,
    Stop,
}

fn info(id: &str) -> Value {
    json!({ "snapshotID": id, "names": [] })
}

/// Sandbox `s`'s `/workspace` saved as `snapshot` (`POST …/snapshots`). Saving starts
/// a paused sandbox's container: it is checkpointed again, so it stays paused.
async fn save(
    client: &stockade_client::Client,
    s: &Sandbox,
    snapshot: &str,
) -> Result<(), E2bError> {
    client
        .save_snapshot(&s.key, snapshot)
        .await
        .map_err(E2bError::of_client)?;
    if s.paused {
        client
            .checkpoint(&s.key)
            .await
            .map_err(E2bError::of_client)?;
    }
    Ok(())
}

/// `POST /sandboxes/{id}/snapshots`: the sandbox's `/workspace` as a new snapshot; 201
/// with its id. The body (`name`, `memory`) is read whole and must be a JSON object
/// when there is one; a name is not kept, and every snapshot is of the filesystem
/// (no memory: processes never survive, as a pause's do not).
pub async fn create(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    if !body.is_empty() {
        super::control::object(&body).map_err(|m| E2bError::new(StatusCode::BAD_REQUEST, m))?;
    }
    let (token, s) = super::control::caller_sandbox(&e, &h, &id).await?;
    let snapshot = ids::snapshot_id(&id);
    save(&e.client(&token), &s, &snapshot).await?;
    tracing::info!(target: "stockade::e2b", sandbox = %id, key = %s.key, snapshot = %snapshot, "snapshot created");
    Ok((StatusCode::CREATED, Json(info(&snapshot))).into_response())
}

/// The caller's sandboxes and killed sources (owner `d`), by id, as `(id, key,
/// killed)`, narrowed to `only` when given (pure over the table).
fn sources_of(
    t: &super::Table,
    d: &[u8; 32],
    only: Option<&str>,
) -> std::collections::BTreeMap<String, (String, bool)> {
    let wanted = |id: &str| only.is_none_or(|want| want == id);
    let mut out = std::collections::BTreeMap::new();
    for (id, s) in &t.sources {
        if crate::compare::same(&s.owner, d) && wanted(id) {
            out.insert(id.clone(), (s.key.clone(), true));
        }
    }
    for (id, s) in &t.by_id {
        if crate::compare::same(&s.owner, d) && wanted(id) {
            out.insert(id.clone(), (s.key.clone(), false));
        }
    }
    out
}

/// `GET /snapshots`: the snapshots of the caller's sandboxes and of its killed ones
/// whose snapshots outlive them, paged.
pub async fn list(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, E2bError> {
    let token = super::control::api_key(&h)?;
    super::control::scope(&e, &token).await?;
    let query =
        ListQuery::parse(raw.as_deref()).map_err(|m| E2bError::new(StatusCode::BAD_REQUEST, m))?;
    let d = digest(&token);
    let mine = sources_of(&e.table(), &d, query.sandbox.as_deref());
    let client = e.client(&token);
    let mut found = Vec::new();
    for (id, (key, killed)) in mine {
        match query.step(&id, &found) {
            Step::Ask => {}
            Step::Skip => continue,
            Step::Stop => break,
        }
        let held = match client.snapshots(&key).await {
            Ok(held) => held,
            // A killed sandbox's key the API no longer answers holds nothing listable
            // (the source is dropped below); a live sandbox's answer is the list's.
            Err(stockade_client::Error::Api { status: 404, .. }) if killed => Vec::new(),
            Err(x) => return Err(E2bError::of_client(x)),
        };
        let before = found.len();
        found.extend(
            held.into_iter()
                .map(|s| s.name)
                .filter(|n| ids::source_of(n) == Some(id.as_str())),
        );
        if killed && found.len() == before {
            // Its last snapshot went another way (the native API): nothing to list.
            e.drop_source(&id)?;
        }
    }
    let (page, next) = query.page(found);
    let mut r = Json(Value::Array(page.iter().map(|i| info(i)).collect())).into_response();
    if let Some(next) = next.and_then(|n| axum::http::HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert("x-next-token", next);
    }
    Ok(r)
}

/// `DELETE /templates/{id}` (the SDK's `delete_snapshot`): 204, or 404 when the
/// caller holds no such snapshot (an unknown id, another token's).
pub async fn delete(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(snapshot): Path<String>,
) -> Result<StatusCode, E2bError> {
    let token = super::control::api_key(&h)?;
    let keys = super::control::scope(&e, &token).await?;
    let missing = || {
        E2bError::new(
            StatusCode::NOT_FOUND,
            format!("snapshot {snapshot} not found"),
        )
    };
    let key = ids::source_key(&keys, &snapshot).ok_or_else(missing)?;
    let client = e.client(&token);
    let held = client.snapshots(&key).await.map_err(E2bError::of_client)?;
    if !held.iter().any(|s| s.name == snapshot) {
        return Err(missing());
    }
    client
        .delete_snapshot(&key, &snapshot)
        .await
        .map_err(E2bError::of_client)?;
    // A killed sandbox's last snapshot: it is no source any more.
    if let Some(source) = ids::source_of(&snapshot) {
        let last = !held
            .iter()
            .any(|s| s.name != snapshot && ids::source_of(&s.name) == Some(source));
        if last && e.table().sources.contains_key(source) {
            e.drop_source(source)?;
        }
    }
    tracing::info!(target: "stockade::e2b", key = %key, snapshot = %snapshot, "snapshot deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// The most forks one `fork` makes (E2B's SDK checks only that it is at least 1).
pub const MAX_FORKS: u64 = 16;
/// E2B's default lifetime of a fork, seconds.
pub const FORK_TIMEOUT_S: u64 = 15;

/// `fork`'s body (pure): `timeout` (seconds, as a create's) and `count` (1 to
/// [`MAX_FORKS`]), both optional; anything else is left, as the SDK sends nothing else.
pub fn fork_ask(body: &[u8]) -> Result<(u64, u64), String> {
    if body.is_empty() {
        return Ok((FORK_TIMEOUT_S, 1));
    }
    let o = super::control::object(body)?;
    let timeout = match o.get("timeout") {
        None | Some(Value::Null) => FORK_TIMEOUT_S,
        Some(t) => super::control::timeout(t)?,
    };
    let count = match o.get("count") {
        None | Some(Value::Null) => 1,
        Some(c) => c
            .as_u64()
            .filter(|n| (1..=MAX_FORKS).contains(n))
            .ok_or_else(|| format!("count: {c} is not a whole number from 1 to {MAX_FORKS}"))?,
    };
    Ok((timeout, count))
}

/// `POST /sandboxes/{id}/fork`: the sandbox's `/workspace` snapshotted once (it runs
/// on), `count` new sandboxes made from it, each with the source's network policy,
/// environment, metadata and lifecycle and the fork's timeout, then the snapshot
/// deleted (each fork has its own copy); 201 with one entry per fork, a sandbox or
/// the error that fork met (E2B's shape: one failing does not fail the others).
pub async fn fork(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let (timeout_s, count) =
        fork_ask(&body).map_err(|m| E2bError::new(StatusCode::BAD_REQUEST, m))?;
    let (token, keys, s) = super::control::caller_scope_and_sandbox(&e, &h, &id).await?;
    let snapshot = ids::snapshot_id(&id);
    let client = e.client(&token);
    save(&client, &s, &snapshot).await?;
    let mut out = Vec::new();
    for _ in 0..count {
        let ask = super::control::Ask {
            template: snapshot.clone(),
            timeout_s,
            metadata: s.metadata.clone(),
            auto_pause: s.auto_pause,
            policy: s.policy.clone(),
            envs: s.envs.clone(),
        };
        out.push(match super::control::make(&e, &token, &keys, ask).await {
            Ok((fid, f)) => {
                let mut made = super::control::created(&e, &fid, &f);
                // A fork's template is its source's, not the snapshot taken for it.
                made["templateID"] = json!(s.template);
                made["alias"] = json!(s.template);
                json!({ "sandbox": made })
            }
            Err(x) => json!({ "error": { "code": x.status.as_u16(), "message": x.message } }),
        });
    }
    let dropped = client.delete_snapshot(&s.key, &snapshot).await;
    tracing::info!(target: "stockade::e2b", sandbox = %id, key = %s.key, count, snapshot_deleted = dropped.is_ok(), "sandbox forked");
    Ok((StatusCode::CREATED, Json(Value::Array(out))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forks_body_is_a_timeout_and_a_count_or_refused() {
        type Want = Result<(u64, u64), ()>;
        let rows: [(&[u8], Want); 8] = [
            (b"", Ok((FORK_TIMEOUT_S, 1))),
            (b"{}", Ok((FORK_TIMEOUT_S, 1))),
            (br#"{"timeout": 60, "count": 3}"#, Ok((60, 3))),
            (br#"{"count": 0}"#, Err(())),
            (br#"{"count": 17}"#, Err(())),
            (br#"{"count": "2"}"#, Err(())),
            (br#"{"timeout": 0}"#, Err(())),
            (b"[1]", Err(())),
        ];
        for (body, want) in rows {
            assert_eq!(
                fork_ask(body).map_err(drop),
                want,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn the_list_asks_the_callers_sandboxes_and_killed_sources_only() {
        let sandbox = |key: &str, owner: u8| Sandbox {
            key: key.into(),
            owner: [owner; 32],
            template: "base".into(),
            started_ms: 0,
            timeout_s: 1,
            end_ms: 0,
            auto_pause: false,
            paused: false,
            metadata: Default::default(),
            policy: Default::default(),
            envs: Default::default(),
        };
        let source = |key: &str, owner: u8| crate::e2b::Source {
            key: key.into(),
            owner: [owner; 32],
        };
        let mut t = crate::e2b::Table::default();
        t.by_id.insert("live".into(), sandbox("k-live", 1));
        t.by_id.insert("other".into(), sandbox("k-other", 2));
        t.sources.insert("killed".into(), source("k-killed", 1));
        t.sources.insert("theirs".into(), source("k-theirs", 2));
        let of = |d: u8, only: Option<&str>| {
            sources_of(&t, &[d; 32], only)
                .into_iter()
                .map(|(id, (key, killed))| format!("{id}={key}:{killed}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(of(1, None), ["killed=k-killed:true", "live=k-live:false"]);
        assert_eq!(of(2, None), ["other=k-other:false", "theirs=k-theirs:true"]);
        assert_eq!(of(1, Some("killed")), ["killed=k-killed:true"]);
        assert!(of(1, Some("theirs")).is_empty(), "another owner's source");
        assert!(of(3, None).is_empty());
    }

    #[test]
    fn the_list_asks_only_the_sources_its_page_needs() {
        let (a, b) = ("a".repeat(20), "b".repeat(20));
        let snap = |src: &str, n: char| format!("{src}{}", n.to_string().repeat(12));
        let q = |raw: &str| ListQuery::parse(Some(raw)).unwrap();
        let found = |ids: &[String]| ids.to_vec();
        let rows: Vec<(ListQuery, &str, Vec<String>, Step)> = vec![
            (q(""), &b, vec![], Step::Ask),
            (
                q("limit=2"),
                &b,
                found(&[snap(&a, '1'), snap(&a, '2')]),
                Step::Ask,
            ),
            // The page and one more: no later source can come before them.
            (
                q("limit=2"),
                &b,
                found(&[snap(&a, '1'), snap(&a, '2'), snap(&a, '3')]),
                Step::Stop,
            ),
            // The page starts after `a`'s snapshots: `a` is not asked, `b` is.
            (
                q(&format!("nextToken={}", snap(&b, '1'))),
                &a,
                vec![],
                Step::Skip,
            ),
            (
                q(&format!("nextToken={}", snap(&b, '1'))),
                &b,
                vec![],
                Step::Ask,
            ),
            // What is found before the token does not count toward the page.
            (
                q(&format!("limit=1&nextToken={}", snap(&a, '2'))),
                &b,
                found(&[snap(&a, '1'), snap(&a, '2'), snap(&a, '3')]),
                Step::Ask,
            ),
            (q("name=n"), &a, vec![], Step::Stop),
        ];
        for (query, source, found, want) in rows {
            assert_eq!(
                query.step(source, &found),
                want,
                "{query:?} {source} {found:?}"
            );
        }
    }

    #[test]
    fn the_list_query_parses_or_refuses_and_pages() {
        let s1 = format!("{}{}", "a".repeat(20), "1".repeat(12));
        let s2 = format!("{}{}", "a".repeat(20), "2".repeat(12));
        let s3 = format!("{}{}", "b".repeat(20), "3".repeat(12));
        let q = ListQuery::parse(Some("limit=2")).unwrap();
        let (page, next) = q.page(vec![s3.clone(), s1.clone(), s2.clone()]);
        assert_eq!(page, vec![s1.clone(), s2.clone()]);
        assert_eq!(next.as_deref(), Some(s2.as_str()));
        let q = ListQuery::parse(Some(&format!("limit=2&nextToken={s2}"))).unwrap();
        assert_eq!(
            q.page(vec![s1.clone(), s2.clone(), s3.clone()]),
            (vec![s3.clone()], None)
        );
        let q = ListQuery::parse(Some("sandboxID=x&name=n")).unwrap();
        assert_eq!(q.sandbox.as_deref(), Some("x"));
        assert_eq!(q.page(vec![s1]), (vec![], None), "no names are kept");
        for bad in [
            "limit=0",
            "limit=101",
            "limit=x",
            "nextToken=zz",
            "order=asc",
            "%zz=1",
        ] {
            assert!(ListQuery::parse(Some(bad)).is_err(), "{bad}");
        }
    }
}
