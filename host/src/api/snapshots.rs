//! The named-snapshot routes (docs/DESIGN.md §2, "Named snapshots and forks"):
//! `POST /v1/sandboxes/{key}/snapshots` (`{"name": N}` → the snapshot; the key's
//! container started if it has none, so it sits behind the ticket gate and a token's
//! share), `GET …/snapshots`, `DELETE …/snapshots/{name}`, and `POST …/fork`
//! (`{"source": K, "name": N}`: `K`'s snapshot becomes this key's restore cache). Each
//! is one facade call; the guest validates and decides.
//!
//! A fork names a second key, in its body: the auth layer checks the path's key, and
//! this handler checks the source against the caller's token. A source outside it is
//! answered as a source holding no such snapshot, byte for byte (404 `not-found`,
//! `names::no_snapshot`): another tenant's keys and snapshots are never learnt through
//! a fork. A well-formed fork the guest refuses is refused for the state: no such
//! snapshot, 404; the key has a container, 409.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::{Extension, Json};
use stockade_grammar::names;
use stockade_wire::{self as wire, ErrorCode};

use super::error::{ApiError, ApiResult, Params};
use super::{ApiState, parse_json};
use crate::tenants::Caller;
use stockade_runtime::bindings::FacadeError;
use stockade_runtime::runtime::CallError;

fn answer(s: stockade_runtime::bindings::SnapshotInfo) -> wire::Snapshot {
    wire::Snapshot {
        name: s.name,
        at_ms: s.at_ms,
    }
}

pub(super) async fn save(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<wire::Snapshot>> {
    let b: wire::SnapshotBody = parse_json(body)?;
    Ok(Json(answer(s.runtime.save_snapshot(&key, &b.name).await?)))
}

pub(super) async fn list(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Snapshots>> {
    let snapshots = s.runtime.snapshots(&key).await?;
    Ok(Json(wire::Snapshots {
        snapshots: snapshots.into_iter().map(answer).collect(),
    }))
}

pub(super) async fn delete(
    State(s): State<Arc<ApiState>>,
    Params((key, name)): Params<(String, String)>,
) -> ApiResult<Json<wire::SnapshotDeleted>> {
    s.runtime.delete_snapshot(&key, &name).await?;
    Ok(Json(wire::SnapshotDeleted { deleted: name }))
}

pub(super) async fn fork(
    State(s): State<Arc<ApiState>>,
    caller: Option<Extension<Caller>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<wire::Forked>> {
    let b: wire::ForkBody = parse_json(body)?;
    if let Some(Extension(c)) = &caller
        && !c.reaches(&b.source)
    {
        tracing::info!(target: "stockade::api", tenant = c.tenant_id().unwrap_or(""), key = %b.source, "a fork's source outside the token's pattern");
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            names::no_snapshot(&b.source, &b.name),
        ));
    }
    match s.runtime.fork(&key, &b.source, &b.name).await {
        Ok(()) => Ok(Json(wire::Forked { forked: key })),
        // Well-formed names the guest refuses are refused for the state (this picks the
        // status only; the guest decides): no such snapshot, 404; the key has a
        // container, 409.
        Err(CallError::Facade(FacadeError::InvalidInput(m)))
            if well_formed(&key, &b.source, &b.name) =>
        {
            Err(if m == names::no_snapshot(&b.source, &b.name) {
                ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, m)
            } else {
                ApiError::new(StatusCode::CONFLICT, ErrorCode::InvalidInput, m)
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Do the fork's key, source and snapshot name pass the grammar?
fn well_formed(key: &str, source: &str, name: &str) -> bool {
    names::key(key).is_ok() && names::key(source).is_ok() && names::snapshot_name(name).is_ok()
}
