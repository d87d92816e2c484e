//! `run-stream` (docs/NODE.md "Streamed stdin"): a run whose stdin goes to the node as
//! signed, tagged frames as it arrives.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{ATTEMPTS, NoAnswer, NodeClient};
use stockade_node_protocol::{self as protocol, IDEMPOTENCY_HEADER, stream};
use stockade_runtime::substrate::{OutputSink, Result, RunResult, SubstrateError};

/// A `run-stream` request's body: its head line, then the stdin's frames.
type StreamBody = http_body_util::StreamBody<
    futures_util::stream::BoxStream<
        'static,
        std::result::Result<hyper::body::Frame<Bytes>, std::io::Error>,
    >,
>;

/// Frames of a streamed stdin on their way to the node at once.
const STREAM_IN_FLIGHT: usize = 4;

/// `run-stream` (docs/NODE.md "Streamed stdin").
impl NodeClient {
    /// `run` with its stdin streamed from `stdin` (the sender's drop is its end): the
    /// head is signed, each chunk goes framed and tagged ([`stream::Framer`]), so the
    /// front holds a few chunks whatever the stdin's size. Output and result as
    /// [`NodeClient::run`]. The stream cannot be sent twice, so only opening the
    /// connection is retried (nothing of it is taken before), never the request; a
    /// connection of its own, not a kept one (the stream's body type is its own, and
    /// a handshake is nothing beside a streamed upload).
    pub async fn run_stream(
        &self,
        key: &str,
        head: &protocol::RunStream,
        mut stdin: tokio::sync::mpsc::Receiver<Bytes>,
        silence: Duration,
        sink: &OutputSink,
    ) -> Result<RunResult> {
        use futures_util::StreamExt as _;
        let deadline = Instant::now() + Duration::from_millis(head.timeout_ms) + self.call_timeout;
        let mut line =
            serde_json::to_vec(head).map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        let path = format!("{}{}", protocol::PREFIX, protocol::call::RUN_STREAM);
        let mut conn = None;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            if Instant::now() >= deadline {
                break;
            }
            match self.open::<StreamBody>().await {
                Ok(c) => {
                    conn = Some(c);
                    break;
                }
                Err(NoAnswer(why)) => {
                    tracing::debug!(target: "stockade::remote", node = %self.name, call = protocol::call::RUN_STREAM, attempt, error = %why, "no connection; retrying");
                    last = why;
                }
            }
        }
        let Some(mut conn) = conn else {
            tracing::warn!(target: "stockade::remote", node = %self.name, call = protocol::call::RUN_STREAM, error = %last, "node unreachable");
            return Err(self.unreachable(format!("{}: {last}", protocol::call::RUN_STREAM)));
        };
        let idempotency = uuid::Uuid::new_v4().simple().to_string();
        let signed = self.sign("POST", &path, key, &idempotency, &line);
        line.push(b'\n');
        let mut framer = stream::Framer::new(&self.secret, &signed.signature);
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_IN_FLIGHT);
        let feeder = tokio::spawn(async move {
            let data = |b: Bytes| Ok(hyper::body::Frame::data(b));
            if tx.send(data(Bytes::from(line))).await.is_err() {
                return;
            }
            while let Some(chunk) = stdin.recv().await {
                for f in framer.frames(&chunk) {
                    if tx.send(data(f)).await.is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(data(framer.end())).await;
        });
        let frames =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            )
            .boxed();
        let mut req = hyper::Request::post(&path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
            .header(IDEMPOTENCY_HEADER, &idempotency);
        for (name, value) in signed.headers(key) {
            req = req.header(name, value);
        }
        let req = req
            .body(http_body_util::StreamBody::new(frames))
            .map_err(|e| self.failed(format!("request: {e}")))?;
        let resp = match tokio::time::timeout_at(deadline.into(), conn.send_request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                feeder.abort();
                return Err(self.unreachable(format!("run-stream: send: {e}")));
            }
            Err(_) => {
                feeder.abort();
                return Err(
                    self.unreachable("run-stream: no answer before the call's deadline".into())
                );
            }
        };
        let (result, _) = self
            .run_answer(resp, deadline, silence, sink, &mut None)
            .await;
        feeder.abort();
        result
    }
}
