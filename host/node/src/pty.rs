//! `run-pty`'s node side (docs/NODE.md "Terminals"): the upgrade checked as a `run`'s
//! body, then the session: the run with its terminal, its frames opened in order
//! ([`stockade_node_protocol::pty`] is the protocol both ends speak).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::sync::mpsc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine as _;

use stockade_node_protocol::auth;
use stockade_node_protocol::pty::*;
use stockade_node_protocol::{RunLine, WireError, call};
use stockade_runtime::substrate::pty::{Input, Session, Size};
use stockade_runtime::substrate::{RunResult, SubstrateError};

use crate::request::{Refusal, check_cmd, header_str, own, parse, refused, verify_as};
use crate::state::{MAX_RUN_TIMEOUT_MS, Node, now_ms};

/// Output chunks waiting for the front at once.
const OUTPUT_IN_FLIGHT: usize = 64;

/// How a session ended before its run did.
enum Early {
    /// The front went (closed, broke off, or silent for [`LINK_SILENCE`]).
    Gone(String),
    /// A frame the protocol refuses: a close code and why.
    Refused(u16, String),
}

fn line(l: &RunLine) -> Message {
    Message::text(serde_json::to_string(l).expect("run lines serialize"))
}

/// The session on an upgraded socket, the head checked (signature, key, owner): the
/// run with its terminal, until its result went to the front or the session ended.
pub async fn session(
    node: Arc<Node>,
    key: String,
    head: Head,
    signature: String,
    socket: WebSocket,
) {
    let (mut sink, mut stream) = socket.split();
    // Checked before the upgrade.
    let size = Size::new(head.rows, head.cols).unwrap_or_default();
    let (in_tx, in_rx) = mpsc::channel::<Input>(OUTPUT_IN_FLIGHT);
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(OUTPUT_IN_FLIGHT);
    // The writer: output as it comes, a heartbeat every heartbeat, and the last line
    // after the output drained; then the close.
    let (last_tx, mut last_rx) = tokio::sync::oneshot::channel::<(Message, u16, String)>();
    let every = node.heartbeat;
    let writer = tokio::spawn(async move {
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut output_open = true;
        let mut last = None;
        loop {
            tokio::select! {
                chunk = out_rx.recv(), if output_open => match chunk {
                    Some(b) => {
                        if sink.send(Message::Binary(b)).await.is_err() {
                            return;
                        }
                    }
                    None => output_open = false,
                },
                l = &mut last_rx, if last.is_none() => match l {
                    Ok(l) => last = Some(l),
                    Err(_) => return,
                },
                _ = beat.tick() => {
                    if sink.send(line(&RunLine::Heartbeat(now_ms()))).await.is_err() {
                        return;
                    }
                }
            }
            // The last line once the output ended (or a moment after the run did: a
            // substrate's pump that outlives its run holds it no longer).
            if let Some((msg, code, reason)) = last.take() {
                if output_open {
                    let drain = async {
                        while let Some(b) = out_rx.recv().await {
                            if sink.send(Message::Binary(b)).await.is_err() {
                                break;
                            }
                        }
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
                }
                let _ = sink.send(msg).await;
                let reason: String = reason.chars().take(120).collect();
                let _ = sink
                    .send(Message::Close(Some(CloseFrame {
                        code,
                        reason: reason.into(),
                    })))
                    .await;
                return;
            }
        }
    });
    let container = head.container.clone();
    let timeout = Duration::from_millis(head.timeout_ms);
    let lease = node.leases.run_started(&container, timeout);
    tracing::info!(target: "stockade::node", key, container, "a terminal session starts");
    let session = Session {
        size,
        input: in_rx,
        output: out_tx,
    };
    let substrate = node.substrate.clone();
    let mut going = Box::pin(substrate.run_pty(&container, head.cmd, timeout, session));
    let mut opener = Opener::new(&node.secret, &signature);
    let ended: Result<stockade_runtime::substrate::Result<RunResult>, Early> = loop {
        tokio::select! {
            r = &mut going => break Ok(r),
            msg = tokio::time::timeout(LINK_SILENCE, stream.next()) => {
                let msg = match msg {
                    Err(_) => break Err(Early::Gone(format!("no frame for {LINK_SILENCE:?}"))),
                    Ok(None) => break Err(Early::Gone("the front went away".into())),
                    Ok(Some(Err(e))) => break Err(unreadable(e)),
                    Ok(Some(Ok(m))) => m,
                };
                let frame = match msg {
                    Message::Binary(b) if b.len() > MAX_MESSAGE => {
                        let why = format!("a message of {} bytes (at most {MAX_MESSAGE})", b.len());
                        break Err(Early::Refused(close_code::SIZE, why));
                    }
                    Message::Binary(b) => opener.open(&b),
                    Message::Text(_) => Err(Refused::Text),
                    Message::Ping(_) | Message::Pong(_) => continue,
                    Message::Close(_) => break Err(Early::Gone("the front closed".into())),
                };
                let input = match frame {
                    Ok(Frame::Input(b)) => Input::Data(b),
                    Ok(Frame::Resize(s)) => Input::Resize(s),
                    Ok(Frame::Alive) => continue,
                    Err(r) => break Err(Early::Refused(close_code::POLICY, r.to_string())),
                };
                // A terminal that takes no more input holds the front back; one whose
                // run ended takes nothing (its result comes next).
                tokio::select! {
                    _ = in_tx.send(input) => {}
                    r = &mut going => break Ok(r),
                }
            },
        }
    };
    // An early end abandons the run here (on linux its terminal hangs up).
    drop(going);
    node.leases.run_ended(&container, lease);
    let (msg, code, reason) = match ended {
        Ok(Ok(result)) => {
            let why = format!("exit {}", result.exit_code);
            (line(&RunLine::Result(result)), close_code::NORMAL, why)
        }
        Ok(Err(e)) => {
            let why = e.to_string();
            (line(&RunLine::Error(e.into())), close_code::NORMAL, why)
        }
        Err(Early::Gone(why)) => {
            // Nobody to tell: the run is abandoned (its future dropped above).
            tracing::warn!(target: "stockade::node", key, container, reason = %why, "a terminal session ended before its run: the run is abandoned");
            writer.abort();
            return;
        }
        Err(Early::Refused(code, why)) => {
            tracing::warn!(target: "stockade::node", key, container, reason = %why, "a terminal session refused a frame: the run is abandoned");
            let e = WireError::from(SubstrateError::Invalid(format!("run-pty: {why}")));
            (line(&RunLine::Error(e)), code, why)
        }
    };
    tracing::info!(target: "stockade::node", key, container, outcome = %reason, "a terminal session ended");
    let _ = last_tx.send((msg, code, reason));
    // The writer sends the last line and the close, or gives up on a front that does
    // not read.
    let _ = tokio::time::timeout(Duration::from_secs(30), writer).await;
}

/// Why a message could not be read: over the bound (1009), or the front gone.
fn unreadable(e: axum::Error) -> Early {
    use tokio_tungstenite::tungstenite::Error as WsError;
    let inner = e.into_inner();
    match inner.downcast_ref::<WsError>() {
        Some(WsError::Capacity(c)) => Early::Refused(
            close_code::SIZE,
            format!("a message over the bound ({MAX_READ} bytes): {c}"),
        ),
        _ => Early::Gone(format!("the link broke: {inner}")),
    }
}

/// `GET /node/v1/run-pty` (docs/NODE.md "Terminals", this module): the head (base64
/// JSON in its header) checked as a `run`'s body — signature (401), key and head (400),
/// owner (403), a WebSocket upgrade (400) — before the upgrade; then the session.
pub(super) async fn upgrade(
    State(node): State<Arc<Node>>,
    Path(call): Path<String>,
    headers: HeaderMap,
    ws: Result<
        axum::extract::ws::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Response {
    if call != call::RUN_PTY {
        let r = Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid",
            format!("no call {call:?} with GET (only run-pty)"),
        );
        return refused(&call, "", &r);
    }
    let path = PATH;
    let key_of = |h: &HeaderMap| header_str(h, auth::KEY_HEADER).unwrap_or("").to_owned();
    let encoded = header_str(&headers, HEAD_HEADER).unwrap_or("");
    if encoded.len() > MAX_HEAD.div_ceil(3) * 4 {
        let r = Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid",
            format!("the head is longer than {} bytes", MAX_HEAD),
        );
        return refused(call::RUN_PTY, &key_of(&headers), &r);
    }
    let body = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_default();
    let (key, _) = match verify_as(&node, &headers, "GET", path, &body) {
        Ok(k) => k,
        Err(r) => return refused(call::RUN_PTY, &key_of(&headers), &r),
    };
    let signature = header_str(&headers, auth::SIGNATURE_HEADER)
        .unwrap_or("")
        .to_owned();
    if let Err(e) = stockade_grammar::names::key(&key) {
        return refused(call::RUN_PTY, &key, &Refusal::invalid(e.to_string()));
    }
    let head: Head = match parse(&body) {
        Ok(h) => h,
        Err(r) => return refused(call::RUN_PTY, &key, &r),
    };
    if let Err(r) = own(&node, &head.container, &key) {
        return refused(call::RUN_PTY, &key, &r);
    }
    let checked = check_cmd(&head.cmd)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            if head.cmd.stdin.is_empty() {
                Ok(())
            } else {
                Err("a terminal's input is the terminal: no stdin".to_owned())
            }
        })
        .and_then(|()| {
            if head.timeout_ms == 0 || head.timeout_ms > MAX_RUN_TIMEOUT_MS {
                Err(format!("timeout_ms must be 1..={MAX_RUN_TIMEOUT_MS}"))
            } else {
                Ok(())
            }
        })
        .and_then(|()| Size::new(head.rows, head.cols).map(|_| ()));
    if let Err(why) = checked {
        return refused(call::RUN_PTY, &key, &Refusal::invalid(why));
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            let r = Refusal::invalid(format!("run-pty is a WebSocket upgrade: {e}"));
            return refused(call::RUN_PTY, &key, &r);
        }
    };
    ws.max_message_size(MAX_READ)
        .max_frame_size(MAX_READ)
        .on_upgrade(move |socket| session(node, key, head, signature, socket))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseEvent;
    use std::sync::atomic::Ordering;
    use stockade_node_protocol::auth::{self, Signed};
    use stockade_runtime::substrate::Substrate as _;
    use stockade_runtime::substrate::pty::echo::Echo;
    use tokio_tungstenite::tungstenite::Message as WsMessage;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

    /// A node over an echoing substrate, served on loopback (plain TCP: the pinned TLS
    /// is the client's test); its address, the node, the substrate and a guard that
    /// ends it.
    struct Served {
        addr: std::net::SocketAddr,
        node: Arc<Node>,
        echo: Arc<Echo>,
        dir: std::path::PathBuf,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    }

    impl Drop for Served {
        fn drop(&mut self) {
            for t in &self.tasks {
                t.abort();
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    async fn served(lease_grace: Duration) -> Served {
        let dir = std::env::temp_dir().join(format!("stockade-node-pty-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Arc::new(stockade_store::Store::open_in(&dir).expect("a store"));
        let echo = Echo::new();
        let node = Node::new(
            "node-1",
            echo.clone(),
            store.clone(),
            stockade_egress::secrets::Secrets::new(store, Default::default()),
            SECRET.to_vec(),
            crate::state::Settings {
                ceiling: 4,
                lease_grace,
                heartbeat: Duration::from_millis(100),
                max_body: 1024,
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = crate::router(node.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let leases = crate::lease::spawn(node.leases.clone(), echo.clone());
        Served {
            addr,
            node,
            echo,
            dir,
            tasks: vec![server, leases],
        }
    }

    impl Served {
        /// `key`'s container, ensured through the substrate and owned by the key.
        async fn container(&self, key: &str) -> String {
            let c = self.echo.ensure(key).await.unwrap();
            self.node.owners().record(&c, key);
            c
        }

        /// Open a session as a front does; `tamper` changes the request first.
        async fn open(
            &self,
            key: &str,
            head: &serde_json::Value,
            tamper: impl FnOnce(&mut axum::http::HeaderMap),
        ) -> Result<(Ws, String), (u16, String)> {
            let body = serde_json::to_vec(head).unwrap();
            let (time, nonce) = (now_ms(), auth::nonce());
            let signature = Signed {
                time_ms: time,
                nonce: &nonce,
                method: "GET",
                path: PATH,
                key,
                idempotency: "",
                body: &body,
            }
            .sign(SECRET);
            let mut req = format!("ws://{}{PATH}", self.addr)
                .into_client_request()
                .unwrap();
            let h = req.headers_mut();
            h.insert(auth::TIME_HEADER, time.to_string().parse().unwrap());
            h.insert(auth::NONCE_HEADER, nonce.parse().unwrap());
            h.insert(auth::KEY_HEADER, key.parse().unwrap());
            h.insert(auth::SIGNATURE_HEADER, signature.parse().unwrap());
            use base64::Engine as _;
            h.insert(
                HEAD_HEADER,
                base64::engine::general_purpose::STANDARD
                    .encode(&body)
                    .parse()
                    .unwrap(),
            );
            tamper(h);
            let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
            match tokio_tungstenite::client_async(req, tcp).await {
                Ok((ws, _)) => Ok((ws, signature)),
                Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err((
                    r.status().as_u16(),
                    String::from_utf8_lossy(&r.into_body().unwrap_or_default()).into_owned(),
                )),
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn head(container: &str, argv: &[&str]) -> serde_json::Value {
        serde_json::json!({
            "container": container,
            "cmd": {"argv": argv, "cwd": "/workspace", "env": []},
            "timeout_ms": 10_000,
            "rows": 24,
            "cols": 80,
        })
    }

    /// What the node sends until it closes: output, lines (heartbeats left out), the
    /// close code.
    async fn to_the_end(ws: &mut Ws) -> (Vec<u8>, Vec<RunLine>, Option<u16>) {
        let (mut out, mut lines) = (Vec::new(), Vec::new());
        let read = async {
            while let Some(Ok(m)) = ws.next().await {
                match m {
                    WsMessage::Binary(b) => out.extend_from_slice(&b),
                    WsMessage::Text(t) => {
                        let l: RunLine = serde_json::from_str(t.as_str()).unwrap();
                        if !matches!(l, RunLine::Heartbeat(_)) {
                            lines.push(l);
                        }
                    }
                    WsMessage::Close(c) => return c.map(|c| u16::from(c.code)),
                    _ => {}
                }
            }
            None
        };
        let code = tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the node closes the session");
        (out, lines, code)
    }

    /// Output until `want` was seen.
    async fn until(ws: &mut Ws, want: &str) -> String {
        let mut seen = String::new();
        let read = async {
            while let Some(Ok(m)) = ws.next().await {
                if let WsMessage::Binary(b) = m {
                    seen.push_str(&String::from_utf8_lossy(&b));
                    if seen.contains(want) {
                        return;
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .unwrap_or_else(|_| panic!("no {want:?} in {seen:?}"));
        seen
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminal_over_the_node_carries_bytes_resizes_and_the_result() {
        let s = served(Duration::from_secs(30)).await;
        let c = s.container("k-pty").await;
        let (mut ws, sig) = s.open("k-pty", &head(&c, &["sh"]), |_| {}).await.unwrap();
        until(&mut ws, "ready 24x80 sh").await;
        let mut seal = Sealer::new(SECRET, &sig);
        for f in seal.input(b"typed") {
            ws.send(WsMessage::Binary(f)).await.unwrap();
        }
        until(&mut ws, "typed").await;
        let f = seal.resize(Size {
            rows: 40,
            cols: 120,
        });
        ws.send(WsMessage::Binary(f)).await.unwrap();
        until(&mut ws, "size 40x120").await;
        for f in seal.input(b"\x04") {
            ws.send(WsMessage::Binary(f)).await.unwrap();
        }
        let (_, lines, code) = to_the_end(&mut ws).await;
        assert!(
            matches!(&lines[..], [RunLine::Result(r)] if r.exit_code == 0),
            "{lines:?}"
        );
        assert_eq!(code, Some(1000));
        assert_eq!(s.echo.abandoned.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_is_refused_before_its_upgrade_and_nothing_runs() {
        let s = served(Duration::from_secs(30)).await;
        let mine = s.container("k-mine").await;
        let theirs = s.container("k-theirs").await;
        let mut h = head(&mine, &["sh"]);
        h["rows"] = 0.into();
        let mut stdin = head(&mine, &["sh"]);
        stdin["cmd"]["stdin"] = "eA==".into();
        let mut unknown = head(&mine, &["sh"]);
        unknown["signal"] = 9.into();
        type Tamper = Box<dyn FnOnce(&mut axum::http::HeaderMap)>;
        let none = || -> Tamper { Box::new(|_| {}) };
        let rows: Vec<(&str, serde_json::Value, Tamper, u16)> = vec![
            (
                "another key's container",
                head(&theirs, &["sh"]),
                none(),
                403,
            ),
            (
                "a container no key was answered",
                head("guessed", &["sh"]),
                none(),
                403,
            ),
            (
                "a head other than the signed one",
                head(&mine, &["sh"]),
                Box::new(|h: &mut axum::http::HeaderMap| {
                    use base64::Engine as _;
                    let other = serde_json::to_vec(&head("x", &["rm", "-rf", "/"])).unwrap();
                    let v = base64::engine::general_purpose::STANDARD.encode(other);
                    h.insert(HEAD_HEADER, v.parse().unwrap());
                }),
                401,
            ),
            (
                "another key than the signed one",
                head(&mine, &["sh"]),
                Box::new(|h: &mut axum::http::HeaderMap| {
                    h.insert(auth::KEY_HEADER, "k-theirs".parse().unwrap());
                }),
                401,
            ),
            ("a zero size", h, none(), 400),
            ("a stdin", stdin, none(), 400),
            ("an unknown field", unknown, none(), 400),
            ("no argv", head(&mine, &[]), none(), 400),
        ];
        for (what, head, tamper, want) in rows {
            let got = s.open("k-mine", &head, tamper).await;
            match got {
                Err((status, body)) => {
                    assert_eq!(status, want, "{what}: {body}");
                    assert!(body.contains("\"error\""), "{what}: {body}");
                }
                Ok(_) => panic!("{what}: upgraded"),
            }
        }
        // A signed request that is no upgrade: 400.
        let r = reqwest_free_get(s.addr).await;
        assert!(r.starts_with("HTTP/1.1 4"), "{r}");
        assert_eq!(s.echo.started.load(Ordering::SeqCst), 0, "nothing ran");
    }

    /// A plain GET of the path (no upgrade, no signature): the node's first line.
    async fn reqwest_free_get(addr: std::net::SocketAddr) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut t = tokio::net::TcpStream::connect(addr).await.unwrap();
        t.write_all(
            format!("GET {PATH} HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut b = Vec::new();
        let _ = t.read_to_end(&mut b).await;
        String::from_utf8_lossy(&b).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_frame_gets_a_typed_close_and_the_run_is_abandoned() {
        let s = served(Duration::from_secs(30)).await;
        let c = s.container("k-bad").await;
        type Frames = Box<dyn Fn(&str) -> Vec<WsMessage>>;
        let rows: Vec<(&str, Frames, u16)> = vec![
            (
                "a text message",
                Box::new(|_: &str| vec![WsMessage::text(r#"{"type":"resize"}"#)]),
                1008,
            ),
            (
                "another session's frame",
                Box::new(|_: &str| vec![WsMessage::Binary(Sealer::new(SECRET, "other").alive())]),
                1008,
            ),
            (
                "a repeated frame",
                Box::new(|sig: &str| {
                    let f = Sealer::new(SECRET, sig).alive();
                    vec![WsMessage::Binary(f.clone()), WsMessage::Binary(f)]
                }),
                1008,
            ),
            (
                "an unknown kind",
                Box::new(|sig: &str| {
                    vec![WsMessage::Binary(Sealer::new(SECRET, sig).seal(7, b""))]
                }),
                1008,
            ),
            (
                "a huge resize",
                Box::new(|sig: &str| {
                    vec![WsMessage::Binary(
                        Sealer::new(SECRET, sig).seal(1, &[0xff, 0xff, 0xff, 0xff]),
                    )]
                }),
                1008,
            ),
            (
                "a message over the bound",
                Box::new(|_: &str| {
                    vec![WsMessage::Binary(Bytes::from(vec![0u8; MAX_MESSAGE + 1]))]
                }),
                1009,
            ),
        ];
        for (i, (what, frames, want)) in rows.into_iter().enumerate() {
            let (mut ws, sig) = s.open("k-bad", &head(&c, &["sh"]), |_| {}).await.unwrap();
            until(&mut ws, "ready").await;
            for f in frames(&sig) {
                let _ = ws.send(f).await;
            }
            let (_, lines, code) = to_the_end(&mut ws).await;
            assert_eq!(code, Some(want), "{what}");
            assert!(
                matches!(&lines[..], [RunLine::Error(e)] if e.kind == "invalid"),
                "{what}: {lines:?}"
            );
            assert_eq!(
                s.echo.abandoned.load(Ordering::SeqCst),
                i as u32 + 1,
                "{what}: the run is abandoned"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_front_gone_abandons_the_run_and_the_lease_kills_its_tree() {
        let s = served(Duration::from_millis(300)).await;
        let c = s.container("k-gone").await;
        let grant = stockade_egress::rules::Grant::parse(&[]).unwrap();
        s.echo.apply_grant(&c, "f1", grant).await.unwrap();
        s.node.leases.on(&c, LeaseEvent::Applied);
        // The front closes its socket mid-run (no close frame: the link just ends).
        let (mut ws, _) = s
            .open("k-gone", &head(&c, &["sleep", "1000"]), |_| {})
            .await
            .unwrap();
        until(&mut ws, "ready").await;
        let gone = s.echo.gone.notified();
        drop(ws);
        tokio::time::timeout(Duration::from_secs(5), gone)
            .await
            .expect("the run is abandoned");
        // The grant's lease falls back to the grace: it kills the tree and revokes.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !s.echo.mock.ops().contains(&"kill-all") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                s.echo.mock.ops()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ops = s.echo.mock.ops();
        let kill = ops.iter().position(|o| *o == "kill-all").unwrap();
        assert!(
            ops[kill..].contains(&"revoke-grant"),
            "killed, then revoked: {ops:?}"
        );
        // A front that stays connected but says nothing (a dead link): the same after
        // LINK_SILENCE.
        let (mut ws, _) = s.open("k-gone", &head(&c, &["sh"]), |_| {}).await.unwrap();
        until(&mut ws, "ready").await;
        let t0 = tokio::time::Instant::now();
        let (_, lines, _) = to_the_end(&mut ws).await;
        assert!(lines.is_empty(), "nobody to tell: {lines:?}");
        assert!(t0.elapsed() >= LINK_SILENCE - Duration::from_millis(200));
        assert_eq!(s.echo.abandoned.load(Ordering::SeqCst), 2);
    }

    /// The vector edge/test/pty.test.mjs checks the edge's sealer against (computed
    /// from docs/NODE.md's formula with an independent HMAC).
    #[test]
    fn a_sealed_frame_is_the_documented_vector() {
        let mut s = Sealer::new(SECRET, &"ab".repeat(32));
        let hex = |b: Bytes| auth::hex(&b);
        assert_eq!(
            hex(s.input(b"ls\n").remove(0)),
            "006c730aa9ba02a087f8dd648bd5f34366f0aa5ec664c2ff57eb60b7a357cbbd22ee9616"
        );
        assert_eq!(
            hex(s.resize(Size {
                rows: 40,
                cols: 120
            })),
            "0100280078afe14beda25b64e9ea4aefce72516972438eb5e59814d31d8aeef672f59e7b6b"
        );
        assert_eq!(
            hex(s.alive()),
            "02d0dd9271b5da0c1f412eea0ab29e61a7019514f2d61ffd397a89c3175262696b"
        );
    }

    #[test]
    fn frames_are_bound_to_their_session_their_place_and_their_kind() {
        let mut s = Sealer::new(SECRET, "sig-a");
        let input = s.input(b"ls\n").remove(0);
        let resize = s.resize(Size {
            rows: 40,
            cols: 120,
        });
        let alive = s.alive();
        let mut o = Opener::new(SECRET, "sig-a");
        assert_eq!(
            o.open(&input),
            Ok(Frame::Input(Bytes::from_static(b"ls\n")))
        );
        assert_eq!(
            o.open(&resize),
            Ok(Frame::Resize(Size {
                rows: 40,
                cols: 120
            }))
        );
        assert_eq!(o.open(&alive), Ok(Frame::Alive));
        // Another session's frame, a repeated one, an altered one, a reordered one.
        let other = Sealer::new(SECRET, "sig-b").alive();
        let rows: Vec<(&str, Vec<Bytes>, Refused)> = vec![
            ("another session's", vec![other], Refused::BadTag(0)),
            (
                "repeated",
                vec![input.clone(), input.clone()],
                Refused::BadTag(1),
            ),
            (
                "altered",
                vec![{
                    let mut b = input.to_vec();
                    b[1] ^= 1;
                    Bytes::from(b)
                }],
                Refused::BadTag(0),
            ),
            (
                "reordered",
                vec![resize.clone(), input.clone()],
                Refused::BadTag(0),
            ),
            (
                "cut short",
                vec![Bytes::from_static(b"\x02abc")],
                Refused::TooShort(4),
            ),
        ];
        for (what, frames, want) in rows {
            let mut o = Opener::new(SECRET, "sig-a");
            let got = frames.iter().map(|f| o.open(f)).find_map(Result::err);
            assert_eq!(got, Some(want), "{what}");
        }
        // Payloads their kind does not take, each well tagged.
        let bad: Vec<(&str, u8, Vec<u8>)> = vec![
            ("empty input", INPUT, vec![]),
            ("input over the bound", INPUT, vec![b'a'; MAX_INPUT + 1]),
            ("a zero resize", RESIZE, vec![0, 0, 0, 80]),
            ("a huge resize", RESIZE, vec![0xff, 0xff, 0, 80]),
            ("a short resize", RESIZE, vec![0, 24]),
            ("an alive with a payload", ALIVE, vec![1]),
            ("an unknown kind", 9, vec![]),
        ];
        for (what, kind, payload) in bad {
            let f = Sealer::new(SECRET, "s").seal(kind, &payload);
            let r = Opener::new(SECRET, "s").open(&f);
            assert!(
                matches!(
                    r,
                    Err(Refused::BadPayload { .. } | Refused::UnknownKind { .. })
                ),
                "{what}: {r:?}"
            );
        }
        // Input over a frame's bound goes as several frames.
        let big = vec![b'x'; MAX_INPUT * 2 + 1];
        assert_eq!(Sealer::new(SECRET, "s").input(&big).len(), 3);
    }
}
