//! envd's `process.Process` service over Connect (JSON codec): `Start` and `Connect`
//! (server streams), `StreamInput` (a client stream), `List`, `SendSignal`,
//! `SendInput`, `Update` and `CloseStdin` (unary).
//!
//! **A command is a fenced exec** (`POST …/exec/stream`): the SDK sends
//! `/bin/bash -l -c CMD` and that argv is run as it is, in the sandbox's key, its
//! output streamed as envd's data events as the command writes it, the sandbox's
//! network policy its grant for as long as it runs. A command lives as long as its
//! stream: when the caller leaves, the call is dropped, which the API sees as its
//! client leaving (the command is killed and its fence torn down).
//! `commands.run(cmd, background=True)` sends the very same `Start` (E2B's wire does
//! not tell them apart; the SDK only stops reading), so it is the same fenced exec,
//! unless the caller asks for a detached process with `STOCKADE_DETACH=1` in its
//! environment ([`DETACH_ENV`]): then it is `POST …/detached`, no grant, ever
//! (docs/E2B.md, the one deliberate difference).
//!
//! **A PTY is a fenced exec with a terminal** (`Start` with `pty.size`): the API's
//! terminal session (`GET …/pty`, a WebSocket, through [`stockade_client::Pty`], the
//! one client `stockade shell` uses too), the same command body and grant as a
//! command's; its output is `data.pty` events; `SendInput`/`StreamInput` with
//! `input.pty` are typed bytes and `Update` with `pty.size` a resize.
//!
//! **Connect** attaches another stream to a running command's events from now on
//! (envd replays nothing): each command's events are also sent on a bounded
//! broadcast ([`FOLLOWERS`]); a follower that falls behind is dropped with
//! `resource_exhausted`, never the command slowed nor memory grown.
//!
//! **A non-terminal command has no live stdin** (docs/E2B.md, "Not yet"): Stockade's
//! exec takes its stdin up front. A `Start` asking `stdin: true` is refused before
//! anything runs (a command would otherwise wait for input that can never come), and
//! `SendInput`/`StreamInput`/`CloseStdin` on one are `failed_precondition`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use stockade_client::Stream;
use stockade_wire::CommandBody;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::connect::{self, Code, RpcError};
use super::{E2b, Sandbox, header, ids};

/// A running command: how to stop it, and what it is (for `List`).
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    config: Value,
    tag: Option<String>,
    /// A detached process's id (`STOCKADE_DETACH=1`); none for a fenced exec.
    detached: Option<String>,
    /// Its events for followers (`Connect`).
    events: broadcast::Sender<Vec<u8>>,
    /// A PTY's input (typed bytes, resizes); none for a command without a terminal.
    input: Option<mpsc::Sender<PtyInput>>,
}

/// What a PTY is sent.
#[derive(Debug, PartialEq, Eq)]
pub enum PtyInput {
    /// Typed bytes (at most [`PTY_CHUNK`] each).
    Bytes(Vec<u8>),
    /// The terminal's new size (rows, cols).
    Resize(u16, u16),
}

/// How many events a follower (`Connect`) may be behind before it is dropped with
/// `resource_exhausted`: the memory a command's followers can hold is this many
/// chunks, however slow they are, and the command never waits for one.
pub const FOLLOWERS: usize = 256;

/// How many inputs a PTY holds before `SendInput` waits (the session sends them as
/// fast as the API takes them).
const PTY_INPUTS: usize = 64;

/// How many of a PTY's output events wait for its caller to take them. A terminal has
/// no output limit: its bound is that a client which reads nothing is dropped (the
/// API's `SEND_WITHIN`). So the stream waits for its caller when this many are queued,
/// and stops reading the terminal meanwhile, rather than queueing without end for a
/// caller that does not read.
const PTY_QUEUE: usize = 64;

/// The most bytes one message to the API's terminal carries (its `MAX_INPUT`):
/// larger input is split.
const PTY_CHUNK: usize = 64 * 1024;

/// A command's events, to its own stream (the one that started it) and to its
/// followers. Sending never waits: the stream's channel holds at most what one run
/// may write (the API's output limit), the broadcast at most [`FOLLOWERS`] events. A
/// PTY, which has no output limit, has a bounded stream instead ([`PTY_QUEUE`]).
#[derive(Clone)]
struct Out {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    events: broadcast::Sender<Vec<u8>>,
}

impl Out {
    fn send(&self, b: Vec<u8>) {
        let _ = self.events.send(b.clone());
        let _ = self.tx.send(b);
    }
}

/// The environment variable that asks for a detached process (docs/E2B.md): E2B's wire
/// does not tell a background command from a foreground one, so the caller says it,
/// `commands.run(cmd, background=True, envs={"STOCKADE_DETACH": "1"})`. It is taken
/// out of the command's environment.
pub const DETACH_ENV: &str = "STOCKADE_DETACH";

/// Does this environment ask for a detached process (pure)? The variable is removed
/// whatever its value; only `1` asks.
pub fn take_detach(envs: &mut std::collections::BTreeMap<String, String>) -> bool {
    envs.remove(DETACH_ENV).as_deref() == Some("1")
}

/// How often a detached process's status is polled (`detached-status` never blocks)
/// while its caller holds the stream, and after it left (for List, and to forget it).
const POLL: std::time::Duration = std::time::Duration::from_millis(500);
const POLL_UNATTENDED: std::time::Duration = std::time::Duration::from_secs(5);

/// `ProcessConfig`, the fields read (others ignored, as envd ignores none of these).
#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `StartRequest`.
#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    pty: Option<PtyConfig>,
    /// Asks for a live stdin (`commands.run(…, stdin=True)`; the SDK sends `false`
    /// otherwise, or nothing).
    #[serde(default)]
    stdin: Option<bool>,
}

/// `PTY`: its size.
#[derive(Debug, Deserialize)]
struct PtyConfig {
    #[serde(default)]
    size: Option<PtySize>,
}

/// `PTY.Size` (proto3 JSON omits a zero).
#[derive(Debug, Deserialize)]
struct PtySize {
    #[serde(default)]
    rows: u32,
    #[serde(default)]
    cols: u32,
}

/// A terminal's size as the API takes it (pure): rows and columns 1 to 1000 each.
fn pty_size(size: Option<&PtySize>) -> Result<(u16, u16), RpcError> {
    let s = size.ok_or_else(|| RpcError::new(Code::InvalidArgument, "a PTY needs a size"))?;
    let ok = |n: u32| (1..=1000).contains(&n);
    if !ok(s.rows) || !ok(s.cols) {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!(
                "a PTY's size is 1 to 1000 rows and columns, not {}x{}",
                s.rows, s.cols
            ),
        ));
    }
    Ok((s.rows as u16, s.cols as u16))
}

/// What a Start asks for beyond a plain command that this layer refuses before
/// anything runs (pure): a live stdin for a command without a terminal (there is none
/// yet: docs/E2B.md "Not yet"), a detached PTY.
fn refused_start(stdin: Option<bool>, pty: bool, detach: bool) -> Option<RpcError> {
    if pty && detach {
        return Some(RpcError::new(
            Code::InvalidArgument,
            "a PTY is a fenced exec with a terminal: STOCKADE_DETACH does not apply",
        ));
    }
    if stdin == Some(true) && !pty {
        return Some(RpcError::new(
            Code::FailedPrecondition,
            "a command's live stdin is not served by Stockade's E2B layer yet \
             (docs/E2B.md, \"Not yet\"): pass input in the command line, or use a PTY",
        ));
    }
    None
}

/// The caller's sandbox for an envd call: `E2b-Sandbox-Id` and `X-Access-Token`, that
/// sandbox's own access token (the create answered it as `envdAccessToken`;
/// `super::access`). A token of another sandbox, the caller's API key, an unknown id:
/// the same `not_found`. The calls are then made with the server's own token, on
/// that sandbox's key only (docs/E2B.md, "envd's access token").
pub(super) fn sandbox_of(e: &E2b, h: &HeaderMap) -> Result<(String, String, Sandbox), RpcError> {
    let access = header(h, "x-access-token")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| RpcError::new(Code::Unauthenticated, "missing access token"))?;
    let id = header(h, "e2b-sandbox-id").unwrap_or_default();
    let s = e
        .by_access(access, id)
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("sandbox {id} not found")))?;
    if s.paused {
        // A paused sandbox runs nothing until it is resumed (E2B's envd is not there
        // either); a command would otherwise start its container behind the pause.
        return Err(RpcError::new(
            Code::Unavailable,
            format!("sandbox {id} is paused: Sandbox.connect resumes it"),
        ));
    }
    let token = e.server_token.clone().ok_or_else(|| {
        RpcError::new(
            Code::Unavailable,
            "this layer has no server token to call the API with",
        )
    })?;
    Ok((token, id.to_string(), s))
}

/// envd's end event for a Stockade exit code (pure): Go's `ProcessState` as envd
/// reports it: a normal exit is its code, `exit status N`; a signal (Stockade's
/// negative code) is `-1`, `signal: NAME`, not exited.
pub fn end_event(exit_code: i32) -> Value {
    if exit_code >= 0 {
        json!({"event": {"end": {
            "exitCode": exit_code, "exited": true, "status": format!("exit status {exit_code}"),
        }}})
    } else {
        let sig = match -exit_code {
            9 => "killed".to_string(),
            15 => "terminated".to_string(),
            2 => "interrupt".to_string(),
            n => format!("signal {n}"),
        };
        json!({"event": {"end": {
            "exitCode": -1, "exited": false, "status": format!("signal: {sig}"),
        }}})
    }
}

/// How often a Start stream sends a keepalive event (pure): the SDK's
/// `Keepalive-Ping-Interval` (seconds), within 1 to 300; else 50, the SDK's own.
pub fn keepalive_interval(asked: Option<&str>) -> std::time::Duration {
    let s = asked
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| (1..=300).contains(s))
        .unwrap_or(50);
    std::time::Duration::from_secs(s)
}

/// A tick every `period`, the first one `period` from now. (`tokio::time::interval`'s
/// first tick is due at once, but awaiting it waits for the timer's next turn, up to
/// a millisecond: a Start waited that long before its command began.)
pub(super) fn every(period: std::time::Duration) -> tokio::time::Interval {
    tokio::time::interval_at(tokio::time::Instant::now() + period, period)
}

/// The most envelopes one chunk of a streaming answer carries.
const ENVELOPES_A_CHUNK: usize = 64;

/// A Connect streaming answer: 200, `application/connect+json`, the envelopes as they
/// come.
pub(super) fn streaming(rx: mpsc::UnboundedReceiver<Vec<u8>>) -> Response {
    use futures_util::StreamExt as _;
    // The envelopes ready together leave as one chunk (a command's end event and the
    // stream's end, a burst of output): one write, one wake-up of the caller.
    respond(
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
            .ready_chunks(ENVELOPES_A_CHUNK)
            // One envelope alone is sent as it is, not copied.
            .map(|bs| match <[Vec<u8>; 1]>::try_from(bs) {
                Ok([one]) => one,
                Err(bs) => bs.concat(),
            }),
    )
}

/// The same from a bounded channel (a PTY's: [`PTY_QUEUE`]), an envelope a chunk, so
/// what waits for a caller that reads nothing stays that queue.
fn streaming_bounded(rx: mpsc::Receiver<Vec<u8>>) -> Response {
    respond(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (b, rx))
    }))
}

fn respond(chunks: impl futures_util::Stream<Item = Vec<u8>> + Send + 'static) -> Response {
    use futures_util::StreamExt as _;
    let body = chunks.map(|b| Ok::<_, std::io::Error>(Bytes::from(b)));
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    r
}

/// A stream that is only its end: the error's trailer.
pub(super) fn failed(err: RpcError) -> Response {
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(connect::end(Some(&err)));
    streaming(rx)
}

/// A unary error: Connect's status for the code, `{"code", "message"}`.
pub(super) fn unary_error(err: RpcError) -> Response {
    (
        StatusCode::from_u16(err.code.http()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(err.json()),
    )
        .into_response()
}

/// `POST /process.Process/Start`.
pub async fn start(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    let (token, id, sbx) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return failed(err),
    };
    let req: StartRequest = match connect::single(&body)
        .map_err(|f| format!("not one message envelope: {f:?}"))
        .and_then(|j| serde_json::from_slice(j).map_err(|x| format!("StartRequest: {x}")))
    {
        Ok(r) => r,
        Err(m) => return failed(RpcError::new(Code::InvalidArgument, m)),
    };
    // The command's deadline is the call's (`Connect-Timeout-Ms`, the SDK's `timeout`);
    // none: the API's default.
    let timeout_ms = header(&h, "connect-timeout-ms").and_then(|t| t.parse::<u64>().ok());
    let keepalive = keepalive_interval(header(&h, "keepalive-ping-interval"));
    let mut argv = vec![req.process.cmd.clone()];
    argv.extend(req.process.args.iter().cloned());
    // The sandbox's environment (its create's `envVars`), under the command's own.
    // Only the command's own environment asks for a detached process.
    let mut own = req.process.envs.clone();
    let detach = take_detach(&mut own);
    let mut envs = sbx.envs.clone();
    envs.remove(DETACH_ENV);
    envs.extend(own);
    if let Some(err) = refused_start(req.stdin, req.pty.is_some(), detach) {
        tracing::info!(target: "stockade::e2b", sandbox = %id, code = err.code.name(),
            "a Start refused before anything ran");
        return failed(err);
    }
    if detach {
        let cmd = CommandBody {
            argv,
            cwd: ids::workdir(req.process.cwd.as_deref()),
            env: envs,
            // A detached process: no grant, ever, and no timeout (DESIGN §2).
            ..Default::default()
        };
        return start_detached(e, token, id, sbx, cmd, req).await;
    }
    let cmd = CommandBody {
        argv,
        cwd: ids::workdir(req.process.cwd.as_deref()),
        env: envs,
        timeout_ms,
        // No grant of its own: the fence opens with the key's network, the sandbox's
        // network policy given at create (`PUT …/network`), open only while it runs
        // (DESIGN §3; docs/E2B.md, "Network").
        ..Default::default()
    };
    if let Some(pty) = &req.pty {
        let size = match pty_size(pty.size.as_ref()) {
            Ok(s) => s,
            Err(err) => return failed(err),
        };
        return start_pty(e, token, id, sbx, cmd, req, size, keepalive).await;
    }
    let pid = e.pid();
    let (stop_tx, stop_rx) = oneshot::channel();
    let (events, _) = broadcast::channel(FOLLOWERS);
    e.running().insert(
        (id.clone(), pid),
        Running {
            stop: Some(stop_tx),
            config: json!({"cmd": req.process.cmd, "args": req.process.args,
                "envs": req.process.envs, "cwd": req.process.cwd}),
            tag: req.tag,
            detached: None,
            events: events.clone(),
            input: None,
        },
    );
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let _ = tx.send(connect::message(&start_event(pid)));
    let out = Out { tx, events };
    let client = e.client(&token);
    let e2 = e.clone();
    tokio::spawn(async move {
        let tx = out.tx.clone();
        let each = out.clone();
        // The output's memory is bounded by the API's (output_limit per stream): the
        // channel holds at most what one run may write.
        let run = client.exec_stream(&sbx.key, &cmd, move |which, bytes| {
            let field = match which {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            each.send(connect::message(&data_event(field, bytes)));
        });
        let mut run = std::pin::pin!(run);
        let mut stop_rx = stop_rx;
        let mut tick = every(keepalive);
        let result = loop {
            tokio::select! {
                r = &mut run => break Some(r),
                // The caller left: dropping the call is the API's client leaving (the
                // command is killed, its fence torn down).
                () = tx.closed() => break None,
                // SendSignal (or the sandbox killed): the same, then the end a killed
                // process has.
                _ = &mut stop_rx => break Some(Ok(stockade_wire::ExitEvent {
                    exit_code: -9,
                    ..Default::default()
                })),
                // A silent command's stream stays alive past the SDK's read timeout.
                _ = tick.tick() => out.send(connect::message(&keepalive_event())),
            }
        };
        e2.running().remove(&(id, pid));
        // The caller left: the command was killed with its call; its followers see the
        // end a killed process has.
        let result = result.unwrap_or(Ok(stockade_wire::ExitEvent {
            exit_code: -9,
            ..Default::default()
        }));
        let end = match result {
            Ok(exit) if exit.timed_out => Some(RpcError::new(
                Code::DeadlineExceeded,
                "the command ran past its timeout and was killed",
            )),
            Ok(exit) => {
                out.send(connect::message(&end_event(exit.exit_code)));
                None
            }
            Err(err) => Some(rpc_of(err)),
        };
        out.send(connect::end(end.as_ref()));
    });
    streaming(rx)
}

/// envd's start event (pure).
pub fn start_event(pid: u32) -> Value {
    json!({"event": {"start": {"pid": pid}}})
}

/// envd's keepalive event (pure).
pub fn keepalive_event() -> Value {
    json!({"event": {"keepalive": {}}})
}

/// envd's data event (pure): `field` is `stdout`, `stderr` or `pty`, the bytes base64.
pub fn data_event(field: &str, bytes: &[u8]) -> Value {
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    json!({"event": {"data": {field: data}}})
}

/// A Start with `pty.size`: the API's terminal session (`GET …/pty`) running the
/// command with the same body and grant as a command's, its output `data.pty` events.
/// The session is this stream's: the caller leaving closes it (the run is abandoned,
/// its tree killed, its fence torn down), as `SendSignal` does.
#[allow(clippy::too_many_arguments)]
async fn start_pty(
    e: Arc<E2b>,
    token: String,
    id: String,
    sbx: Sandbox,
    cmd: CommandBody,
    req: StartRequest,
    (rows, cols): (u16, u16),
    keepalive: std::time::Duration,
) -> Response {
    let client = e.client(&token);
    let mut pty = match client.pty(&sbx.key, &cmd, rows, cols).await {
        Ok(p) => p,
        Err(err) => return failed(rpc_of(err)),
    };
    let pid = e.pid();
    tracing::info!(target: "stockade::e2b", sandbox = %id, pid, rows, cols, "a PTY started");
    let (stop_tx, mut stop_rx) = oneshot::channel();
    let (events, _) = broadcast::channel(FOLLOWERS);
    let (in_tx, mut in_rx) = mpsc::channel(PTY_INPUTS);
    e.running().insert(
        (id.clone(), pid),
        Running {
            stop: Some(stop_tx),
            config: json!({"cmd": req.process.cmd, "args": req.process.args,
                "envs": req.process.envs, "cwd": req.process.cwd}),
            tag: req.tag,
            detached: None,
            events: events.clone(),
            input: Some(in_tx),
        },
    );
    let (tx, rx) = mpsc::channel::<Vec<u8>>(PTY_QUEUE);
    let _ = tx.try_send(connect::message(&start_event(pid)));
    let e2 = e.clone();
    tokio::spawn(async move {
        let mut tick = every(keepalive);
        let end: Result<i32, RpcError> = loop {
            tokio::select! {
                ev = pty.next() => match ev {
                    Some(stockade_client::PtyEvent::Output(b)) => {
                        let m = connect::message(&data_event("pty", &b));
                        let _ = events.send(m.clone());
                        // Wait for the caller to take it (the terminal is not read
                        // meanwhile: [`PTY_QUEUE`]), or for the run's end.
                        tokio::select! {
                            sent = tx.send(m) => if sent.is_err() { break Ok(-9) },
                            _ = &mut stop_rx => break Ok(-9),
                        }
                    }
                    Some(stockade_client::PtyEvent::Exit(x)) if x.timed_out => {
                        break Err(RpcError::new(
                            Code::DeadlineExceeded,
                            "the PTY ran past its timeout and was killed",
                        ));
                    }
                    Some(stockade_client::PtyEvent::Exit(x)) => break Ok(x.exit_code),
                    Some(stockade_client::PtyEvent::Failed(err)) => break Err(rpc_of(err)),
                    None => break Err(RpcError::new(Code::Unavailable, "the terminal ended")),
                },
                input = in_rx.recv() => {
                    let sent = match input {
                        Some(PtyInput::Bytes(b)) => pty.send(b).await,
                        Some(PtyInput::Resize(r, c)) => pty.resize(r, c).await,
                        None => Ok(()),
                    };
                    if let Err(err) = sent {
                        break Err(rpc_of(err));
                    }
                }
                // The caller left: closing the session ends the run (its tree killed,
                // its fence torn down); followers see a killed process's end.
                () = tx.closed() => break Ok(-9),
                // SendSignal (or the sandbox killed): the same.
                _ = &mut stop_rx => break Ok(-9),
                // A keepalive only keeps a silent stream open: one that has output
                // queued needs none, so a full queue drops it.
                _ = tick.tick() => {
                    let m = connect::message(&keepalive_event());
                    let _ = events.send(m.clone());
                    let _ = tx.try_send(m);
                }
            }
        };
        // Dropping the session closes its socket before anyone is told it ended.
        drop(pty);
        e2.running().remove(&(id.clone(), pid));
        match &end {
            Ok(code) => tracing::info!(target: "stockade::e2b", sandbox = %id, pid, exit = code,
                "a PTY ended"),
            Err(err) => tracing::info!(target: "stockade::e2b", sandbox = %id, pid,
                code = err.code.name(), message = %err.message, "a PTY ended"),
        }
        let last = match end {
            Ok(code) => vec![connect::message(&end_event(code)), connect::end(None)],
            Err(err) => vec![connect::end(Some(&err))],
        };
        for m in last {
            let _ = events.send(m.clone());
            if tx.send(m).await.is_err() {
                break;
            }
        }
    });
    streaming_bounded(rx)
}

/// A Start asking for a detached process: `POST …/detached` (no grant, ever), its
/// stream a start event, keepalives while it runs and the end its status reports
/// (polled). It has no output (a detached process's is its own). The caller leaving
/// does not stop it (it is detached); `SendSignal` or the sandbox's kill does.
async fn start_detached(
    e: Arc<E2b>,
    token: String,
    id: String,
    sbx: Sandbox,
    cmd: CommandBody,
    req: StartRequest,
) -> Response {
    let client = e.client(&token);
    let started = match client.start(&sbx.key, &cmd).await {
        Ok(s) => s,
        Err(err) => return failed(rpc_of(err)),
    };
    let pid = e.pid();
    let (stop_tx, mut stop_rx) = oneshot::channel();
    let (events, _) = broadcast::channel(FOLLOWERS);
    e.running().insert(
        (id.clone(), pid),
        Running {
            stop: Some(stop_tx),
            config: json!({"cmd": req.process.cmd, "args": req.process.args,
                "envs": cmd.env, "cwd": req.process.cwd}),
            tag: req.tag,
            detached: Some(started.id.clone()),
            events: events.clone(),
            input: None,
        },
    );
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let _ = tx.send(connect::message(&start_event(pid)));
    let out = Out { tx, events };
    let tx = out.tx.clone();
    let e2 = e.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL);
        let mut attached = true;
        let end = loop {
            tokio::select! {
                // The caller left: the process lives on (it is detached); its status is
                // still followed, so List stays true.
                () = tx.closed(), if attached => {
                    attached = false;
                    tick = tokio::time::interval(POLL_UNATTENDED);
                }
                _ = &mut stop_rx => break Ok(-9),
                _ = tick.tick() => match client.status(&sbx.key, &started.id).await {
                    Ok(stockade_wire::DetachedState::Running) => {
                        out.send(connect::message(&keepalive_event()));
                    }
                    Ok(stockade_wire::DetachedState::Exited { code }) => break Ok(code),
                    Ok(stockade_wire::DetachedState::Gone { reason }) => {
                        break Err(RpcError::new(Code::NotFound, format!("the process is gone: {reason:?}")));
                    }
                    Err(err) => break Err(rpc_of(err)),
                },
            }
        };
        e2.running().remove(&(id, pid));
        let trailer = match end {
            Ok(code) => {
                out.send(connect::message(&end_event(code)));
                None
            }
            Err(err) => Some(err),
        };
        out.send(connect::end(trailer.as_ref()));
    });
    streaming(rx)
}

/// The Connect error of a failed API call.
pub(super) fn rpc_of(err: stockade_client::Error) -> RpcError {
    match err {
        stockade_client::Error::Api {
            status, message, ..
        } => RpcError::new(Code::of_status(status), message),
        other => RpcError::new(Code::Unavailable, other.to_string()),
    }
}

/// `POST /process.Process/List`: the sandbox's commands running now.
///
/// The request's body (`{}`) is read although nothing in it is used: an answer given
/// before the body arrived leaves the connection with unread bytes, which the server
/// then closes instead of keeping alive, and a client that has already sent its next
/// request on it (the SDK's pool reuses it at once) sees "Server disconnected without
/// sending a response". Every unary handler here reads its whole body for that reason.
pub async fn list(State(e): State<Arc<E2b>>, h: HeaderMap, _body: Bytes) -> Response {
    let (_, id, _) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return unary_error(err),
    };
    let mut procs: Vec<(u32, Value)> = e
        .running()
        .iter()
        .filter(|((sid, _), _)| *sid == id)
        .map(|((_, pid), r)| {
            let mut p = json!({"pid": pid, "config": r.config});
            if let Some(t) = &r.tag {
                p["tag"] = Value::String(t.clone());
            }
            (*pid, p)
        })
        .collect();
    procs.sort_by_key(|(pid, _)| *pid);
    axum::Json(json!({"processes": procs.into_iter().map(|(_, p)| p).collect::<Vec<_>>()}))
        .into_response()
}

/// `SendSignalRequest`.
#[derive(Debug, Deserialize)]
struct SendSignal {
    process: Selector,
    signal: String,
}

#[derive(Debug, Deserialize)]
struct Selector {
    pid: u32,
}

/// `POST /process.Process/SendSignal`: `SIGKILL` or `SIGTERM` ends the command (its
/// exec is dropped: the API kills its tree); the command's stream ends as a killed
/// process's. Another signal is `unimplemented`; an unknown pid `not_found`.
pub async fn send_signal(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    let (token, id, sbx) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return unary_error(err),
    };
    let req: SendSignal = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(x) => {
            return unary_error(RpcError::new(
                Code::InvalidArgument,
                format!("SendSignalRequest: {x}"),
            ));
        }
    };
    if !matches!(req.signal.as_str(), "SIGNAL_SIGKILL" | "SIGNAL_SIGTERM") {
        return unary_error(RpcError::new(
            Code::Unimplemented,
            format!("{}: only SIGKILL and SIGTERM are served", req.signal),
        ));
    }
    let detached = e
        .running()
        .get(&(id.clone(), req.process.pid))
        .and_then(|r| r.detached.clone());
    if let Some(d) = detached
        && let Err(err) = e.client(&token).stop(&sbx.key, &d).await
    {
        return unary_error(rpc_of(err));
    }
    let stop = e
        .running()
        .get_mut(&(id, req.process.pid))
        .and_then(|r| r.stop.take());
    match stop {
        Some(s) => {
            let _ = s.send(());
            axum::Json(json!({})).into_response()
        }
        None => unary_error(RpcError::new(
            Code::NotFound,
            format!("process with pid {} not found", req.process.pid),
        )),
    }
}

/// `{"process": {"pid": N}}`: the selector alone (`ConnectRequest`, `CloseStdinRequest`).
#[derive(Debug, Deserialize)]
struct Selected {
    process: Selector,
}

/// `ProcessInput`: `stdin` or `pty`, base64 bytes.
#[derive(Debug, Default, Deserialize)]
struct ProcessInput {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

/// `SendInputRequest`.
#[derive(Debug, Deserialize)]
struct SendInputRequest {
    process: Selector,
    #[serde(default)]
    input: ProcessInput,
}

/// `UpdateRequest`.
#[derive(Debug, Deserialize)]
struct UpdateRequest {
    process: Selector,
    #[serde(default)]
    pty: Option<PtyConfig>,
}

/// One `StreamInputRequest` envelope: `start` (first, once), `data`, `keepalive`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamInputRequest {
    #[serde(default)]
    start: Option<Selected>,
    #[serde(default)]
    data: Option<StreamInputData>,
    #[serde(default)]
    keepalive: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct StreamInputData {
    #[serde(default)]
    input: ProcessInput,
}

/// The bytes of a `ProcessInput` (pure): `pty` or `stdin` (envd writes either to a
/// terminal), base64; both, neither, or not base64 is `invalid_argument`. Whether it
/// says `pty` matters not: only a PTY takes input here.
fn input_bytes(i: &ProcessInput) -> Result<Vec<u8>, RpcError> {
    let b64 = match (&i.pty, &i.stdin) {
        (Some(p), None) => p,
        (None, Some(s)) => s,
        _ => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "a ProcessInput is one of stdin or pty",
            ));
        }
    };
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|x| RpcError::new(Code::InvalidArgument, format!("ProcessInput: {x}")))
}

/// Typed bytes as the API's terminal takes them (pure): messages of at most
/// [`PTY_CHUNK`] bytes, in order; nothing for none.
fn chunks(bytes: Vec<u8>) -> Vec<PtyInput> {
    if bytes.len() <= PTY_CHUNK {
        return if bytes.is_empty() {
            Vec::new()
        } else {
            vec![PtyInput::Bytes(bytes)]
        };
    }
    bytes
        .chunks(PTY_CHUNK)
        .map(|c| PtyInput::Bytes(c.to_vec()))
        .collect()
}

/// The error of input to a command that has no terminal (docs/E2B.md, "Not yet").
fn no_live_stdin(pid: u32) -> RpcError {
    RpcError::new(
        Code::FailedPrecondition,
        format!(
            "process {pid} has no live stdin: a command's stdin is not served by \
             Stockade's E2B layer yet (docs/E2B.md, \"Not yet\"); a PTY's is"
        ),
    )
}

fn no_process(pid: u32) -> RpcError {
    RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
}

/// The input channel of this sandbox's process `pid`: an unknown pid (another
/// sandbox's included: the table is keyed by the sandbox) is `not_found`; a command
/// without a terminal `failed_precondition`.
fn pty_input(e: &E2b, id: &str, pid: u32) -> Result<mpsc::Sender<PtyInput>, RpcError> {
    let running = e.running();
    let r = running
        .get(&(id.to_string(), pid))
        .ok_or_else(|| no_process(pid))?;
    r.input.clone().ok_or_else(|| no_live_stdin(pid))
}

/// Send `inputs` to a PTY, in order: a PTY that ended meanwhile is `not_found`.
async fn deliver(
    to: &mpsc::Sender<PtyInput>,
    pid: u32,
    inputs: Vec<PtyInput>,
) -> Result<(), RpcError> {
    for i in inputs {
        to.send(i).await.map_err(|_| no_process(pid))?;
    }
    Ok(())
}

/// `POST /process.Process/Connect`: another stream of a running process's events,
/// from now on (a start event first, then what it writes, then its end). Not this
/// sandbox's pid: `not_found`, nothing attached.
pub async fn connect(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    let (_, id, _) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return failed(err),
    };
    let req: Selected = match connect::single(&body)
        .map_err(|f| format!("not one message envelope: {f:?}"))
        .and_then(|j| serde_json::from_slice(j).map_err(|x| format!("ConnectRequest: {x}")))
    {
        Ok(r) => r,
        Err(m) => return failed(RpcError::new(Code::InvalidArgument, m)),
    };
    let pid = req.process.pid;
    let Some(events) = e
        .running()
        .get(&(id.clone(), pid))
        .map(|r| r.events.subscribe())
    else {
        return failed(no_process(pid));
    };
    tracing::info!(target: "stockade::e2b", sandbox = %id, pid, "a follower attached to a process");
    // The body is read from the broadcast as the client takes it: nothing is queued for
    // a follower but the broadcast's own bounded buffer, so one that reads slower than
    // the process writes falls behind and is ended ([`followed`]).
    let first = connect::message(&start_event(pid));
    let stream = futures_util::stream::unfold(
        (Some(first), Some(events)),
        move |(first, events)| async move {
            if let Some(b) = first {
                return Some((Ok::<_, std::io::Error>(Bytes::from(b)), (None, events)));
            }
            let mut events = events?;
            let (b, last) = followed(events.recv().await, pid);
            Some((Ok(Bytes::from(b)), (None, (!last).then_some(events))))
        },
    );
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    r
}

/// What a follower sends for what its broadcast gave (pure): an event as it is (the
/// last if it is the end); behind by more than the broadcast holds, the end with
/// `resource_exhausted` (it is dropped, never waited for); the process's events gone
/// without an end, a plain end.
pub fn followed(r: Result<Vec<u8>, broadcast::error::RecvError>, pid: u32) -> (Vec<u8>, bool) {
    match r {
        Ok(b) => {
            let last = b.first() == Some(&connect::FLAG_END);
            (b, last)
        }
        Err(broadcast::error::RecvError::Lagged(n)) => (
            connect::end(Some(&RpcError::new(
                Code::ResourceExhausted,
                format!("this stream fell {n} events behind process {pid} and was dropped"),
            ))),
            true,
        ),
        Err(broadcast::error::RecvError::Closed) => (connect::end(None), true),
    }
}

/// Read a unary request's JSON, or the `invalid_argument` that says why not.
fn unary<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, RpcError> {
    serde_json::from_slice(body)
        .map_err(|x| RpcError::new(Code::InvalidArgument, format!("{what}: {x}")))
}

/// A unary call's answer: `{}` (its empty response message), or its error.
fn unary_answer(result: Result<(), RpcError>) -> Response {
    match result {
        Ok(()) => axum::Json(json!({})).into_response(),
        Err(err) => unary_error(err),
    }
}

/// `POST /process.Process/SendInput`: bytes typed into a PTY.
pub async fn send_input(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    let (_, id, _) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return unary_error(err),
    };
    let result = async {
        let req: SendInputRequest = unary(&body, "SendInputRequest")?;
        let bytes = input_bytes(&req.input)?;
        let to = pty_input(&e, &id, req.process.pid)?;
        deliver(&to, req.process.pid, chunks(bytes)).await
    }
    .await;
    unary_answer(result)
}

/// `POST /process.Process/Update`: a PTY's new size; anything else
/// `invalid_argument`.
pub async fn update(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    let (_, id, _) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return unary_error(err),
    };
    let result = async {
        let req: UpdateRequest = unary(&body, "UpdateRequest")?;
        let size = req
            .pty
            .as_ref()
            .and_then(|p| p.size.as_ref())
            .ok_or_else(|| {
                RpcError::new(
                    Code::InvalidArgument,
                    "an Update here is a PTY's size (pty.size); nothing else is served",
                )
            })?;
        let (rows, cols) = pty_size(Some(size))?;
        let to = pty_input(&e, &id, req.process.pid)?;
        deliver(&to, req.process.pid, vec![PtyInput::Resize(rows, cols)]).await
    }
    .await;
    unary_answer(result)
}

/// `POST /process.Process/CloseStdin`: no process here has a stdin to close (a
/// command has none live; a PTY's input is its terminal: Ctrl-D, `\x04`, is its end
/// of file). An unknown pid is `not_found`.
pub async fn close_stdin(State(e): State<Arc<E2b>>, h: HeaderMap, body: Bytes) -> Response {
    let (_, id, _) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return unary_error(err),
    };
    let result = (|| {
        let req: Selected = unary(&body, "CloseStdinRequest")?;
        let pid = req.process.pid;
        match e.running().get(&(id.clone(), pid)) {
            None => Err(no_process(pid)),
            Some(r) if r.input.is_some() => Err(RpcError::new(
                Code::FailedPrecondition,
                format!(
                    "process {pid} is a PTY: its input is the terminal (send Ctrl-D, \\x04, for end of file)"
                ),
            )),
            Some(_) => Err(no_live_stdin(pid)),
        }
    })();
    unary_answer(result)
}

/// The answer of a client stream (unary over a stream): a `{}` message and the end,
/// or the end with the error.
fn client_stream_answer(result: Result<(), RpcError>) -> Response {
    let (tx, rx) = mpsc::unbounded_channel();
    match result {
        Ok(()) => {
            let _ = tx.send(connect::message(&json!({})));
            let _ = tx.send(connect::end(None));
        }
        Err(err) => {
            let _ = tx.send(connect::end(Some(&err)));
        }
    }
    streaming(rx)
}

/// `POST /process.Process/StreamInput`: a client stream of input to a PTY, each
/// envelope read as it arrives (`start` with the process first, then `data` and
/// `keepalive`), bounded as [`connect::Envelopes`] is. A malformed envelope ends the
/// call with `invalid_argument` (what came before it was delivered; a malformed start
/// delivers nothing).
pub async fn stream_input(State(e): State<Arc<E2b>>, h: HeaderMap, body: Body) -> Response {
    let (_, id, _) = match sandbox_of(&e, &h) {
        Ok(x) => x,
        Err(err) => return client_stream_answer(Err(err)),
    };
    client_stream_answer(read_stream_input(&e, &id, body).await)
}

async fn read_stream_input(e: &E2b, id: &str, body: Body) -> Result<(), RpcError> {
    use http_body_util::BodyExt as _;
    let bad = |m: String| RpcError::new(Code::InvalidArgument, m);
    let mut body = body;
    let mut env = connect::Envelopes::default();
    let mut to: Option<(u32, mpsc::Sender<PtyInput>)> = None;
    loop {
        while let Some(m) = env
            .next_message()
            .map_err(|f| bad(format!("StreamInput: {f:?}")))?
        {
            let req: StreamInputRequest =
                serde_json::from_slice(&m).map_err(|x| bad(format!("StreamInputRequest: {x}")))?;
            match (req.start, req.data, req.keepalive, &to) {
                (Some(s), None, None, None) => {
                    let pid = s.process.pid;
                    to = Some((pid, pty_input(e, id, pid)?));
                }
                (None, Some(d), None, Some((pid, tx))) => {
                    deliver(tx, *pid, chunks(input_bytes(&d.input)?)).await?;
                }
                (None, None, Some(_), Some(_)) => {}
                (_, _, _, None) => {
                    return Err(bad("StreamInput: the first message is one start".into()));
                }
                _ => {
                    return Err(bad(
                        "StreamInput: a message is one of data or keepalive after the start".into(),
                    ));
                }
            }
        }
        match body.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    env.push(d)
                        .map_err(|f| bad(format!("StreamInput: {f:?}")))?;
                }
            }
            Some(Err(x)) => {
                return Err(RpcError::new(
                    Code::Unavailable,
                    format!("StreamInput: {x}"),
                ));
            }
            None => break,
        }
    }
    env.finish()
        .map_err(|f| bad(format!("StreamInput: {f:?}")))?;
    match to {
        Some(_) => Ok(()),
        None => Err(bad("StreamInput: no start message".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stockade_detach_1_asks_for_a_detached_process_and_is_taken_out() {
        for (envs, want) in [
            (vec![], false),
            (vec![("STOCKADE_DETACH", "1")], true),
            (vec![("STOCKADE_DETACH", "0")], false),
            (vec![("STOCKADE_DETACH", "true")], false),
            (vec![("A", "1"), ("STOCKADE_DETACH", "1")], true),
            (vec![("stockade_detach", "1")], false),
        ] {
            let mut m: std::collections::BTreeMap<String, String> = envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(take_detach(&mut m), want, "{envs:?}");
            assert!(!m.contains_key(DETACH_ENV), "{envs:?}");
        }
    }

    #[test]
    fn a_ptys_size_is_1_to_1000_each_way() {
        let size = |rows, cols| PtySize { rows, cols };
        for (s, want) in [
            (Some(size(24, 80)), Some((24, 80))),
            (Some(size(1, 1)), Some((1, 1))),
            (Some(size(1000, 1000)), Some((1000, 1000))),
            (Some(size(0, 80)), None),
            (Some(size(24, 0)), None),
            (Some(size(1001, 80)), None),
            (Some(size(24, 70_000)), None),
            (None, None),
        ] {
            let got = pty_size(s.as_ref());
            assert_eq!(got.as_ref().ok().copied(), want, "{s:?}");
            if let Err(e) = got {
                assert_eq!(e.code, Code::InvalidArgument);
            }
        }
    }

    #[test]
    fn a_live_stdin_without_a_terminal_and_a_detached_pty_are_refused_before_anything_runs() {
        for (stdin, pty, detach, want) in [
            (None, false, false, None),
            (Some(false), false, false, None),
            (Some(true), false, false, Some(Code::FailedPrecondition)),
            (Some(true), false, true, Some(Code::FailedPrecondition)),
            (Some(true), true, false, None),
            (None, true, false, None),
            (None, true, true, Some(Code::InvalidArgument)),
            (None, false, true, None),
        ] {
            let got = refused_start(stdin, pty, detach).map(|e| e.code);
            assert_eq!(got, want, "stdin {stdin:?} pty {pty} detach {detach}");
        }
        let m = refused_start(Some(true), false, false).unwrap().message;
        assert!(m.contains("docs/E2B.md"), "{m}");
    }

    #[test]
    fn requests_decode_as_the_sdk_sends_them() {
        // What the Python SDK's JSON codec sends (protobuf JSON: bytes are base64, the
        // selector's oneof is its field).
        let r: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"TERM":"xterm-256color"}},
                "pty":{"size":{"rows":24,"cols":80}}}"#,
        )
        .unwrap();
        assert_eq!(
            pty_size(r.pty.as_ref().and_then(|p| p.size.as_ref())).ok(),
            Some((24, 80))
        );
        assert_eq!(r.stdin, None);
        let r: StartRequest =
            serde_json::from_str(r#"{"process":{"cmd":"x"},"stdin":true}"#).unwrap();
        assert_eq!(r.stdin, Some(true));
        let r: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":1000},"input":{"pty":"ZWNobyBoaQo="}}"#)
                .unwrap();
        assert_eq!(r.process.pid, 1000);
        assert_eq!(input_bytes(&r.input).unwrap(), b"echo hi\n");
        let r: UpdateRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"pty":{"size":{"rows":40,"cols":100}}}"#)
                .unwrap();
        assert_eq!(
            pty_size(r.pty.as_ref().and_then(|p| p.size.as_ref())).ok(),
            Some((40, 100))
        );
        let r: StreamInputRequest =
            serde_json::from_str(r#"{"start":{"process":{"pid":3}}}"#).unwrap();
        assert_eq!(r.start.map(|s| s.process.pid), Some(3));
        let r: StreamInputRequest =
            serde_json::from_str(r#"{"data":{"input":{"pty":"YQ=="}}}"#).unwrap();
        assert_eq!(input_bytes(&r.data.unwrap().input).unwrap(), b"a");
        let r: StreamInputRequest = serde_json::from_str(r#"{"keepalive":{}}"#).unwrap();
        assert!(r.keepalive.is_some());
    }

    #[test]
    fn input_is_one_of_stdin_or_pty_in_base64() {
        let input = |stdin: Option<&str>, pty: Option<&str>| ProcessInput {
            stdin: stdin.map(str::to_string),
            pty: pty.map(str::to_string),
        };
        for (i, want) in [
            (input(None, Some("aGk=")), Some(b"hi".to_vec())),
            (input(Some("aGk="), None), Some(b"hi".to_vec())),
            (input(None, Some("")), Some(Vec::new())),
            (input(None, None), None),
            (input(Some("aGk="), Some("aGk=")), None),
            (input(None, Some("not base64!")), None),
        ] {
            let got = input_bytes(&i);
            assert_eq!(got.as_ref().ok(), want.as_ref(), "{i:?}");
            if let Err(e) = got {
                assert_eq!(e.code, Code::InvalidArgument);
            }
        }
    }

    #[test]
    fn input_is_split_into_the_terminals_messages_in_order() {
        assert_eq!(chunks(Vec::new()), vec![]);
        assert_eq!(
            chunks(b"ab".to_vec()),
            vec![PtyInput::Bytes(b"ab".to_vec())]
        );
        let big: Vec<u8> = (0..(2 * PTY_CHUNK + 5)).map(|i| i as u8).collect();
        let parts = chunks(big.clone());
        assert_eq!(parts.len(), 3);
        let mut joined = Vec::new();
        for p in parts {
            let PtyInput::Bytes(b) = p else { panic!() };
            assert!(b.len() <= PTY_CHUNK);
            joined.extend(b);
        }
        assert_eq!(joined, big);
    }

    #[test]
    fn events_are_envds() {
        assert_eq!(
            start_event(1000),
            json!({"event": {"start": {"pid": 1000}}})
        );
        assert_eq!(keepalive_event(), json!({"event": {"keepalive": {}}}));
        assert_eq!(
            data_event("pty", b"hi\r\n"),
            json!({"event": {"data": {"pty": "aGkNCg=="}}})
        );
        assert_eq!(
            data_event("stdout", b""),
            json!({"event": {"data": {"stdout": ""}}})
        );
    }

    #[test]
    fn a_follower_passes_events_ends_at_the_end_and_is_dropped_when_behind() {
        let data = connect::message(&data_event("stdout", b"x"));
        let end = connect::end(None);
        assert_eq!(followed(Ok(data.clone()), 7), (data, false));
        assert_eq!(followed(Ok(end.clone()), 7), (end.clone(), true));
        assert_eq!(
            followed(Err(broadcast::error::RecvError::Closed), 7),
            (end, true)
        );
        let (b, last) = followed(Err(broadcast::error::RecvError::Lagged(3)), 7);
        assert!(last);
        let v: Value = serde_json::from_slice(&b[5..]).unwrap();
        assert_eq!(b[0], connect::FLAG_END);
        assert_eq!(v["error"]["code"], "resource_exhausted", "{v}");
    }

    #[test]
    fn a_follower_that_does_not_read_falls_behind_the_bounded_broadcast_never_holds_it_up() {
        // The sender never waits: FOLLOWERS + 1 events go out with a follower reading
        // none of them, and that follower's next read says it fell behind.
        let (tx, mut rx) = broadcast::channel::<Vec<u8>>(FOLLOWERS);
        for i in 0..=FOLLOWERS {
            tx.send(vec![0, i as u8]).unwrap();
        }
        let r = rx.try_recv().map_err(|e| match e {
            broadcast::error::TryRecvError::Lagged(n) => broadcast::error::RecvError::Lagged(n),
            _ => broadcast::error::RecvError::Closed,
        });
        let (b, last) = followed(r, 1);
        assert!(last);
        let v: Value = serde_json::from_slice(&b[5..]).unwrap();
        assert_eq!(v["error"]["code"], "resource_exhausted", "{v}");
    }

    /// A stream's timer's first tick is one period from its start, never due at once
    /// (awaiting a due-at-once tick waited for the timer's next turn before a Start's
    /// command began: docs/BENCHMARKS.md, "E2B").
    #[tokio::test(start_paused = true)]
    async fn a_streams_first_tick_is_one_period_away() {
        use futures_util::FutureExt as _;
        let period = std::time::Duration::from_secs(50);
        let mut tick = every(period);
        assert!(tick.tick().now_or_never().is_none(), "due at once");
        tokio::time::advance(period - std::time::Duration::from_millis(1)).await;
        assert!(
            tick.tick().now_or_never().is_none(),
            "due before its period"
        );
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        assert!(
            tick.tick().now_or_never().is_some(),
            "not due after its period"
        );
    }

    #[test]
    fn keepalives_follow_the_sdks_ask_within_bounds() {
        for (asked, want) in [
            (None, 50),
            (Some("50"), 50),
            (Some("1"), 1),
            (Some("300"), 300),
            (Some("0"), 50),
            (Some("301"), 50),
            (Some("x"), 50),
        ] {
            assert_eq!(keepalive_interval(asked).as_secs(), want, "{asked:?}");
        }
    }

    #[test]
    fn exit_codes_are_reported_as_envd_does() {
        for (code, want) in [
            (
                0,
                json!({"exitCode": 0, "exited": true, "status": "exit status 0"}),
            ),
            (
                3,
                json!({"exitCode": 3, "exited": true, "status": "exit status 3"}),
            ),
            (
                -9,
                json!({"exitCode": -1, "exited": false, "status": "signal: killed"}),
            ),
            (
                -15,
                json!({"exitCode": -1, "exited": false, "status": "signal: terminated"}),
            ),
            (
                -6,
                json!({"exitCode": -1, "exited": false, "status": "signal: signal 6"}),
            ),
        ] {
            assert_eq!(end_event(code)["event"]["end"], want, "{code}");
        }
    }
}
