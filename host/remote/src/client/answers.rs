//! A node's answers read: a plain call's JSON as the substrate's result ([`decode`],
//! pure), and the NDJSON of `run` and `batch` ([`Lines`]), their output forwarded as it
//! comes and their silence bounded.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Response, StatusCode};
use serde::de::DeserializeOwned;

use super::{Driver, MAX_ANSWER, MAX_LINE, NodeClient, drive};
use stockade_node_protocol::{self as protocol, Answer, RunLine, WireError};
use stockade_runtime::substrate::{Output, OutputSink, Result, RunResult, SubstrateError};

impl NodeClient {
    /// `run`: forward its output lines to `sink` as they come; its result. No line for
    /// `silence` (heartbeats included) is `unreachable`.
    pub async fn run(
        &self,
        key: &str,
        req: &protocol::Run,
        silence: Duration,
        sink: &OutputSink,
    ) -> Result<RunResult> {
        let deadline = Instant::now() + Duration::from_millis(req.timeout_ms) + self.call_timeout;
        let body = Bytes::from(
            serde_json::to_vec(req).map_err(|e| SubstrateError::Invalid(e.to_string()))?,
        );
        let (resp, mut conn) = self.send(protocol::call::RUN, key, body, deadline).await?;
        let (result, body) = self
            .run_answer(resp, deadline, silence, sink, &mut conn.driver)
            .await;
        // The answer ends after its result line: read to its end so the connection can
        // be kept (briefly; a node that says more is left to close it).
        if let Some(body) = body
            && let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_millis(200), conn.drive(body.collect())).await
        {
            self.keep(conn);
        }
        result
    }

    /// `batch`: the calls in one signed request; one answer per call the node made, in
    /// order (the last an error, if one stopped it). A run's output lines go to `sink`
    /// as they come, after [`Output::Started`] (sent once every call before the run
    /// answered `ok`: the live stream starts where the run does). `Err`: what was made
    /// is not known (no answer, or one cut short), or the batch was refused whole.
    /// `answered` sees each answer as its line arrives (a front records an `ensure`'s
    /// container before the run after it ends).
    pub async fn batch(
        &self,
        key: &str,
        req: &protocol::Batch,
        silence: Duration,
        sink: &OutputSink,
        answered: &mut (dyn FnMut(&Answer<serde_json::Value>) + Send),
    ) -> Result<Vec<Answer<serde_json::Value>>> {
        let runs: u64 = req
            .calls
            .iter()
            .map(|c| match c {
                protocol::BatchCall::Run(r) => r.timeout_ms,
                _ => 0,
            })
            .sum();
        let deadline = Instant::now() + Duration::from_millis(runs) + self.call_timeout;
        let body = Bytes::from(
            serde_json::to_vec(req).map_err(|e| SubstrateError::Invalid(e.to_string()))?,
        );
        let (resp, mut conn) = self
            .send(protocol::call::BATCH, key, body, deadline)
            .await?;
        let status = resp.status();
        if status != StatusCode::OK {
            let bytes = tokio::time::timeout_at(
                deadline.into(),
                conn.drive(Limited::new(resp.into_body(), MAX_ANSWER).collect()),
            )
            .await
            .ok()
            .and_then(|r| r.ok())
            .map(|b| b.to_bytes())
            .unwrap_or_default();
            return Err(match decode::<serde_json::Value>(status, &bytes) {
                Err(e) => e,
                Ok(_) => self.failed(format!("batch: HTTP {status}")),
            });
        }
        let starts = |i: usize| matches!(req.calls.get(i), Some(protocol::BatchCall::Run(_)));
        if starts(0) {
            let _ = sink.send(Output::Started);
        }
        let mut body = resp.into_body();
        let mut lines = Lines::default();
        let mut answers: Vec<Answer<serde_json::Value>> = Vec::with_capacity(req.calls.len());
        'read: loop {
            let wait = silence.min(deadline.saturating_duration_since(Instant::now()));
            let frame = match tokio::time::timeout(wait, conn.drive(body.frame())).await {
                Err(_) => {
                    return Err(
                        self.unreachable(format!("batch: no line for {} ms", wait.as_millis()))
                    );
                }
                Ok(None) => {
                    return Err(self.unreachable(
                        "batch: the answer ended before every call was answered".into(),
                    ));
                }
                Ok(Some(Err(e))) => return Err(self.unreachable(format!("batch: {e}"))),
                Ok(Some(Ok(f))) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for line in lines.push(&data).map_err(|e| self.failed(e))? {
                match line {
                    RunLine::Stdout(b) => {
                        let _ = sink.send(Output::Stdout(b));
                    }
                    RunLine::Stderr(b) => {
                        let _ = sink.send(Output::Stderr(b));
                    }
                    RunLine::Heartbeat(_) | RunLine::Upload(_) => {}
                    RunLine::Result(_) | RunLine::Error(_) => {
                        return Err(self.failed("batch: a run's last line in a batch".into()));
                    }
                    RunLine::Answer(a) => {
                        let ok = matches!(a, Answer::Ok(_));
                        answered(&a);
                        answers.push(a);
                        if !ok || answers.len() == req.calls.len() {
                            break 'read;
                        }
                        if starts(answers.len()) {
                            let _ = sink.send(Output::Started);
                        }
                    }
                }
            }
        }
        // The answer ends after its last answer line: read to its end so the
        // connection can be kept (briefly; a node that says more is left to close it).
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(200), conn.drive(body.collect())).await
        {
            self.keep(conn);
        }
        Ok(answers)
    }

    /// A `run` or `run-stream` answer: its output lines forwarded to `sink` as they
    /// come, then its result; with the rest of the body when the answer was a stream
    /// that ended well (to read to its end before its connection is kept).
    pub(super) async fn run_answer(
        &self,
        resp: Response<Incoming>,
        deadline: Instant,
        silence: Duration,
        sink: &OutputSink,
        driver: &mut Option<Driver>,
    ) -> (Result<RunResult>, Option<Incoming>) {
        let status = resp.status();
        if status != StatusCode::OK {
            let bytes = tokio::time::timeout_at(
                deadline.into(),
                drive(driver, Limited::new(resp.into_body(), MAX_ANSWER).collect()),
            )
            .await
            .ok()
            .and_then(|r| r.ok())
            .map(|b| b.to_bytes())
            .unwrap_or_default();
            return (decode::<RunResult>(status, &bytes), None);
        }
        let mut body = resp.into_body();
        let mut lines = Lines::default();
        loop {
            let wait = silence.min(deadline.saturating_duration_since(Instant::now()));
            let frame = match tokio::time::timeout(wait, drive(driver, body.frame())).await {
                Err(_) => {
                    let why = format!("run: no line for {} ms", wait.as_millis());
                    return (Err(self.unreachable(why)), None);
                }
                Ok(None) => {
                    let why = "run: the answer ended without a result".into();
                    return (Err(self.unreachable(why)), None);
                }
                Ok(Some(Err(e))) => return (Err(self.unreachable(format!("run: {e}"))), None),
                Ok(Some(Ok(f))) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let got = match lines.push(&data) {
                Ok(l) => l,
                Err(e) => return (Err(self.failed(e)), None),
            };
            for line in got {
                match line {
                    RunLine::Stdout(b) => {
                        let _ = sink.send(Output::Stdout(b));
                    }
                    RunLine::Stderr(b) => {
                        let _ = sink.send(Output::Stderr(b));
                    }
                    // A batch's answer is never a run's line: ignored as a stray.
                    RunLine::Heartbeat(_) | RunLine::Upload(_) | RunLine::Answer(_) => {}
                    RunLine::Result(r) => return (Ok(r), Some(body)),
                    RunLine::Error(e) => return (Err(SubstrateError::from(e)), Some(body)),
                }
            }
        }
    }
}

/// A node's answer (not `run`'s stream) as the substrate's result (pure).
pub fn decode<T: DeserializeOwned>(status: StatusCode, body: &[u8]) -> Result<T> {
    let message = || {
        serde_json::from_slice::<Answer<serde_json::Value>>(body)
            .ok()
            .and_then(|a| match a {
                Answer::Error(WireError { message, .. }) => Some(message),
                Answer::Ok(_) => None,
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned())
    };
    match status {
        StatusCode::OK => serde_json::from_slice::<Answer<T>>(body)
            .map_err(|e| SubstrateError::Failed(format!("the node's answer does not parse: {e}")))?
            .into_result(),
        StatusCode::BAD_REQUEST => Err(SubstrateError::Invalid(message())),
        // The request is larger than the node takes (a run's stdin travels inside its
        // body): the caller's input, not a failure of the node.
        StatusCode::PAYLOAD_TOO_LARGE => Err(SubstrateError::Invalid(format!(
            "the request is larger than the node takes: {}",
            message()
        ))),
        StatusCode::UNAUTHORIZED => Err(SubstrateError::Failed(format!(
            "the node refused the request's signature: {}",
            message()
        ))),
        StatusCode::FORBIDDEN => Err(SubstrateError::Failed(format!(
            "the node refused: another key's container: {}",
            message()
        ))),
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT => {
            Err(SubstrateError::Unreachable(format!(
                "HTTP {status}: {}",
                message()
            )))
        }
        s => Err(SubstrateError::Failed(format!("HTTP {s}: {}", message()))),
    }
}

/// NDJSON lines out of a byte stream cut anywhere.
#[derive(Default)]
pub struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    /// Add bytes; the complete lines they end (an empty line is skipped).
    pub fn push(&mut self, data: &[u8]) -> std::result::Result<Vec<RunLine>, String> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            out.push(
                serde_json::from_slice(line)
                    .map_err(|e| format!("run: a line that does not parse: {e}"))?,
            );
        }
        if self.buf.len() > MAX_LINE {
            return Err(format!("run: a line longer than {MAX_LINE} bytes"));
        }
        Ok(out)
    }
}
