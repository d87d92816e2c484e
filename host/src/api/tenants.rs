//! `/v1/tokens`: the operator makes, lists and revokes scoped consumer tokens
//! (docs/TENANTS.md; the decisions are `crate::tenants`).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
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
