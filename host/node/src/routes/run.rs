//! `run` (docs/NODE.md "Calls"): the command in its own tree, its output as NDJSON lines
//! as it comes, then its `result` or `error`; the grant's lease extended while it runs.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::streamed::{Begun, Hold, Streamed, begin_streamed, keep, line, whole};
use crate::idempotency;
use crate::request::{check_cmd, own, parse, refused};
use crate::state::{MAX_RUN_TIMEOUT_MS, Node};
use stockade_node_protocol::{self as protocol, RunLine, call};
use stockade_runtime::substrate::{Output, SubstrateError};

/// `run`: parse and own (plain refusals), then NDJSON, made in the call's task.
pub(crate) async fn run(
    node: Arc<Node>,
    key: String,
    body: Bytes,
    id: Option<idempotency::Id>,
    begun: oneshot::Sender<Begun>,
) {
    let req: protocol::Run = match parse(&body) {
        Ok(r) => r,
        Err(r) => return whole(begun, refused(call::RUN, &key, &r)),
    };
    if let Err(r) = own(&node, &req.container, &key) {
        return whole(begun, refused(call::RUN, &key, &r));
    }
    let tx = match begin_streamed(&node, id.as_ref()) {
        Streamed::Go(tx) => tx,
        Streamed::Answered(answered) => return whole(begun, answered),
    };
    let (lines_tx, lines_rx) = mpsc::unbounded_channel::<Bytes>();
    // The front may have gone: the run goes on, its lines with nowhere to go.
    let _ = begun.send(Begun::Lines(lines_rx, Hold::FirstLine));
    let last = run_task(&node, req, &lines_tx).await;
    keep(&node, id, tx, last.clone());
    let _ = lines_tx.send(last);
}

/// The run itself, its output sent as lines as it comes; its last line.
pub(crate) async fn run_task(
    node: &Node,
    req: protocol::Run,
    lines: &mpsc::UnboundedSender<Bytes>,
) -> Bytes {
    match run_call(node, req, lines).await {
        Ok(result) => line(&RunLine::Result(result)),
        Err(e) => line(&RunLine::Error(e.into())),
    }
}

/// A run (alone or in a batch), its output sent as lines as it comes; its result
/// (without output: it went in the lines).
pub(crate) async fn run_call(
    node: &Node,
    req: protocol::Run,
    lines: &mpsc::UnboundedSender<Bytes>,
) -> stockade_runtime::substrate::Result<stockade_runtime::substrate::RunResult> {
    check_cmd(&req.cmd)?;
    if req.timeout_ms == 0 || req.timeout_ms > MAX_RUN_TIMEOUT_MS {
        return Err(SubstrateError::Invalid(format!(
            "timeout_ms must be 1..={MAX_RUN_TIMEOUT_MS}"
        )));
    }
    let timeout = Duration::from_millis(req.timeout_ms);
    let lease = node.leases.run_started(&req.container, timeout);
    let (sink, mut out) = mpsc::unbounded_channel::<Output>();
    let send = |o: Output| {
        let l = match o {
            Output::Stdout(b) if !b.is_empty() => RunLine::Stdout(b),
            Output::Stderr(b) if !b.is_empty() => RunLine::Stderr(b),
            _ => return,
        };
        // The front may have gone: the run goes on, its output with nowhere to go.
        let _ = lines.send(line(&l));
    };
    let going = node
        .substrate
        .run_streaming(&req.container, req.cmd, timeout, sink);
    tokio::pin!(going);
    let r = loop {
        tokio::select! {
            r = &mut going => break r,
            Some(o) = out.recv() => send(o),
        }
    };
    while let Ok(o) = out.try_recv() {
        send(o);
    }
    node.leases.run_ended(&req.container, lease);
    let mut result = r?;
    // The result carries no output (it went in the lines before).
    let (o, e) = (
        std::mem::take(&mut result.stdout),
        std::mem::take(&mut result.stderr),
    );
    send(Output::Stdout(o));
    send(Output::Stderr(e));
    Ok(result)
}
