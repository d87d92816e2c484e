//! Preview doors on the key's own container (docs/NODE.md "Preview doors"):
//! `open-preview`, `close-preview`, `list-previews`.

use axum::body::Bytes;

use crate::request::{Refusal, answer, own, parse};
use crate::state::Node;
use stockade_node_protocol as protocol;
use stockade_runtime::substrate::SubstrateError;

/// `open-preview`.
pub(crate) async fn open(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnPort = parse(body)?;
    own(node, &req.container, key)?;
    let r = match check_port(req.port) {
        Ok(()) => node.substrate.open_preview(&req.container, req.port).await,
        Err(e) => Err(e),
    };
    Ok(answer(r.map(protocol::Preview::from)))
}

/// `close-preview`.
pub(crate) async fn close(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnPort = parse(body)?;
    own(node, &req.container, key)?;
    let r = match check_port(req.port) {
        Ok(()) => node.substrate.close_preview(&req.container, req.port).await,
        Err(e) => Err(e),
    };
    Ok(answer(r))
}

/// `list-previews`.
pub(crate) async fn list(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnContainer = parse(body)?;
    own(node, &req.container, key)?;
    let r = node.substrate.list_previews(&req.container).await;
    Ok(answer(r.map(|v| {
        v.into_iter()
            .map(protocol::Preview::from)
            .collect::<Vec<_>>()
    })))
}

/// A door's port: 1-65535 (the guest checked it; a node checks again).
fn check_port(port: u16) -> stockade_runtime::substrate::Result<()> {
    if port == 0 {
        return Err(SubstrateError::Invalid(
            "the port must be 1-65535, got 0".into(),
        ));
    }
    Ok(())
}
