//! A key's records on this node: `denials` and `admitted` (the egress audit its proxy
//! kept), `list-artifacts` and `read-artifact` (its `/artifacts`).

use axum::body::Bytes;
use base64::Engine;

use crate::request::{Refusal, answer, parse};
use crate::state::Node;
use stockade_node_protocol as protocol;
use stockade_runtime::substrate::SubstrateError;

/// `denials`.
pub(crate) async fn denials(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let protocol::Empty {} = parse(body)?;
    Ok(answer(node.substrate.denials(key).await))
}

/// `admitted`: read from the store off the async threads.
pub(crate) async fn admitted(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let protocol::Empty {} = parse(body)?;
    let store = node.store.clone();
    let key = key.to_owned();
    let r = tokio::task::spawn_blocking(move || store.admitted(&key))
        .await
        .map_err(|e| SubstrateError::Failed(e.to_string()))
        .and_then(|r| r.map_err(|e| SubstrateError::Failed(e.to_string())));
    Ok(answer(r))
}

/// `list-artifacts`.
pub(crate) async fn list_artifacts(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let protocol::Empty {} = parse(body)?;
    let r = node.substrate.list_artifacts(key).await;
    Ok(answer(r.map(|v| {
        v.into_iter()
            .map(|a| protocol::ArtifactInfo {
                name: a.name,
                size: a.size,
            })
            .collect::<Vec<_>>()
    })))
}

/// `read-artifact`: the bytes as base64.
pub(crate) async fn read_artifact(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::ReadArtifact = parse(body)?;
    let r = node
        .substrate
        .read_artifact(key, &req.name, req.offset, req.length)
        .await;
    Ok(answer(r.map(|b| {
        base64::engine::general_purpose::STANDARD.encode(b)
    })))
}
