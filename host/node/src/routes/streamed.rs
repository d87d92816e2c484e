//! What the streamed calls (`run`, `batch`, `run-stream`) share: how an answer begins
//! ([`Begun`], held back as [`Hold`] says), its NDJSON lines and heartbeats
//! ([`stream`]), and the idempotency cache's side of it ([`begin_streamed`], [`keep`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, oneshot, watch};

use crate::idempotency::{self, Begin, Stored};
use crate::request::{NDJSON, respond, wait};
use crate::state::{Node, now_ms};
use stockade_node_protocol::RunLine;

/// How a streamed call's answer begins (sent from the call's task to the
/// connection's).
pub(crate) enum Begun {
    /// A whole answer: a refusal, or a retry's stored answer.
    Whole(Response),
    /// Its lines as the call makes them, the head held as [`Hold`] says.
    Lines(mpsc::UnboundedReceiver<Bytes>, Hold),
}

/// A streamed call's whole answer (the connection's task may have gone: nothing to do).
pub(crate) fn whole(begun: oneshot::Sender<Begun>, r: Response) {
    let _ = begun.send(Begun::Whole(r));
}

/// How long a streamed answer holds its head back.
pub(crate) enum Hold {
    /// For the first line ([`stream_after_first_line`]: `run`).
    FirstLine,
    /// For a line that is not a call's answer ([`stream_after_answers`]: `batch`).
    Answers,
}

pub(crate) fn line(l: &RunLine) -> Bytes {
    let mut v = serde_json::to_vec(l).expect("run lines serialize");
    v.push(b'\n');
    Bytes::from(v)
}

/// The idempotency cache's side of a streamed call (`run`, `run-stream`, `batch`): the
/// sender to finish a fresh attempt with (`None`: nothing remembered), or the answer
/// already: a stored one, or, for a retry of an attempt still going, heartbeats and
/// then that attempt's last line.
pub(crate) fn begin_streamed(node: &Arc<Node>, id: Option<&idempotency::Id>) -> Streamed {
    match id.map(|id| node.answers().begin(id, now_ms())) {
        Some(Begin::Done(s)) => Streamed::Answered(respond(s, NDJSON)),
        Some(Begin::Wait(rx)) => {
            let (lines_tx, lines_rx) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                let _ = lines_tx.send(wait(rx).await.body);
            });
            Streamed::Answered(stream(lines_rx, node.heartbeat))
        }
        Some(Begin::Fresh(tx)) => Streamed::Go(Some(tx)),
        Some(Begin::Untracked) | None => Streamed::Go(None),
    }
}

/// What [`begin_streamed`] says.
pub(crate) enum Streamed {
    /// Make the call; finish the cache's entry with this sender, if any.
    Go(Option<watch::Sender<Option<Stored>>>),
    /// Answered already.
    Answered(Response),
}

/// A streamed call's answer kept under its idempotency key, if it has one: a retry
/// gets it (a run's output went to the first attempt).
pub(crate) fn keep(
    node: &Node,
    id: Option<idempotency::Id>,
    tx: Option<watch::Sender<Option<Stored>>>,
    body: Bytes,
) {
    if let (Some(id), Some(tx)) = (id, tx) {
        node.answers().finish(&id, tx, Stored { status: 200, body });
    }
}

/// How long a `run`'s answer holds back its head for the run's first line, so that a
/// short run's head, last line and end leave in one write: the front wakes once per
/// run, not twice (docs/BENCHMARKS.md, "Remote exec"). Short, as until the head arrives a
/// front tells a cut link only at the call's deadline, not after its silence bound.
pub const FIRST_LINE_WAIT: Duration = Duration::from_millis(10);

/// [`stream`], its head sent with the first line, or after [`FIRST_LINE_WAIT`] (at most
/// `every`) without one.
pub(crate) async fn stream_after_first_line(
    mut lines: mpsc::UnboundedReceiver<Bytes>,
    every: Duration,
) -> Response {
    let first = match tokio::time::timeout(every.min(FIRST_LINE_WAIT), lines.recv()).await {
        Ok(Some(l)) => Some(l),
        // Ended without a line (the task went away): an empty body, as `stream`'s.
        Ok(None) | Err(_) => None,
    };
    stream_from(first, lines, every)
}

/// An NDJSON body: the lines as they come, a heartbeat after `every` without one; it
/// ends when the lines do.
pub(crate) fn stream(lines: mpsc::UnboundedReceiver<Bytes>, every: Duration) -> Response {
    stream_from(None, lines, every)
}

/// [`stream`] starting with `first`.
pub(crate) fn stream_from(
    first: Option<Bytes>,
    lines: mpsc::UnboundedReceiver<Bytes>,
    every: Duration,
) -> Response {
    let rest = futures_util::stream::unfold(lines, move |mut lines| async move {
        let next = tokio::time::timeout(every, lines.recv()).await;
        match next {
            Ok(Some(l)) => Some((Ok::<_, std::convert::Infallible>(l), lines)),
            Ok(None) => None,
            Err(_) => Some((Ok(line(&RunLine::Heartbeat(now_ms()))), lines)),
        }
    });
    let first = futures_util::stream::iter(first.map(Ok));
    let body = futures_util::StreamExt::chain(first, rest);
    let mut r = Body::from_stream(body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    r
}
