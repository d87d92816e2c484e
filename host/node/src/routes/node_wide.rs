//! The node's own calls, the front's housekeeping and its approver API: `health`,
//! `idle`, `open-grants`, `put-secret`, `remove-secret`, `pending`, `answer-pending`.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;

use crate::request::{Refusal, answer, parse};
use crate::state::{Node, now_ms};
use stockade_node_protocol as protocol;
use stockade_runtime::substrate::SubstrateError;

/// `health`: the node's name, substrate, live containers and ceiling.
pub(crate) async fn health(node: &Node, _key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let protocol::Empty {} = parse(body)?;
    let live = node.owners().live() as u32;
    Ok(answer(Ok(protocol::Health {
        node: node.name.clone(),
        substrate: node.substrate.kind().to_owned(),
        live,
        ceiling: node.ceiling,
    })))
}

/// `idle`: the keys whose container has been idle this long.
pub(crate) async fn idle(node: &Node, _key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::Idle = parse(body)?;
    Ok(answer(Ok(node
        .substrate
        .idle(Duration::from_millis(req.idle_for_ms))
        .await)))
}

/// `open-grants`: the containers with a grant open (a front's shutdown revokes them).
pub(crate) async fn open_grants(node: &Node, _key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let protocol::Empty {} = parse(body)?;
    Ok(answer(Ok(node.substrate.open_grants())))
}

/// `put-secret`: the binding parsed as the API parses it; the value never logged.
pub(crate) async fn put_secret(node: &Node, _key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    // serde's message may quote the input: never a secret in an answer or a log.
    let req: protocol::PutSecret = parse(body).map_err(|_| {
        Refusal::invalid("the body must be {name, value, host, port, methods, path_prefix}")
    })?;
    Ok(answer(set_secret(node, &req)))
}

fn set_secret(node: &Node, req: &protocol::PutSecret) -> stockade_runtime::substrate::Result<()> {
    let host = if req.host.contains(':') {
        format!("[{}]:{}", req.host, req.port)
    } else {
        format!("{}:{}", req.host, req.port)
    };
    let prefix = (!req.path_prefix.is_empty()).then_some(req.path_prefix.as_str());
    let binding = stockade_grammar::binding::parse(&host, &req.methods, prefix)
        .map_err(|e| SubstrateError::Invalid(e.to_string()))?;
    node.secrets
        .set(&req.name, &req.value, &binding, now_ms())
        .map_err(|e| SubstrateError::Invalid(e.to_string()))?;
    tracing::info!(target: "stockade::node", secret = %req.name, binding = %binding, "secret set");
    Ok(())
}

/// `remove-secret`.
pub(crate) async fn remove_secret(node: &Node, _key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::RemoveSecret = parse(body)?;
    let r = node
        .secrets
        .remove(&req.name)
        .map_err(|e| SubstrateError::Invalid(e.to_string()));
    if r.is_ok() {
        tracing::info!(target: "stockade::node", secret = %req.name, "secret removed");
    }
    Ok(answer(r))
}

/// `pending`: the egress decisions held, the key's (node-wide, empty key: every key's).
pub(crate) async fn pending(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let protocol::Empty {} = parse(body)?;
    Ok(answer(
        node.substrate
            .pending((!key.is_empty()).then_some(key))
            .await,
    ))
}

/// `answer-pending`: the decision answered once, if it is the key's (node-wide, empty
/// key: whoever's). Another key's is 403 and stays held; a substrate failure is a
/// `failed` answer, not a refusal.
pub(crate) async fn answer_pending(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    use stockade_egress::ask::{Answer as Verdict, AnswerError};
    let req: protocol::AnswerPending = parse(body)?;
    let verdict = match req.decision {
        stockade_wire::Verdict::Approve => Verdict::Approve,
        stockade_wire::Verdict::Refuse => Verdict::Refuse,
    };
    let of = (!key.is_empty()).then_some(key);
    let r = match node.substrate.answer_pending(&req.id, of, verdict).await {
        Ok(r) => r,
        Err(e) => return Ok(answer::<protocol::PendingAnswer>(Err(e))),
    };
    Ok(answer(Ok(match r {
        Ok(p) => {
            tracing::info!(target: "stockade::node", id = %req.id, key = %p.key, fence = %p.fence, decision = ?req.decision, "egress decision answered");
            protocol::PendingAnswer::Answered(p)
        }
        Err(AnswerError::Decided { outcome, .. }) => {
            protocol::PendingAnswer::AlreadyDecided(outcome.to_owned())
        }
        Err(AnswerError::Unknown(_)) => protocol::PendingAnswer::NotFound,
        Err(AnswerError::Foreign(id)) => {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("egress decision {id} is another key's"),
            ));
        }
    })))
}
