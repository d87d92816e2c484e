//! The preview routes (DESIGN §8; docs/PREVIEW.md): `POST /v1/sandboxes/{key}/previews`
//! (`{"port": N}` → the door), `GET …/previews` (the key's doors), `DELETE
//! …/previews/{port}`. Each is one facade call; the guest validates the port and the
//! key's container, the substrate opens the door. A port in range that the guest
//! refuses (no running container, the per-key bound) is a 409: the sandbox's state
//! refuses a well-formed request. A port no door may open onto (the egress proxy's,
//! 3128, refused by the guest before any substrate call) is a 400 like one out of
//! range. The door itself is served by the
//! substrate's own listener (`[preview]`), never by this API.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use stockade_wire as wire;

use axum::http::StatusCode;
use stockade_wire::ErrorCode;

use super::error::{ApiError, ApiResult, Params};
use super::{ApiState, parse_json};
use stockade_runtime::bindings::FacadeError;
use stockade_runtime::bindings::Preview;
use stockade_runtime::runtime::CallError;

/// The container's egress proxy's port, which the guest never opens a door onto
/// (`guest/src/decide/preview.rs` `PROXY_PORT`).
const PROXY_PORT: u32 = 3128;

fn answer(p: Preview) -> wire::Preview {
    wire::Preview {
        port: p.port,
        token: p.token,
        url: p.url,
    }
}

pub(super) async fn expose(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<wire::Preview>> {
    let b: wire::ExposeBody = parse_json(body)?;
    match s.runtime.expose(&key, b.port).await {
        Ok(p) => Ok(Json(answer(p))),
        // A port in range refused by the guest is refused for the sandbox's state (no
        // running container, the per-key bound): the request is well-formed, so 409.
        // The guest refuses the proxy's port whatever the state: that request is
        // malformed, a 400 (this picks the status only; the guest decides).
        Err(CallError::Facade(FacadeError::InvalidInput(m)))
            if (1..=65535).contains(&b.port) && b.port != PROXY_PORT =>
        {
            Err(ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::InvalidInput,
                m,
            ))
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn previews(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Previews>> {
    let v = s.runtime.previews(&key).await?;
    Ok(Json(wire::Previews {
        previews: v.into_iter().map(answer).collect(),
    }))
}

pub(super) async fn unexpose(
    State(s): State<Arc<ApiState>>,
    Params((key, port)): Params<(String, u32)>,
) -> ApiResult<Json<wire::Unexposed>> {
    s.runtime.unexpose(&key, port).await?;
    Ok(Json(wire::Unexposed { unexposed: port }))
}
