//! `GET /v1/sandboxes/{key}/pty`: an interactive terminal over a WebSocket (`stockade
//! shell`, DESIGN §8). The session is a fenced exec whose I/O is a terminal
//! (`stockade_runtime::substrate::pty`): the guest decides it (floor, approval), ensures the
//! container, applies its grant for the session's life, and tears it down (kill-all,
//! revoke) when it ends, however it ends.
//!
//! One message table, both ways (docs/LINUX.md, "Interactive terminal"):
//!
//! | from   | frame  | content                                                        |
//! |--------|--------|----------------------------------------------------------------|
//! | client | text   | `{"type":"start","command":{…},"rows":R,"cols":C}`, first, once |
//! | client | binary | bytes typed (at most [`MAX_INPUT`] a message)                  |
//! | client | text   | `{"type":"resize","rows":R,"cols":C}`                          |
//! | server | binary | the terminal's output                                          |
//! | server | text   | `{"type":"exit",…}` (the exec stream's exit event), last       |
//! | server | text   | `{"type":"error","error":{"code","message"}}`, last            |
//!
//! `command` is `POST …/exec`'s body (no stdin: the terminal is the input); an empty
//! `argv` is the container's shell, `/bin/sh -i`. Rows and columns are 1 to 1000.
//! Close codes: 1000 after the exit event; 1008 for a frame the table refuses (binary
//! or a resize before the start, a second start, text that is no row of it, no start
//! within [`START_WITHIN`], a client that reads nothing for [`SEND_WITHIN`]); 1009 for a
//! message over the bound; 1011 after an error event (the call failed). Closing the
//! socket ends the session: the run is abandoned and its fence torn down.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use stockade_wire::{CommandBody, ErrorCode};
use tokio::sync::mpsc;

use super::error::{ApiError, ApiResult, Params, error_event};
use super::{ApiState, exec_command, exit_event};
use stockade_runtime::runtime::{CallError, ExecIo};
use stockade_runtime::substrate::pty::{Attach, Input, Session, Size};

/// Most bytes one input message carries.
pub const MAX_INPUT: usize = 64 * 1024;
/// How long the client has to send its start message.
pub const START_WITHIN: Duration = Duration::from_secs(10);
/// How long one output message may wait for a client that does not read.
pub const SEND_WITHIN: Duration = Duration::from_secs(30);
/// The shell a session without a command runs.
pub const DEFAULT_SHELL: &[&str] = &["/bin/sh", "-i"];

/// A text message of the client (the table's text rows).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum Text {
    Start {
        #[serde(default)]
        command: Option<CommandBody>,
        rows: u64,
        cols: u64,
    },
    Resize {
        rows: u64,
        cols: u64,
    },
}

/// A client message as the session acts on it.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// Start the command at this size.
    Start(Box<CommandBody>, Size),
    /// Bytes typed.
    Input(Bytes),
    /// The window's new size.
    Resize(Size),
    /// Nothing to do (a ping or pong: the socket answers pings itself).
    Nothing,
    /// The client closed.
    Closed,
}

/// Why a session closes on a client's frame: a close code and its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The WebSocket close code.
    pub code: u16,
    /// Why (said in the close frame and the error event).
    pub reason: String,
}

fn refuse(reason: impl Into<String>) -> Refusal {
    Refusal {
        code: close_code::POLICY,
        reason: reason.into(),
    }
}

/// Decide what a client message is (pure): `started` says whether the start came.
pub fn decode(msg: &Message, started: bool) -> Result<Frame, Refusal> {
    match msg {
        Message::Binary(b) if !started => Err(refuse(format!(
            "{} input bytes before the start message",
            b.len()
        ))),
        Message::Binary(b) if b.len() > MAX_INPUT => Err(Refusal {
            code: close_code::SIZE,
            reason: format!("an input message is at most {MAX_INPUT} bytes"),
        }),
        Message::Binary(b) => Ok(Frame::Input(b.clone())),
        Message::Text(t) => {
            let text: Text = serde_json::from_str(t.as_str())
                .map_err(|e| refuse(format!("not a message of the terminal protocol: {e}")))?;
            match (text, started) {
                (
                    Text::Start {
                        command,
                        rows,
                        cols,
                    },
                    false,
                ) => {
                    let size = Size::new(rows, cols).map_err(refuse)?;
                    let mut command = command.unwrap_or_default();
                    if command.stdin.is_some() || command.stdin_base64.is_some() {
                        return Err(refuse("a terminal's input is the terminal: no stdin"));
                    }
                    if command.argv.is_empty() {
                        command.argv = DEFAULT_SHELL.iter().map(|s| s.to_string()).collect();
                    }
                    Ok(Frame::Start(Box::new(command), size))
                }
                (Text::Start { .. }, true) => Err(refuse("a second start message")),
                (Text::Resize { .. }, false) => Err(refuse("a resize before the start message")),
                (Text::Resize { rows, cols }, true) => {
                    Ok(Frame::Resize(Size::new(rows, cols).map_err(refuse)?))
                }
            }
        }
        Message::Ping(_) | Message::Pong(_) => Ok(Frame::Nothing),
        Message::Close(_) => Ok(Frame::Closed),
    }
}

/// The route: the upgrade (a plain GET is a 400 that says what the route is).
pub(super) async fn pty(
    State(s): State<Arc<ApiState>>,
    hold: Option<axum::Extension<Arc<crate::tenants::Hold>>>,
    Params(key): Params<String>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    stockade_grammar::names::key(&key)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, e))?;
    let ws = ws.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidInput,
            format!("this route is a WebSocket (a terminal session): {e}"),
        )
    })?;
    Ok(ws
        .max_message_size(MAX_INPUT + 4096)
        .max_frame_size(MAX_INPUT + 4096)
        .on_upgrade(move |socket| async move {
            // A scoped token's place in its share is held for the session's life.
            let _hold = hold;
            let outcome = session(&s, &key, socket).await;
            tracing::info!(target: "stockade::api", key, outcome, "a terminal session closed");
        }))
}

/// Why a message could not be read: over the bound (1009), not WebSocket (1002), or
/// `None`: the client went away (the connection closed or broke; nobody to tell).
fn unreadable(e: axum::Error) -> Option<Refusal> {
    use tokio_tungstenite::tungstenite::Error as WsError;
    use tokio_tungstenite::tungstenite::error::ProtocolError;
    let inner = e.into_inner();
    match inner.downcast_ref::<WsError>() {
        Some(WsError::Capacity(c)) => Some(Refusal {
            code: close_code::SIZE,
            reason: format!("a message over the bound ({MAX_INPUT} bytes of input): {c}"),
        }),
        Some(
            WsError::ConnectionClosed
            | WsError::AlreadyClosed
            | WsError::Io(_)
            | WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake),
        ) => None,
        _ => Some(Refusal {
            code: close_code::PROTOCOL,
            reason: format!("not a WebSocket message: {inner}"),
        }),
    }
}

/// Send `msg`, or give up after [`SEND_WITHIN`] (a client that does not read).
async fn send(socket: &mut WebSocket, msg: Message) -> bool {
    matches!(
        tokio::time::timeout(SEND_WITHIN, socket.send(msg)).await,
        Ok(Ok(()))
    )
}

/// Close with `code`, after `event` (a JSON text message) if there is one.
async fn close(socket: &mut WebSocket, event: Option<serde_json::Value>, code: u16, reason: &str) {
    if let Some(ev) = event {
        let _ = send(socket, Message::text(ev.to_string())).await;
    }
    let reason: String = reason.chars().take(120).collect();
    let _ = send(
        socket,
        Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })),
    )
    .await;
}

fn error_value(e: ApiError) -> Option<serde_json::Value> {
    serde_json::to_value(error_event(e)).ok()
}

fn refused(r: &Refusal) -> Option<serde_json::Value> {
    error_value(ApiError::new(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidInput,
        r.reason.clone(),
    ))
}

/// One session, from the start message to the close; how it ended (for the log line).
async fn session(s: &Arc<ApiState>, key: &str, mut socket: WebSocket) -> &'static str {
    // The start message, in time.
    let first = match tokio::time::timeout(START_WITHIN, socket.recv()).await {
        Err(_) => {
            let r = refuse(format!("no start message within {START_WITHIN:?}"));
            close(&mut socket, refused(&r), r.code, &r.reason).await;
            return "no start";
        }
        Ok(None) => return "gone before the start",
        Ok(Some(Err(e))) => {
            let Some(r) = unreadable(e) else {
                return "gone before the start";
            };
            close(&mut socket, refused(&r), r.code, &r.reason).await;
            return "refused";
        }
        Ok(Some(Ok(m))) => m,
    };
    let (command, size) = match decode(&first, false) {
        Ok(Frame::Start(c, size)) => (c, size),
        Ok(Frame::Closed) => return "closed before the start",
        Ok(_) => {
            let r = refuse("the first message must be the start message");
            close(&mut socket, refused(&r), r.code, &r.reason).await;
            return "refused";
        }
        Err(r) => {
            close(&mut socket, refused(&r), r.code, &r.reason).await;
            return "refused";
        }
    };
    let input = match exec_command(s, *command) {
        Ok(i) => i,
        Err(e) => {
            let reason = e.message.clone();
            close(&mut socket, error_value(e), close_code::POLICY, &reason).await;
            return "refused";
        }
    };
    let (in_tx, in_rx) = mpsc::channel::<Input>(64);
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(64);
    let attach = Attach::new(Session {
        size,
        input: in_rx,
        output: out_tx,
    });
    // Held while the socket is open: its drop (any return below) abandons the run,
    // whose teardown kills the tree and revokes the grant.
    let (_present, caller) = tokio::sync::watch::channel(());
    let rt = s.runtime.clone();
    let key = key.to_string();
    let mut call = tokio::spawn(async move {
        let io = ExecIo {
            caller: Some(caller),
            pty: Some(attach),
            ..ExecIo::default()
        };
        rt.exec_with(&key, &input, io).await
    });
    let mut result = None;
    let mut output_open = true;
    loop {
        if result.is_some() && !output_open {
            break;
        }
        tokio::select! {
            chunk = out_rx.recv(), if output_open => match chunk {
                Some(b) => {
                    if !send(&mut socket, Message::Binary(b)).await {
                        return "the client stopped reading";
                    }
                }
                None => output_open = false,
            },
            r = &mut call, if result.is_none() => {
                result = Some(r);
                // The run is over: what it wrote is drained for a moment at most.
                if output_open {
                    let drain = async {
                        while let Some(b) = out_rx.recv().await {
                            if !send(&mut socket, Message::Binary(b)).await {
                                break;
                            }
                        }
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
                    output_open = false;
                }
            },
            msg = socket.recv(), if result.is_none() => {
                let msg = match msg {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => {
                        let Some(r) = unreadable(e) else {
                            return "the client went away";
                        };
                        close(&mut socket, refused(&r), r.code, &r.reason).await;
                        return "refused";
                    }
                    None => return "the client went away",
                };
                let frame = match decode(&msg, true) {
                    Ok(f) => f,
                    Err(r) => {
                        close(&mut socket, refused(&r), r.code, &r.reason).await;
                        return "refused";
                    }
                };
                let sent = match frame {
                    Frame::Input(b) => in_tx.send(Input::Data(b)).await.is_ok(),
                    Frame::Resize(size) => in_tx.send(Input::Resize(size)).await.is_ok(),
                    Frame::Closed => return "the client closed",
                    Frame::Nothing | Frame::Start(..) => true,
                };
                // The run took no terminal (refused before it started): its answer
                // comes next.
                let _ = sent;
            },
        }
    }
    match result {
        Some(Ok(Ok(out))) => {
            let ev = serde_json::to_value(exit_event(&out)).ok();
            close(&mut socket, ev, close_code::NORMAL, "exit").await;
            "exit"
        }
        Some(Ok(Err(e))) => {
            let e = ApiError::from(e);
            let reason = e.message.clone();
            close(&mut socket, error_value(e), close_code::ERROR, &reason).await;
            "error"
        }
        _ => {
            let e = ApiError::from(CallError::Trap("the call's task failed".into()));
            close(&mut socket, error_value(e), close_code::ERROR, "failed").await;
            "failed"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Message {
        Message::text(s.to_string())
    }

    #[test]
    fn the_frame_table() {
        let shell = CommandBody {
            argv: DEFAULT_SHELL.iter().map(|s| s.to_string()).collect(),
            ..CommandBody::default()
        };
        let size = |rows, cols| Size { rows, cols };
        type Want = Result<Frame, u16>;
        let rows: Vec<(&str, Message, bool, Want)> = vec![
            (
                "a start with no command is the shell",
                text(r#"{"type":"start","rows":24,"cols":80}"#),
                false,
                Ok(Frame::Start(Box::new(shell.clone()), size(24, 80))),
            ),
            (
                "a start with a command",
                text(r#"{"type":"start","command":{"argv":["sleep","1"]},"rows":5,"cols":7}"#),
                false,
                Ok(Frame::Start(
                    Box::new(CommandBody {
                        argv: vec!["sleep".into(), "1".into()],
                        ..CommandBody::default()
                    }),
                    size(5, 7),
                )),
            ),
            (
                "a start with stdin",
                text(r#"{"type":"start","command":{"argv":["sh"],"stdin":"x"},"rows":5,"cols":7}"#),
                false,
                Err(close_code::POLICY),
            ),
            (
                "a second start",
                text(r#"{"type":"start","rows":24,"cols":80}"#),
                true,
                Err(close_code::POLICY),
            ),
            (
                "a huge resize",
                text(r#"{"type":"resize","rows":100000,"cols":80}"#),
                true,
                Err(close_code::POLICY),
            ),
            (
                "a zero resize",
                text(r#"{"type":"resize","rows":0,"cols":0}"#),
                true,
                Err(close_code::POLICY),
            ),
            (
                "a negative resize",
                text(r#"{"type":"resize","rows":-1,"cols":80}"#),
                true,
                Err(close_code::POLICY),
            ),
            (
                "a resize",
                text(r#"{"type":"resize","rows":40,"cols":120}"#),
                true,
                Ok(Frame::Resize(size(40, 120))),
            ),
            (
                "a resize before the start",
                text(r#"{"type":"resize","rows":40,"cols":120}"#),
                false,
                Err(close_code::POLICY),
            ),
            (
                "an unknown field",
                text(r#"{"type":"resize","rows":4,"cols":4,"x":1}"#),
                true,
                Err(close_code::POLICY),
            ),
            (
                "an unknown type",
                text(r#"{"type":"signal","sig":9}"#),
                true,
                Err(close_code::POLICY),
            ),
            ("not JSON", text("\u{1b}[A"), true, Err(close_code::POLICY)),
            (
                "binary before the start",
                Message::Binary(Bytes::from_static(b"ls\n")),
                false,
                Err(close_code::POLICY),
            ),
            (
                "bytes typed, Ctrl-C and Ctrl-D included",
                Message::Binary(Bytes::from_static(b"\x03\x04\xff\x00")),
                true,
                Ok(Frame::Input(Bytes::from_static(b"\x03\x04\xff\x00"))),
            ),
            (
                "an input message over the bound",
                Message::Binary(Bytes::from(vec![b'a'; MAX_INPUT + 1])),
                true,
                Err(close_code::SIZE),
            ),
            (
                "a ping",
                Message::Ping(Bytes::new()),
                true,
                Ok(Frame::Nothing),
            ),
            ("a close", Message::Close(None), false, Ok(Frame::Closed)),
        ];
        for (what, msg, started, want) in rows {
            let got = decode(&msg, started).map_err(|r| r.code);
            assert_eq!(got, want, "{what}");
        }
    }
}
