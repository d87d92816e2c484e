//! `run-pty` (docs/NODE.md "Terminals"): a run with a terminal on the node, its frames
//! sealed both ways over a WebSocket.

use std::time::Duration;

use super::{ATTEMPTS, NoAnswer, NodeClient, decode};
use stockade_node_protocol::{self as protocol, RunLine, pty};
use stockade_runtime::substrate::{Result, RunResult, SubstrateError};

/// `run-pty` (docs/NODE.md "Terminals", [`stockade_node_protocol::pty`]).
impl NodeClient {
    /// A run with a terminal on the node: the signed upgrade (the head in its header),
    /// then `session`'s input and resizes as sealed frames (an "alive" after
    /// [`pty::ALIVE_EVERY`] of silence) and the terminal's output into `session`'s
    /// output, until the result. Only opening the connection is retried; no message
    /// for `silence` (the node's heartbeats included) is `unreachable`. Dropping the
    /// future drops the socket: the node abandons the run.
    pub async fn run_pty(
        &self,
        key: &str,
        head: &pty::Head,
        session: stockade_runtime::substrate::pty::Session,
        silence: Duration,
    ) -> Result<RunResult> {
        use base64::Engine as _;
        use futures_util::{SinkExt as _, StreamExt as _};
        use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest as _};
        let body = serde_json::to_vec(head).map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        let mut last = String::new();
        let mut opened = None;
        for attempt in 1..=ATTEMPTS {
            let signed = self.sign("GET", pty::PATH, key, "", &body);
            let mut req = format!("ws://{}{}", self.authority, pty::PATH)
                .into_client_request()
                .map_err(|e| self.failed(format!("run-pty: request: {e}")))?;
            let h = req.headers_mut();
            let value = |v: &str| {
                hyper::header::HeaderValue::from_str(v)
                    .map_err(|e| SubstrateError::Invalid(format!("run-pty: a header: {e}")))
            };
            for (name, v) in signed.headers(key) {
                h.insert(name, value(v)?);
            }
            h.insert(
                pty::HEAD_HEADER,
                value(&base64::engine::general_purpose::STANDARD.encode(&body))?,
            );
            let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                .max_message_size(Some(pty::MAX_NODE_MESSAGE))
                .max_frame_size(Some(pty::MAX_NODE_MESSAGE));
            let open = async {
                let tls = self.tls_stream().await?;
                match tokio_tungstenite::client_async_with_config(req, tls, Some(config)).await {
                    Ok((ws, _)) => Ok(Ok(ws)),
                    // An answer that is no upgrade: the node refused (401, 403, 400).
                    Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                        let status = r.status();
                        let body = r.into_body().unwrap_or_default();
                        Ok(Err(decode::<serde_json::Value>(status, &body)
                            .err()
                            .unwrap_or_else(|| {
                                self.failed(format!("run-pty: HTTP {status}"))
                            })))
                    }
                    Err(e) => Err(NoAnswer(format!("websocket: {e}"))),
                }
            };
            match tokio::time::timeout(self.connect_timeout, open).await {
                Ok(Ok(Ok(ws))) => {
                    opened = Some((ws, signed.signature));
                    break;
                }
                Ok(Ok(Err(refused))) => return Err(refused),
                Ok(Err(NoAnswer(why))) => last = why,
                Err(_) => last = format!("no session within {:?}", self.connect_timeout),
            }
            tracing::debug!(target: "stockade::remote", node = %self.name, call = protocol::call::RUN_PTY, attempt, error = %last, "no session; retrying");
        }
        let Some((ws, signature)) = opened else {
            tracing::warn!(target: "stockade::remote", node = %self.name, call = protocol::call::RUN_PTY, error = %last, "node unreachable");
            return Err(self.unreachable(format!("{}: {last}", protocol::call::RUN_PTY)));
        };
        let (mut tx, mut rx) = ws.split();
        let stockade_runtime::substrate::pty::Session {
            mut input, output, ..
        } = session;
        let mut sealer = pty::Sealer::new(&self.secret, &signature);
        // The writer: bytes typed and resizes as they come, "alive" after a silence.
        let writer = Abort(tokio::spawn(async move {
            loop {
                let frames = match tokio::time::timeout(pty::ALIVE_EVERY, input.recv()).await {
                    Ok(Some(stockade_runtime::substrate::pty::Input::Data(b))) => sealer.input(&b),
                    Ok(Some(stockade_runtime::substrate::pty::Input::Resize(s))) => {
                        vec![sealer.resize(s)]
                    }
                    // The caller typed its last: the node still hears it is there.
                    Ok(None) => {
                        std::future::pending::<()>().await;
                        return;
                    }
                    Err(_) => vec![sealer.alive()],
                };
                for f in frames {
                    if tx.send(Message::Binary(f)).await.is_err() {
                        return;
                    }
                }
            }
        }));
        let ended = loop {
            let msg = match tokio::time::timeout(silence, rx.next()).await {
                Err(_) => {
                    break Err(self.unreachable(format!(
                        "run-pty: no message for {} ms",
                        silence.as_millis()
                    )));
                }
                Ok(None) => {
                    break Err(
                        self.unreachable("run-pty: the session ended without a result".into())
                    );
                }
                Ok(Some(Err(e))) => break Err(self.unreachable(format!("run-pty: {e}"))),
                Ok(Some(Ok(m))) => m,
            };
            match msg {
                Message::Binary(b) => {
                    // The caller stopped listening: its run is being abandoned.
                    let _ = output.send(b).await;
                }
                Message::Text(t) => match serde_json::from_str::<RunLine>(t.as_str()) {
                    Ok(RunLine::Result(r)) => break Ok(r),
                    Ok(RunLine::Error(e)) => break Err(SubstrateError::from(e)),
                    Ok(_) => {}
                    Err(e) => {
                        break Err(self.failed(format!("run-pty: a line that does not parse: {e}")));
                    }
                },
                Message::Close(_) => {
                    break Err(
                        self.unreachable("run-pty: the session closed without a result".into())
                    );
                }
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        };
        drop(writer);
        ended
    }
}

/// A task aborted when dropped.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}
