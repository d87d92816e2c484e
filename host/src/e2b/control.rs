//! E2B's control plane (`spec/openapi.yml`): create, list, get, connect, kill. The
//! caller's `X-API-KEY` is a Stockade consumer token; its scope (`GET
//! /v1/tokens/self`) decides where its sandboxes' keys are ([`super::ids::key_for`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::{
    E2b, E2bError, ENVD_VERSION, MAX_PER_TOKEN, MAX_SANDBOXES, Sandbox, digest, header, ids,
    network,
};

/// The one template: Stockade's image (`base` is the SDK's default).
pub const TEMPLATE: &str = "base";
/// E2B's default timeout, seconds (what the SDK sends when none is given).
pub const DEFAULT_TIMEOUT_S: u64 = 300;

/// The caller's key: `X-API-KEY`, present and non-empty.
pub(super) fn api_key(h: &HeaderMap) -> Result<String, E2bError> {
    header(h, "x-api-key")
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .ok_or_else(E2bError::unauthenticated)
}

/// The caller's scope, which also proves the key is a live consumer token (a wrong
/// one, or the approver's, is the API's 401, answered as E2B's).
pub(super) async fn scope(e: &E2b, token: &str) -> Result<String, E2bError> {
    match e.client(token).token_self().await {
        Ok(s) => Ok(s.keys),
        Err(err) => Err(match E2bError::of_client(err) {
            x if x.status == StatusCode::UNAUTHORIZED => E2bError::unauthenticated(),
            x => x,
        }),
    }
}

/// The caller's key (a live consumer token) and its sandbox `id`: another token's is
/// the same 404 as an unknown one.
pub(super) async fn caller_sandbox(
    e: &E2b,
    h: &HeaderMap,
    id: &str,
) -> Result<(String, Sandbox), E2bError> {
    caller_scope_and_sandbox(e, h, id)
        .await
        .map(|(token, _, s)| (token, s))
}

/// [`caller_sandbox`], with the caller's scope it looked up (for a call that makes
/// keys in it).
pub(super) async fn caller_scope_and_sandbox(
    e: &E2b,
    h: &HeaderMap,
    id: &str,
) -> Result<(String, String, Sandbox), E2bError> {
    let token = api_key(h)?;
    let keys = scope(e, &token).await?;
    let s = e
        .owned(&token, id)
        .ok_or_else(|| E2bError::no_sandbox(id))?;
    Ok((token, keys, s))
}

/// A request body that must be a JSON object (pure): the object, or what it is not.
pub(super) fn object(body: &[u8]) -> Result<Map<String, Value>, String> {
    match serde_json::from_slice(body).map_err(|e| format!("body: {e}"))? {
        Value::Object(o) => Ok(o),
        _ => Err("body: not a JSON object".into()),
    }
}

/// What a create asks (the fields this slice reads; others are ignored, as the
/// SDK sends many this slice does not serve: docs/E2B.md).
pub(super) struct Ask {
    pub(super) template: String,
    pub(super) timeout_s: u64,
    pub(super) metadata: Map<String, Value>,
    pub(super) auto_pause: bool,
    pub(super) policy: network::Policy,
    pub(super) envs: std::collections::BTreeMap<String, String>,
}

/// At most this many `envVars` (each command's environment is the API's to check).
pub const MAX_ENVS: usize = 256;

/// The longest sandbox timeout, seconds (E2B's own bound for its paid tier: 24 h).
pub const MAX_TIMEOUT_S: u64 = 24 * 3600;

/// Read a create's body (pure): a JSON object; `templateID` a string; `timeout` a
/// whole number of seconds, at most [`MAX_TIMEOUT_S`]; `metadata` an object of
/// strings; `autoPause` a boolean; the network policy ([`network::policy`], with the
/// operator's `internet`).
fn ask(body: &[u8], internet: &[String]) -> Result<Ask, String> {
    let o = &object(body)?;
    let template = match o.get("templateID") {
        None => TEMPLATE.to_string(),
        Some(Value::String(t)) => t.clone(),
        Some(_) => return Err("templateID: not a string".into()),
    };
    let timeout_s = match o.get("timeout") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT_S,
        Some(t) => timeout(t)?,
    };
    let auto_pause = match o.get("autoPause") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("autoPause: not a boolean".into()),
    };
    let policy = network::policy(o, internet)?;
    let envs = match o.get("envVars") {
        None | Some(Value::Null) => Default::default(),
        Some(Value::Object(m)) if m.len() <= MAX_ENVS => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(v) => Ok((k.clone(), v.clone())),
                _ => Err(format!("envVars.{k}: not a string")),
            })
            .collect::<Result<_, String>>()?,
        Some(_) => {
            return Err(format!(
                "envVars: not an object of at most {MAX_ENVS} strings"
            ));
        }
    };
    let metadata = match o.get("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) if m.values().all(Value::is_string) => m.clone(),
        Some(_) => return Err("metadata: not an object of strings".into()),
    };
    Ok(Ask {
        template,
        timeout_s,
        metadata,
        auto_pause,
        policy,
        envs,
    })
}

/// A timeout in seconds (pure): a whole number, 1 to [`MAX_TIMEOUT_S`].
pub(super) fn timeout(t: &Value) -> Result<u64, String> {
    match t.as_u64() {
        Some(s) if (1..=MAX_TIMEOUT_S).contains(&s) => Ok(s),
        _ => Err(format!(
            "timeout: {t} is not a whole number of seconds from 1 to {MAX_TIMEOUT_S}"
        )),
    }
}

/// `POST /sandboxes` (and `/v2/sandboxes`): a new id, its key in the caller's scope,
/// and the key's container started (`POST …/ensure`: no command, no grant), so a
/// refusal (the share, the ceiling) is the create's, as E2B's is.
pub async fn create(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, E2bError> {
    let token = api_key(&h)?;
    let keys = scope(&e, &token).await?;
    let body = body?;
    let ask = ask(&body, &e.internet).map_err(|m| E2bError::new(StatusCode::BAD_REQUEST, m))?;
    let (id, sbx) = make(&e, &token, &keys, ask).await?;
    Ok((StatusCode::CREATED, Json(created(&e, &id, &sbx))).into_response())
}

/// Make a sandbox as `ask` says, for `token` whose scope is `keys`: a new id, its key,
/// the table's bounds, the fork when the template is a snapshot, the container started
/// (`POST …/ensure`), the table's row.
pub(super) async fn make(
    e: &E2b,
    token: &str,
    keys: &str,
    ask: Ask,
) -> Result<(String, Sandbox), E2bError> {
    let from_snapshot = ask.template != TEMPLATE;
    if from_snapshot && ids::source_of(&ask.template).is_none() {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!(
                "template {} not found: this server has one, {TEMPLATE}, and the snapshots made here",
                ask.template
            ),
        ));
    }
    let id = ids::new_id();
    let key = ids::key_for(keys, &id).map_err(|err| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("no sandbox key for this token's keys {keys:?}: {err:?}"),
        )
    })?;
    {
        let t = e.table();
        if t.by_id.len() >= MAX_SANDBOXES {
            return Err(E2bError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too many sandboxes on this server",
            ));
        }
        let owner = digest(token);
        if t.by_id.values().filter(|s| s.owner == owner).count() >= MAX_PER_TOKEN {
            return Err(E2bError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("this key holds {MAX_PER_TOKEN} sandboxes: kill some first"),
            ));
        }
        if t.by_id.values().any(|s| s.key == key) {
            // A token of one key holds one sandbox at a time.
            return Err(E2bError::new(
                StatusCode::CONFLICT,
                format!("this token's one key {key} already holds a sandbox"),
            ));
        }
    }
    // The metadata first (the API checks it, and the key is known from now on), then
    // the fork, the network, the lifetime and the container: a failure after the
    // metadata forgets the key again (`DELETE /v1/sandboxes/{key}`), so a refused create
    // leaves no known key, no network and no container.
    let client = e.client(token);
    let metadata: std::collections::BTreeMap<String, String> = ask
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    // None given (the SDK's default): no call; the lifetime makes the key known.
    if !metadata.is_empty() {
        client
            .set_metadata(&key, metadata)
            .await
            .map_err(E2bError::of_client)?;
    }
    let started_ms = now_ms();
    let end_ms = started_ms + ask.timeout_s * 1000;
    let made = async {
        if from_snapshot {
            fork_onto(e, token, keys, &ask.template, &key)
                .await
                .unwrap_or_else(|| {
                    Err(E2bError::new(
                        StatusCode::NOT_FOUND,
                        format!("template {} not found", ask.template),
                    ))
                })?;
        }
        // The network policy is the key's native network: the grant of each of its
        // fenced commands (none named: no call, its commands run with no rule).
        if let Some(g) = ask.policy.grant() {
            client
                .set_network(&key, &g)
                .await
                .map_err(E2bError::of_client)?;
        }
        client
            .set_lifetime(&key, &lifetime(end_ms, ask.auto_pause))
            .await
            .map_err(E2bError::of_client)?;
        client.ensure(&key).await.map_err(E2bError::of_client)
    }
    .await;
    if let Err(x) = made {
        let _ = client.forget(&key).await;
        return Err(x);
    }
    let sbx = Sandbox {
        key,
        owner: digest(token),
        template: ask.template,
        started_ms,
        timeout_s: ask.timeout_s,
        end_ms,
        auto_pause: ask.auto_pause,
        paused: false,
        metadata: ask.metadata,
        policy: ask.policy,
        envs: ask.envs,
    };
    tracing::info!(target: "stockade::e2b", sandbox = %id, key = %sbx.key, hosts = ?sbx.policy.hosts, timeout_s = sbx.timeout_s, "sandbox created");
    e.remember(&id, &sbx)?;
    Ok((id, sbx))
}

/// A create from snapshot `template` onto the new `key`: the fork (`POST …/fork`),
/// before the key's container is started. `None` when `template` is no snapshot id
/// (the caller answers its unknown template); a snapshot the caller does not hold is
/// the same 404 as an unknown template.
async fn fork_onto(
    e: &E2b,
    token: &str,
    keys: &str,
    template: &str,
    key: &str,
) -> Option<Result<(), E2bError>> {
    let source = ids::source_key(keys, template)?;
    Some(match e.client(token).fork(key, &source, template).await {
        Ok(_) => Ok(()),
        Err(stockade_client::Error::Api {
            status: 400 | 404, ..
        }) => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template {template} not found"),
        )),
        Err(x) => Err(E2bError::of_client(x)),
    })
}

/// A create's (and a connect's) answer. `envdAccessToken` is the sandbox's own
/// access token (`super::access`: it opens this sandbox's envd routes and nothing
/// else), never the caller's API key; `trafficAccessToken` opens its ports in the
/// domain form when its traffic is not public; `domain` is the server's domain form
/// when it has one (the SDK builds `{port}-{id}.{domain}` from it; null: its own
/// `E2B_DOMAIN`).
pub(super) fn created(e: &E2b, id: &str, s: &Sandbox) -> Value {
    json!({
        "templateID": s.template,
        "sandboxID": id,
        "clientID": "stockade",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": e.access_token(id),
        "trafficAccessToken": e.traffic_token(id),
        "domain": e.domain,
        "alias": s.template,
    })
}

/// A sandbox as listed and described.
fn detail(id: &str, s: &Sandbox) -> Value {
    json!({
        "templateID": s.template,
        "alias": s.template,
        "sandboxID": id,
        "clientID": "stockade",
        "startedAt": rfc3339(s.started_ms),
        "endAt": rfc3339(if s.end_ms == 0 { s.started_ms } else { s.end_ms }),
        "envdVersion": ENVD_VERSION,
        "cpuCount": 1,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": if s.paused { "paused" } else { "running" },
        "metadata": s.metadata,
        "lifecycle": {
            "autoResume": false,
            "onTimeout": if s.auto_pause { "pause" } else { "kill" },
        },
        "network": {
            "allowOut": s.policy.hosts,
            "allowPublicTraffic": s.policy.public,
        },
    })
}

/// `GET /sandboxes` (and `/v2/sandboxes`): the caller's sandboxes, nobody else's,
/// filtered and paged by the query (`super::listing`: metadata, state, startedAfter,
/// template, order, limit, nextToken; the next page's token in `x-next-token`).
pub async fn list(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, E2bError> {
    let token = api_key(&h)?;
    scope(&e, &token).await?;
    let query = super::listing::Query::parse(raw.as_deref())
        .map_err(|m| E2bError::new(StatusCode::BAD_REQUEST, m))?;
    let d = digest(&token);
    let mine: Vec<(String, Sandbox)> = e
        .table()
        .by_id
        .iter()
        .filter(|(_, s)| crate::compare::same(&s.owner, &d))
        .map(|(id, s)| (id.clone(), s.clone()))
        .collect();
    let rows = mine
        .iter()
        .map(|(id, s)| super::listing::Row {
            id,
            started_ms: s.started_ms,
            paused: s.paused,
            template: &s.template,
            metadata: &s.metadata,
        })
        .collect();
    let (page, next) = query.page(rows);
    let by_id: HashMap<&str, &Sandbox> = mine.iter().map(|(id, s)| (id.as_str(), s)).collect();
    let body = Value::Array(
        page.iter()
            .filter_map(|r| by_id.get(r.id).map(|s| detail(r.id, s)))
            .collect(),
    );
    let mut r = Json(body).into_response();
    if let Some(next) = next.and_then(|n| axum::http::HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert("x-next-token", next);
    }
    Ok(r)
}

/// `GET /sandboxes/{id}`.
pub async fn info(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, E2bError> {
    let (_, s) = caller_sandbox(&e, &h, &id).await?;
    let mut v = detail(&id, &s);
    v["envdAccessToken"] = Value::String(e.access_token(&id));
    v["trafficAccessToken"] = Value::String(e.traffic_token(&id));
    v["domain"] = json!(e.domain);
    Ok(Json(v))
}

/// `POST /sandboxes/{id}/connect` (and `/v2/…`): a running sandbox's handle again
/// (200), its end moved to now plus the body's `timeout` if that is later; a paused
/// one resumed (201): it is running again and its next command starts its container
/// from the checkpoint's `/workspace` (its processes did not survive the pause:
/// docs/E2B.md).
pub async fn connect(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, E2bError> {
    let (token, s) = caller_sandbox(&e, &h, &id).await?;
    let body = body?;
    let timeout_s = optional_timeout(&body)?.unwrap_or(s.timeout_s);
    let end = now_ms() + timeout_s * 1000;
    let status = if s.paused {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let end = if s.paused { end } else { end.max(s.end_ms) };
    e.client(&token)
        .set_lifetime(&s.key, &lifetime(end, s.auto_pause))
        .await
        .map_err(E2bError::of_client)?;
    if !e.set_state(&id, end, false)? {
        return Err(E2bError::no_sandbox(&id));
    }
    if s.paused {
        tracing::info!(target: "stockade::e2b", sandbox = %id, key = %s.key, "sandbox resumed");
    }
    let s = e
        .owned(&token, &id)
        .ok_or_else(|| E2bError::no_sandbox(&id))?;
    Ok((status, Json(created(&e, &id, &s))).into_response())
}

/// A body's optional `timeout` (pure): an empty body or none: `None`.
fn optional_timeout(body: &[u8]) -> Result<Option<u64>, E2bError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let bad = |m: String| E2bError::new(StatusCode::BAD_REQUEST, m);
    let o = object(body).map_err(bad)?;
    match o.get("timeout") {
        None | Some(Value::Null) => Ok(None),
        Some(t) => timeout(t).map(Some).map_err(bad),
    }
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now
/// (shorter or longer than before, as E2B's); 204.
pub async fn set_timeout(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, E2bError> {
    let (token, s) = caller_sandbox(&e, &h, &id).await?;
    let body = body?;
    let t = optional_timeout(&body)?
        .ok_or_else(|| E2bError::new(StatusCode::BAD_REQUEST, "timeout: required"))?;
    if s.paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is paused: connect resumes it"),
        ));
    }
    let end = now_ms() + t * 1000;
    e.client(&token)
        .set_lifetime(&s.key, &lifetime(end, s.auto_pause))
        .await
        .map_err(E2bError::of_client)?;
    if !e.set_state(&id, end, false)? {
        return Err(E2bError::no_sandbox(&id));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /sandboxes/{id}/network` (`update_network`): the sandbox's network policy
/// replaced whole ([`network::update`]: a field left out is cleared, as E2B's), made its
/// key's network (`PUT …/network`, or `DELETE …/network` when it names no host), then
/// kept in the table; 204. Its next command runs under it; a command running now keeps
/// the grant its fence opened with. A body that does not parse or that asks what is not
/// served is a 400 and changes nothing.
pub async fn update_network(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, E2bError> {
    let (token, s) = caller_sandbox(&e, &h, &id).await?;
    let body = body?;
    let bad = |m: String| E2bError::new(StatusCode::BAD_REQUEST, m);
    let o = object(&body).map_err(bad)?;
    let policy = network::update(&o, &e.internet, s.policy.public).map_err(bad)?;
    let client = e.client(&token);
    match policy.grant() {
        Some(g) => client.set_network(&s.key, &g).await,
        None => client.clear_network(&s.key).await,
    }
    .map_err(E2bError::of_client)?;
    tracing::info!(target: "stockade::e2b", sandbox = %id, key = %s.key, hosts = ?policy.hosts, "sandbox network updated");
    if !e.set_policy(&id, &policy)? {
        return Err(E2bError::no_sandbox(&id));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause`: a checkpoint (the container stops, `/workspace` is
/// kept, its processes end; DESIGN §1), the sandbox paused until `connect`; 204, or
/// 409 when it is paused already (the SDK's `pause()` then answers false).
pub async fn pause(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
    // Read whole before answering, so the connection stays reusable (see
    // `process::list`).
    _body: Bytes,
) -> Result<StatusCode, E2bError> {
    let (token, s) = caller_sandbox(&e, &h, &id).await?;
    if s.paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is paused already"),
        ));
    }
    pause_key(&e, &e.client(&token), &id, &s.key).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Checkpoint `key` and mark sandbox `id` paused (no end while paused).
async fn pause_key(
    e: &E2b,
    client: &stockade_client::Client,
    id: &str,
    key: &str,
) -> Result<(), E2bError> {
    client.checkpoint(key).await.map_err(E2bError::of_client)?;
    // Paused has no end, as on E2B.
    client
        .clear_lifetime(key)
        .await
        .map_err(E2bError::of_client)?;
    e.set_state(id, 0, true)?;
    // Its commands' streams end: their execs ended with the container.
    e.running().retain(|(sid, _), _| sid != id);
    tracing::info!(target: "stockade::e2b", sandbox = %id, key = %key, "sandbox paused");
    Ok(())
}

/// The native lifetime of a sandbox that ends at `end_ms`: at its end it is
/// checkpointed (a pause) when it asked to pause at its timeout, else aborted and
/// forgotten (a kill).
fn lifetime(end_ms: u64, auto_pause: bool) -> stockade_wire::LifetimeBody {
    stockade_wire::LifetimeBody {
        ends_at_ms: Some(end_ms),
        ends_in_ms: None,
        on_end: Some(if auto_pause {
            stockade_wire::OnEnd::Checkpoint
        } else {
            stockade_wire::OnEnd::Abort
        }),
    }
}

/// A sandbox's end is the server's: its native lifetime (`PUT …/lifetime`), which the
/// server ends as it says (docs/DESIGN.md §2). This task, every second, follows what
/// the server did to the sandboxes past their end: a key no longer known was aborted
/// (the sandbox is gone: its id forgotten), a known one with no lifetime and no
/// container that asked to pause was checkpointed (the sandbox is paused). At its first tick it gives every
/// running sandbox of the table its lifetime again, and every sandbox its network (a
/// table from before the server kept lifetimes and networks). With the server's own
/// token; ends with the layer.
pub async fn reap(e: std::sync::Weak<E2b>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut first = true;
    loop {
        tick.tick().await;
        let Some(e) = e.upgrade() else { return };
        let Some(token) = e.server_token.clone() else {
            return;
        };
        let client = e.client(&token);
        if std::mem::take(&mut first) {
            // The networks before the lifetimes: a key the server ended while the layer
            // was away is made known again by its network, then ended again by its
            // lifetime (which the reaper below then follows).
            let networks: Vec<(String, stockade_wire::GrantBody)> = e
                .table()
                .by_id
                .values()
                .filter_map(|s| Some((s.key.clone(), s.policy.grant()?)))
                .collect();
            for (key, g) in networks {
                if let Err(x) = client.set_network(&key, &g).await {
                    tracing::warn!(target: "stockade::e2b", key = %key, error = %x, "a sandbox's network could not be given again");
                }
            }
            let running: Vec<Sandbox> = e
                .table()
                .by_id
                .values()
                .filter(|s| !s.paused && s.end_ms != 0)
                .cloned()
                .collect();
            for s in running {
                if let Err(x) = client
                    .set_lifetime(&s.key, &lifetime(s.end_ms, s.auto_pause))
                    .await
                {
                    tracing::warn!(target: "stockade::e2b", key = %s.key, error = %x, "a sandbox's lifetime could not be given again");
                }
            }
        }
        let now = now_ms();
        let due: Vec<(String, Sandbox)> = e
            .table()
            .by_id
            .iter()
            .filter(|(_, s)| ended(s, now))
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        for (id, s) in due {
            let followed = match client.describe(&s.key).await {
                Err(stockade_client::Error::Api { status: 404, .. }) => {
                    e.outlive(&client, &id, &s).await;
                    e.forget(&id).map(|()| "ended")
                }
                // Checkpointed at its end: paused. Only one that asked to pause can be:
                // one whose end is an abort is seen this way while the abort is being
                // made (its lifetime removed, its key not yet forgotten: a describe
                // made meanwhile), and is gone at a later look.
                Ok(i) if !i.running && i.lifetime.is_none() && s.auto_pause => {
                    e.set_state(&id, 0, true).map(|_| "paused")
                }
                Ok(_) => Ok("not yet"),
                Err(x) => Err(E2bError::of_client(x)),
            };
            match followed {
                Ok("not yet") => {}
                Ok(what) => {
                    // Its commands' streams end: their execs ended with the container.
                    e.running().retain(|(sid, _), _| *sid != id);
                    tracing::info!(target: "stockade::e2b", sandbox = %id, key = %s.key, what, "sandbox reached its timeout");
                }
                Err(x) => {
                    tracing::warn!(target: "stockade::e2b", sandbox = %id, key = %s.key, error = %x.message, "a sandbox past its timeout could not be looked up; again in a second")
                }
            }
        }
    }
}

/// Is this sandbox past its end (pure)? A paused one has none.
pub fn ended(s: &Sandbox, now_ms: u64) -> bool {
    !s.paused && s.end_ms != 0 && now_ms >= s.end_ms
}

/// Kill sandbox `id` (its key aborted and forgotten) and forget it; its snapshots
/// outlive it ([`E2b::outlive`]).
async fn end(
    e: &E2b,
    client: &stockade_client::Client,
    id: &str,
    s: &Sandbox,
) -> Result<(), E2bError> {
    // Aborted and forgotten natively; a key the API does not know any more (its
    // lifetime ended it) is gone already.
    match client.forget(&s.key).await {
        Ok(_) => {}
        Err(stockade_client::Error::Api { status: 404, .. }) => {}
        Err(x) => return Err(E2bError::of_client(x)),
    }
    e.outlive(client, id, s).await;
    e.forget(id)?;
    // Its running commands' streams end (their execs were killed with the container).
    e.running().retain(|(sid, _), _| sid != id);
    Ok(())
}

/// `DELETE /sandboxes/{id}`: the key's container aborted (its processes and detached
/// records gone), the id forgotten; 204.
pub async fn kill(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let (token, s) = caller_sandbox(&e, &h, &id).await?;
    end(&e, &e.client(&token), &id, &s).await?;
    tracing::info!(target: "stockade::e2b", sandbox = %id, key = %s.key, "sandbox killed");
    Ok(StatusCode::NO_CONTENT)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `ms` since the epoch as RFC 3339 UTC, to the second (pure; civil-from-days, Howard
/// Hinnant's algorithm).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_ends_at_its_end_unless_paused() {
        let s = |end_ms, paused| Sandbox {
            key: "k".into(),
            owner: [0; 32],
            template: TEMPLATE.into(),
            started_ms: 0,
            timeout_s: 1,
            end_ms,
            auto_pause: false,
            paused,
            metadata: Map::new(),
            policy: network::Policy::default(),
            envs: Default::default(),
        };
        for (end, paused, now, want) in [
            (1000, false, 999, false),
            (1000, false, 1000, true),
            (1000, true, 5000, false),
            (0, false, 5000, false),
        ] {
            assert_eq!(ended(&s(end, paused), now), want, "{end} {paused} {now}");
        }
        assert_eq!(optional_timeout(b"").unwrap(), None);
        assert_eq!(optional_timeout(br#"{"timeout":60}"#).unwrap(), Some(60));
        assert_eq!(optional_timeout(br#"{}"#).unwrap(), None);
        for bad in [
            &b"[]"[..],
            br#"{"timeout":-1}"#,
            br#"{"timeout":"60"}"#,
            b"{",
        ] {
            assert!(
                optional_timeout(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn times_are_rfc3339() {
        for (ms, want) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400_000, "2000-02-29T00:00:00Z"),
            (1_796_601_600_123, "2026-12-07T00:00:00Z"),
            (1_796_601_599_999, "2026-12-06T23:59:59Z"),
        ] {
            assert_eq!(rfc3339(ms), want, "{ms}");
        }
    }

    #[test]
    fn creates_are_read_strictly() {
        let ok = ask(
            br#"{"templateID":"base","timeout":300,"metadata":{"a":"b"},"envVars":{},"autoPause":true,"network":{"allowOut":["a.test"]}}"#,
            &[],
        )
        .unwrap();
        assert_eq!((ok.template.as_str(), ok.timeout_s), ("base", 300));
        assert!(ok.auto_pause);
        assert_eq!(ok.policy.hosts, ["a.test"]);
        let e = ask(br#"{"envVars":{"A":"1"}}"#, &[]).unwrap();
        assert_eq!(e.envs.get("A").map(String::as_str), Some("1"));
        let d = ask(b"{}", &["pypi.org".into()]).unwrap();
        assert_eq!(
            (d.template.as_str(), d.timeout_s, d.auto_pause),
            ("base", DEFAULT_TIMEOUT_S, false)
        );
        assert_eq!(d.policy.hosts, ["pypi.org"]);
        for bad in [
            &b"[]"[..],
            b"not json",
            br#"{"templateID":7}"#,
            br#"{"timeout":-1}"#,
            br#"{"timeout":1.5}"#,
            br#"{"metadata":{"a":1}}"#,
            br#"{"timeout":0}"#,
            br#"{"timeout":86401}"#,
            br#"{"autoPause":"yes"}"#,
            br#"{"envVars":{"A":1}}"#,
            br#"{"envVars":[]}"#,
            br#"{"network":{"allowOut":["0.0.0.0/0"]}}"#,
        ] {
            assert!(ask(bad, &[]).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
