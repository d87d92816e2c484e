//! The mock-only routes (docs/MOCK.md): a consumer's tests script what commands do, arm
//! faults and read what the fence did, through the API they already call. Mounted only
//! by `stockade serve` over the mock substrate: anywhere else they are the same 404 as
//! any unknown route (they are not in [`super::ROUTES`] nor in docs/openapi.json).
//! The operator's token only ([`super::auth::MOCK_ROUTES`]). Bad input is a typed 400
//! and changes nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router, middleware};
use serde_json::{Value, json};

use stockade_runtime::substrate::mock::{Mock, control, faults, script::Script};
use stockade_wire::ErrorCode;

use super::error::{ApiError, ApiResult, Params};
use super::{ApiState, auth, method_not_allowed, parse_json};

/// The mock routes (method, template): never in [`super::ROUTES`].
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/mock/script"),
    ("PUT", "/v1/mock/script"),
    ("POST", "/v1/mock/faults"),
    ("DELETE", "/v1/mock/faults"),
    ("GET", "/v1/mock/trace/{key}"),
    ("DELETE", "/v1/mock/trace/{key}"),
    ("POST", "/v1/mock/control"),
];

type MockExt = Extension<Arc<Mock>>;

fn invalid(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, message)
}

async fn script(Extension(mock): MockExt) -> Json<Value> {
    Json(mock.script_doc())
}

async fn set_script(
    Extension(mock): MockExt,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Value>> {
    let doc: Value = parse_json(body)?;
    let script = Script::from_value(&doc).map_err(|e| invalid(format!("script: {e}")))?;
    let rules = script.rules.len();
    let default = script.default.is_some();
    mock.set_script(script, doc);
    tracing::info!(target: "stockade::mock", rules, default, "mock script set");
    Ok(Json(json!({"rules": rules, "default": default})))
}

async fn arm(
    Extension(mock): MockExt,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Value>> {
    let doc: Value = parse_json(body)?;
    let r = faults::parse(&doc).map_err(|e| invalid(format!("fault: {e}")))?;
    tracing::info!(target: "stockade::mock", op = %r.op, fault = ?r.fault, skip = r.skip, times = ?r.times, key = ?r.key, "mock fault armed");
    mock.arm(r);
    Ok(Json(json!({"armed": doc})))
}

async fn control(
    Extension(mock): MockExt,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Value>> {
    let doc: Value = parse_json(body)?;
    let c = control::parse(&doc).map_err(|e| invalid(format!("control: {e}")))?;
    let what = format!("{c:?}");
    mock.control(c)
        .map_err(|e| invalid(format!("control: {e}")))?;
    tracing::info!(target: "stockade::mock", control = %what, "mock control done");
    Ok(Json(json!({"done": doc})))
}

async fn clear_faults(Extension(mock): MockExt) -> Json<Value> {
    mock.clear_faults();
    tracing::info!(target: "stockade::mock", "mock faults cleared");
    Json(json!({"cleared": true}))
}

async fn trace(Extension(mock): MockExt, Params(key): Params<String>) -> Json<Value> {
    let calls: Vec<Value> = mock
        .key_trace(&key)
        .into_iter()
        .map(|c| json!({"op": c.op, "target": c.target}))
        .collect();
    Json(json!({"key": key, "calls": calls}))
}

async fn clear_trace(Extension(mock): MockExt, Params(key): Params<String>) -> Json<Value> {
    mock.clear_key_trace(&key);
    Json(json!({"key": key, "calls": []}))
}

/// The mock routes over `mock`, behind the API's auth layer.
pub fn router(state: Arc<ApiState>, mock: Arc<Mock>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/mock/script", get(script).put(set_script))
        .route("/v1/mock/faults", post(arm).delete(clear_faults))
        .route("/v1/mock/trace/{key}", get(trace).delete(clear_trace))
        .route("/v1/mock/control", post(control))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(Extension(mock))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(state, auth::auth))
}
