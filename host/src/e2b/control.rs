//! E2B's control plane (`spec/openapi.yml`): create, list, get, connect, kill. The
//! caller's `X-API-KEY` is a Stockade consumer token; its scope (`GET
//! /v1/tokens/self`) decides where its sandboxes' keys are ([`super::ids::key_for`]).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use stockade_wire::CommandBody;

use super::{
    E2b, E2bError, ENVD_VERSION, MAX_PER_TOKEN, MAX_SANDBOXES, Sandbox, digest, header, ids,
};

/// The one template: Stockade's image (`base` is the SDK's default).
pub const TEMPLATE: &str = "base";
/// E2B's default timeout, seconds (informational here).
pub const DEFAULT_TIMEOUT_S: u64 = 300;

/// The caller's key: `X-API-KEY`, present and non-empty.
fn api_key(h: &HeaderMap) -> Result<String, E2bError> {
    header(h, "x-api-key")
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .ok_or_else(E2bError::unauthenticated)
}

/// The caller's scope, which also proves the key is a live consumer token (a wrong
/// one, or the approver's, is the API's 401, answered as E2B's).
async fn scope(e: &E2b, token: &str) -> Result<String, E2bError> {
    match e.client(token).token_self().await {
        Ok(s) => Ok(s.keys),
        Err(err) => Err(match E2bError::of_client(err) {
            x if x.status == StatusCode::UNAUTHORIZED => E2bError::unauthenticated(),
            x => x,
        }),
    }
}

/// What a create asks (the fields this slice reads; others are ignored, as the
/// SDK sends many this slice does not serve: docs/E2B.md).
struct Ask {
    template: String,
    timeout_s: u64,
    metadata: Map<String, Value>,
}

/// Read a create's body (pure): a JSON object; `templateID` a string; `timeout` a
/// whole number of seconds; `metadata` an object of strings.
fn ask(body: &[u8]) -> Result<Ask, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body: {e}"))?;
    let o = v.as_object().ok_or("body: not a JSON object")?;
    let template = match o.get("templateID") {
        None => TEMPLATE.to_string(),
        Some(Value::String(t)) => t.clone(),
        Some(_) => return Err("templateID: not a string".into()),
    };
    let timeout_s = match o.get("timeout") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT_S,
        Some(t) => t.as_u64().ok_or("timeout: not a whole number of seconds")?,
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
    })
}

/// `POST /sandboxes` (and `/v2/sandboxes`): a new id, its key in the caller's scope,
/// and the key's container started (a fenced `true`, no grant), so a refusal (the
/// share, the ceiling) is the create's, as E2B's is.
pub async fn create(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, E2bError> {
    let token = api_key(&h)?;
    let keys = scope(&e, &token).await?;
    let body = body.map_err(|r| E2bError::new(r.status(), r.body_text()))?;
    let ask = ask(&body).map_err(|m| E2bError::new(StatusCode::BAD_REQUEST, m))?;
    if ask.template != TEMPLATE {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!(
                "template {} not found: this server has one, {TEMPLATE}",
                ask.template
            ),
        ));
    }
    let id = ids::new_id();
    let key = ids::key_for(&keys, &id).map_err(|err| {
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
        let owner = digest(&token);
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
    let start = CommandBody {
        argv: vec!["true".into()],
        timeout_ms: Some(60_000),
        ..Default::default()
    };
    let out = e
        .client(&token)
        .exec(&key, &start)
        .await
        .map_err(E2bError::of_client)?;
    if out.exit_code != 0 {
        return Err(E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the sandbox did not start: exit {}", out.exit_code),
        ));
    }
    let sbx = Sandbox {
        key,
        owner: digest(&token),
        template: ask.template,
        started_ms: now_ms(),
        timeout_s: ask.timeout_s,
        metadata: ask.metadata,
    };
    tracing::info!(target: "stockade::e2b", sandbox = %id, key = %sbx.key, "sandbox created");
    e.remember(&id, &sbx)?;
    Ok((StatusCode::CREATED, Json(created(&id, &sbx, &token))).into_response())
}

/// A create's (and a connect's) answer. `envdAccessToken` is the caller's own key:
/// envd's routes take it as `X-Access-Token` and call the API with it, so nothing is
/// disclosed the caller did not send, and no second secret is kept.
fn created(id: &str, s: &Sandbox, token: &str) -> Value {
    json!({
        "templateID": s.template,
        "sandboxID": id,
        "clientID": "stockade",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
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
        "endAt": rfc3339(s.started_ms + s.timeout_s * 1000),
        "envdVersion": ENVD_VERSION,
        "cpuCount": 1,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": "running",
        "metadata": s.metadata,
    })
}

/// `GET /sandboxes` (and `/v2/sandboxes`): the caller's sandboxes, nobody else's.
pub async fn list(State(e): State<Arc<E2b>>, h: HeaderMap) -> Result<Json<Value>, E2bError> {
    let token = api_key(&h)?;
    scope(&e, &token).await?;
    let d = digest(&token);
    let mut mine: Vec<(String, Sandbox)> = e
        .table()
        .by_id
        .iter()
        .filter(|(_, s)| crate::compare::same(&s.owner, &d))
        .map(|(id, s)| (id.clone(), s.clone()))
        .collect();
    mine.sort_by_key(|(_, s)| s.started_ms);
    Ok(Json(Value::Array(
        mine.iter().map(|(id, s)| detail(id, s)).collect(),
    )))
}

/// `GET /sandboxes/{id}`.
pub async fn info(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, E2bError> {
    let token = api_key(&h)?;
    scope(&e, &token).await?;
    let s = e
        .owned(&token, &id)
        .ok_or_else(|| E2bError::no_sandbox(&id))?;
    let mut v = detail(&id, &s);
    v["envdAccessToken"] = Value::String(token);
    Ok(Json(v))
}

/// `POST /sandboxes/{id}/connect`: a running sandbox's handle again (201).
pub async fn connect(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let token = api_key(&h)?;
    scope(&e, &token).await?;
    let s = e
        .owned(&token, &id)
        .ok_or_else(|| E2bError::no_sandbox(&id))?;
    Ok((StatusCode::CREATED, Json(created(&id, &s, &token))).into_response())
}

/// `DELETE /sandboxes/{id}`: the key's container aborted (its processes and detached
/// records gone), the id forgotten; 204.
pub async fn kill(
    State(e): State<Arc<E2b>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let token = api_key(&h)?;
    scope(&e, &token).await?;
    let s = e
        .owned(&token, &id)
        .ok_or_else(|| E2bError::no_sandbox(&id))?;
    e.client(&token)
        .abort(&s.key)
        .await
        .map_err(E2bError::of_client)?;
    e.forget(&id)?;
    // Its running commands' streams end (their execs were killed with the container).
    e.running().retain(|(sid, _), _| sid != &id);
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
        let ok = ask(br#"{"templateID":"base","timeout":300,"metadata":{"a":"b"},"envVars":{}}"#)
            .unwrap();
        assert_eq!((ok.template.as_str(), ok.timeout_s), ("base", 300));
        assert_eq!(ask(b"{}").unwrap().template, "base");
        for bad in [
            &b"[]"[..],
            b"not json",
            br#"{"templateID":7}"#,
            br#"{"timeout":-1}"#,
            br#"{"timeout":1.5}"#,
            br#"{"metadata":{"a":1}}"#,
        ] {
            assert!(ask(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
