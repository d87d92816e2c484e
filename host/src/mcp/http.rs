//! `/mcp` on the API listener: the protocol over Streamable HTTP (revision
//! 2025-11-25; the older revisions the handshake knows are answered the same way).
//!
//! * **POST** carries one JSON-RPC message. A request is answered as
//!   `application/json`, except a `tools/call` of `exec` whose caller sent a
//!   `progressToken`: that one is a `text/event-stream` of `notifications/progress`
//!   (each chunk of the command's output as it is written, through the live-output
//!   route) and then the response. A notification or a response is a 202.
//! * **GET** (a server-initiated stream) is a 405: Stockade never speaks first (no
//!   list changes, no sampling, no elicitation), so there is nothing to stream.
//! * **DELETE** ends the session.
//! * **`notifications/cancelled`** ends the session's request it names, if it runs:
//!   its call is dropped (an exec is killed, as when its caller leaves) and it answers
//!   error -32800, which the client ignores. Another session cannot cancel it.
//!
//! Checked on every request, in this order, before anything is parsed: the `Origin`
//! (absent, or this server's own loopback origin on its port, or one configured in
//! `api.mcp_origins`; anything else a 403, the DNS-rebinding defence), the consumer's
//! bearer token (missing or wrong, the approver's included: 401, as every consumer
//! route answers). Then the session: `initialize` opens one (its id two UUIDv4s, 244
//! bits from the OS CSPRNG) bound to the token that opened it; every other message
//! names it in `Mcp-Session-Id` (missing: 400; unknown, expired, ended, or opened by
//! another token: 404, alike) and, if it sends `MCP-Protocol-Version`, a revision this
//! server speaks (else 400). Sessions are bounded ([`super::session`]).
//!
//! Each tool call is made as a client of this very server, over loopback, with the
//! caller's own token (`stockade-client`, as `stockade mcp` does): the API's routes
//! make every check, and a caller that disconnects drops the call, which the API sees
//! as its client leaving (an exec is killed and its fence torn down).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use stockade_client::Client;

use super::protocol::{self, PROTOCOL_VERSIONS, rpc_error};
use super::session::{self, Sessions};

/// The session header.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// The revision header.
pub const VERSION_HEADER: &str = "mcp-protocol-version";

/// What `/mcp` shares.
pub struct McpHttp {
    /// This server's API, over loopback (`http://127.0.0.1:PORT`).
    api: String,
    /// The port this server listens on (its own origins are on it).
    port: u16,
    /// The operator's bearer token.
    token: String,
    /// The scoped consumer tokens: each may use `/mcp`, whose tools call the API with
    /// it, so each sees only its own keys there (docs/TENANTS.md).
    tenants: std::sync::OnceLock<Arc<crate::tenants::Tenants>>,
    /// Origins allowed beyond this server's own (`api.mcp_origins`), normalized.
    origins: Vec<String>,
    sessions: Mutex<Sessions>,
    /// The requests running now, by (session, JSON-RPC id): how to cancel each.
    inflight: Mutex<HashMap<(String, String), tokio::sync::oneshot::Sender<()>>>,
    tools: Value,
}

impl McpHttp {
    /// `/mcp` of the server listening on `local`, taking `token`, allowing `origins`
    /// beyond its own.
    pub fn new(local: SocketAddr, token: String, origins: &[String]) -> Arc<Self> {
        Self::with_limits(local, token, origins, session::MAX_SESSIONS, session::IDLE)
    }

    /// As [`McpHttp::new`], with the session table's bounds.
    pub fn with_limits(
        local: SocketAddr,
        token: String,
        origins: &[String],
        max_sessions: usize,
        idle: Duration,
    ) -> Arc<Self> {
        let ip = match local.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
            ip if ip.is_unspecified() => "[::1]".to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            ip => ip.to_string(),
        };
        Arc::new(Self {
            api: format!("http://{ip}:{}", local.port()),
            port: local.port(),
            token,
            tenants: std::sync::OnceLock::new(),
            origins: origins.iter().map(|o| normalize(o)).collect(),
            sessions: Mutex::new(Sessions::new(max_sessions, idle)),
            inflight: Mutex::new(HashMap::new()),
            tools: super::tools::tools(),
        })
    }

    /// This `/mcp` also takes the scoped tokens of `tenants`.
    pub fn with_tenants(self: Arc<Self>, tenants: Arc<crate::tenants::Tenants>) -> Arc<Self> {
        let _ = self.tenants.set(tenants);
        self
    }

    /// Is `t` a consumer's token: the operator's, or a live scoped one?
    fn consumer(&self, t: &str) -> bool {
        crate::compare::same(t.as_bytes(), self.token.as_bytes())
            || self.tenants.get().is_some_and(|ts| ts.verify(t).is_some())
    }

    fn inflight(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), tokio::sync::oneshot::Sender<()>>>
    {
        self.inflight.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        // A panic while holding it leaves a table that is still consistent.
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The `/mcp` route, with its own checks (it is merged beside the API's router, whose
/// auth layer it does not need: it checks the same consumer token itself).
pub fn router(m: Arc<McpHttp>, max_body_bytes: usize) -> Router {
    Router::new()
        .route(
            "/mcp",
            post(post_mcp)
                .get(get_mcp)
                .delete(delete_mcp)
                .fallback(other_method),
        )
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(m)
}

/// An origin as compared: lowercase, no trailing slash.
fn normalize(o: &str) -> String {
    o.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Is a request with this `Origin` header allowed (pure)? Absent: yes (not a
/// browser). Present: only this server's own loopback origin on its port, or one
/// configured. A page on any other origin (a rebinding `http://evil.example:PORT`,
/// `null`) is refused even if its name resolves to this machine.
pub fn origin_allowed(origin: Option<&str>, port: u16, configured: &[String]) -> bool {
    let Some(o) = origin else {
        return true;
    };
    let o = normalize(o);
    if configured.contains(&o) {
        return true;
    }
    let Some(rest) = o
        .strip_prefix("http://")
        .or_else(|| o.strip_prefix("https://"))
    else {
        return false;
    };
    ["localhost", "127.0.0.1", "[::1]"]
        .iter()
        .any(|h| rest == format!("{h}:{port}"))
}

/// Why a request was refused before it reached the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `Origin` not allowed: 403.
    Origin,
    /// Token missing or wrong: 401.
    Token,
    /// `Mcp-Session-Id` missing on a non-initialize message: 400.
    NoSession,
    /// Session unknown, expired, ended or another token's: 404.
    UnknownSession,
    /// `MCP-Protocol-Version` not one this server speaks: 400.
    Version,
    /// `Accept` lacks `application/json` or `text/event-stream`: 406.
    Accept,
    /// The body is not `application/json`: 415.
    ContentType,
    /// Not one JSON-RPC message (unparsable, a batch): 400.
    Message,
    /// The body is too large: 413.
    TooLarge,
}

impl Refusal {
    fn status(self) -> StatusCode {
        match self {
            Refusal::Origin => StatusCode::FORBIDDEN,
            Refusal::Token => StatusCode::UNAUTHORIZED,
            Refusal::NoSession | Refusal::Version | Refusal::Message => StatusCode::BAD_REQUEST,
            Refusal::UnknownSession => StatusCode::NOT_FOUND,
            Refusal::Accept => StatusCode::NOT_ACCEPTABLE,
            Refusal::ContentType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Refusal::Origin => "origin",
            Refusal::Token => "token",
            Refusal::NoSession => "no-session",
            Refusal::UnknownSession => "unknown-session",
            Refusal::Version => "protocol-version",
            Refusal::Accept => "accept",
            Refusal::ContentType => "content-type",
            Refusal::Message => "message",
            Refusal::TooLarge => "too-large",
        }
    }

    /// The answer: the status and a JSON-RPC error saying why (one log line).
    fn answer(self, message: impl Into<String>) -> Response {
        let message = message.into();
        if matches!(self, Refusal::Origin | Refusal::Token) {
            // Before the token: anyone on the network can cause these, so they are
            // not logged at the level a flood of them would fill a disk with.
            tracing::debug!(target: "stockade::mcp", decision = "refused", reason = self.reason(), %message, "mcp http");
        } else {
            tracing::info!(target: "stockade::mcp", decision = "refused", reason = self.reason(), %message, "mcp http");
        }
        let code = match self {
            Refusal::Message => -32600,
            _ => -32000,
        };
        let mut r = (
            self.status(),
            axum::Json(rpc_error(Value::Null, code, message)),
        )
            .into_response();
        if self == Refusal::Token {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

fn header_str(h: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A refusal and its message, answered by [`Refusal::answer`].
type Refused = (Refusal, String);

/// The Origin and the token, on every method; the caller's token when both pass.
fn admit(m: &McpHttp, h: &HeaderMap) -> Result<String, Refused> {
    let origin = h.get(header::ORIGIN).map(|v| v.to_str().unwrap_or("\u{0}"));
    if !origin_allowed(origin, m.port, &m.origins) {
        return Err((
            Refusal::Origin,
            "this Origin may not use this server".into(),
        ));
    }
    let presented = header_str(h, header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(t) if m.consumer(t) => Ok(t.to_string()),
        _ => Err((Refusal::Token, "missing or wrong bearer token".into())),
    }
}

/// The session a non-initialize request names, and its revision.
fn session(m: &McpHttp, h: &HeaderMap, token: &str) -> Result<(String, &'static str), Refused> {
    let Some(id) = header_str(h, SESSION_HEADER) else {
        return Err((
            Refusal::NoSession,
            "Mcp-Session-Id is required (initialize first)".into(),
        ));
    };
    let Some(version) = m.sessions().touch(id, token, Instant::now()) else {
        return Err((
            Refusal::UnknownSession,
            "no such session (initialize again)".into(),
        ));
    };
    match header_str(h, VERSION_HEADER) {
        // A revision this server does not speak is refused. One it speaks but the
        // session did not negotiate is taken, as the reference SDKs and the
        // conformance suite do: the revisions frame messages alike here.
        Some(v) if !PROTOCOL_VERSIONS.contains(&v) => Err((
            Refusal::Version,
            format!(
                "MCP-Protocol-Version {v:?}: this server speaks {}",
                PROTOCOL_VERSIONS.join(", ")
            ),
        )),
        _ => Ok((id.to_string(), version)),
    }
}

/// Does `Accept` take both answers a POST may get (pure)?
fn accepts_both(accept: Option<&str>) -> bool {
    let Some(a) = accept else {
        return false;
    };
    let types: Vec<String> = a
        .split(',')
        .map(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    let has = |t: &str| types.iter().any(|x| x == t || x == "*/*");
    has("application/json") && has("text/event-stream")
}

async fn post_mcp(
    State(m): State<Arc<McpHttp>>,
    h: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let token = match admit(&m, &h) {
        Ok(t) => t,
        Err((r, message)) => return r.answer(message),
    };
    if !accepts_both(header_str(&h, header::ACCEPT)) {
        return Refusal::Accept.answer("Accept must list application/json and text/event-stream");
    }
    if !header_str(&h, header::CONTENT_TYPE).is_some_and(|c| {
        c.trim()
            .to_ascii_lowercase()
            .starts_with("application/json")
    }) {
        return Refusal::ContentType.answer("the body must be application/json");
    }
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Refusal::TooLarge.answer(e.body_text());
        }
        Err(e) => return Refusal::Message.answer(e.body_text()),
    };
    let msg: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(Value::Array(_)) => {
            return Refusal::Message.answer("one JSON-RPC message per POST (no batches)");
        }
        Ok(_) => return Refusal::Message.answer("a JSON-RPC message is an object"),
        Err(e) => {
            let mut r = Refusal::Message.answer(format!("parse error: {e}"));
            *r.body_mut() = Body::from(
                serde_json::to_vec(&rpc_error(Value::Null, -32700, format!("parse error: {e}")))
                    .unwrap_or_default(),
            );
            return r;
        }
    };
    let client = match Client::new(&m.api, token.clone()) {
        Ok(c) => c,
        Err(e) => return Refusal::Message.answer(e.to_string()),
    };
    if msg["method"] == "initialize" {
        return initialize(&m, &client, &token, msg).await;
    }
    let (id, _version) = match session(&m, &h, &token) {
        Ok(s) => s,
        Err((r, message)) => return r.answer(message),
    };
    if msg["method"] == "notifications/cancelled" {
        cancel(&m, &id, &msg["params"]["requestId"]);
    }
    if msg.get("id").is_none() || msg.get("method").is_none() {
        // A notification, or a response to a request we never send: accepted.
        return StatusCode::ACCEPTED.into_response();
    }
    let progress = progress_token(&msg);
    tracing::debug!(target: "stockade::mcp", session = %short(&id), method = %msg["method"], progress = progress.is_some(), "mcp http request");
    let running = Running::start(&m, id, &msg["id"]);
    let rpc_id = msg["id"].clone();
    match progress {
        Some(p) if msg["method"] == "tools/call" && msg["params"]["name"] == "exec" => {
            sse(m, client, msg, p, running)
        }
        _ => {
            let work = protocol::handle_value(&client, &m.tools, msg, None);
            match running.unless_cancelled(work).await {
                Some(Some(resp)) => axum::Json(resp).into_response(),
                Some(None) => StatusCode::ACCEPTED.into_response(),
                None => axum::Json(cancelled(rpc_id)).into_response(),
            }
        }
    }
}

/// The answer to a request its client cancelled (the client ignores it).
fn cancelled(id: Value) -> Value {
    rpc_error(id, -32800, "request cancelled")
}

/// `notifications/cancelled`: end the session's request `request_id` if it runs.
/// Dropping its call drops its loopback call, which the API sees as its client
/// leaving (an exec is killed and its fence torn down).
fn cancel(m: &McpHttp, session: &str, request_id: &Value) {
    let key = (session.to_string(), request_id.to_string());
    if let Some(tx) = m.inflight().remove(&key) {
        let _ = tx.send(());
        tracing::info!(target: "stockade::mcp", decision = "cancelled", session = %short(session), request = %request_id, "mcp http");
    }
}

/// A request running now: registered so `notifications/cancelled` finds it, and
/// forgotten when it ends (this is dropped with the call, however it ends).
struct Running {
    m: Arc<McpHttp>,
    key: (String, String),
    cancelled: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Running {
    fn start(m: &Arc<McpHttp>, session: String, id: &Value) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let key = (session, id.to_string());
        // A client reusing a running request's id replaces it as the one cancellable.
        m.inflight().insert(key.clone(), tx);
        Running {
            m: m.clone(),
            key,
            cancelled: Some(rx),
        }
    }

    /// `work`'s result, or `None` if the client cancelled it first (then `work` is
    /// dropped).
    async fn unless_cancelled<T>(
        mut self,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let rx = self.cancelled.take()?;
        tokio::select! {
            r = work => Some(r),
            Ok(()) = rx => None,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Ours closes now, whether or not the call ever ran.
        drop(self.cancelled.take());
        let mut inflight = self.m.inflight();
        // Only this request's entry (a reused id may have replaced it).
        if inflight.get(&self.key).is_some_and(|tx| tx.is_closed()) {
            inflight.remove(&self.key);
        }
    }
}

/// The first characters of a session id, for logs (never the whole id: it is a
/// bearer capability next to the token).
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// `initialize`: answered by the protocol; a success opens a session.
async fn initialize(m: &McpHttp, client: &Client, token: &str, msg: Value) -> Response {
    let Some(resp) = protocol::handle_value(client, &m.tools, msg, None).await else {
        return Refusal::Message.answer("initialize is a request (it needs an id)");
    };
    let Some(version) = resp["result"]["protocolVersion"]
        .as_str()
        .and_then(|v| PROTOCOL_VERSIONS.iter().find(|k| **k == v).copied())
    else {
        return axum::Json(resp).into_response();
    };
    let id = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let opened = m
        .sessions()
        .open(id.clone(), token, version, Instant::now());
    tracing::info!(target: "stockade::mcp", decision = "session-opened", session = %short(&id), version, expired = opened.expired, evicted = opened.evicted.as_deref().map(short), "mcp http");
    let mut r = axum::Json(resp).into_response();
    if let Ok(v) = HeaderValue::from_str(&id) {
        r.headers_mut().insert(SESSION_HEADER, v);
    }
    r
}

/// The caller's `params._meta.progressToken` (a string or an integer), if any.
fn progress_token(msg: &Value) -> Option<Value> {
    let t = &msg["params"]["_meta"]["progressToken"];
    (t.is_string() || t.is_i64() || t.is_u64()).then(|| t.clone())
}

/// One SSE event carrying one JSON-RPC message.
fn event(v: &Value) -> Bytes {
    let mut out = b"event: message\ndata: ".to_vec();
    out.extend(serde_json::to_vec(v).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// A progress notification: the `n`th chunk of output.
fn progress_event(token: &Value, n: u64, chunk: String) -> Bytes {
    event(&json!({
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": { "progressToken": token, "progress": n, "message": chunk },
    }))
}

type Work = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Value>> + Send>>;

/// An exec whose caller asked for progress: an SSE stream of its output as progress
/// notifications, then its response. The call runs inside the response body, so a
/// caller that goes away drops it (and the API ends the run).
fn sse(m: Arc<McpHttp>, client: Client, msg: Value, token: Value, running: Running) -> Response {
    let rpc_id = msg["id"].clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let work: Work = Box::pin(async move {
        let call = protocol::handle_value(&client, &m.tools, msg, Some(tx));
        // A cancelled call ends its stream with the (ignored) cancellation answer.
        running
            .unless_cancelled(call)
            .await
            .unwrap_or_else(|| Some(cancelled(rpc_id)))
    });
    struct Live {
        work: Option<Work>,
        rx: tokio::sync::mpsc::UnboundedReceiver<String>,
        result: Option<Value>,
        token: Value,
        n: u64,
    }
    let live = Live {
        work: Some(work),
        rx,
        result: None,
        token,
        n: 0,
    };
    let events = futures_util::stream::unfold(live, |mut l| async move {
        loop {
            if let Some(w) = l.work.as_mut() {
                tokio::select! {
                    biased;
                    Some(chunk) = l.rx.recv() => {
                        l.n += 1;
                        let ev = progress_event(&l.token, l.n, chunk);
                        return Some((Ok::<_, std::convert::Infallible>(ev), l));
                    }
                    r = w.as_mut() => {
                        l.work = None;
                        l.result = r;
                    }
                }
            } else {
                // The call is over: what it wrote last, then its response.
                if let Ok(chunk) = l.rx.try_recv() {
                    l.n += 1;
                    let ev = progress_event(&l.token, l.n, chunk);
                    return Some((Ok(ev), l));
                }
                let r = l.result.take()?;
                return Some((Ok(event(&r)), l));
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

async fn get_mcp(State(m): State<Arc<McpHttp>>, h: HeaderMap) -> Response {
    if let Err((r, message)) = admit(&m, &h) {
        return r.answer(message);
    }
    not_offered("no server-initiated stream: Stockade never speaks first")
}

async fn other_method(State(m): State<Arc<McpHttp>>, h: HeaderMap) -> Response {
    if let Err((r, message)) = admit(&m, &h) {
        return r.answer(message);
    }
    not_offered("/mcp takes POST and DELETE")
}

fn not_offered(message: &str) -> Response {
    let mut r = (
        StatusCode::METHOD_NOT_ALLOWED,
        axum::Json(rpc_error(Value::Null, -32000, message)),
    )
        .into_response();
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
    r
}

async fn delete_mcp(State(m): State<Arc<McpHttp>>, h: HeaderMap) -> Response {
    let token = match admit(&m, &h) {
        Ok(t) => t,
        Err((r, message)) => return r.answer(message),
    };
    let Some(id) = header_str(&h, SESSION_HEADER) else {
        return Refusal::NoSession.answer("Mcp-Session-Id is required");
    };
    if m.sessions().close(id, &token, Instant::now()) {
        tracing::info!(target: "stockade::mcp", decision = "session-ended", session = %short(id), "mcp http");
        StatusCode::NO_CONTENT.into_response()
    } else {
        Refusal::UnknownSession.answer("no such session")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_servers_own_or_configured_origins_are_allowed() {
        let conf = vec![normalize("https://agent.example.com/")];
        let rows: &[(&str, Option<&str>, bool)] = &[
            ("no Origin: not a browser", None, true),
            ("localhost on our port", Some("http://localhost:8787"), true),
            ("127.0.0.1 on our port", Some("http://127.0.0.1:8787"), true),
            ("[::1] on our port", Some("http://[::1]:8787"), true),
            ("case does not matter", Some("HTTP://LocalHost:8787"), true),
            (
                "a configured origin",
                Some("https://agent.example.com"),
                true,
            ),
            (
                "localhost on another port",
                Some("http://localhost:3000"),
                false,
            ),
            (
                "a rebinding name on our port",
                Some("http://evil.example:8787"),
                false,
            ),
            (
                "a suffix trick",
                Some("http://localhost:8787.evil.example"),
                false,
            ),
            (
                "userinfo trick",
                Some("http://localhost:8787@evil.example"),
                false,
            ),
            ("the null origin", Some("null"), false),
            ("no scheme", Some("localhost:8787"), false),
            (
                "a configured host on another scheme",
                Some("http://agent.example.com"),
                false,
            ),
            ("unreadable bytes", Some("\u{0}"), false),
        ];
        for (sentence, origin, want) in rows {
            assert_eq!(origin_allowed(*origin, 8787, &conf), *want, "{sentence}");
        }
    }

    #[test]
    fn a_post_must_accept_both_answers() {
        let rows: &[(Option<&str>, bool)] = &[
            (Some("application/json, text/event-stream"), true),
            (Some("text/event-stream;q=0.9, application/json"), true),
            (Some("*/*"), true),
            (Some("application/json"), false),
            (Some("text/event-stream"), false),
            (None, false),
        ];
        for (accept, want) in rows {
            assert_eq!(accepts_both(*accept), *want, "{accept:?}");
        }
    }

    #[test]
    fn the_progress_token_is_a_string_or_an_integer() {
        let rows = [
            (
                json!({"params": {"_meta": {"progressToken": "t1"}}}),
                Some(json!("t1")),
            ),
            (
                json!({"params": {"_meta": {"progressToken": 7}}}),
                Some(json!(7)),
            ),
            (json!({"params": {"_meta": {"progressToken": 1.5}}}), None),
            (json!({"params": {"_meta": {"progressToken": {}}}}), None),
            (json!({"params": {}}), None),
        ];
        for (msg, want) in rows {
            assert_eq!(progress_token(&msg), want, "{msg}");
        }
    }

    #[tokio::test]
    async fn a_running_request_is_forgotten_however_it_ends_and_cancelled_only_by_its_session() {
        let m = McpHttp::new("127.0.0.1:1".parse().unwrap(), "t".into(), &[]);
        drop(Running::start(&m, "s".into(), &json!(1)));
        assert!(m.inflight().is_empty(), "dropped before it ran");
        let r = Running::start(&m, "s".into(), &json!(2));
        assert_eq!(r.unless_cancelled(async { 5 }).await, Some(5));
        assert!(m.inflight().is_empty(), "ran to its end");
        let r = Running::start(&m, "s".into(), &json!(3));
        cancel(&m, "s", &json!(3));
        assert_eq!(r.unless_cancelled(std::future::pending::<()>()).await, None);
        assert!(m.inflight().is_empty(), "cancelled");
        let r = Running::start(&m, "s".into(), &json!(4));
        cancel(&m, "other", &json!(4));
        cancel(&m, "s", &json!("4"));
        assert_eq!(
            m.inflight().len(),
            1,
            "another session's, or another id's, cancel"
        );
        drop(r);
        assert!(m.inflight().is_empty());
    }

    #[test]
    fn an_event_is_one_sse_message() {
        let e = event(&json!({"a": "x\ny"}));
        assert_eq!(&e[..], b"event: message\ndata: {\"a\":\"x\\ny\"}\n\n");
    }
}
