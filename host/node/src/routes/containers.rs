//! A key's container and the processes in it: `ensure`, `current`, `start-process`,
//! `list-processes`, `process-status`, `kill-process`, `kill-all`, `snapshot`, `stop`, and the named snapshots' `save-snapshot`,
//! `fork-snapshot`, `drop-snapshot`.
//! Every call on a container is the key's own ([`own`]); `ensure` and `current` record
//! the key as the owner of the container they answer.

use axum::body::Bytes;

use crate::lease::LeaseEvent;
use crate::request::{Refusal, answer, check_cmd, own, parse};
use crate::state::Node;
use stockade_node_protocol as protocol;

/// `ensure`: the key's live container, its owner recorded.
pub(crate) async fn ensure(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let protocol::Empty {} = parse(body)?;
    let r = node.substrate.ensure(key).await;
    if let Ok(c) = &r {
        node.owners().record(c, key);
    }
    Ok(answer(r))
}

/// `current`: the key's live container, if any, its owner recorded.
pub(crate) async fn current(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let protocol::Empty {} = parse(body)?;
    let r = node.substrate.current(key).await;
    if let Ok(Some(c)) = &r {
        node.owners().record(c, key);
    }
    Ok(answer(r))
}

/// `start-process`.
pub(crate) async fn start_process(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::StartProcess = parse(body)?;
    own(node, &req.container, key)?;
    let r = match check_cmd(&req.cmd) {
        Ok(()) => node.substrate.start_process(&req.container, req.cmd).await,
        Err(e) => Err(e),
    };
    Ok(answer(r))
}

/// `list-processes`.
pub(crate) async fn list_processes(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnContainer = parse(body)?;
    own(node, &req.container, key)?;
    let r = node.substrate.list_processes(&req.container).await;
    Ok(answer(
        r.map(|v| v.into_iter().map(process).collect::<Vec<_>>()),
    ))
}

/// `process-status`.
pub(crate) async fn process_status(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnProcess = parse(body)?;
    own(node, &req.container, key)?;
    Ok(answer(
        node.substrate
            .process_status(&req.container, &req.id)
            .await
            .map(|p| p.map(process)),
    ))
}

/// `kill-process`.
pub(crate) async fn kill_process(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnProcess = parse(body)?;
    own(node, &req.container, key)?;
    Ok(answer(
        node.substrate.kill_process(&req.container, &req.id).await,
    ))
}

/// `kill-all`.
pub(crate) async fn kill_all(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnContainer = parse(body)?;
    own(node, &req.container, key)?;
    Ok(answer(node.substrate.kill_all(&req.container).await))
}

/// `snapshot`.
pub(crate) async fn snapshot(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnContainer = parse(body)?;
    own(node, &req.container, key)?;
    Ok(answer(node.substrate.snapshot(&req.container).await))
}

/// `save-snapshot`.
pub(crate) async fn save_snapshot(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::SaveSnapshot = parse(body)?;
    own(node, &req.container, key)?;
    Ok(answer(
        node.substrate
            .save_snapshot(&req.container, &req.name)
            .await,
    ))
}

/// `fork-snapshot`: onto the signed key, from a source key on this node.
pub(crate) async fn fork_snapshot(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::ForkSnapshot = parse(body)?;
    Ok(answer(
        node.substrate
            .fork_snapshot(&req.source, &req.name, key)
            .await,
    ))
}

/// `drop-snapshot`.
pub(crate) async fn drop_snapshot(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::Named = parse(body)?;
    Ok(answer(node.substrate.drop_snapshot(key, &req.name).await))
}

/// `stop`: the container gone, its owner forgotten and its grant's lease ended.
pub(crate) async fn stop(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnContainer = parse(body)?;
    own(node, &req.container, key)?;
    let r = node.substrate.stop(&req.container).await;
    node.owners().retire(&req.container);
    node.leases.on(&req.container, LeaseEvent::Revoked);
    Ok(answer(r))
}

fn process(p: stockade_runtime::substrate::ProcessInfo) -> protocol::Process {
    protocol::Process {
        id: p.id,
        running: p.running,
        exit_code: p.exit_code,
    }
}
