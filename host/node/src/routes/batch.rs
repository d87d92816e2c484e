//! `batch` (docs/NODE.md "Batches"): the calls a front's guest decided, made as their
//! plan says (`stockade_runtime::substrate::batch`), answered as NDJSON lines.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::response::Response;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::grants::{apply_grant, revoke_grant};
use super::run::run_call;
use super::streamed::{
    Begun, FIRST_LINE_WAIT, Hold, Streamed, begin_streamed, keep, line, stream_from, whole,
};
use crate::idempotency;
use crate::request::{Refusal, own, parse, refused};
use crate::state::Node;
use stockade_node_protocol::{self as protocol, Answer, RunLine, call};
use stockade_runtime::substrate::{SubstrateError, batch};

/// `batch` (docs/NODE.md "Batches"): the body parsed (400), 1 to
/// [`stockade_runtime::substrate::MAX_BATCH`] calls (400), every container the key's (403) — all
/// before any call is made — then the calls in order, stopping at the first error,
/// answered NDJSON: a run's lines as they come, one `answer` line per call made. The
/// idempotency cache keeps the answer lines (a retry gets them; a run's output went
/// to the first attempt, as a `run`'s).
pub(crate) async fn batch(
    node: Arc<Node>,
    key: String,
    body: Bytes,
    id: Option<idempotency::Id>,
    begun: oneshot::Sender<Begun>,
) {
    let req: protocol::Batch = match parse(&body) {
        Ok(r) => r,
        Err(r) => return whole(begun, refused(call::BATCH, &key, &r)),
    };
    let n = req.calls.len();
    // The grant a batch's apply opened is named by its lease number: the plan makes
    // the batch's teardown after the run only while that grant is still the open one.
    // A front that went away mid-run may have torn the fence down by calls of its own
    // and started the key's next fence since; a teardown made then would kill that
    // fence's command and revoke its grant.
    let mut plan: batch::Plan<serde_json::Value, SubstrateError, Option<u64>> =
        match batch::Plan::new(req.calls.iter().map(protocol::BatchCall::step).collect()) {
            Ok(p) => p,
            Err(e) => {
                return whole(
                    begun,
                    refused(call::BATCH, &key, &Refusal::invalid(e.to_string())),
                );
            }
        };
    // The ensured container is the key's by construction; every other one must be.
    for c in &req.calls {
        if c.container() != protocol::ENSURED
            && let Err(r) = own(&node, c.container(), &key)
        {
            return whole(begun, refused(call::BATCH, &key, &r));
        }
    }
    let tx = match begin_streamed(&node, id.as_ref()) {
        Streamed::Go(tx) => tx,
        Streamed::Answered(answered) => return whole(begun, answered),
    };
    let (lines_tx, lines_rx) = mpsc::unbounded_channel::<Bytes>();
    let _ = begun.send(Begun::Lines(lines_rx, Hold::Answers));
    let mut answers = bytes::BytesMut::new();
    let mut made = Vec::with_capacity(n);
    let mut calls: Vec<Option<protocol::BatchCall>> = req.calls.into_iter().map(Some).collect();
    while let Some(next) = plan.next() {
        let Some(mut c) = calls[next.index].take() else {
            break;
        };
        let name = c.name();
        // `""` names the container the batch's ensure answered: the plan's resolved.
        if let Some(on) = &next.container {
            c.set_container(on);
        }
        let container = c.container().to_owned();
        let mut opened = None;
        let r: stockade_runtime::substrate::Result<serde_json::Value> = match c {
            _ if next
                .while_open
                .as_ref()
                .is_some_and(|g| node.leases.open_grant(&container) != *g) =>
            {
                Err(batch::closed_meanwhile(&container))
            }
            protocol::BatchCall::Ensure(protocol::Empty {}) => {
                let r = node.substrate.ensure(&key).await;
                if let Ok(c) = &r {
                    node.owners().record(c, &key);
                }
                r.and_then(json)
            }
            protocol::BatchCall::ApplyGrant(a) => {
                let r = apply_grant(&node, &a).await;
                if r.is_ok() {
                    opened = Some(node.leases.open_grant(&a.container));
                }
                r.map(|()| serde_json::Value::Null)
            }
            protocol::BatchCall::Run(r) => run_call(&node, r, &lines_tx).await.and_then(json),
            protocol::BatchCall::KillAll(c) => {
                node.substrate.kill_all(&c.container).await.and_then(json)
            }
            protocol::BatchCall::RevokeGrant(c) => {
                revoke_grant(&node, &c.container).await.and_then(json)
            }
        };
        let failed = r.is_err();
        made.push(format!("{name}:{}", if failed { "error" } else { "ok" }));
        let l = line(&RunLine::Answer(Answer::from_result(r.clone())));
        answers.extend_from_slice(&l);
        let _ = lines_tx.send(l);
        match opened {
            Some(grant) => plan.answer_opened(r, grant),
            None => plan.answer(r),
        }
        if failed {
            tracing::info!(target: "stockade::node", key = %key, container = %container, call = name, "batch stopped at its first error");
        }
    }
    tracing::debug!(target: "stockade::node", key = %key, calls = n, made = ?made, "batch");
    keep(&node, id, tx, answers.freeze());
}

fn json<T: Serialize>(v: T) -> stockade_runtime::substrate::Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| SubstrateError::Failed(e.to_string()))
}

/// A batch's [`stream`]: its head held until a line that is not a call's answer (a
/// run's output or heartbeat), the end, or [`FIRST_LINE_WAIT`] (at most `every`), with
/// every line before it: a short batch's head, answers and end leave in one write.
pub(crate) async fn stream_after_answers(
    mut lines: mpsc::UnboundedReceiver<Bytes>,
    every: Duration,
) -> Response {
    let deadline = tokio::time::Instant::now() + every.min(FIRST_LINE_WAIT);
    let mut first = bytes::BytesMut::new();
    while let Ok(Some(l)) = tokio::time::timeout_at(deadline, lines.recv()).await {
        let answer = l.starts_with(b"{\"answer\":");
        first.extend_from_slice(&l);
        if !answer {
            break;
        }
    }
    let first = (!first.is_empty()).then(|| first.freeze());
    stream_from(first, lines, every)
}
