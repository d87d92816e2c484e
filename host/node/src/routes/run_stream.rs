//! `run-stream` (docs/NODE.md "Streamed stdin"): a run whose stdin is the rest of its
//! request's body, verified frame by frame, or through an upload's checker.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tokio::sync::mpsc;

use super::run::run_task;
use super::streamed::{Streamed, begin_streamed, keep, line, stream};
use crate::idempotency;
use crate::request::{
    Refusal, header_str, own, parse, precheck, refused, too_slow, unverified_permit, verify,
};
use crate::state::{Node, SMALL_BODY};
use stockade_node_protocol::auth;
use stockade_node_protocol::stream;
use stockade_node_protocol::{self as protocol, RunLine, call};
use stockade_runtime::substrate::SubstrateError;

/// A `run-stream` body that sends nothing for this long is broken off.
pub const STREAM_IDLE: Duration = Duration::from_secs(60);

/// Frames of a streamed stdin waiting for the run at once (each at most
/// [`stream::MAX_FRAME`]): with the one being verified, what a node holds of a stream.
const STREAM_IN_FLIGHT: usize = 4;

/// `run-stream` (docs/NODE.md "Streamed stdin"): the head line is read (within
/// [`Node::max_body`]) and checked as any call's body (signature, key, idempotency,
/// parse, owner); then the run starts with the rest of the body, verified frame by
/// frame ([`stream::Deframer`]), as its stdin, and answers NDJSON as `run`. A stream
/// refused or broken off closes the run's stdin short (an upload's unpack then never
/// sees its completion entry and writes nothing) and makes the run's last line an
/// `invalid` error.
pub(crate) async fn run_stream(
    node: Arc<Node>,
    headers: &HeaderMap,
    path: String,
    body: Body,
) -> Response {
    let mut body = body;
    let key_of = || {
        header_str(headers, auth::KEY_HEADER)
            .unwrap_or("")
            .to_owned()
    };
    // The signing headers first: a request failing them is refused unread.
    let deadline = match precheck(&node, headers) {
        Ok(d) => d,
        Err(r) => return refused(call::RUN_STREAM, &key_of(), &r),
    };
    let (head, rest) = match tokio::time::timeout(deadline, read_head(&node, &mut body)).await {
        Ok(Ok(h)) => h,
        Ok(Err(r)) => return refused(call::RUN_STREAM, &key_of(), &r),
        Err(_) => return refused(call::RUN_STREAM, &key_of(), &too_slow(deadline)),
    };
    let Checked {
        key,
        req,
        signature,
        id,
    } = match check_head(&node, headers, &path, &head) {
        Ok(c) => c,
        Err((key, r)) => return refused(call::RUN_STREAM, &key, &r),
    };
    let tx = match begin_streamed(&node, id.as_ref()) {
        Streamed::Go(tx) => tx,
        Streamed::Answered(answered) => return answered,
    };
    if let Err(r) = check_marker(&req) {
        return refused(call::RUN_STREAM, &key, &r);
    }
    let (lines_tx, lines_rx) = mpsc::unbounded_channel::<Bytes>();
    let stdin = stdin(&node, &signature, &req, body, rest);
    tokio::spawn(run_and_answer(
        node.clone(),
        key,
        req,
        stdin,
        id,
        tx,
        lines_tx,
    ));
    stream(lines_rx, node.heartbeat)
}

/// Step 1: the head line, read within [`Node::max_body`]; with the bytes read past it.
/// A head longer than [`SMALL_BODY`] is read on with an unverified body's permit
/// ([`unverified_permit`]), or refused 503.
async fn read_head(node: &Node, body: &mut Body) -> Result<(Bytes, Bytes), Refusal> {
    use http_body_util::BodyExt as _;
    let mut buf = bytes::BytesMut::new();
    let mut permit = None;
    loop {
        if permit.is_none() && buf.len() > SMALL_BODY {
            permit = Some(unverified_permit(node)?);
        }
        if let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let head = buf.split_to(i).freeze();
            let _ = buf.split_to(1);
            return Ok((head, buf.freeze()));
        }
        if buf.len() > node.max_body {
            return Err(Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid",
                format!("the head line is longer than {} bytes", node.max_body),
            ));
        }
        let why = match tokio::time::timeout(STREAM_IDLE, body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Ok(d) = f.into_data() {
                    buf.extend_from_slice(&d);
                }
                continue;
            }
            Ok(Some(Err(e))) => e.to_string(),
            Ok(None) => "the body ended before its head line".to_owned(),
            Err(_) => "the body sent no head line in time".to_owned(),
        };
        return Err(Refusal::invalid(why));
    }
}

/// A `run-stream`'s head, checked.
struct Checked {
    key: String,
    req: protocol::RunStream,
    /// The request's signature, which keys its frames' tags.
    signature: String,
    id: Option<idempotency::Id>,
}

/// Step 2: the head checked as any call's body: the signature, time and nonce, the
/// key, the parse, the owner, no stdin of its own. A refusal comes with the key it
/// names (for the log).
fn check_head(
    node: &Node,
    headers: &HeaderMap,
    path: &str,
    head: &[u8],
) -> Result<Checked, (String, Refusal)> {
    let (key, idem) = verify(node, headers, path, head).map_err(|r| {
        let key = header_str(headers, auth::KEY_HEADER).unwrap_or("");
        (key.to_owned(), r)
    })?;
    let signature = header_str(headers, auth::SIGNATURE_HEADER)
        .unwrap_or("")
        .to_owned();
    let refuse = |r: Refusal| (key.clone(), r);
    stockade_grammar::names::key(&key).map_err(|e| refuse(Refusal::invalid(e.to_string())))?;
    let req: protocol::RunStream = parse(head).map_err(refuse)?;
    own(node, &req.container, &key).map_err(refuse)?;
    if !req.cmd.stdin.is_empty() {
        return Err(refuse(Refusal::invalid(
            "a run-stream's command carries no stdin of its own",
        )));
    }
    let id = (!idem.is_empty()).then(|| idempotency::Id {
        key: key.clone(),
        call: call::RUN_STREAM.to_owned(),
        idempotency: idem,
    });
    Ok(Checked {
        key,
        req,
        signature,
        id,
    })
}

/// Step 3, once the idempotency cache has not answered it: an upload's marker is 1 to
/// 64 letters and digits.
fn check_marker(req: &protocol::RunStream) -> Result<(), Refusal> {
    let Some(u) = &req.upload else {
        return Ok(());
    };
    let marker = match u {
        protocol::UploadCheck::Archive { marker } | protocol::UploadCheck::File { marker, .. } => {
            marker
        }
    };
    if marker.is_empty() || marker.len() > 64 || !marker.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(Refusal::invalid(
            "an upload's marker is 1 to 64 letters and digits",
        ));
    }
    Ok(())
}

/// The run's stdin as it is fed: its chunks, why the stream was refused or broke off
/// (if it was), the feeder, and an upload's checker (its entries, or its refusal).
struct Stdin {
    chunks: mpsc::Receiver<Bytes>,
    failed: tokio::sync::oneshot::Receiver<String>,
    feeder: tokio::task::JoinHandle<()>,
    checker: Option<
        tokio::task::JoinHandle<Result<usize, stockade_node_protocol::upload::archive::Stop>>,
    >,
}

/// Step 4: the rest of the body, verified frame by frame ([`feed`]), to the run as it
/// is ([`pass`]) or through an upload's checker.
fn stdin(
    node: &Node,
    signature: &str,
    req: &protocol::RunStream,
    body: Body,
    rest: Bytes,
) -> Stdin {
    let (chunks_tx, chunks) = mpsc::channel::<Bytes>(STREAM_IN_FLIGHT);
    let (frames_tx, frames_rx) =
        mpsc::channel::<stockade_node_protocol::upload::Frame>(STREAM_IN_FLIGHT);
    let (failed_tx, failed) = tokio::sync::oneshot::channel::<String>();
    let deframer = stream::Deframer::new(&node.secret, signature, req.length);
    let feeder = tokio::spawn(feed(body, rest, deframer, frames_tx, failed_tx));
    let checker = match req.upload.clone() {
        None => {
            tokio::spawn(pass(frames_rx, chunks_tx));
            None
        }
        Some(u) => {
            let (what, marker) = match u {
                protocol::UploadCheck::Archive { marker } => (
                    stockade_node_protocol::upload::Upload::Archive {
                        dest: String::new(),
                    },
                    marker,
                ),
                protocol::UploadCheck::File { path, len, marker } => (
                    stockade_node_protocol::upload::Upload::File { path, len },
                    marker,
                ),
            };
            Some(stockade_node_protocol::upload::check_stream(
                what, &marker, frames_rx, chunks_tx,
            ))
        }
    };
    Stdin {
        chunks,
        failed,
        feeder,
        checker,
    }
}

/// Step 5, in a task of its own: the run with that stdin, its lines sent as they come;
/// then an upload's verdict line, and the last line (an `invalid` error if the stream
/// was refused or broke off), kept under the idempotency key.
async fn run_and_answer(
    node: Arc<Node>,
    key: String,
    req: protocol::RunStream,
    stdin: Stdin,
    id: Option<idempotency::Id>,
    tx: Option<tokio::sync::watch::Sender<Option<crate::idempotency::Stored>>>,
    lines_tx: mpsc::UnboundedSender<Bytes>,
) {
    let Stdin {
        chunks,
        mut failed,
        feeder,
        checker,
    } = stdin;
    let mut cmd = req.cmd;
    cmd.stdin_stream = Some(stockade_runtime::substrate::StdinStream::new(chunks));
    let run = protocol::Run {
        container: req.container,
        cmd,
        timeout_ms: req.timeout_ms,
    };
    let mut last = run_task(&node, run, &lines_tx).await;
    // The feeder says why before it closes the stdin short, so a refused or
    // broken-off stream is known here; one the run did not read to its end is not.
    if let Ok(why) = failed.try_recv() {
        tracing::warn!(target: "stockade::node", call = call::RUN_STREAM, key = %key, reason = %why, "stdin stream refused");
        last = line(&RunLine::Error(
            SubstrateError::Invalid(format!("the stdin stream: {why}")).into(),
        ));
    }
    feeder.abort();
    if let Some(checker) = checker {
        // The feeder is gone (its sender with it) and the run's stdin closed: the
        // checker ends.
        let verdict = match checker.await {
            Ok(Ok(n)) => Some(protocol::UploadLine::Entries(n)),
            Ok(Err(stockade_node_protocol::upload::archive::Stop::Refused(why))) => {
                Some(protocol::UploadLine::Refused(why))
            }
            _ => None,
        };
        if let Some(v) = verdict {
            let _ = lines_tx.send(line(&RunLine::Upload(v)));
        }
    }
    keep(&node, id, tx, last.clone());
    let _ = lines_tx.send(last);
}

/// Feed a `run-stream`'s frames, verified, to its run (`first`: the bytes read with
/// the head). A refusal or a broken-off body is reported on `failed` and then the
/// stdin closes; a run that stopped reading ends the feed quietly.
async fn feed(
    mut body: Body,
    first: Bytes,
    mut deframer: stream::Deframer,
    chunks: mpsc::Sender<stockade_node_protocol::upload::Frame>,
    failed: tokio::sync::oneshot::Sender<String>,
) {
    use http_body_util::BodyExt as _;
    let mut data = first;
    loop {
        let pieces = match deframer.push(&data) {
            Ok(p) => p,
            Err(e) => {
                let _ = failed.send(e.to_string());
                return;
            }
        };
        for p in pieces {
            match p {
                stream::Piece::Data(b) => {
                    if chunks
                        .send(stockade_node_protocol::upload::Frame::Data(b))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                stream::Piece::End => {
                    let _ = chunks
                        .send(stockade_node_protocol::upload::Frame::End)
                        .await;
                }
            }
        }
        data = match tokio::time::timeout(STREAM_IDLE, body.frame()).await {
            Ok(Some(Ok(f))) => match f.into_data() {
                Ok(d) => d,
                Err(_) => Bytes::new(),
            },
            Ok(None) => {
                if let Err(e) = deframer.finish() {
                    let _ = failed.send(e.to_string());
                }
                return;
            }
            Ok(Some(Err(e))) => {
                let _ = failed.send(format!("the body broke off: {e}"));
                return;
            }
            Err(_) => {
                let _ = failed.send(format!(
                    "the body sent nothing for {} s",
                    STREAM_IDLE.as_secs()
                ));
                return;
            }
        };
    }
}

/// A verified stream to the run as it is: its data, until its end (or the feeder's
/// drop: a refused or broken-off stream, closed short).
async fn pass(
    mut frames: mpsc::Receiver<stockade_node_protocol::upload::Frame>,
    chunks: mpsc::Sender<Bytes>,
) {
    while let Some(stockade_node_protocol::upload::Frame::Data(b)) = frames.recv().await {
        if chunks.send(b).await.is_err() {
            return;
        }
    }
}
