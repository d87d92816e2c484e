//! The node's HTTP routes (docs/NODE.md "Calls"): `POST /node/v1/{call}` for every call
//! of [`protocol::call::ALL`], each checked in this order before anything is done:
//!
//! 1. the body is read, bounded (`413` past [`Node::max_body`]; a `run`'s, which
//!    carries its stdin, past [`Node::max_run_body`]: the largest stdin a front
//!    sends, an upload's archive, as base64. Bodies over the plain bound are read
//!    [`BIG_BODIES`] at a time, as their signature cannot be checked before they are
//!    read);
//! 2. the signature, time and nonce ([`auth::verify`], then the shared
//!    [`auth::Nonces`]: a forged request never takes a nonce slot) — `401`;
//! 3. the key: a keyed call needs a well-formed sandbox key — `400`;
//! 4. an idempotency key answered before gets that answer ([`idempotency`]);
//! 5. the body parses (unknown fields refused) — `400`, then the container it names
//!    is the key's ([`owners`]) — `403`. (The container is a body field, so the body
//!    is parsed first; neither step changes anything.)
//!
//! Only then does the call reach the substrate. Every call runs in a task of its own,
//! so a front that goes away mid-call does not cancel it halfway (its retry gets the
//! answer). `run` answers NDJSON ([`RunLine`]s): output as it comes, a heartbeat every
//! [`Node::heartbeat`] without other output, then one `result` or `error` line.
//!
//! One canonical line per refused request (`target: "stockade::node"`, `request
//! refused`, with the call, the key, the status and the reason).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot, watch};

use super::idempotency::{self, Begin, Stored};
use super::lease::{LeaseEvent, Leases};
use super::owners::{Owners, Ownership};
use stockade_egress::secrets::Secrets;
use stockade_node_protocol::auth::{self, Signed};
use stockade_node_protocol::stream;
use stockade_node_protocol::{self as protocol, Answer, RunLine, WireError, call};
use stockade_runtime::substrate::{Command, Output, Substrate, SubstrateError, batch};

/// Nonces held at once (a request rate far above any front's, over twice the window).
pub const NONCES: usize = 100_000;

/// The longest `run` timeout a node takes (a day): past it, `invalid`.
pub const MAX_RUN_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// Everything the routes share.
pub struct Node {
    /// The node's name (`node.name`).
    pub name: String,
    /// The substrate every call goes to.
    pub substrate: Arc<dyn Substrate>,
    /// The ticket gate's ceiling (`substrate.ceiling`), for `health`.
    pub ceiling: u32,
    /// Where `put-secret` and `remove-secret` go (the store the substrate reads).
    pub secrets: Secrets,
    /// The node's store (the egress audit's admitted requests, for `admitted`).
    pub store: Arc<stockade_store::Store>,
    /// The request secret (HMAC key).
    pub secret: Vec<u8>,
    /// Nonces seen inside the window.
    pub nonces: Mutex<auth::Nonces>,
    /// Which key owns which container.
    pub owners: Mutex<Owners>,
    /// Grant leases.
    pub leases: Arc<Leases>,
    /// Answers of idempotency keys.
    pub answers: Mutex<idempotency::Cache>,
    /// A running `run` sends a heartbeat this often without other output.
    pub heartbeat: Duration,
    /// Largest request body.
    pub max_body: usize,
    /// Largest `run` body.
    pub max_run_body: usize,
    /// Permits to read a body over `max_body`.
    big_bodies: tokio::sync::Semaphore,
}

/// Bodies over the plain bound read at once (each up to [`Node::max_run_body`]).
pub const BIG_BODIES: usize = 2;

/// A `run` body's bound: the largest stdin a front sends (an upload's archive,
/// [`stockade_node_protocol::MAX_STREAMED_STDIN`]) as base64, plus a MiB for the
/// rest of the command.
pub fn run_body_bound(max_body: usize) -> usize {
    let stdin = stockade_node_protocol::MAX_STREAMED_STDIN;
    max_body.max(stdin.div_ceil(3) * 4 + (1 << 20))
}

/// A node's numbers (from `[node]`, `[substrate]` and `[api]`).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The ticket gate's ceiling, for `health`.
    pub ceiling: u32,
    /// A grant's lease beyond its run's timeout.
    pub lease_grace: Duration,
    /// A running `run` sends a heartbeat this often without other output.
    pub heartbeat: Duration,
    /// Largest request body.
    pub max_body: usize,
}

impl Node {
    /// A node called `name` over `substrate` and `store`, verifying requests with
    /// `secret`.
    pub fn new(
        name: &str,
        substrate: Arc<dyn Substrate>,
        store: Arc<stockade_store::Store>,
        secrets: Secrets,
        secret: Vec<u8>,
        settings: Settings,
    ) -> Arc<Node> {
        Arc::new(Node {
            name: name.to_owned(),
            substrate,
            store,
            ceiling: settings.ceiling,
            secrets,
            secret,
            nonces: Mutex::new(auth::Nonces::new(NONCES)),
            owners: Mutex::new(Owners::default()),
            leases: Leases::new(settings.lease_grace),
            answers: Mutex::new(idempotency::Cache::new(
                idempotency::CAPACITY,
                idempotency::TTL,
            )),
            heartbeat: settings.heartbeat,
            max_body: settings.max_body,
            max_run_body: run_body_bound(settings.max_body),
            big_bodies: tokio::sync::Semaphore::new(BIG_BODIES),
        })
    }

    /// The owner map.
    pub fn owners(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, idempotency::Cache> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A request refused before the substrate: its status and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 400, 401, 403, 404 or 413.
    pub status: StatusCode,
    /// The wire error's kind.
    pub kind: &'static str,
    /// Why (for the log and the front's message).
    pub message: String,
}

impl Refusal {
    pub(super) fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
    ) -> Refusal {
        Refusal {
            status,
            kind,
            message: message.into(),
        }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, "invalid", message)
    }

    fn stored(&self) -> Stored {
        let body: Answer<()> = Answer::Error(WireError {
            kind: self.kind.to_owned(),
            message: self.message.clone(),
        });
        Stored {
            status: self.status.as_u16(),
            body: json_bytes(&body),
        }
    }
}

fn json_bytes<T: Serialize>(v: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("answers serialize"))
}

fn respond(s: Stored, content_type: &'static str) -> Response {
    let mut r = Response::new(Body::from(s.body));
    *r.status_mut() = StatusCode::from_u16(s.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

const JSON: &str = "application/json";
const NDJSON: &str = "application/x-ndjson";

pub(super) fn refused(call: &str, key: &str, r: &Refusal) -> Response {
    tracing::warn!(
        target: "stockade::node",
        call,
        key,
        status = r.status.as_u16(),
        reason = %r.message,
        "request refused"
    );
    respond(r.stored(), JSON)
}

pub(super) fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Step 2: the signature, the time, then the nonce.
fn verify(
    node: &Node,
    headers: &HeaderMap,
    path: &str,
    body: &[u8],
) -> Result<(String, String), Refusal> {
    verify_as(node, headers, "POST", path, body)
}

/// [`verify`] for a request of `method` (`run-pty` is a `GET`: a WebSocket upgrade).
pub(super) fn verify_as(
    node: &Node,
    headers: &HeaderMap,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(String, String), Refusal> {
    let unauthorized =
        |e: auth::Refused| Refusal::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string());
    let (Some(time), Some(nonce), Some(signature)) = (
        header_str(headers, auth::TIME_HEADER),
        header_str(headers, auth::NONCE_HEADER),
        header_str(headers, auth::SIGNATURE_HEADER),
    ) else {
        return Err(unauthorized(auth::Refused::Malformed));
    };
    let time_ms: u64 = time
        .parse()
        .map_err(|_| unauthorized(auth::Refused::Malformed))?;
    let key = header_str(headers, auth::KEY_HEADER).unwrap_or("");
    let idempotency = header_str(headers, protocol::IDEMPOTENCY_HEADER).unwrap_or("");
    let signed = Signed {
        time_ms,
        nonce,
        method,
        path,
        key,
        idempotency,
        body,
    };
    let now = now_ms();
    auth::verify(&signed, signature, &node.secret, now).map_err(unauthorized)?;
    node.nonces
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .accept(nonce, now)
        .map_err(unauthorized)?;
    Ok((key.to_owned(), idempotency.to_owned()))
}

pub(super) async fn handle(
    State(node): State<Arc<Node>>,
    Path(call): Path<String>,
    req: Request,
) -> Response {
    // `run-stream` reads its body as its stdin, in the run's own task.
    if call == call::RUN_STREAM {
        return call_task(node, call, req).await;
    }
    // Every other call whole in a task of its own, its body read there too. Read in
    // the connection's task, the body's hand-over woke that task from inside itself,
    // which tokio takes as a yield and answers by waking a parked worker to steal it:
    // a futex or eventfd write and a context switch on another CPU per request
    // (docs/BENCHMARKS.md, "Remote exec's round trip taken apart"). From another task
    // on the same worker it is a plain wake, in the worker's LIFO slot.
    if call == call::RUN || call == call::BATCH {
        // A streamed answer's call goes on in that task once its answer has begun,
        // sending its lines to the connection's task: one task per call, never a
        // second spawned after the body (whose wake would displace the connection's
        // task from the LIFO slot and wake a parked worker, as the yield did).
        let (begun_tx, begun) = oneshot::channel();
        tokio::spawn(streamed_task(node.clone(), call, req, begun_tx));
        return match begun.await {
            Ok(Begun::Whole(r)) => r,
            Ok(Begun::Lines(lines, Hold::FirstLine)) => {
                stream_after_first_line(lines, node.heartbeat).await
            }
            Ok(Begun::Lines(lines, Hold::Answers)) => {
                stream_after_answers(lines, node.heartbeat).await
            }
            Err(_) => respond(
                Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "failed",
                    "the call's task ended without an answer",
                )
                .stored(),
                JSON,
            ),
        };
    }
    match tokio::spawn(call_task(node, call, req)).await {
        Ok(r) => r,
        Err(e) => respond(
            Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "failed", e.to_string()).stored(),
            JSON,
        ),
    }
}

/// How a streamed call's answer begins (sent from the call's task to the
/// connection's).
enum Begun {
    /// A whole answer: a refusal, or a retry's stored answer.
    Whole(Response),
    /// Its lines as the call makes them, the head held as [`Hold`] says.
    Lines(mpsc::UnboundedReceiver<Bytes>, Hold),
}

/// A streamed call's whole answer (the connection's task may have gone: nothing to do).
fn whole(begun: oneshot::Sender<Begun>, r: Response) {
    let _ = begun.send(Begun::Whole(r));
}

/// How long a streamed answer holds its head back.
enum Hold {
    /// For the first line ([`stream_after_first_line`]: `run`).
    FirstLine,
    /// For a line that is not a call's answer ([`stream_after_answers`]: `batch`).
    Answers,
}

/// A call's checked request: its key, its body, its idempotency id.
struct Accepted {
    key: String,
    body: Bytes,
    id: Option<idempotency::Id>,
}

/// Steps 1-4 of every call but `run-stream`: the call named, the body read within its
/// bound, the signature, time and nonce verified, the key checked; or the refusal.
async fn accept(node: &Arc<Node>, call: &'static str, req: Request) -> Result<Accepted, Response> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let declared: Option<usize> =
        header_str(&parts.headers, header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse().ok());
    let limit = if call == call::RUN || call == call::BATCH {
        node.max_run_body
    } else {
        node.max_body
    };
    let big = if limit > node.max_body && declared.is_none_or(|n| n > node.max_body) {
        node.big_bodies.acquire().await.ok()
    } else {
        None
    };
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let r = Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid",
                format!("the body could not be read within {limit} bytes: {e}"),
            );
            return Err(refused(call, "", &r));
        }
    };
    drop(big);
    let (key, idem) = match verify(node, &parts.headers, path, &body) {
        Ok(k) => k,
        Err(r) => {
            let key = header_str(&parts.headers, auth::KEY_HEADER).unwrap_or("");
            return Err(refused(call, key, &r));
        }
    };
    // A keyed-or-node-wide call with no key is node-wide (the front's approver API).
    let node_wide = call::node_wide(call) || (call::keyed_or_node_wide(call) && key.is_empty());
    if !node_wide && let Err(e) = stockade_grammar::names::key(&key) {
        return Err(refused(call, &key, &Refusal::invalid(e.to_string())));
    }
    let id = (!idem.is_empty()).then(|| idempotency::Id {
        key: key.clone(),
        call: call.to_owned(),
        idempotency: idem,
    });
    Ok(Accepted { key, body, id })
}

/// The call's name as the protocol spells it, or its 404.
fn named(call: &str) -> Result<&'static str, Box<Response>> {
    call::ALL
        .iter()
        .copied()
        .find(|c| *c == call)
        .ok_or_else(|| {
            let r = Refusal::new(
                StatusCode::NOT_FOUND,
                "invalid",
                format!("no call {call:?}"),
            );
            Box::new(refused(call, "", &r))
        })
}

/// [`handle`]'s `run` or `batch`, in its own task: accepted, then begun and made.
async fn streamed_task(node: Arc<Node>, call: String, req: Request, begun: oneshot::Sender<Begun>) {
    let accepted = match named(&call) {
        Ok(call) => accept(&node, call, req).await,
        Err(r) => Err(*r),
    };
    let Accepted { key, body, id } = match accepted {
        Ok(a) => a,
        Err(r) => return whole(begun, r),
    };
    if call == call::RUN {
        run(node, key, body, id, begun).await;
    } else {
        batch(node, key, body, id, begun).await;
    }
}

/// [`handle`]'s plain call (and `run-stream`). A plain call runs in a task of its own
/// (so a front that goes away mid-call does not cancel it halfway: its retry gets the
/// answer).
async fn call_task(node: Arc<Node>, call: String, req: Request) -> Response {
    let call = match named(&call) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    if call == call::RUN_STREAM {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_owned();
        return run_stream(node, &parts.headers, path, body).await;
    }
    let Accepted { key, body, id } = match accept(&node, call, req).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let begun = id.as_ref().map(|id| node.answers().begin(id, now_ms()));
    let tx = match begun {
        Some(Begin::Done(s)) => return respond(s, JSON),
        Some(Begin::Wait(rx)) => return respond(wait(rx).await, JSON),
        Some(Begin::Fresh(tx)) => Some(tx),
        Some(Begin::Untracked) | None => None,
    };
    let stored = match dispatch(&node, call, &key, &body).await {
        Ok(answer) => Stored {
            status: 200,
            body: answer,
        },
        Err(r) => {
            tracing::warn!(
                target: "stockade::node",
                call,
                key,
                status = r.status.as_u16(),
                reason = %r.message,
                "request refused"
            );
            r.stored()
        }
    };
    if let (Some(id), Some(tx)) = (id, tx) {
        node.answers().finish(&id, tx, stored.clone());
    }
    respond(stored, JSON)
}

/// The first attempt's answer (a failed one if it went away without one).
async fn wait(mut rx: watch::Receiver<Option<Stored>>) -> Stored {
    match rx.wait_for(Option::is_some).await {
        Ok(s) => s.clone().expect("waited for Some"),
        Err(_) => Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed",
            "the first attempt of this call ended without an answer",
        )
        .stored(),
    }
}

pub(super) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| Refusal::invalid(format!("the body: {e}")))
}

pub(super) fn own(node: &Node, container: &str, key: &str) -> Result<(), Refusal> {
    match node.owners().check(container, key) {
        Ownership::Owned => Ok(()),
        Ownership::Other => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("container {container:?} is another key's"),
        )),
        Ownership::Unknown => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("container {container:?} was not ensured by this key"),
        )),
    }
}

fn answer<T: Serialize>(r: stockade_runtime::substrate::Result<T>) -> Bytes {
    json_bytes(&Answer::from_result(r))
}

pub(super) fn check_cmd(cmd: &Command) -> stockade_runtime::substrate::Result<()> {
    if cmd.argv.is_empty() {
        return Err(SubstrateError::Invalid("argv is empty".into()));
    }
    Ok(())
}

/// A door's port: 1-65535 (the guest checked it; a node checks again).
fn check_port(port: u16) -> stockade_runtime::substrate::Result<()> {
    if port == 0 {
        return Err(SubstrateError::Invalid(
            "the port must be 1-65535, got 0".into(),
        ));
    }
    Ok(())
}

fn process(p: stockade_runtime::substrate::ProcessInfo) -> protocol::Process {
    protocol::Process {
        id: p.id,
        running: p.running,
        exit_code: p.exit_code,
    }
}

/// Steps 5 and on for every call but `run`: the answer's JSON (a substrate failure
/// is an answer), or a refusal.
async fn dispatch(node: &Node, call: &str, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let s = node.substrate.as_ref();
    Ok(match call {
        call::ENSURE => {
            let protocol::Empty {} = parse(body)?;
            let r = s.ensure(key).await;
            if let Ok(c) = &r {
                node.owners().record(c, key);
            }
            answer(r)
        }
        call::CURRENT => {
            let protocol::Empty {} = parse(body)?;
            let r = s.current(key).await;
            if let Ok(Some(c)) = &r {
                node.owners().record(c, key);
            }
            answer(r)
        }
        call::APPLY_GRANT => {
            let req: protocol::ApplyGrant = parse(body)?;
            own(node, &req.container, key)?;
            answer(apply_grant(node, &req).await)
        }
        call::REVOKE_GRANT => {
            let req: protocol::OnContainer = parse(body)?;
            own(node, &req.container, key)?;
            answer(revoke_grant(node, &req.container).await)
        }
        call::START_PROCESS => {
            let req: protocol::StartProcess = parse(body)?;
            own(node, &req.container, key)?;
            let r = match check_cmd(&req.cmd) {
                Ok(()) => s.start_process(&req.container, req.cmd).await,
                Err(e) => Err(e),
            };
            answer(r)
        }
        call::LIST_PROCESSES => {
            let req: protocol::OnContainer = parse(body)?;
            own(node, &req.container, key)?;
            let r = s.list_processes(&req.container).await;
            answer(r.map(|v| v.into_iter().map(process).collect::<Vec<_>>()))
        }
        call::PROCESS_STATUS => {
            let req: protocol::OnProcess = parse(body)?;
            own(node, &req.container, key)?;
            answer(
                s.process_status(&req.container, &req.id)
                    .await
                    .map(|p| p.map(process)),
            )
        }
        call::KILL_PROCESS => {
            let req: protocol::OnProcess = parse(body)?;
            own(node, &req.container, key)?;
            answer(s.kill_process(&req.container, &req.id).await)
        }
        call::KILL_ALL => {
            let req: protocol::OnContainer = parse(body)?;
            own(node, &req.container, key)?;
            answer(s.kill_all(&req.container).await)
        }
        call::SNAPSHOT => {
            let req: protocol::OnContainer = parse(body)?;
            own(node, &req.container, key)?;
            answer(s.snapshot(&req.container).await)
        }
        call::STOP => {
            let req: protocol::OnContainer = parse(body)?;
            own(node, &req.container, key)?;
            let r = s.stop(&req.container).await;
            node.owners().retire(&req.container);
            node.leases.on(&req.container, LeaseEvent::Revoked);
            answer(r)
        }
        call::DENIALS => {
            let protocol::Empty {} = parse(body)?;
            answer(s.denials(key).await)
        }
        call::ADMITTED => {
            let protocol::Empty {} = parse(body)?;
            let store = node.store.clone();
            let key = key.to_owned();
            let r = tokio::task::spawn_blocking(move || store.admitted(&key))
                .await
                .map_err(|e| SubstrateError::Failed(e.to_string()))
                .and_then(|r| r.map_err(|e| SubstrateError::Failed(e.to_string())));
            answer(r)
        }
        call::LIST_ARTIFACTS => {
            let protocol::Empty {} = parse(body)?;
            let r = s.list_artifacts(key).await;
            answer(r.map(|v| {
                v.into_iter()
                    .map(|a| protocol::ArtifactInfo {
                        name: a.name,
                        size: a.size,
                    })
                    .collect::<Vec<_>>()
            }))
        }
        call::READ_ARTIFACT => {
            let req: protocol::ReadArtifact = parse(body)?;
            let r = s
                .read_artifact(key, &req.name, req.offset, req.length)
                .await;
            answer(r.map(|b| base64::engine::general_purpose::STANDARD.encode(b)))
        }
        call::HEALTH => {
            let protocol::Empty {} = parse(body)?;
            let live = node.owners().live() as u32;
            answer(Ok(protocol::Health {
                node: node.name.clone(),
                substrate: s.kind().to_owned(),
                live,
                ceiling: node.ceiling,
            }))
        }
        call::IDLE => {
            let req: protocol::Idle = parse(body)?;
            answer(Ok(s.idle(Duration::from_millis(req.idle_for_ms)).await))
        }
        call::PUT_SECRET => {
            // serde's message may quote the input: never a secret in an answer or a log.
            let req: protocol::PutSecret = parse(body).map_err(|_| {
                Refusal::invalid("the body must be {name, value, host, port, methods, path_prefix}")
            })?;
            answer(put_secret(node, &req))
        }
        call::REMOVE_SECRET => {
            let req: protocol::RemoveSecret = parse(body)?;
            let r = node
                .secrets
                .remove(&req.name)
                .map_err(|e| SubstrateError::Invalid(e.to_string()));
            if r.is_ok() {
                tracing::info!(target: "stockade::node", secret = %req.name, "secret removed");
            }
            answer(r)
        }
        call::PENDING => {
            let protocol::Empty {} = parse(body)?;
            answer(s.pending((!key.is_empty()).then_some(key)).await)
        }
        call::ANSWER_PENDING => {
            let req: protocol::AnswerPending = parse(body)?;
            answer(answer_pending(node, key, &req).await?)
        }
        call::OPEN_GRANTS => {
            let protocol::Empty {} = parse(body)?;
            answer(Ok(s.open_grants()))
        }
        call::OPEN_PREVIEW => {
            let req: protocol::OnPort = parse(body)?;
            own(node, &req.container, key)?;
            let r = match check_port(req.port) {
                Ok(()) => s.open_preview(&req.container, req.port).await,
                Err(e) => Err(e),
            };
            answer(r.map(protocol::Preview::from))
        }
        call::CLOSE_PREVIEW => {
            let req: protocol::OnPort = parse(body)?;
            own(node, &req.container, key)?;
            let r = match check_port(req.port) {
                Ok(()) => s.close_preview(&req.container, req.port).await,
                Err(e) => Err(e),
            };
            answer(r)
        }
        call::LIST_PREVIEWS => {
            let req: protocol::OnContainer = parse(body)?;
            own(node, &req.container, key)?;
            let r = s.list_previews(&req.container).await;
            answer(r.map(|v| {
                v.into_iter()
                    .map(protocol::Preview::from)
                    .collect::<Vec<_>>()
            }))
        }
        other => return Err(Refusal::invalid(format!("no call {other:?}"))),
    })
}

/// `answer-pending`: the decision answered once, if it is the key's (node-wide, empty
/// key: whoever's). Another key's is 403 and stays held; a substrate failure is a
/// `failed` answer, not a refusal.
async fn answer_pending(
    node: &Node,
    key: &str,
    req: &protocol::AnswerPending,
) -> Result<stockade_runtime::substrate::Result<protocol::PendingAnswer>, Refusal> {
    use stockade_egress::ask::{Answer as Verdict, AnswerError};
    let verdict = match req.decision {
        stockade_wire::Verdict::Approve => Verdict::Approve,
        stockade_wire::Verdict::Refuse => Verdict::Refuse,
    };
    let of = (!key.is_empty()).then_some(key);
    let r = match node.substrate.answer_pending(&req.id, of, verdict).await {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    Ok(Ok(match r {
        Ok(p) => {
            tracing::info!(target: "stockade::node", id = %req.id, key = %p.key, fence = %p.fence, decision = ?req.decision, "egress decision answered");
            protocol::PendingAnswer::Answered(p)
        }
        Err(AnswerError::Decided { outcome, .. }) => {
            protocol::PendingAnswer::AlreadyDecided(outcome.to_owned())
        }
        Err(AnswerError::Unknown(_)) => protocol::PendingAnswer::NotFound,
        Err(AnswerError::Foreign(id)) => {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("egress decision {id} is another key's"),
            ));
        }
    }))
}

/// `apply-grant` (alone or in a batch): the grant parsed again, opened, leased.
async fn apply_grant(
    node: &Node,
    req: &protocol::ApplyGrant,
) -> stockade_runtime::substrate::Result<()> {
    let g = req.grant()?;
    // A front serializes a key's fences, so a run still going here is an earlier
    // fence's that its front could not tear down (a cut link, a front that died): a
    // new grant would reach that command too. Refused until the run ends (its timeout,
    // then the lease closes its fence). A run its own front just killed may take a
    // moment to be seen ending (the supervisor's report): that is waited for, briefly.
    if !node.leases.runs_ended(&req.container, RUN_END_WAIT).await {
        return Err(SubstrateError::Failed(
            "a run of an earlier fence is still going on this container: no new grant until it ends"
                .into(),
        ));
    }
    node.substrate
        .apply_grant(&req.container, &req.fence, g)
        .await?;
    node.leases.on(&req.container, LeaseEvent::Applied);
    Ok(())
}

/// How long an apply waits for a run still going on its container to be seen ending.
const RUN_END_WAIT: Duration = Duration::from_secs(2);

/// `revoke-grant` (alone or in a batch): closed, its lease with it.
async fn revoke_grant(
    node: &Node,
    container: &str,
) -> stockade_runtime::substrate::Result<protocol::Counts> {
    let r = node.substrate.revoke_grant(container).await;
    node.leases.on(container, LeaseEvent::Revoked);
    r.map(|c| protocol::Counts {
        admitted: c.admitted,
        denied: c.denied,
    })
}

/// `put-secret`: the binding parsed as the API parses it; the value never logged.
fn put_secret(node: &Node, req: &protocol::PutSecret) -> stockade_runtime::substrate::Result<()> {
    let host = if req.host.contains(':') {
        format!("[{}]:{}", req.host, req.port)
    } else {
        format!("{}:{}", req.host, req.port)
    };
    let prefix = (!req.path_prefix.is_empty()).then_some(req.path_prefix.as_str());
    let binding = stockade_grammar::binding::parse(&host, &req.methods, prefix)
        .map_err(|e| SubstrateError::Invalid(e.to_string()))?;
    node.secrets
        .set(&req.name, &req.value, &binding, now_ms())
        .map_err(|e| SubstrateError::Invalid(e.to_string()))?;
    tracing::info!(target: "stockade::node", secret = %req.name, binding = %binding, "secret set");
    Ok(())
}

fn line(l: &RunLine) -> Bytes {
    let mut v = serde_json::to_vec(l).expect("run lines serialize");
    v.push(b'\n');
    Bytes::from(v)
}

/// The idempotency cache's side of a streamed call (`run`, `run-stream`, `batch`): the
/// sender to finish a fresh attempt with (`None`: nothing remembered), or the answer
/// already: a stored one, or, for a retry of an attempt still going, heartbeats and
/// then that attempt's last line.
fn begin_streamed(node: &Arc<Node>, id: Option<&idempotency::Id>) -> Streamed {
    match id.map(|id| node.answers().begin(id, now_ms())) {
        Some(Begin::Done(s)) => Streamed::Answered(respond(s, NDJSON)),
        Some(Begin::Wait(rx)) => {
            let (lines_tx, lines_rx) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                let _ = lines_tx.send(wait(rx).await.body);
            });
            Streamed::Answered(stream(lines_rx, node.heartbeat))
        }
        Some(Begin::Fresh(tx)) => Streamed::Go(Some(tx)),
        Some(Begin::Untracked) | None => Streamed::Go(None),
    }
}

/// What [`begin_streamed`] says.
enum Streamed {
    /// Make the call; finish the cache's entry with this sender, if any.
    Go(Option<watch::Sender<Option<Stored>>>),
    /// Answered already.
    Answered(Response),
}

/// `run`: parse and own (plain refusals), then NDJSON, made in the call's task.
async fn run(
    node: Arc<Node>,
    key: String,
    body: Bytes,
    id: Option<idempotency::Id>,
    begun: oneshot::Sender<Begun>,
) {
    let req: protocol::Run = match parse(&body) {
        Ok(r) => r,
        Err(r) => return whole(begun, refused(call::RUN, &key, &r)),
    };
    if let Err(r) = own(&node, &req.container, &key) {
        return whole(begun, refused(call::RUN, &key, &r));
    }
    let tx = match begin_streamed(&node, id.as_ref()) {
        Streamed::Go(tx) => tx,
        Streamed::Answered(answered) => return whole(begun, answered),
    };
    let (lines_tx, lines_rx) = mpsc::unbounded_channel::<Bytes>();
    // The front may have gone: the run goes on, its lines with nowhere to go.
    let _ = begun.send(Begun::Lines(lines_rx, Hold::FirstLine));
    let last = run_task(&node, req, &lines_tx).await;
    keep(&node, id, tx, last.clone());
    let _ = lines_tx.send(last);
}

/// A streamed call's answer kept under its idempotency key, if it has one: a retry
/// gets it (a run's output went to the first attempt).
fn keep(
    node: &Node,
    id: Option<idempotency::Id>,
    tx: Option<watch::Sender<Option<Stored>>>,
    body: Bytes,
) {
    if let (Some(id), Some(tx)) = (id, tx) {
        node.answers().finish(&id, tx, Stored { status: 200, body });
    }
}

/// How long a `run`'s answer holds back its head for the run's first line, so that a
/// short run's head, last line and end leave in one write: the front wakes once per
/// run, not twice (docs/BENCHMARKS.md, "Remote exec"). Short, as until the head arrives a
/// front tells a cut link only at the call's deadline, not after its silence bound.
pub const FIRST_LINE_WAIT: Duration = Duration::from_millis(10);

/// [`stream`], its head sent with the first line, or after [`FIRST_LINE_WAIT`] (at most
/// `every`) without one.
async fn stream_after_first_line(
    mut lines: mpsc::UnboundedReceiver<Bytes>,
    every: Duration,
) -> Response {
    let first = match tokio::time::timeout(every.min(FIRST_LINE_WAIT), lines.recv()).await {
        Ok(Some(l)) => Some(l),
        // Ended without a line (the task went away): an empty body, as `stream`'s.
        Ok(None) | Err(_) => None,
    };
    stream_from(first, lines, every)
}

/// The run itself, its output sent as lines as it comes; its last line.
async fn run_task(node: &Node, req: protocol::Run, lines: &mpsc::UnboundedSender<Bytes>) -> Bytes {
    match run_call(node, req, lines).await {
        Ok(result) => line(&RunLine::Result(result)),
        Err(e) => line(&RunLine::Error(e.into())),
    }
}

/// A run (alone or in a batch), its output sent as lines as it comes; its result
/// (without output: it went in the lines).
async fn run_call(
    node: &Node,
    req: protocol::Run,
    lines: &mpsc::UnboundedSender<Bytes>,
) -> stockade_runtime::substrate::Result<stockade_runtime::substrate::RunResult> {
    check_cmd(&req.cmd)?;
    if req.timeout_ms == 0 || req.timeout_ms > MAX_RUN_TIMEOUT_MS {
        return Err(SubstrateError::Invalid(format!(
            "timeout_ms must be 1..={MAX_RUN_TIMEOUT_MS}"
        )));
    }
    let timeout = Duration::from_millis(req.timeout_ms);
    let lease = node.leases.run_started(&req.container, timeout);
    let (sink, mut out) = mpsc::unbounded_channel::<Output>();
    let send = |o: Output| {
        let l = match o {
            Output::Stdout(b) if !b.is_empty() => RunLine::Stdout(b),
            Output::Stderr(b) if !b.is_empty() => RunLine::Stderr(b),
            _ => return,
        };
        // The front may have gone: the run goes on, its output with nowhere to go.
        let _ = lines.send(line(&l));
    };
    let going = node
        .substrate
        .run_streaming(&req.container, req.cmd, timeout, sink);
    tokio::pin!(going);
    let r = loop {
        tokio::select! {
            r = &mut going => break r,
            Some(o) = out.recv() => send(o),
        }
    };
    while let Ok(o) = out.try_recv() {
        send(o);
    }
    node.leases.run_ended(&req.container, lease);
    let mut result = r?;
    // The result carries no output (it went in the lines before).
    let (o, e) = (
        std::mem::take(&mut result.stdout),
        std::mem::take(&mut result.stderr),
    );
    send(Output::Stdout(o));
    send(Output::Stderr(e));
    Ok(result)
}

/// `batch` (docs/NODE.md "Batches"): the body parsed (400), 1 to
/// [`stockade_runtime::substrate::MAX_BATCH`] calls (400), every container the key's (403) — all
/// before any call is made — then the calls in order, stopping at the first error,
/// answered NDJSON: a run's lines as they come, one `answer` line per call made. The
/// idempotency cache keeps the answer lines (a retry gets them; a run's output went
/// to the first attempt, as a `run`'s).
async fn batch(
    node: Arc<Node>,
    key: String,
    body: Bytes,
    id: Option<idempotency::Id>,
    begun: oneshot::Sender<Begun>,
) {
    let req: protocol::Batch = match parse(&body) {
        Ok(r) => r,
        Err(r) => return whole(begun, refused(call::BATCH, &key, &r)),
    };
    let n = req.calls.len();
    // The grant a batch's apply opened is named by its lease number: the plan makes
    // the batch's teardown after the run only while that grant is still the open one.
    // A front that went away mid-run may have torn the fence down by calls of its own
    // and started the key's next fence since; a teardown made then would kill that
    // fence's command and revoke its grant.
    let mut plan: batch::Plan<serde_json::Value, SubstrateError, Option<u64>> =
        match batch::Plan::new(req.calls.iter().map(protocol::BatchCall::step).collect()) {
            Ok(p) => p,
            Err(e) => {
                return whole(
                    begun,
                    refused(call::BATCH, &key, &Refusal::invalid(e.to_string())),
                );
            }
        };
    // The ensured container is the key's by construction; every other one must be.
    for c in &req.calls {
        if c.container() != protocol::ENSURED
            && let Err(r) = own(&node, c.container(), &key)
        {
            return whole(begun, refused(call::BATCH, &key, &r));
        }
    }
    let tx = match begin_streamed(&node, id.as_ref()) {
        Streamed::Go(tx) => tx,
        Streamed::Answered(answered) => return whole(begun, answered),
    };
    let (lines_tx, lines_rx) = mpsc::unbounded_channel::<Bytes>();
    let _ = begun.send(Begun::Lines(lines_rx, Hold::Answers));
    let mut answers = bytes::BytesMut::new();
    let mut made = Vec::with_capacity(n);
    let mut calls: Vec<Option<protocol::BatchCall>> = req.calls.into_iter().map(Some).collect();
    while let Some(next) = plan.next() {
        let Some(mut c) = calls[next.index].take() else {
            break;
        };
        let name = c.name();
        // `""` names the container the batch's ensure answered: the plan's resolved.
        if let Some(on) = &next.container {
            c.set_container(on);
        }
        let container = c.container().to_owned();
        let mut opened = None;
        let r: stockade_runtime::substrate::Result<serde_json::Value> = match c {
            _ if next
                .while_open
                .as_ref()
                .is_some_and(|g| node.leases.open_grant(&container) != *g) =>
            {
                Err(batch::closed_meanwhile(&container))
            }
            protocol::BatchCall::Ensure(protocol::Empty {}) => {
                let r = node.substrate.ensure(&key).await;
                if let Ok(c) = &r {
                    node.owners().record(c, &key);
                }
                r.and_then(json)
            }
            protocol::BatchCall::ApplyGrant(a) => {
                let r = apply_grant(&node, &a).await;
                if r.is_ok() {
                    opened = Some(node.leases.open_grant(&a.container));
                }
                r.map(|()| serde_json::Value::Null)
            }
            protocol::BatchCall::Run(r) => run_call(&node, r, &lines_tx).await.and_then(json),
            protocol::BatchCall::KillAll(c) => {
                node.substrate.kill_all(&c.container).await.and_then(json)
            }
            protocol::BatchCall::RevokeGrant(c) => {
                revoke_grant(&node, &c.container).await.and_then(json)
            }
        };
        let failed = r.is_err();
        made.push(format!("{name}:{}", if failed { "error" } else { "ok" }));
        let l = line(&RunLine::Answer(Answer::from_result(r.clone())));
        answers.extend_from_slice(&l);
        let _ = lines_tx.send(l);
        match opened {
            Some(grant) => plan.answer_opened(r, grant),
            None => plan.answer(r),
        }
        if failed {
            tracing::info!(target: "stockade::node", key = %key, container = %container, call = name, "batch stopped at its first error");
        }
    }
    tracing::debug!(target: "stockade::node", key = %key, calls = n, made = ?made, "batch");
    keep(&node, id, tx, answers.freeze());
}

fn json<T: Serialize>(v: T) -> stockade_runtime::substrate::Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| SubstrateError::Failed(e.to_string()))
}

/// A batch's [`stream`]: its head held until a line that is not a call's answer (a
/// run's output or heartbeat), the end, or [`FIRST_LINE_WAIT`] (at most `every`), with
/// every line before it: a short batch's head, answers and end leave in one write.
async fn stream_after_answers(
    mut lines: mpsc::UnboundedReceiver<Bytes>,
    every: Duration,
) -> Response {
    let deadline = tokio::time::Instant::now() + every.min(FIRST_LINE_WAIT);
    let mut first = bytes::BytesMut::new();
    while let Ok(Some(l)) = tokio::time::timeout_at(deadline, lines.recv()).await {
        let answer = l.starts_with(b"{\"answer\":");
        first.extend_from_slice(&l);
        if !answer {
            break;
        }
    }
    let first = (!first.is_empty()).then(|| first.freeze());
    stream_from(first, lines, every)
}

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
async fn run_stream(node: Arc<Node>, headers: &HeaderMap, path: String, body: Body) -> Response {
    use http_body_util::BodyExt as _;
    let call = call::RUN_STREAM;
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    let head = loop {
        if let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let head = buf.split_to(i).freeze();
            let _ = buf.split_to(1);
            break head;
        }
        if buf.len() > node.max_body {
            let r = Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid",
                format!("the head line is longer than {} bytes", node.max_body),
            );
            return refused(call, "", &r);
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
        return refused(call, "", &Refusal::invalid(why));
    };
    let (key, idem) = match verify(&node, headers, &path, &head) {
        Ok(k) => k,
        Err(r) => {
            let key = header_str(headers, auth::KEY_HEADER).unwrap_or("");
            return refused(call, key, &r);
        }
    };
    let signature = header_str(headers, auth::SIGNATURE_HEADER)
        .unwrap_or("")
        .to_owned();
    if let Err(e) = stockade_grammar::names::key(&key) {
        return refused(call, &key, &Refusal::invalid(e.to_string()));
    }
    let req: protocol::RunStream = match parse(&head) {
        Ok(r) => r,
        Err(r) => return refused(call, &key, &r),
    };
    if let Err(r) = own(&node, &req.container, &key) {
        return refused(call, &key, &r);
    }
    if !req.cmd.stdin.is_empty() {
        let r = Refusal::invalid("a run-stream's command carries no stdin of its own");
        return refused(call, &key, &r);
    }
    let id = (!idem.is_empty()).then(|| idempotency::Id {
        key: key.clone(),
        call: call.to_owned(),
        idempotency: idem,
    });
    let tx = match begin_streamed(&node, id.as_ref()) {
        Streamed::Go(tx) => tx,
        Streamed::Answered(answered) => return answered,
    };
    if let Some(u) = &req.upload {
        let marker = match u {
            protocol::UploadCheck::Archive { marker }
            | protocol::UploadCheck::File { marker, .. } => marker,
        };
        if marker.is_empty()
            || marker.len() > 64
            || !marker.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            let r = Refusal::invalid("an upload's marker is 1 to 64 letters and digits");
            return refused(call, &key, &r);
        }
    }
    let (chunks_tx, chunks_rx) = mpsc::channel::<Bytes>(STREAM_IN_FLIGHT);
    let (frames_tx, frames_rx) =
        mpsc::channel::<stockade_node_protocol::upload::Frame>(STREAM_IN_FLIGHT);
    let (failed_tx, mut failed_rx) = tokio::sync::oneshot::channel::<String>();
    let deframer = stream::Deframer::new(&node.secret, &signature, req.length);
    let feeder = tokio::spawn(feed(body, buf.freeze(), deframer, frames_tx, failed_tx));
    // The verified stream goes to the run as it is, or through the upload checker.
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
    let mut cmd = req.cmd;
    cmd.stdin_stream = Some(stockade_runtime::substrate::StdinStream::new(chunks_rx));
    let run = protocol::Run {
        container: req.container,
        cmd,
        timeout_ms: req.timeout_ms,
    };
    let (lines_tx, lines_rx) = mpsc::unbounded_channel::<Bytes>();
    let n = node.clone();
    tokio::spawn(async move {
        let mut last = run_task(&n, run, &lines_tx).await;
        // The feeder says why before it closes the stdin short, so a refused or
        // broken-off stream is known here; one the run did not read to its end is not.
        if let Ok(why) = failed_rx.try_recv() {
            tracing::warn!(target: "stockade::node", call, key = %key, reason = %why, "stdin stream refused");
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
        keep(&n, id, tx, last.clone());
        let _ = lines_tx.send(last);
    });
    stream(lines_rx, node.heartbeat)
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

/// An NDJSON body: the lines as they come, a heartbeat after `every` without one; it
/// ends when the lines do.
fn stream(lines: mpsc::UnboundedReceiver<Bytes>, every: Duration) -> Response {
    stream_from(None, lines, every)
}

/// [`stream`] starting with `first`.
fn stream_from(
    first: Option<Bytes>,
    lines: mpsc::UnboundedReceiver<Bytes>,
    every: Duration,
) -> Response {
    let rest = futures_util::stream::unfold(lines, move |mut lines| async move {
        let next = tokio::time::timeout(every, lines.recv()).await;
        match next {
            Ok(Some(l)) => Some((Ok::<_, std::convert::Infallible>(l), lines)),
            Ok(None) => None,
            Err(_) => Some((Ok(line(&RunLine::Heartbeat(now_ms()))), lines)),
        }
    });
    let first = futures_util::stream::iter(first.map(Ok));
    let body = futures_util::StreamExt::chain(first, rest);
    let mut r = Body::from_stream(body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use stockade_runtime::substrate::mock::Mock;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// A directory removed when dropped (the store's).
    struct Dir(std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn node(mock: Arc<Mock>) -> (Arc<Node>, Dir) {
        let dir = Dir(
            std::env::temp_dir().join(format!("stockade-node-server-{}", uuid::Uuid::new_v4()))
        );
        std::fs::create_dir_all(&dir.0).unwrap();
        let store = Arc::new(stockade_store::Store::open_in(&dir.0).expect("a store"));
        let node = Node::new(
            "node-1",
            mock,
            store.clone(),
            Secrets::new(store, Default::default()),
            SECRET.to_vec(),
            Settings {
                ceiling: 4,
                lease_grace: Duration::from_secs(30),
                heartbeat: Duration::from_millis(100),
                max_body: 1024,
            },
        );
        (node, dir)
    }

    async fn send(node: &Arc<Node>, call: &str, key: &str, body: &[u8]) -> (u16, String) {
        send_idem(node, call, key, body, "").await
    }

    /// [`send`] with an idempotency key.
    async fn send_idem(
        node: &Arc<Node>,
        call: &str,
        key: &str,
        body: &[u8],
        idempotency: &str,
    ) -> (u16, String) {
        let path = format!("{}{call}", protocol::PREFIX);
        let (time, nonce) = (now_ms(), auth::nonce());
        let sig = Signed {
            time_ms: time,
            nonce: &nonce,
            method: "POST",
            path: &path,
            key,
            idempotency,
            body,
        }
        .sign(SECRET);
        let req = axum::http::Request::post(&path)
            .header(auth::TIME_HEADER, time.to_string())
            .header(auth::NONCE_HEADER, nonce)
            .header(auth::KEY_HEADER, key)
            .header(protocol::IDEMPOTENCY_HEADER, idempotency)
            .header(auth::SIGNATURE_HEADER, sig)
            .body(Body::from(body.to_vec()))
            .unwrap();
        let r = handle(State(node.clone()), Path(call.to_owned()), req).await;
        let status = r.status().as_u16();
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// A `run-stream` request: the head signed (with `nonce`), then `frames` as the
    /// body; its status and NDJSON lines.
    async fn send_stream(
        node: &Arc<Node>,
        key: &str,
        head: &[u8],
        nonce: &str,
        frames: impl FnOnce(&str) -> Vec<u8>,
    ) -> (u16, Vec<String>) {
        send_stream_idem(node, key, head, nonce, "", frames).await
    }

    /// [`send_stream`] with an idempotency key.
    async fn send_stream_idem(
        node: &Arc<Node>,
        key: &str,
        head: &[u8],
        nonce: &str,
        idempotency: &str,
        frames: impl FnOnce(&str) -> Vec<u8>,
    ) -> (u16, Vec<String>) {
        let path = format!("{}{}", protocol::PREFIX, call::RUN_STREAM);
        let time = now_ms();
        let sig = Signed {
            time_ms: time,
            nonce,
            method: "POST",
            path: &path,
            key,
            idempotency,
            body: head,
        }
        .sign(SECRET);
        let mut body = head.to_vec();
        body.push(b'\n');
        body.extend(frames(&sig));
        // The body arrives in small pieces, as a stream does.
        let pieces: Vec<Result<Bytes, std::io::Error>> = body
            .chunks(1000)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let req = axum::http::Request::post(&path)
            .header(auth::TIME_HEADER, time.to_string())
            .header(auth::NONCE_HEADER, nonce)
            .header(auth::KEY_HEADER, key)
            .header(protocol::IDEMPOTENCY_HEADER, idempotency)
            .header(auth::SIGNATURE_HEADER, sig)
            .body(Body::from_stream(futures_util::stream::iter(pieces)))
            .unwrap();
        let r = handle(State(node.clone()), Path(call::RUN_STREAM.to_owned()), req).await;
        let status = r.status().as_u16();
        let body = axum::body::to_bytes(r.into_body(), 1 << 24).await.unwrap();
        let lines = String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| !l.contains("heartbeat"))
            .map(str::to_owned)
            .collect();
        (status, lines)
    }

    /// A batch's answer lines (heartbeats left out).
    fn batch_lines(b: &str) -> Vec<RunLine> {
        b.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|l| !matches!(l, RunLine::Heartbeat(_)))
            .collect()
    }

    fn fence_batch(container: &str, argv: &[&str]) -> Vec<u8> {
        let grant = stockade_egress::rules::Grant::parse(&[]).unwrap();
        serde_json::to_vec(&protocol::Batch {
            calls: vec![
                protocol::BatchCall::ApplyGrant(protocol::ApplyGrant::new(container, "f1", &grant)),
                protocol::BatchCall::Run(protocol::Run {
                    container: container.into(),
                    cmd: Command {
                        argv: argv.iter().map(|a| a.to_string()).collect(),
                        cwd: "/workspace".into(),
                        env: vec![],
                        stdin: vec![],
                        stdin_stream: None,
                    },
                    timeout_ms: 5_000,
                }),
                protocol::BatchCall::KillAll(protocol::OnContainer {
                    container: container.into(),
                }),
                protocol::BatchCall::RevokeGrant(protocol::OnContainer {
                    container: container.into(),
                }),
            ],
        })
        .unwrap()
    }

    #[tokio::test]
    async fn a_batch_makes_its_calls_in_order_and_stops_at_the_first_error() {
        let mock = Arc::new(Mock::new(2));
        let (n, _dir) = node(mock.clone());
        let id = ensured(&n, "alpha").await;
        mock.clear_trace();
        let (s, b) = send(&n, call::BATCH, "alpha", &fence_batch(&id, &["echo", "hi"])).await;
        assert_eq!(s, 200, "{b}");
        let lines = batch_lines(&b);
        assert_eq!(
            lines[0],
            RunLine::Answer(Answer::Ok(serde_json::Value::Null)),
            "{b}"
        );
        assert_eq!(lines[1], RunLine::Stdout(b"hi\n".to_vec()), "{b}");
        assert!(
            matches!(&lines[2], RunLine::Answer(Answer::Ok(v)) if v["exit_code"] == 0),
            "{b}"
        );
        assert!(matches!(&lines[3], RunLine::Answer(Answer::Ok(_))), "{b}");
        assert!(
            matches!(&lines[4], RunLine::Answer(Answer::Ok(v)) if v["denied"] == 0),
            "{b}"
        );
        assert_eq!(lines.len(), 5, "{b}");
        assert_eq!(
            mock.ops(),
            ["apply-grant", "run", "kill-all", "revoke-grant"]
        );
        assert!(mock.open_grants_now().is_empty());
        // A retry (the same idempotency key, freshly signed) gets the answers again and
        // makes nothing twice.
        mock.clear_trace();
        let body = fence_batch(&id, &["echo", "once"]);
        let first = send_idem(&n, call::BATCH, "alpha", &body, "idem-1").await;
        let again = send_idem(&n, call::BATCH, "alpha", &body, "idem-1").await;
        assert_eq!(
            mock.ops(),
            ["apply-grant", "run", "kill-all", "revoke-grant"]
        );
        let answers = |b: &str| -> Vec<RunLine> {
            batch_lines(b)
                .into_iter()
                .filter(|l| matches!(l, RunLine::Answer(_)))
                .collect()
        };
        assert_eq!(again.0, 200);
        assert_eq!(answers(&again.1), answers(&first.1), "{}", again.1);
        // A failed apply: the run is never made, and the answer says so.
        mock.clear_trace();
        mock.inject(
            "apply-grant",
            stockade_runtime::substrate::mock::Fault::Error(SubstrateError::Failed("proxy".into())),
            Some(1),
        );
        let (s, b) = send(&n, call::BATCH, "alpha", &fence_batch(&id, &["echo", "no"])).await;
        assert_eq!(s, 200, "{b}");
        let lines = batch_lines(&b);
        assert!(
            matches!(&lines[..], [RunLine::Answer(Answer::Error(e))] if e.kind == "failed"),
            "{b}"
        );
        assert_eq!(mock.ops(), ["apply-grant"]);
    }

    #[tokio::test]
    async fn a_batch_naming_another_keys_container_is_refused_whole_before_any_call() {
        let mock = Arc::new(Mock::new(4));
        let (n, _dir) = node(mock.clone());
        let (mine, theirs) = (ensured(&n, "alpha").await, ensured(&n, "beta").await);
        mock.clear_trace();
        // Its own apply first, then a kill of another key's container: nothing is made.
        let mut batch: protocol::Batch =
            serde_json::from_slice(&fence_batch(&mine, &["echo"])).unwrap();
        batch.calls[2] = protocol::BatchCall::KillAll(protocol::OnContainer {
            container: theirs.clone(),
        });
        let (s, b) = send(
            &n,
            call::BATCH,
            "alpha",
            &serde_json::to_vec(&batch).unwrap(),
        )
        .await;
        assert_eq!(s, 403, "{b}");
        assert!(mock.ops().is_empty(), "{:?}", mock.ops());
        // A guessed container, an empty batch, too many calls, a call a batch does not
        // carry: refused whole, nothing made.
        let guessed = fence_batch("c-guessed", &["echo"]);
        assert_eq!(send(&n, call::BATCH, "alpha", &guessed).await.0, 403);
        assert_eq!(
            send(&n, call::BATCH, "alpha", br#"{"calls":[]}"#).await.0,
            400
        );
        let many = protocol::Batch {
            calls: vec![
                protocol::BatchCall::KillAll(protocol::OnContainer {
                    container: mine.clone()
                });
                stockade_runtime::substrate::MAX_BATCH + 1
            ],
        };
        let (s, b) = send(
            &n,
            call::BATCH,
            "alpha",
            &serde_json::to_vec(&many).unwrap(),
        )
        .await;
        assert_eq!(s, 400, "{b}");
        let stop = format!(r#"{{"calls":[{{"stop":{{"container":"{mine}"}}}}]}}"#);
        assert_eq!(send(&n, call::BATCH, "alpha", stop.as_bytes()).await.0, 400);
        assert!(mock.ops().is_empty(), "{:?}", mock.ops());
    }

    /// `[ensure, apply-grant, run]` on the ensured container (`""`).
    fn ensure_batch(argv: &[&str]) -> Vec<u8> {
        ensured_batch(argv, 2)
    }

    /// `[ensure, apply-grant, run, kill-all, revoke-grant]`, all on the ensured container.
    fn whole_batch(argv: &[&str]) -> Vec<u8> {
        ensured_batch(argv, 4)
    }

    /// [`fence_batch`]'s first `calls` on the ensured container, after an `ensure`.
    fn ensured_batch(argv: &[&str], calls: usize) -> Vec<u8> {
        let mut b: protocol::Batch =
            serde_json::from_slice(&fence_batch(protocol::ENSURED, argv)).unwrap();
        b.calls.truncate(calls);
        b.calls
            .insert(0, protocol::BatchCall::Ensure(protocol::Empty {}));
        serde_json::to_vec(&b).unwrap()
    }

    /// The key's container, by a plain `ensure`.
    async fn ensured(n: &Arc<Node>, key: &str) -> String {
        let (_, b) = send(n, "ensure", key, b"{}").await;
        match serde_json::from_str::<Answer<String>>(&b).unwrap() {
            Answer::Ok(id) => id,
            Answer::Error(e) => panic!("{e:?}"),
        }
    }

    /// `body` sent as a batch in a task of its own, once its run is going on `container`.
    async fn batch_running(
        n: &Arc<Node>,
        key: &'static str,
        container: &str,
        body: Vec<u8>,
    ) -> tokio::task::JoinHandle<(u16, String)> {
        let batch = tokio::spawn({
            let n = n.clone();
            async move { send(&n, call::BATCH, key, &body).await }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !n.leases.running(container) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the batch's run started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        batch
    }

    #[tokio::test]
    async fn a_batch_opening_with_ensure_fences_the_container_it_answered() {
        let mock = Arc::new(Mock::new(2));
        let (n, _dir) = node(mock.clone());
        let (s, b) = send(&n, call::BATCH, "alpha", &ensure_batch(&["echo", "hi"])).await;
        assert_eq!(s, 200, "{b}");
        let lines = batch_lines(&b);
        let RunLine::Answer(Answer::Ok(serde_json::Value::String(id))) = &lines[0] else {
            panic!("the ensure's answer first: {b}")
        };
        assert!(!id.is_empty(), "{b}");
        assert_eq!(lines[2], RunLine::Stdout(b"hi\n".to_vec()), "{b}");
        assert!(
            matches!(&lines[3], RunLine::Answer(Answer::Ok(v)) if v["exit_code"] == 0),
            "{b}"
        );
        assert_eq!(mock.ops(), ["ensure", "apply-grant", "run"]);
        assert_eq!(mock.open_grants_now(), std::slice::from_ref(id));
        // The key owns what its batch ensured: the teardown names it as any container.
        let (s, b) = send(&n, call::BATCH, "alpha", &fence_batch(id, &["true"])[..]).await;
        assert_eq!(s, 200, "{b}");
        assert!(mock.open_grants_now().is_empty());
        // Another key's batch cannot name it, nor fence it by the ensured name: its own
        // ensure answers its own container.
        let (s, b) = send(&n, call::BATCH, "beta", &fence_batch(id, &["true"])).await;
        assert_eq!(s, 403, "{b}");
        mock.clear_trace();
        let (s, b) = send(&n, call::BATCH, "beta", &ensure_batch(&["true"])).await;
        assert_eq!(s, 200, "{b}");
        let RunLine::Answer(Answer::Ok(serde_json::Value::String(theirs))) = &batch_lines(&b)[0]
        else {
            panic!("{b}")
        };
        assert_ne!(theirs, id);
        // The whole fence in one batch: the teardown names the ensured container too,
        // and leaves nothing open.
        mock.clear_trace();
        let (s, b) = send(&n, call::BATCH, "alpha", &whole_batch(&["true"])).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(
            mock.ops(),
            ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"]
        );
        assert_eq!(batch_lines(&b).len(), 5, "{b}");
        // (Only beta's grant, which its batch above left open, is.)
        assert_eq!(mock.open_grants_now(), std::slice::from_ref(theirs));
        // An ensure that fails makes nothing after it.
        mock.clear_trace();
        mock.inject(
            "ensure",
            stockade_runtime::substrate::mock::Fault::Error(SubstrateError::OverCapacity),
            Some(1),
        );
        let (s, b) = send(&n, call::BATCH, "gamma", &ensure_batch(&["true"])).await;
        assert_eq!(s, 200, "{b}");
        let lines = batch_lines(&b);
        assert_eq!(lines.len(), 1, "{b}");
        assert!(
            matches!(&lines[0], RunLine::Answer(Answer::Error(_))),
            "{b}"
        );
        assert_eq!(mock.ops(), ["ensure"]);
    }

    #[tokio::test]
    async fn a_batchs_teardown_is_not_made_once_its_fence_was_closed_by_another_call() {
        let mock = Arc::new(Mock::new(2));
        let (n, _dir) = node(mock.clone());
        let id = ensured(&n, "alpha").await;
        // The whole fence in one batch, its run long enough for a front that went away
        // to tear the fence down by calls of its own meanwhile.
        let batch = batch_running(&n, "alpha", &id, whole_batch(&["sleep-ms", "400"])).await;
        let on = serde_json::to_vec(&protocol::OnContainer {
            container: id.clone(),
        })
        .unwrap();
        assert_eq!(send(&n, "revoke-grant", "alpha", &on).await.0, 200);
        mock.clear_trace();
        let (s, b) = batch.await.unwrap();
        assert_eq!(s, 200, "{b}");
        let lines: Vec<RunLine> = batch_lines(&b)
            .into_iter()
            .filter(|l| matches!(l, RunLine::Answer(_)))
            .collect();
        assert_eq!(lines.len(), 4, "stopped at the kill-all: {b}");
        assert!(
            matches!(&lines[3], RunLine::Answer(Answer::Error(e)) if e.kind == "unreachable"),
            "{b}"
        );
        // Nothing was killed or revoked after the fence was closed: a later fence of
        // the key (which opens once the run ended) is never this batch's to touch.
        assert!(
            !mock
                .ops()
                .iter()
                .any(|o| *o == "kill-all" || *o == "revoke-grant"),
            "{:?}",
            mock.ops()
        );
    }

    #[tokio::test]
    async fn no_grant_opens_on_a_container_while_an_earlier_fences_run_is_going() {
        let mock = Arc::new(Mock::new(2));
        let (n, _dir) = node(mock.clone());
        let id = ensured(&n, "alpha").await;
        // A fence whose front went away mid-run (a cut link): its run goes on.
        let mut first: protocol::Batch =
            serde_json::from_slice(&fence_batch(&id, &["sleep-ms", "2600"])).unwrap();
        first.calls.truncate(2);
        let batch = batch_running(&n, "alpha", &id, serde_json::to_vec(&first).unwrap()).await;
        // The key's next fence cannot open a grant the old command would share: the
        // apply waits RUN_END_WAIT for the run to end, then is refused.
        let grant = stockade_egress::rules::Grant::parse(&[]).unwrap();
        let next = serde_json::to_vec(&protocol::ApplyGrant::new(&id, "f2", &grant)).unwrap();
        let (s, b) = send(&n, "apply-grant", "alpha", &next).await;
        assert_eq!(s, 200, "{b}");
        assert!(
            matches!(serde_json::from_str::<Answer<()>>(&b).unwrap(), Answer::Error(e) if e.kind == "failed"),
            "{b}"
        );
        assert!(n.leases.running(&id), "refused while the run still went");
        // An apply made while the run is about to end (a run its front just killed)
        // waits for it and opens.
        let (s, b) = send(&n, "apply-grant", "alpha", &next).await;
        assert!(!n.leases.running(&id));
        batch.await.unwrap();
        assert_eq!(s, 200, "{b}");
        assert!(
            matches!(
                serde_json::from_str::<Answer<()>>(&b).unwrap(),
                Answer::Ok(())
            ),
            "{b}"
        );
    }

    #[tokio::test]
    async fn a_batch_naming_the_ensured_container_without_opening_with_ensure_is_refused_whole() {
        let mock = Arc::new(Mock::new(2));
        let (n, _dir) = node(mock.clone());
        // `""` with no ensure before it.
        let (s, b) = send(
            &n,
            call::BATCH,
            "alpha",
            &fence_batch(protocol::ENSURED, &["true"]),
        )
        .await;
        assert_eq!(s, 400, "{b}");
        // An ensure that is not the first call.
        let mut late: protocol::Batch = serde_json::from_slice(&ensure_batch(&["true"])).unwrap();
        late.calls.swap(0, 1);
        let (s, b) = send(
            &n,
            call::BATCH,
            "alpha",
            &serde_json::to_vec(&late).unwrap(),
        )
        .await;
        assert_eq!(s, 400, "{b}");
        // Two ensures.
        let two = br#"{"calls":[{"ensure":{}},{"ensure":{}}]}"#;
        assert_eq!(send(&n, call::BATCH, "alpha", two).await.0, 400);
        // An ensure's body takes nothing.
        let extra = br#"{"calls":[{"ensure":{"key":"beta"}}]}"#;
        assert_eq!(send(&n, call::BATCH, "alpha", extra).await.0, 400);
        assert!(mock.ops().is_empty(), "{:?}", mock.ops());
    }

    #[tokio::test]
    async fn a_streamed_stdin_arrives_whole_and_a_tampered_one_is_refused() {
        let mock = Arc::new(Mock::new(2));
        let (n, _dir) = node(mock.clone());
        let id = ensured(&n, "alpha").await;
        let head = |length: Option<u64>| {
            serde_json::to_vec(&protocol::RunStream {
                container: id.clone(),
                cmd: Command {
                    argv: vec!["cat".into()],
                    cwd: "/workspace".into(),
                    env: vec![],
                    stdin: vec![],
                    stdin_stream: None,
                },
                timeout_ms: 5_000,
                length,
                upload: None,
            })
            .unwrap()
        };
        // Larger than the node's plain body bound (1 KiB here) many times over.
        let data: Vec<u8> = (0..3 * stream::MAX_FRAME + 5)
            .map(|i| (i % 253) as u8)
            .collect();
        let framed = |sig: &str, data: &[u8]| {
            let mut f = stream::Framer::new(SECRET, sig);
            let mut out: Vec<u8> = f.frames(data).concat();
            out.extend_from_slice(&f.end());
            out
        };
        let nonce = auth::nonce();
        let h = head(Some(data.len() as u64));
        let (s, lines) = send_stream(&n, "alpha", &h, &nonce, |sig| framed(sig, &data)).await;
        assert_eq!(s, 200);
        let mut got = Vec::new();
        for l in &lines[..lines.len() - 1] {
            let RunLine::Stdout(b) = serde_json::from_str(l).unwrap() else {
                panic!("{l}")
            };
            got.extend(b);
        }
        assert!(got == data, "the stdin arrived whole ({} bytes)", got.len());
        assert!(
            lines.last().unwrap().contains(r#""exit_code":0"#),
            "{lines:?}"
        );
        // The same request again (its nonce): a replay, refused before any frame.
        let (s, _) = send_stream(&n, "alpha", &h, &nonce, |sig| framed(sig, &data)).await;
        assert_eq!(s, 401);
        // (why, the key, the frames for a request signed `sig`, what the answer says)
        type Frames = Box<dyn FnOnce(&str) -> Vec<u8>>;
        let cut = framed("x", &data).len() - 1;
        let d1 = data.clone();
        let d2 = data.clone();
        let d3 = data.clone();
        let rows: Vec<(&str, &str, Frames, &str)> = vec![
            (
                "frames of another request (spliced)",
                "alpha",
                Box::new(move |_| framed("another-signature", &d1)),
                "tag does not verify",
            ),
            (
                "cut before its end",
                "alpha",
                Box::new(move |sig| framed(sig, &d2)[..cut].to_vec()),
                "broke off",
            ),
            (
                "longer than signed",
                "alpha",
                Box::new(move |sig| framed(sig, &[&d3[..], b"x"].concat())),
                "longer than its signed length",
            ),
        ];
        for (why, key, frames, says) in rows {
            let (s, lines) = send_stream(&n, key, &h, &auth::nonce(), frames).await;
            assert_eq!(s, 200, "{why}");
            let last: RunLine = serde_json::from_str(lines.last().unwrap()).unwrap();
            let RunLine::Error(e) = last else {
                panic!("{why}: {lines:?}")
            };
            assert_eq!(e.kind, "invalid", "{why}");
            assert!(e.message.contains(says), "{why}: {}", e.message);
        }
        // A retry (a fresh nonce, the same idempotency key) gets the first answer's last
        // line; the run is not done again.
        let before = mock.ops().iter().filter(|o| **o == "run").count();
        let (s, first) = send_stream_idem(&n, "alpha", &h, &auth::nonce(), "i-1", |sig| {
            framed(sig, &data)
        })
        .await;
        assert_eq!(s, 200);
        let (s, again) = send_stream_idem(&n, "alpha", &h, &auth::nonce(), "i-1", |sig| {
            framed(sig, &data)
        })
        .await;
        assert_eq!(s, 200);
        assert_eq!(
            again,
            vec![first.last().unwrap().clone()],
            "the stored last line"
        );
        assert_eq!(
            mock.ops().iter().filter(|o| **o == "run").count(),
            before + 1,
            "one run for two attempts"
        );
        // Another key naming the container: 403 before anything runs.
        let before = mock.ops().len();
        let (s, _) = send_stream(&n, "beta", &h, &auth::nonce(), |sig| framed(sig, b"")).await;
        assert_eq!(s, 403);
        assert_eq!(mock.ops().len(), before, "nothing ran");
    }

    /// A tar archive of (name, kind, link target or contents), headers written raw.
    fn tar_of(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            if *kind == tar::EntryType::Symlink {
                h.set_size(0);
                // Raw, as a hostile archive would carry it.
                h.as_old_mut().linkname[..data.len()].copy_from_slice(data.as_bytes());
                h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
                h.set_cksum();
                b.append(&h, std::io::empty()).unwrap();
            } else {
                h.set_size(data.len() as u64);
                h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
                h.set_cksum();
                b.append(&h, data.as_bytes()).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    #[tokio::test]
    async fn a_node_checks_an_upload_it_is_asked_to_with_the_servers_checker() {
        let mock = Arc::new(Mock::new(2));
        let (n, _dir) = node(mock.clone());
        let id = ensured(&n, "alpha").await;
        let head = |upload: protocol::UploadCheck| {
            serde_json::to_vec(&protocol::RunStream {
                container: id.clone(),
                cmd: Command {
                    argv: vec!["cat".into()],
                    cwd: "/workspace".into(),
                    env: vec![],
                    stdin: vec![],
                    stdin_stream: None,
                },
                timeout_ms: 5_000,
                length: None,
                upload: Some(upload),
            })
            .unwrap()
        };
        let archive = |marker: &str| protocol::UploadCheck::Archive {
            marker: marker.into(),
        };
        use tar::EntryType::{Regular, Symlink};
        // (why, what is checked, the body, the verdict, whether the completion entry
        // reached the run)
        let rows: Vec<(&str, protocol::UploadCheck, Vec<u8>, &str, bool)> = vec![
            (
                "a good archive",
                archive("m1"),
                tar_of(&[("a.txt", Regular, "hello"), ("l", Symlink, "a.txt")]),
                r#"{"upload":{"entries":2}}"#,
                true,
            ),
            (
                "a ../ path",
                archive("m2"),
                tar_of(&[("ok.txt", Regular, "fine"), ("../evil", Regular, "EVIL")]),
                r#"{"upload":{"refused":"../evil has .."}}"#,
                false,
            ),
            (
                "a symlink out of the tree",
                archive("m3"),
                tar_of(&[("esc", Symlink, "../../etc")]),
                r#"{"upload":{"refused":"#,
                false,
            ),
            (
                "one file",
                protocol::UploadCheck::File {
                    path: "d/f.bin".into(),
                    len: 3,
                    marker: "m4".into(),
                },
                b"abc".to_vec(),
                r#"{"upload":{"entries":1}}"#,
                true,
            ),
            (
                "one file, a bad path",
                protocol::UploadCheck::File {
                    path: "../f".into(),
                    len: 3,
                    marker: "m5".into(),
                },
                b"abc".to_vec(),
                r#"{"upload":{"refused":"#,
                false,
            ),
        ];
        for (why, check, body, verdict, complete) in rows {
            let marker = match &check {
                protocol::UploadCheck::Archive { marker }
                | protocol::UploadCheck::File { marker, .. } => marker.clone(),
            };
            let h = head(check);
            let (s, lines) = send_stream(&n, "alpha", &h, &auth::nonce(), |sig| {
                let mut f = stream::Framer::new(SECRET, sig);
                let mut out: Vec<u8> = f.frames(&body).concat();
                out.extend_from_slice(&f.end());
                out
            })
            .await;
            assert_eq!(s, 200, "{why}");
            let mut stdin = Vec::new();
            for l in &lines {
                if let Ok(RunLine::Stdout(b)) = serde_json::from_str(l) {
                    stdin.extend(b);
                }
            }
            let at = lines.len() - 2;
            assert!(lines[at].starts_with(verdict), "{why}: {lines:?}");
            let name = stockade_node_protocol::upload::archive::completion_name(&marker);
            let has = |needle: &[u8]| stdin.windows(needle.len()).any(|w| w == needle);
            assert_eq!(has(name.as_bytes()), complete, "{why}");
            assert!(!has(b"EVIL"), "{why}: a refused entry reached the run");
        }
        // A marker that is not letters and digits: refused before anything runs.
        let before = mock.ops().len();
        let h = head(archive("../x"));
        let (s, _) = send_stream(&n, "alpha", &h, &auth::nonce(), |sig| {
            stream::Framer::new(SECRET, sig).end().to_vec()
        })
        .await;
        assert_eq!(s, 400);
        assert_eq!(mock.ops().len(), before);
    }

    #[tokio::test]
    async fn pending_decisions_are_a_keys_own_and_answered_once() {
        use stockade_egress::ask::Pending;
        let mock = Arc::new(Mock::new(4));
        let (n, _dir) = node(mock.clone());
        let hold = |key: &str| {
            let p = Pending {
                id: String::new(),
                key: key.into(),
                fence: format!("f-{key}"),
                method: "GET".into(),
                host: "example.com".into(),
                port: 80,
                path: "/x".into(),
                reason: "no-rule".into(),
                at_ms: 0,
                expires_ms: 0,
                widens: "GET example.com:80/x".into(),
            };
            mock.asks().hold(&format!("c-{key}"), p).expect("room")
        };
        let (a, _wait_a) = hold("alpha");
        let (b, _wait_b) = hold("beta");
        let listed = |body: &str| -> Vec<String> {
            match serde_json::from_str::<Answer<Vec<Pending>>>(body).unwrap() {
                Answer::Ok(v) => v.into_iter().map(|p| p.id).collect(),
                Answer::Error(e) => panic!("{e:?}"),
            }
        };
        // Keyed: the key's own only; node-wide (no key): every key's.
        let (s, body) = send(&n, "pending", "alpha", b"{}").await;
        assert_eq!(s, 200, "{body}");
        assert_eq!(listed(&body), vec![a.id.clone()]);
        let (_, body) = send(&n, "pending", "", b"{}").await;
        let mut all = listed(&body);
        all.sort();
        let mut want = vec![a.id.clone(), b.id.clone()];
        want.sort();
        assert_eq!(all, want);
        let verdict = |id: &str, d: &str| format!(r#"{{"id":"{id}","decision":"{d}"}}"#);
        // A key answering another key's decision: 403, and it stays held.
        let (s, body) = send(
            &n,
            "answer-pending",
            "alpha",
            verdict(&b.id, "approve").as_bytes(),
        )
        .await;
        assert_eq!(s, 403, "{body}");
        assert_eq!(mock.asks().pending(Some("beta")).len(), 1, "still held");
        // Its own: answered once; again: already decided.
        let answered =
            |body: &str| serde_json::from_str::<Answer<protocol::PendingAnswer>>(body).unwrap();
        let (s, body) = send(
            &n,
            "answer-pending",
            "alpha",
            verdict(&a.id, "refuse").as_bytes(),
        )
        .await;
        assert_eq!(s, 200, "{body}");
        assert_eq!(
            answered(&body),
            Answer::Ok(protocol::PendingAnswer::Answered(a.clone()))
        );
        let (_, body) = send(
            &n,
            "answer-pending",
            "alpha",
            verdict(&a.id, "approve").as_bytes(),
        )
        .await;
        assert_eq!(
            answered(&body),
            Answer::Ok(protocol::PendingAnswer::AlreadyDecided("refused".into()))
        );
        // Node-wide: whoever's; an id never issued is not found.
        let (_, body) = send(
            &n,
            "answer-pending",
            "",
            verdict(&b.id, "approve").as_bytes(),
        )
        .await;
        assert_eq!(
            answered(&body),
            Answer::Ok(protocol::PendingAnswer::Answered(b.clone()))
        );
        let never = uuid::Uuid::new_v4().to_string();
        let (_, body) = send(
            &n,
            "answer-pending",
            "",
            verdict(&never, "approve").as_bytes(),
        )
        .await;
        assert_eq!(
            answered(&body),
            Answer::Ok(protocol::PendingAnswer::NotFound)
        );
        // A key outside the grammar is still refused; an unknown verdict does not parse.
        let (s, _) = send(&n, "pending", "../etc", b"{}").await;
        assert_eq!(s, 400);
        let (s, _) = send(
            &n,
            "answer-pending",
            "",
            verdict(&never, "maybe").as_bytes(),
        )
        .await;
        assert_eq!(s, 400);
    }

    #[tokio::test]
    async fn bad_input_is_a_typed_refusal_and_changes_nothing() {
        let mock = Arc::new(Mock::new(4));
        let (n, _dir) = node(mock.clone());
        let big = vec![b' '; 2048];
        // (why, call, key, body, status, kind)
        type Row<'a> = (&'a str, &'a str, &'a str, &'a [u8], u16, &'a str);
        let rows: &[Row<'_>] = &[
            (
                "an unknown field",
                "ensure",
                "alpha",
                br#"{"key":"beta"}"#,
                400,
                "invalid",
            ),
            ("not JSON", "ensure", "alpha", b"ensure!", 400, "invalid"),
            (
                "a key outside the grammar",
                "ensure",
                "../etc",
                b"{}",
                400,
                "invalid",
            ),
            (
                "no key on a keyed call",
                "ensure",
                "",
                b"{}",
                400,
                "invalid",
            ),
            (
                "an unknown call",
                "format-disk",
                "alpha",
                b"{}",
                404,
                "invalid",
            ),
            (
                "a body over the bound",
                "ensure",
                "alpha",
                &big,
                413,
                "invalid",
            ),
            (
                "a container never ensured",
                "stop",
                "alpha",
                br#"{"container":"c1"}"#,
                403,
                "forbidden",
            ),
        ];
        for (why, call, key, body, status, kind) in rows {
            let (s, b) = send(&n, call, key, body).await;
            assert_eq!(s, *status, "{why}: {b}");
            let v: serde_json::Value = serde_json::from_str(&b).unwrap();
            assert_eq!(v["error"]["kind"], *kind, "{why}: {b}");
        }
        assert!(
            mock.ops().is_empty(),
            "nothing reached the substrate: {:?}",
            mock.ops()
        );
        // A put-secret that does not parse never echoes its value.
        let (s, b) = send(
            &n,
            "put-secret",
            "",
            br#"{"name":"tok","value":"hunter2","host":"a.example","port":"hunter2","methods":["GET"],"path_prefix":"/"}"#,
        )
        .await;
        assert_eq!(s, 400);
        assert!(!b.contains("hunter2"), "{b}");
    }

    #[tokio::test]
    async fn a_door_opens_only_on_the_keys_own_container_and_a_bad_port_is_invalid() {
        let mock = Arc::new(Mock::new(4));
        let (n, _dir) = node(mock.clone());
        let ensure = |key: &'static str| {
            let n = n.clone();
            async move {
                let (s, b) = send(&n, "ensure", key, b"{}").await;
                assert_eq!(s, 200, "{b}");
                match serde_json::from_str::<Answer<String>>(&b).unwrap() {
                    Answer::Ok(id) => id,
                    Answer::Error(e) => panic!("{e:?}"),
                }
            }
        };
        let (a, b) = (ensure("alpha").await, ensure("beta").await);
        let on = |c: &str, port: &str| format!(r#"{{"container":"{c}","port":{port}}}"#);
        let (s, body) = send(&n, "open-preview", "alpha", on(&a, "8000").as_bytes()).await;
        assert_eq!(s, 200, "{body}");
        let Answer::Ok(door) = serde_json::from_str::<Answer<protocol::Preview>>(&body).unwrap()
        else {
            panic!("{body}")
        };
        assert_eq!(door.port, 8000);
        assert!(door.url.contains(&door.token), "{door:?}");
        let (_, again) = send(&n, "open-preview", "alpha", on(&a, "8000").as_bytes()).await;
        assert_eq!(
            again, body,
            "the open door answered again, not a second one"
        );
        let list = format!(r#"{{"container":"{a}"}}"#);
        let (_, listed) = send(&n, "list-previews", "alpha", list.as_bytes()).await;
        assert_eq!(listed, format!(r#"{{"ok":[{}]}}"#, json_str(&door)));
        // Nothing below reaches the substrate: another key's container (whichever
        // call), a container no key ensured, a port that does not parse, port 0.
        let before = mock.ops();
        // (why, call, key, body, status, kind)
        let rows: Vec<(&str, &str, &str, String, u16, &str)> = vec![
            (
                "another key opens",
                "open-preview",
                "beta",
                on(&a, "9000"),
                403,
                "forbidden",
            ),
            (
                "another key closes",
                "close-preview",
                "beta",
                on(&a, "8000"),
                403,
                "forbidden",
            ),
            (
                "another key lists",
                "list-previews",
                "beta",
                list.clone(),
                403,
                "forbidden",
            ),
            (
                "never ensured",
                "open-preview",
                "alpha",
                on("c-guessed", "8000"),
                403,
                "forbidden",
            ),
            (
                "port 65536",
                "open-preview",
                "alpha",
                on(&a, "65536"),
                400,
                "invalid",
            ),
            (
                "port -1",
                "open-preview",
                "alpha",
                on(&a, "-1"),
                400,
                "invalid",
            ),
            (
                "port a string",
                "open-preview",
                "alpha",
                on(&a, "\"8000\""),
                400,
                "invalid",
            ),
            (
                "an unknown field",
                "open-preview",
                "alpha",
                format!(r#"{{"container":"{a}","port":8000,"key":"beta"}}"#),
                400,
                "invalid",
            ),
            (
                "port 0 opens",
                "open-preview",
                "alpha",
                on(&a, "0"),
                200,
                "invalid",
            ),
            (
                "port 0 closes",
                "close-preview",
                "alpha",
                on(&a, "0"),
                200,
                "invalid",
            ),
        ];
        for (why, call, key, body, status, kind) in rows {
            let (s, got) = send(&n, call, key, body.as_bytes()).await;
            assert_eq!(s, status, "{why}: {got}");
            let v: serde_json::Value = serde_json::from_str(&got).unwrap();
            assert_eq!(v["error"]["kind"], kind, "{why}: {got}");
        }
        assert_eq!(mock.ops(), before, "nothing reached the substrate");
        // Beta's own container has no door; alpha's is as it was.
        let (_, theirs) = send(
            &n,
            "list-previews",
            "beta",
            format!(r#"{{"container":"{b}"}}"#).as_bytes(),
        )
        .await;
        assert_eq!(theirs, r#"{"ok":[]}"#);
        let (_, still) = send(&n, "list-previews", "alpha", list.as_bytes()).await;
        assert_eq!(still, listed);
        // Its owner closes it: true once, then false; gone from the list.
        let (_, closed) = send(&n, "close-preview", "alpha", on(&a, "8000").as_bytes()).await;
        assert_eq!(closed, r#"{"ok":true}"#);
        let (_, closed) = send(&n, "close-preview", "alpha", on(&a, "8000").as_bytes()).await;
        assert_eq!(closed, r#"{"ok":false}"#);
        let (_, listed) = send(&n, "list-previews", "alpha", list.as_bytes()).await;
        assert_eq!(listed, r#"{"ok":[]}"#);
    }

    fn json_str<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[tokio::test]
    async fn calls_reach_the_substrate_for_their_key_and_answer_its_words() {
        let mock = Arc::new(Mock::new(1));
        let (n, _dir) = node(mock.clone());
        let (s, b) = send(&n, "ensure", "alpha", b"{}").await;
        assert_eq!(s, 200, "{b}");
        let id: Answer<String> = serde_json::from_str(&b).unwrap();
        let Answer::Ok(id) = id else { panic!("{b}") };
        // The gate is full: an answer, not an HTTP error.
        let (s, b) = send(&n, "ensure", "beta", b"").await;
        assert_eq!(
            (s, b.as_str()),
            (200, r#"{"error":{"kind":"over-capacity","message":""}}"#)
        );
        let (s, b) = send(&n, "health", "", b"{}").await;
        assert_eq!(s, 200);
        assert_eq!(
            serde_json::from_str::<Answer<protocol::Health>>(&b).unwrap(),
            Answer::Ok(protocol::Health {
                node: "node-1".into(),
                substrate: "mock".into(),
                live: 1,
                ceiling: 4,
            })
        );
        let stop = format!(r#"{{"container":"{id}"}}"#);
        let (s, _) = send(&n, "stop", "beta", stop.as_bytes()).await;
        assert_eq!(s, 403, "another key");
        // The egress audit's admitted requests are the key's own, from the node's store.
        let a = stockade_egress::audit::Admitted {
            at_ms: 1,
            fence: "f".into(),
            method: "GET".into(),
            host: "example.com".into(),
            port: 443,
            ..Default::default()
        };
        n.store.record_admitted("alpha", &id, &a).unwrap();
        let (s, b) = send(&n, "admitted", "alpha", b"{}").await;
        assert_eq!(s, 200, "{b}");
        let got: Answer<Vec<stockade_egress::audit::Admitted>> = serde_json::from_str(&b).unwrap();
        assert_eq!(got, Answer::Ok(vec![a]));
        let (_, b) = send(&n, "admitted", "beta", b"{}").await;
        assert_eq!(b, r#"{"ok":[]}"#, "another key's are not");
        // A run carries its stdin: its body may pass the plain bound (1 KiB here).
        let stdin = vec![b'x'; 4096];
        let run = serde_json::to_vec(&protocol::Run {
            container: id.clone(),
            cmd: Command {
                argv: vec!["cat".into()],
                cwd: "/workspace".into(),
                env: vec![],
                stdin: stdin.clone(),
                stdin_stream: None,
            },
            timeout_ms: 5_000,
        })
        .unwrap();
        let (s, b) = send(&n, "run", "alpha", &run).await;
        assert_eq!(s, 200, "{b}");
        let lines: Vec<RunLine> = b
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.first(), Some(&RunLine::Stdout(stdin)), "{b}");
        assert!(
            matches!(lines.last(), Some(RunLine::Result(r)) if r.exit_code == 0),
            "{b}"
        );
        let (s, b) = send(&n, "stop", "alpha", stop.as_bytes()).await;
        assert_eq!((s, b.as_str()), (200, r#"{"ok":null}"#));
    }

    #[tokio::test]
    async fn a_runs_head_waits_for_its_first_line_but_never_past_the_bound() {
        use futures_util::StreamExt;
        let every = Duration::from_secs(5);
        // A short run: its one line and the end are the answer's first frames.
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Bytes::from_static(b"{\"result\":1}\n")).unwrap();
        drop(tx);
        let r = stream_after_first_line(rx, every).await;
        let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        assert_eq!(&b[..], b"{\"result\":1}\n");
        // A run saying nothing: the head goes after FIRST_LINE_WAIT, not a heartbeat's
        // interval, and the heartbeats follow as before.
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        let t = std::time::Instant::now();
        let r = stream_after_first_line(rx, every).await;
        let waited = t.elapsed();
        assert!(
            waited >= FIRST_LINE_WAIT && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        tx.send(Bytes::from_static(b"{\"stdout\":\"\"}\n")).unwrap();
        let mut body = r.into_body().into_data_stream();
        let first = body.next().await.unwrap().unwrap();
        assert_eq!(&first[..], b"{\"stdout\":\"\"}\n");
        drop(tx);
        assert!(body.next().await.is_none(), "ends with its lines");
    }
}
