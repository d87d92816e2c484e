//! `POST /v1/nodes/events`: a node's call back when a container stopped on its own
//! (docs/NODE.md "Call back"). Not a bearer-token route: the request is signed with
//! the node's secret (`x-stockade-node` names the node) and verified by the remote
//! substrate's [`Callbacks`] — unknown node, bad signature, stale time or a replayed
//! nonce is 401 and changes nothing. A verified event reaches the guest as `on-stop`
//! through the substrate's event channel.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use stockade_wire::ErrorCode;

use super::error::ApiError;
use stockade_node_protocol::auth;
use stockade_node_protocol::{EVENTS_PATH, IDEMPOTENCY_HEADER};
use stockade_remote::{CallbackHeaders, CallbackRefused, Callbacks};
use stockade_runtime::imports::clock::now_ms;

/// The call-back route, to merge beside the API's router (outside its bearer-token
/// layer).
pub fn router(callbacks: Arc<Callbacks>) -> Router {
    Router::new()
        .route(EVENTS_PATH, post(event))
        .with_state(callbacks)
}

async fn event(
    State(cb): State<Arc<Callbacks>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let h = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let signed = CallbackHeaders {
        node: h(auth::NODE_HEADER),
        time: h(auth::TIME_HEADER),
        nonce: h(auth::NONCE_HEADER),
        key: h(auth::KEY_HEADER),
        idempotency: h(IDEMPOTENCY_HEADER),
        signature: h(auth::SIGNATURE_HEADER),
    };
    match cb.accept(&signed, &body, now_ms()) {
        Ok(ev) => {
            tracing::info!(target: "stockade::api", node = signed.node, event = ?ev, "node event accepted");
            Ok(StatusCode::NO_CONTENT)
        }
        Err(e) => {
            tracing::warn!(target: "stockade::api", node = signed.node, error = %e, "node event refused");
            Err(match e {
                CallbackRefused::Unauthenticated(_) => ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    ErrorCode::Unauthorized,
                    "the event is not signed by a configured node",
                ),
                CallbackRefused::Invalid(m) => {
                    ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, m)
                }
            })
        }
    }
}
