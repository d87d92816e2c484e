//! A terminal session: `GET /v1/sandboxes/{key}/pty`, a WebSocket (docs/LINUX.md,
//! "Interactive terminal"). A text `start` message with the command and the window's
//! size, then binary frames both ways (typed bytes in, the terminal's output out),
//! `resize` messages, and one last event: the exit, or the call's error.
//!
//! One implementation for every client of the route: `stockade shell` (the CLI) and
//! the E2B layer's PTYs both drive a [`Pty`].

use futures_util::{SinkExt as _, StreamExt as _};
use stockade_wire::{CommandBody, ExitEvent, StreamEvent};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::{Client, Error, segment};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What a session's next message is.
#[derive(Debug)]
pub enum PtyEvent {
    /// Bytes the terminal wrote.
    Output(Vec<u8>),
    /// The command ended: its outcome (the last event).
    Exit(ExitEvent),
    /// The call failed, or the connection closed or broke without an exit (the last
    /// event).
    Failed(Error),
}

/// An open terminal session.
pub struct Pty {
    ws: Socket,
    done: bool,
}

/// The WebSocket address of `key`'s terminal on the server at `addr` (`HOST:PORT`,
/// pure).
pub fn url(addr: &str, key: &str) -> String {
    format!("ws://{addr}/v1/sandboxes/{}/pty", segment(key))
}

/// The start message (pure).
pub fn start_message(command: &CommandBody, rows: u16, cols: u16) -> String {
    serde_json::json!({"type": "start", "command": command, "rows": rows, "cols": cols}).to_string()
}

/// A resize message (pure).
pub fn resize_message(rows: u16, cols: u16) -> String {
    serde_json::json!({"type": "resize", "rows": rows, "cols": cols}).to_string()
}

/// What a server's message means (pure): `None` for one that says nothing (a ping, a
/// text that is no event).
pub fn event_of(msg: Message) -> Option<PtyEvent> {
    match msg {
        Message::Binary(b) => Some(PtyEvent::Output(b.to_vec())),
        Message::Text(t) => match serde_json::from_str::<StreamEvent>(t.as_str()) {
            Ok(StreamEvent::Exit(e)) => Some(PtyEvent::Exit(e)),
            Ok(StreamEvent::Error(e)) => Some(PtyEvent::Failed(Error::Api {
                status: e.status,
                code: e.error.code,
                message: e.error.message,
            })),
            _ => None,
        },
        Message::Close(f) => {
            let why = f
                .map(|f| format!(": {} {}", u16::from(f.code), f.reason))
                .unwrap_or_default();
            Some(PtyEvent::Failed(Error::Unreachable(format!(
                "the server closed the terminal without an exit{why}"
            ))))
        }
        _ => None,
    }
}

/// The error of a refused upgrade: its body's code and message.
fn refused(status: u16, body: &[u8]) -> Error {
    match Error::answer(status, body) {
        Error::Api { message, .. } if message.is_empty() => {
            Error::BadAnswer(format!("the server refused the terminal: HTTP {status}"))
        }
        e => e,
    }
}

impl Client {
    /// Open a terminal session on `key` running `command` (`argv` empty: the
    /// container's shell) at `rows` by `cols`.
    pub async fn pty(
        &self,
        key: &str,
        command: &CommandBody,
        rows: u16,
        cols: u16,
    ) -> Result<Pty, Error> {
        let mut req = url(&self.addr, key)
            .into_client_request()
            .map_err(|e| Error::Usage(format!("the server's address: {e}")))?;
        let auth = format!("Bearer {}", self.token)
            .parse()
            .map_err(|_| Error::Usage("the token is not a header value".into()))?;
        req.headers_mut().insert("authorization", auth);
        let (mut ws, _) = tokio_tungstenite::connect_async(req)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(r) => {
                    refused(r.status().as_u16(), r.body().as_deref().unwrap_or_default())
                }
                e => Error::Unreachable(format!("{}: {e}", self.addr)),
            })?;
        ws.send(Message::text(start_message(command, rows, cols)))
            .await
            .map_err(broken)?;
        Ok(Pty { ws, done: false })
    }
}

fn broken(e: tokio_tungstenite::tungstenite::Error) -> Error {
    Error::Unreachable(format!("the terminal's connection broke: {e}"))
}

impl Pty {
    /// Send typed bytes.
    pub async fn send(&mut self, bytes: Vec<u8>) -> Result<(), Error> {
        self.ws
            .send(Message::Binary(bytes.into()))
            .await
            .map_err(broken)
    }

    /// Say the window's new size.
    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), Error> {
        self.ws
            .send(Message::text(resize_message(rows, cols)))
            .await
            .map_err(broken)
    }

    /// The session's next event; after its last, `None`. Cancel-safe (a `select!`
    /// branch): nothing is held across its one await but the socket.
    pub async fn next(&mut self) -> Option<PtyEvent> {
        if self.done {
            return None;
        }
        loop {
            let ev = match self.ws.next().await {
                Some(Ok(m)) => match event_of(m) {
                    Some(ev) => ev,
                    None => continue,
                },
                Some(Err(e)) => PtyEvent::Failed(broken(e)),
                None => PtyEvent::Failed(Error::Unreachable(
                    "the terminal's connection closed without an exit".into(),
                )),
            };
            if !matches!(ev, PtyEvent::Output(_)) {
                self.done = true;
            }
            return Some(ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_terminal_address_is_the_servers_with_ws() {
        assert_eq!(
            url("127.0.0.1:8787", "demo"),
            "ws://127.0.0.1:8787/v1/sandboxes/demo/pty"
        );
        assert_eq!(url("h:1", "a b/c"), "ws://h:1/v1/sandboxes/a%20b%2Fc/pty");
    }

    #[test]
    fn messages_are_the_protocols_rows() {
        let cmd = CommandBody {
            argv: vec!["/bin/bash".into()],
            ..Default::default()
        };
        let v: serde_json::Value = serde_json::from_str(&start_message(&cmd, 24, 80)).unwrap();
        assert_eq!(v["type"], "start");
        assert_eq!(v["rows"], 24);
        assert_eq!(v["cols"], 80);
        assert_eq!(v["command"]["argv"][0], "/bin/bash");
        let v: serde_json::Value = serde_json::from_str(&resize_message(40, 100)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "resize", "rows": 40, "cols": 100})
        );
    }

    #[test]
    fn server_messages_are_events() {
        assert!(matches!(
            event_of(Message::Binary(b"hi".to_vec().into())),
            Some(PtyEvent::Output(b)) if b == b"hi"
        ));
        assert!(matches!(
            event_of(Message::text(
                serde_json::to_string(&StreamEvent::Exit(ExitEvent {
                    exit_code: 3,
                    ..Default::default()
                }))
                .unwrap()
            )),
            Some(PtyEvent::Exit(e)) if e.exit_code == 3
        ));
        assert!(matches!(
            event_of(Message::text(
                r#"{"type":"error","status":400,"error":{"code":"invalid-input","message":"no"}}"#
            )),
            Some(PtyEvent::Failed(Error::Api { status: 400, .. }))
        ));
        assert!(matches!(
            event_of(Message::Close(None)),
            Some(PtyEvent::Failed(Error::Unreachable(_)))
        ));
        assert!(event_of(Message::Ping(vec![].into())).is_none());
        assert!(event_of(Message::text("{}")).is_none());
    }
}
