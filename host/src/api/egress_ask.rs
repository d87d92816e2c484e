//! The approver's side of egress that can ask (DESIGN §5; docs/EGRESS.md): the requests
//! `ask = true` grants hold, listed, and answered once.
//!
//! * `GET /v1/egress/pending` (optionally `?key=K`) and
//!   `GET /v1/sandboxes/{key}/egress/pending`: either token. The consumer's may list —
//!   the MCP server runs with it and offers the list as a tool — but never answer.
//! * `POST /v1/egress/pending/{id}` `{"decision": "approve"|"refuse"}`: the approver's
//!   token only (the consumer's is 403 `approver-only`, `APPROVER_ROUTES`). Answered
//!   once: an id already answered, timed out or dropped with its fence is 409
//!   `already-decided`; one never issued is 404 `not-found`.
//!
//! The pending decisions live where the proxies hold them, and the substrate lists and
//! answers them (`Housekeeping::pending`, `answer_pending`): the linux substrate's own
//! table; the remote substrate's nodes' (docs/NODE.md "Pending egress decisions": the
//! union over the nodes, an answer asked of each, the id a UUID on every node). A node
//! that cannot be asked is 502 `unreachable`, never a list that looks complete.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use stockade_wire::{self as wire, ErrorCode};

use super::error::{ApiError, ApiResult, Params};
use super::{ApiState, parse_json};
use crate::tenants::Caller;
use stockade_egress::ask::{Answer, AnswerError};

/// The query of `GET /v1/egress/pending`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PendingQuery {
    key: Option<String>,
}

/// The pending decisions of `key` (or every key), those `caller` reaches: a scoped
/// token sees its own keys' only, and asking for another's is the empty list an
/// unknown key's is (docs/TENANTS.md).
async fn list(
    s: &ApiState,
    caller: &Caller,
    key: Option<&str>,
) -> ApiResult<Json<wire::PendingDecisions>> {
    if let Some(k) = key {
        stockade_grammar::names::key(k)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, e))?;
        if !caller.reaches(k) {
            return Ok(Json(wire::PendingDecisions { pending: vec![] }));
        }
    }
    let mut pending = s
        .runtime
        .substrate()
        .pending(key)
        .await
        .map_err(super::substrate_error)?;
    pending.retain(|p| caller.reaches(&p.key));
    Ok(Json(wire::PendingDecisions { pending }))
}

/// `GET /v1/egress/pending[?key=K]`.
pub(super) async fn pending(
    State(s): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<PendingQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<wire::PendingDecisions>> {
    let Query(q) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidInput,
            e.body_text(),
        )
    })?;
    list(&s, &caller, q.key.as_deref()).await
}

/// `GET /v1/sandboxes/{key}/egress/pending`.
pub(super) async fn pending_of_key(
    State(s): State<Arc<ApiState>>,
    Extension(caller): Extension<Caller>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::PendingDecisions>> {
    list(&s, &caller, Some(&key)).await
}

/// `POST /v1/egress/pending/{id}` (the approver's token).
pub(super) async fn answer(
    State(s): State<Arc<ApiState>>,
    Params(id): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<wire::Decided>> {
    let b: wire::VerdictBody = parse_json(body)?;
    let unknown = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            "no such pending egress decision",
        )
    };
    // An id is a UUID; anything else was never issued (and is not echoed back).
    if uuid::Uuid::parse_str(&id).is_err() {
        return Err(unknown());
    }
    let answer = match b.decision {
        wire::Verdict::Approve => Answer::Approve,
        wire::Verdict::Refuse => Answer::Refuse,
    };
    let answered = s
        .runtime
        .substrate()
        .answer_pending(&id, None, answer)
        .await
        .map_err(super::substrate_error)?;
    match answered {
        Ok(p) => {
            tracing::info!(target: "stockade::api", id = %id, key = %p.key, fence = %p.fence, decision = ?b.decision, widens = %p.widens, "egress decision answered");
            Ok(Json(wire::Decided {
                pending: p,
                decision: b.decision,
            }))
        }
        // `Foreign` is a keyed answer's; the approver's is never scoped to a key.
        Err(AnswerError::Unknown(_) | AnswerError::Foreign(_)) => Err(unknown()),
        Err(e @ AnswerError::Decided { .. }) => Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::AlreadyDecided,
            e.to_string(),
        )),
    }
}
