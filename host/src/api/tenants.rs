//! `/v1/tokens`: the operator makes, lists and revokes scoped consumer tokens
//! (docs/TENANTS.md; the decisions are `crate::tenants`).

use std::sync::Arc;

use crate::tenants::Caller;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::{Extension, Json};
use stockade_runtime::imports::clock::now_ms;
use stockade_wire::{self as wire, ErrorCode};

use super::auth::tenant_error;
use super::error::{ApiError, ApiResult, Params};
use super::{ApiState, parse_json};

/// `POST /v1/tokens`.
pub(super) async fn create(
    State(s): State<Arc<ApiState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<wire::TokenCreated>)> {
    let b: wire::TokenBody = parse_json(body)?;
    let made = s.tenants.create(&b, now_ms()).map_err(tenant_error)?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// `GET /v1/tokens`.
pub(super) async fn list(State(s): State<Arc<ApiState>>) -> ApiResult<Json<wire::Tokens>> {
    Ok(Json(wire::Tokens {
        tokens: s.tenants.list().map_err(tenant_error)?,
    }))
}

/// `GET /v1/tokens/self`: the presenting token's own scope. A consumer route (the auth
/// layer admitted the operator's or a live scoped token and left its caller here), so
/// a tenant learns only its own pattern, never another's.
pub(super) async fn own(caller: Option<Extension<Caller>>) -> Json<wire::TokenSelf> {
    Json(match caller.map(|Extension(c)| c) {
        Some(Caller::Tenant(t)) => wire::TokenSelf {
            keys: t.keys.to_string(),
            id: Some(t.id.clone()),
        },
        // The operator's token reaches every key.
        _ => wire::TokenSelf {
            keys: "*".to_string(),
            id: None,
        },
    })
}

/// `DELETE /v1/tokens/{id}`.
pub(super) async fn revoke(
    State(s): State<Arc<ApiState>>,
    Params(id): Params<String>,
) -> ApiResult<Json<wire::Revoked>> {
    if s.tenants.revoke(&id, now_ms()).map_err(tenant_error)? {
        Ok(Json(wire::Revoked { revoked: id }))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            "no live token with that id",
        ))
    }
}
