//! The node's HTTP routes (docs/NODE.md "Calls"): `POST /node/v1/{call}` for every call
//! of [`protocol::call::ALL`], each checked in this order before anything is done:
//!
//! 1. before a byte of the body is read, what the headers alone show
//!    ([`precheck`]): the signing headers well-formed, the time inside the window, the
//!    nonce unseen — `401` with the body unread; a declared length over the bound —
//!    `413` unread;
//! 2. the body is read, bounded (`413` past [`Node::max_body`]; a `run`'s, which
//!    carries its stdin, past [`Node::max_run_body`]: the largest stdin a front
//!    sends, an upload's archive, as base64), before its request's time leaves the
//!    window (`408`). Its signature cannot be checked before it is read, so bodies
//!    over [`SMALL_BODY`] are read [`UNVERIFIED_BODIES`](crate::state::UNVERIFIED_BODIES)
//!    at a time (past it `503` at once), those over the plain bound
//!    [`BIG_BODIES`](crate::state::BIG_BODIES) at a time;
//! 3. the signature, time and nonce ([`auth::verify`], then the shared
//!    [`auth::Nonces`]: a forged request never takes a nonce slot) — `401`;
//! 4. the key: a keyed call needs a well-formed sandbox key — `400`;
//! 5. an idempotency key answered before gets that answer ([`idempotency`]);
//! 6. the body parses (unknown fields refused) — `400`, then the container it names
//!    is the key's ([`owners`]) — `403`. (The container is a body field, so the body
//!    is parsed first; neither step changes anything.)
//!
//! Only then does the call reach the substrate. Every call runs in a task of its own,
//! so a front that goes away mid-call does not cancel it halfway (its retry gets the
//! answer). `run` answers NDJSON ([`RunLine`]s): output as it comes, a heartbeat every
//! [`Node::heartbeat`] without other output, then one `result` or `error` line.
//!
//! One canonical line per refused request (`target: "stockade::node"`, `request
//! refused`, with the call, the key, the status and the reason).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use tokio::sync::oneshot;

use crate::idempotency::{self, Begin, Stored};
use crate::request::{
    JSON, Refusal, header_str, precheck, refused, respond, too_slow, unverified_permit, verify,
    wait,
};
use crate::routes::streamed::{Begun, Hold, stream_after_first_line, whole};
use crate::routes::{
    batch::batch, batch::stream_after_answers, dispatch, run::run, run_stream::run_stream,
};
use crate::state::{Node, SMALL_BODY, now_ms};
use stockade_node_protocol::auth;
use stockade_node_protocol::call;

/// `POST /node/v1/{call}`: every call, checked as this module says, then made by its
/// route ([`crate::routes`]) in a task of its own.
pub async fn handle(
    State(node): State<Arc<Node>>,
    Path(call): Path<String>,
    req: Request,
) -> Response {
    // `run-stream` reads its body as its stdin, in the run's own task.
    if call == call::RUN_STREAM {
        return call_task(node, call, req).await;
    }
    // Every other call whole in a task of its own, its body read there too. Read in
    // the connection's task, the body's hand-over woke that task from inside itself,
    // which tokio takes as a yield and answers by waking a parked worker to steal it:
    // a futex or eventfd write and a context switch on another CPU per request
    // (docs/BENCHMARKS.md, "Remote exec's round trip taken apart"). From another task
    // on the same worker it is a plain wake, in the worker's LIFO slot.
    if call == call::RUN || call == call::BATCH {
        // A streamed answer's call goes on in that task once its answer has begun,
        // sending its lines to the connection's task: one task per call, never a
        // second spawned after the body (whose wake would displace the connection's
        // task from the LIFO slot and wake a parked worker, as the yield did).
        let (begun_tx, begun) = oneshot::channel();
        tokio::spawn(streamed_task(node.clone(), call, req, begun_tx));
        return match begun.await {
            Ok(Begun::Whole(r)) => r,
            Ok(Begun::Lines(lines, Hold::FirstLine)) => {
                stream_after_first_line(lines, node.heartbeat).await
            }
            Ok(Begun::Lines(lines, Hold::Answers)) => {
                stream_after_answers(lines, node.heartbeat).await
            }
            Err(_) => respond(
                Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "failed",
                    "the call's task ended without an answer",
                )
                .stored(),
                JSON,
            ),
        };
    }
    match tokio::spawn(call_task(node, call, req)).await {
        Ok(r) => r,
        Err(e) => respond(
            Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "failed", e.to_string()).stored(),
            JSON,
        ),
    }
}

/// A call's checked request: its key, its body, its idempotency id.
struct Accepted {
    key: String,
    body: Bytes,
    id: Option<idempotency::Id>,
}

/// Steps 1-5 of every call but `run-stream`: the call named, the body read within its
/// bound, the signature, time and nonce verified, the key checked; or the refusal.
async fn accept(node: &Arc<Node>, call: &'static str, req: Request) -> Result<Accepted, Response> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    // The length the body says it has (hyper holds a body to its Content-Length).
    let declared: Option<usize> = header_str(&parts.headers, header::CONTENT_LENGTH.as_str())
        .and_then(|v| v.parse().ok())
        .or_else(|| {
            axum::body::HttpBody::size_hint(&body)
                .exact()
                .and_then(|n| usize::try_from(n).ok())
        });
    let key_of =
        |h: &axum::http::HeaderMap| header_str(h, auth::KEY_HEADER).unwrap_or("").to_owned();
    // Everything the headers alone can show before a byte of the body is read.
    let deadline = match precheck(node, &parts.headers) {
        Ok(d) => d,
        Err(r) => return Err(refused(call, &key_of(&parts.headers), &r)),
    };
    let limit = if call == call::RUN || call == call::BATCH {
        node.max_run_body
    } else {
        node.max_body
    };
    if let Some(n) = declared
        && n > limit
    {
        let r = Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid",
            format!("a body of {n} bytes (at most {limit})"),
        );
        return Err(refused(call, &key_of(&parts.headers), &r));
    }
    let unverified = if declared.is_none_or(|n| n > SMALL_BODY) {
        match unverified_permit(node) {
            Ok(p) => Some(p),
            Err(r) => return Err(refused(call, &key_of(&parts.headers), &r)),
        }
    } else {
        None
    };
    let read = async {
        let _big = if limit > node.max_body && declared.is_none_or(|n| n > node.max_body) {
            node.big_bodies.acquire().await.ok()
        } else {
            None
        };
        axum::body::to_bytes(body, limit).await
    };
    let body = match tokio::time::timeout(deadline, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            let r = Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid",
                format!("the body could not be read within {limit} bytes: {e}"),
            );
            return Err(refused(call, &key_of(&parts.headers), &r));
        }
        Err(_) => return Err(refused(call, &key_of(&parts.headers), &too_slow(deadline))),
    };
    drop(unverified);
    let (key, idem) = match verify(node, &parts.headers, path, &body) {
        Ok(k) => k,
        Err(r) => {
            let key = header_str(&parts.headers, auth::KEY_HEADER).unwrap_or("");
            return Err(refused(call, key, &r));
        }
    };
    // A keyed-or-node-wide call with no key is node-wide (the front's approver API).
    let node_wide = call::node_wide(call) || (call::keyed_or_node_wide(call) && key.is_empty());
    if !node_wide && let Err(e) = stockade_grammar::names::key(&key) {
        return Err(refused(call, &key, &Refusal::invalid(e.to_string())));
    }
    let id = (!idem.is_empty()).then(|| idempotency::Id {
        key: key.clone(),
        call: call.to_owned(),
        idempotency: idem,
    });
    Ok(Accepted { key, body, id })
}

/// The call's name as the protocol spells it, or its 404.
fn named(call: &str) -> Result<&'static str, Box<Response>> {
    call::ALL
        .iter()
        .copied()
        .find(|c| *c == call)
        .ok_or_else(|| {
            let r = Refusal::new(
                StatusCode::NOT_FOUND,
                "invalid",
                format!("no call {call:?}"),
            );
            Box::new(refused(call, "", &r))
        })
}

/// [`handle`]'s `run` or `batch`, in its own task: accepted, then begun and made.
async fn streamed_task(node: Arc<Node>, call: String, req: Request, begun: oneshot::Sender<Begun>) {
    let accepted = match named(&call) {
        Ok(call) => accept(&node, call, req).await,
        Err(r) => Err(*r),
    };
    let Accepted { key, body, id } = match accepted {
        Ok(a) => a,
        Err(r) => return whole(begun, r),
    };
    if call == call::RUN {
        run(node, key, body, id, begun).await;
    } else {
        batch(node, key, body, id, begun).await;
    }
}

/// [`handle`]'s plain call (and `run-stream`). A plain call runs in a task of its own
/// (so a front that goes away mid-call does not cancel it halfway: its retry gets the
/// answer).
async fn call_task(node: Arc<Node>, call: String, req: Request) -> Response {
    let call = match named(&call) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    if call == call::RUN_STREAM {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_owned();
        return run_stream(node, &parts.headers, path, body).await;
    }
    let Accepted { key, body, id } = match accept(&node, call, req).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let begun = id.as_ref().map(|id| node.answers().begin(id, now_ms()));
    let tx = match begun {
        Some(Begin::Done(s)) => return respond(s, JSON),
        Some(Begin::Wait(rx)) => return respond(wait(rx).await, JSON),
        Some(Begin::Fresh(tx)) => Some(tx),
        Some(Begin::Untracked) | None => None,
    };
    let stored = match dispatch(&node, call, &key, &body).await {
        Ok(answer) => Stored {
            status: 200,
            body: answer,
        },
        Err(r) => {
            tracing::warn!(
                target: "stockade::node",
                call,
                key,
                status = r.status.as_u16(),
                reason = %r.message,
                "request refused"
            );
            r.stored()
        }
    };
    if let (Some(id), Some(tx)) = (id, tx) {
        node.answers().finish(&id, tx, stored.clone());
    }
    respond(stored, JSON)
}

#[cfg(test)]
mod tests;
