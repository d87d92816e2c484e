//! envd's `process.Process` service over Connect (JSON codec): `Start` (a server
//! stream), `List` and `SendSignal` (unary). The rest of the service (`Connect`,
//! `SendInput`, `StreamInput`, `Update`, `CloseStdin`) is not served in this slice:
//! the router has no route for it (404).
//!
//! **A command is a fenced exec with no grant** (`POST …/exec/stream`): the SDK sends
//! `/bin/bash -l -c CMD` and that argv is run as it is, in the sandbox's key, its
//! output streamed as envd's data events as the command writes it. No grant in this
//! slice: nothing leaves the sandbox (network policy comes later). A command lives as
//! long as its stream: when the caller leaves, the call is dropped, which the API sees
//! as its client leaving (the command is killed and its fence torn down).
//! `commands.run(cmd, background=True)` sends the very same `Start` (E2B's wire does
//! not tell them apart; the SDK only stops reading), so it is the same fenced exec,
//! unless the caller asks for a detached process with `STOCKADE_DETACH=1` in its
//! environment ([`DETACH_ENV`]): then it is `POST …/detached`, no grant, ever
//! (docs/E2B.md, the one deliberate difference).

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
use tokio::sync::{mpsc, oneshot};

use super::connect::{self, Code, RpcError};
use super::{E2b, Sandbox, header, ids};

/// A running command: how to stop it, and what it is (for `List`).
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    config: Value,
    tag: Option<String>,
    /// A detached process's id (`STOCKADE_DETACH=1`); none for a fenced exec.
    detached: Option<String>,
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

/// A Connect streaming answer: 200, `application/connect+json`, the envelopes as they
/// come.
pub(super) fn streaming(rx: mpsc::UnboundedReceiver<Vec<u8>>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::io::Error>(Bytes::from(b)), rx))
    });
    let mut r = Response::new(Body::from_stream(stream));
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
        // The fence: the sandbox's network policy is this command's grant, open only
        // while it runs (DESIGN §3; docs/E2B.md, "Network"). None when it names no host.
        grant: (!sbx.policy.hosts.is_empty()).then(|| stockade_wire::GrantBody {
            rules: sbx.policy.rules(),
            ask: false,
        }),
        ..Default::default()
    };
    let pid = e.pid();
    let (stop_tx, stop_rx) = oneshot::channel();
    e.running().insert(
        (id.clone(), pid),
        Running {
            stop: Some(stop_tx),
            config: json!({"cmd": req.process.cmd, "args": req.process.args,
                "envs": req.process.envs, "cwd": req.process.cwd}),
            tag: req.tag,
            detached: None,
        },
    );
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let _ = tx.send(connect::message(&json!({"event": {"start": {"pid": pid}}})));
    let client = e.client(&token);
    let e2 = e.clone();
    tokio::spawn(async move {
        let out = tx.clone();
        // The output's memory is bounded by the API's (output_limit per stream): the
        // channel holds at most what one run may write.
        let run = client.exec_stream(&sbx.key, &cmd, move |which, bytes| {
            let field = match which {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            let data = base64::engine::general_purpose::STANDARD.encode(bytes);
            let _ = out.send(connect::message(&json!({"event": {"data": {field: data}}})));
        });
        let mut run = std::pin::pin!(run);
        let mut stop_rx = stop_rx;
        let mut tick = tokio::time::interval(keepalive);
        tick.tick().await;
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
                _ = tick.tick() => {
                    let _ = tx.send(connect::message(&json!({"event": {"keepalive": {}}})));
                }
            }
        };
        e2.running().remove(&(id, pid));
        let Some(result) = result else { return };
        let end = match result {
            Ok(exit) if exit.timed_out => Some(RpcError::new(
                Code::DeadlineExceeded,
                "the command ran past its timeout and was killed",
            )),
            Ok(exit) => {
                let _ = tx.send(connect::message(&end_event(exit.exit_code)));
                None
            }
            Err(stockade_client::Error::Api {
                status, message, ..
            }) => Some(RpcError::new(Code::of_status(status), message)),
            Err(other) => Some(RpcError::new(Code::Unavailable, other.to_string())),
        };
        let _ = tx.send(connect::end(end.as_ref()));
    });
    streaming(rx)
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
    e.running().insert(
        (id.clone(), pid),
        Running {
            stop: Some(stop_tx),
            config: json!({"cmd": req.process.cmd, "args": req.process.args,
                "envs": cmd.env, "cwd": req.process.cwd}),
            tag: req.tag,
            detached: Some(started.id.clone()),
        },
    );
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let _ = tx.send(connect::message(&json!({"event": {"start": {"pid": pid}}})));
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
                        if attached {
                            let _ = tx.send(connect::message(&json!({"event": {"keepalive": {}}})));
                        }
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
                let _ = tx.send(connect::message(&end_event(code)));
                None
            }
            Err(err) => Some(err),
        };
        let _ = tx.send(connect::end(trailer.as_ref()));
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
pub async fn list(State(e): State<Arc<E2b>>, h: HeaderMap) -> Response {
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
