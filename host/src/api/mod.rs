//! The HTTP JSON API: one route per facade call, bearer-token auth, every error a
//! JSON object with a stable code. `docs/openapi.json` describes it; a test checks the
//! document against [`ROUTES`].

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::Value;

use stockade_runtime::bindings::{ExecInput, ExecOutcome, FacadeError};
use stockade_wire::{self as wire, ErrorCode};

use stockade_runtime::imports::clock::now_ms;
use stockade_runtime::runtime::{CallError, ExecIo, Runtime};

mod auth;
mod egress_ask;
mod error;
pub mod in_process;
pub mod mock;
pub mod nodes;
pub mod previews;
mod pty;
mod sandboxes;
mod snapshots;
mod tenants;
mod tokens;
mod upload;

pub use auth::{APPROVER_ROUTES, EITHER_ROUTES, ENSURING_ROUTES, MOCK_ROUTES, OPERATOR_ROUTES};
use error::{ApiError, ApiResult, Params, error_event};
pub use tokens::{load_or_create_approver_token, load_or_create_token};
use upload::{UploadSlots, put_archive, put_file};

/// Every route: (method, path template). The OpenAPI document must list exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/health"),
    ("GET", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes/{key}"),
    ("DELETE", "/v1/sandboxes/{key}"),
    ("PUT", "/v1/sandboxes/{key}/lifetime"),
    ("DELETE", "/v1/sandboxes/{key}/lifetime"),
    ("PUT", "/v1/sandboxes/{key}/metadata"),
    ("PUT", "/v1/sandboxes/{key}/network"),
    ("DELETE", "/v1/sandboxes/{key}/network"),
    ("POST", "/v1/sandboxes/{key}/exec"),
    ("POST", "/v1/sandboxes/{key}/exec/stream"),
    ("POST", "/v1/sandboxes/{key}/detached"),
    ("GET", "/v1/sandboxes/{key}/detached/{id}"),
    ("DELETE", "/v1/sandboxes/{key}/detached/{id}"),
    ("POST", "/v1/sandboxes/{key}/ensure"),
    ("POST", "/v1/sandboxes/{key}/abort"),
    ("POST", "/v1/sandboxes/{key}/checkpoint"),
    ("POST", "/v1/sandboxes/{key}/snapshots"),
    ("GET", "/v1/sandboxes/{key}/snapshots"),
    ("DELETE", "/v1/sandboxes/{key}/snapshots/{name}"),
    ("POST", "/v1/sandboxes/{key}/fork"),
    ("GET", "/v1/sandboxes/{key}/denials"),
    ("GET", "/v1/sandboxes/{key}/artifacts"),
    ("GET", "/v1/sandboxes/{key}/artifacts/{name}"),
    ("POST", "/v1/sandboxes/{key}/approvals"),
    ("PUT", "/v1/sandboxes/{key}/files"),
    ("PUT", "/v1/sandboxes/{key}/files/{path}"),
    ("GET", "/v1/sandboxes/{key}/egress"),
    ("POST", "/v1/sandboxes/{key}/previews"),
    ("GET", "/v1/sandboxes/{key}/previews"),
    ("DELETE", "/v1/sandboxes/{key}/previews/{port}"),
    ("GET", "/v1/sandboxes/{key}/pty"),
    ("GET", "/v1/sandboxes/{key}/egress/pending"),
    ("GET", "/v1/egress/pending"),
    ("POST", "/v1/egress/pending/{id}"),
    ("GET", "/v1/secrets"),
    ("PUT", "/v1/secrets/{name}"),
    ("DELETE", "/v1/secrets/{name}"),
    ("POST", "/v1/tokens"),
    ("GET", "/v1/tokens"),
    ("DELETE", "/v1/tokens/{id}"),
    ("GET", "/v1/tokens/self"),
];

/// What the handlers share.
pub struct ApiState {
    /// The runtime.
    pub runtime: Arc<Runtime>,
    /// The consumers' bearer token.
    pub token: String,
    /// The approvers' bearer token: the only one `POST …/approvals` takes (a consumer
    /// does not approve its own floor commands).
    pub approver_token: String,
    /// How long an approval lives.
    pub approval_ttl_ms: u64,
    /// Server-held secrets (`/v1/secrets`, the approver's token only).
    pub secrets: stockade_egress::secrets::Secrets,
    /// The scoped consumer tokens (`/v1/tokens`, the operator's token only).
    pub tenants: Arc<crate::tenants::Tenants>,
}

/// The request types are the wire crate's; kept at this path for the handlers'
/// callers.
pub use stockade_wire::{CommandBody, GrantBody, RuleSpec};

use crate::answers;
pub use crate::answers::{detached_state, exec_input, outcome};

fn parse_json<T: for<'de> Deserialize<'de>>(body: Result<Bytes, BytesRejection>) -> ApiResult<T> {
    let body = raw_body(body)?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::MalformedJson,
            e.to_string(),
        )
    })
}

fn command_input(cmd: CommandBody) -> ApiResult<ExecInput> {
    exec_input(cmd).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, e))
}

/// A fenced command's input, with its grant's secrets checked ([`check_secrets`]) after
/// the input itself converts (a bad stdin is answered first, as it always was).
fn exec_command(s: &ApiState, cmd: CommandBody) -> ApiResult<ExecInput> {
    let rules = cmd
        .grant
        .as_ref()
        .map(|g| g.rules.clone())
        .unwrap_or_default();
    let input = command_input(cmd)?;
    check_secrets(s, &rules)?;
    Ok(input)
}

/// A grant may name only secrets the server holds: one it does not is a 409
/// `secret-not-set` (the request is well-formed; the server's state is missing a value).
/// A rule naming a secret must sit inside the binding its approver set (DESIGN §5): one
/// outside it, or naming an unbound secret, is a 400 `invalid-input` naming the rule and
/// the secret (never a value). The grant is validated in one place, the guest
/// (`guest/src/decide/validate.rs`, `decide/credentials.rs`); this answers the same
/// refusals earlier, with the API's status codes (the guest sees bindings, not which
/// secrets are set), by the same grammar functions on the same `RuleSpec`s
/// ([`stockade_grammar::rules::Grant::parse`], [`stockade_grammar::binding::grant_within`]),
/// so the two cannot disagree. Names and rules outside the grammar in a grant that names
/// no secret are left to the guest's 400.
fn check_secrets(s: &ApiState, rules: &[RuleSpec]) -> ApiResult<()> {
    let named = || {
        rules
            .iter()
            .flat_map(|r| r.headers.iter().map(|(_, secret)| secret.as_str()))
            .filter(|n| stockade_grammar::rules::secret_name(n).is_ok())
    };
    for name in named() {
        if !s.secrets.exists(name) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::SecretNotSet,
                format!(
                    "secret {name:?} is not set (PUT /v1/secrets/{name} with the approver token)"
                ),
            ));
        }
    }
    if named().next().is_none() {
        return Ok(());
    }
    // A grant naming a secret is parsed here whole, so a credential rule the grammar
    // refuses (no methods, TRACE, ...) is refused before anything runs, as the guest
    // would, with the same message.
    let invalid =
        |message: String| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, message);
    let grant = stockade_grammar::rules::Grant::parse(rules).map_err(|e| invalid(e.to_string()))?;
    stockade_grammar::binding::grant_within(&grant, |name| s.secrets.binding(name))
        .map_err(|e| invalid(e.to_string()))
}

async fn health() -> Json<wire::Health> {
    Json(wire::Health { ok: true })
}

async fn exec(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<wire::ExecOutcome>> {
    let cmd: CommandBody = parse_json(body)?;
    let input = exec_command(&s, cmd)?;
    // Held while this handler waits: a client that disconnects drops it (hyper drops
    // the handler), and its run is killed and its fence torn down (ExecIo).
    let (_present, caller) = tokio::sync::watch::channel(());
    let io = ExecIo {
        caller: Some(caller),
        ..ExecIo::default()
    };
    let out = s.runtime.exec_with(&key, &input, io).await?;
    Ok(Json(outcome(&out)))
}

/// `exec` with live output: NDJSON, one event per chunk as the command writes it,
/// then the outcome (`crate::stream`). An error before the command starts (bad input,
/// a floor command, over capacity) is the same plain error as `exec`'s; after, it is
/// the stream's last event. A client that disconnects ends the command (its fence is
/// torn down and revoked as on every path). A slow client never slows the command:
/// what is waiting for it is bounded by the output limit.
async fn exec_stream(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    use stockade_runtime::substrate::Output;
    let cmd: CommandBody = parse_json(body)?;
    let input = exec_command(&s, cmd)?;
    let (present, caller) = tokio::sync::watch::channel(());
    let (sink, mut output) = tokio::sync::mpsc::unbounded_channel();
    let rt = s.runtime.clone();
    let call = tokio::spawn(async move {
        let io = ExecIo {
            output: Some(sink),
            caller: Some(caller),
            ..ExecIo::default()
        };
        rt.exec_with(&key, &input, io).await
    });
    // Until the run starts, the call may still fail as a plain error.
    let started = matches!(output.recv().await, Some(Output::Started));
    let mut call = Some(call);
    if !started {
        let r = call.take().expect("the call").await;
        let out = r.map_err(|e| CallError::Trap(format!("the call's task failed: {e}")))??;
        return Ok(ndjson(futures_util::stream::iter([Ok::<
            _,
            std::convert::Infallible,
        >(event_line(
            &exit_event(&out),
        ))])));
    }
    struct Live {
        output: tokio::sync::mpsc::UnboundedReceiver<Output>,
        call: Option<tokio::task::JoinHandle<Result<ExecOutcome, CallError>>>,
        // Dropped with the body when the client goes away: that ends the run.
        _present: tokio::sync::watch::Sender<()>,
        out: crate::stream::Utf8Chunker,
        err: crate::stream::Utf8Chunker,
    }
    let live = Live {
        output,
        call,
        _present: present,
        out: Default::default(),
        err: Default::default(),
    };
    let events = futures_util::stream::unfold(live, |mut l| async move {
        use crate::stream::{line, output_event};
        loop {
            match l.output.recv().await {
                Some(Output::Stdout(b)) => {
                    if let Some(p) = l.out.push(&b) {
                        return Some((Ok(line(&output_event("stdout", p))), l));
                    }
                }
                Some(Output::Stderr(b)) => {
                    if let Some(p) = l.err.push(&b) {
                        return Some((Ok(line(&output_event("stderr", p))), l));
                    }
                }
                Some(Output::Started) => {}
                None => {
                    // The run is over (every sender is gone): what is held, then the
                    // outcome.
                    if let Some(p) = l.out.finish() {
                        return Some((Ok(line(&output_event("stdout", p))), l));
                    }
                    if let Some(p) = l.err.finish() {
                        return Some((Ok(line(&output_event("stderr", p))), l));
                    }
                    let call = l.call.take()?;
                    let last = match call.await {
                        Ok(Ok(out)) => exit_event(&out),
                        Ok(Err(e)) => error_event(ApiError::from(e)),
                        Err(e) => error_event(ApiError::from(CallError::Trap(format!(
                            "the call's task failed: {e}"
                        )))),
                    };
                    return Some((Ok::<_, std::convert::Infallible>(event_line(&last)), l));
                }
            }
        }
    });
    Ok(ndjson(events))
}

/// A 200 NDJSON response over `events`.
fn ndjson<S>(events: S) -> Response
where
    S: futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static,
{
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        axum::body::Body::from_stream(events),
    )
        .into_response()
}

/// The stream's last event after a run: the outcome without its output (already
/// streamed).
pub fn exit_event(o: &ExecOutcome) -> wire::StreamEvent {
    wire::StreamEvent::Exit(wire::ExitEvent::from(&outcome(o)))
}

/// A final event as one NDJSON line (keys in the order every line has: sorted).
fn event_line(ev: &wire::StreamEvent) -> Bytes {
    crate::stream::line(&serde_json::to_value(ev).unwrap_or(Value::Null))
}

async fn start_detached(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<wire::Started>)> {
    let cmd: CommandBody = parse_json(body)?;
    let id = s.runtime.start_detached(&key, &command_input(cmd)?).await?;
    Ok((StatusCode::CREATED, Json(wire::Started { id })))
}

async fn detached_status(
    State(s): State<Arc<ApiState>>,
    Params((key, id)): Params<(String, String)>,
) -> ApiResult<Json<wire::DetachedState>> {
    let st = s.runtime.detached_status(&key, &id).await?;
    Ok(Json(detached_state(&st)))
}

async fn stop_detached(
    State(s): State<Arc<ApiState>>,
    Params((key, id)): Params<(String, String)>,
) -> ApiResult<Json<wire::Stopped>> {
    s.runtime.stop_detached(&key, &id).await?;
    Ok(Json(wire::Stopped { stopped: id }))
}

async fn ensure(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Ensured>> {
    s.runtime.ensure(&key).await?;
    Ok(Json(wire::Ensured { ensured: key }))
}

async fn abort(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Aborted>> {
    s.runtime.abort(&key).await?;
    Ok(Json(wire::Aborted { aborted: key }))
}

async fn checkpoint(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Checkpointed>> {
    s.runtime.checkpoint(&key).await?;
    Ok(Json(wire::Checkpointed { checkpointed: key }))
}

async fn denials(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Denials>> {
    let d = s.runtime.denials(&key).await?;
    Ok(Json(wire::Denials { denials: d }))
}

/// `GET …/egress`: everything the fence decided for the key, admitted and denied, in
/// one timeline (the proxy's records; no guest decision is involved).
async fn egress(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Egress>> {
    stockade_grammar::names::key(&key)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, e))?;
    let store = s.runtime.store();
    let failed = |e: stockade_store::StoreError| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Failed,
            e.to_string(),
        )
    };
    // A remote substrate's audit is on the key's node (its proxy decided).
    let (admitted, denied) = match s.runtime.substrate().egress_audit(&key).await {
        Some(r) => r.map_err(substrate_error)?,
        None => (
            store.admitted(&key).map_err(failed)?,
            store.denials(&key).map_err(failed)?,
        ),
    };
    let timeline = stockade_egress::audit::timeline(admitted, denied);
    Ok(Json(wire::Egress { egress: timeline }))
}

/// A substrate's error met outside the guest (the egress audit of a remote
/// substrate), answered as the guest's same error would be.
fn substrate_error(e: stockade_runtime::substrate::SubstrateError) -> ApiError {
    use stockade_runtime::substrate::SubstrateError as E;
    match e {
        E::Unreachable(m) => ApiError::new(StatusCode::BAD_GATEWAY, ErrorCode::Unreachable, m),
        E::OverCapacity => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::OverCapacity,
            "over capacity",
        ),
        E::Invalid(m) => ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, m),
        E::Failed(m) | E::Trap(m) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Failed, m)
        }
    }
}

use stockade_wire::SecretBody;

fn secret_error(e: stockade_egress::secrets::SecretError) -> ApiError {
    use stockade_egress::secrets::SecretError;
    match e {
        SecretError::Invalid(m) => {
            ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, m)
        }
        e @ SecretError::FromFile(_) => ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::DefinedByConfiguration,
            e.to_string(),
        ),
        SecretError::Store(m) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Failed, m)
        }
    }
}

/// `GET /v1/secrets`: names and sources, never values.
async fn list_secrets(State(s): State<Arc<ApiState>>) -> ApiResult<Json<wire::Secrets>> {
    let list = s.secrets.list().map_err(secret_error)?;
    Ok(Json(wire::Secrets {
        secrets: list.into_iter().map(answers::secret_info).collect(),
    }))
}

/// `PUT /v1/secrets/{name}`: set or replace; the answer never echoes the value.
async fn set_secret(
    State(s): State<Arc<ApiState>>,
    Params(name): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let b: SecretBody = parse_json(body).map_err(|mut e| {
        // serde's message may quote the input: never a secret in an answer.
        e.message = "the body must be {\"value\": \"...\", \"host\": \"api.example.com[:port]\", \"methods\": [\"GET\", ...], \"path_prefix\": \"/v1/\" (optional)}".into();
        e
    })?;
    let binding = stockade_grammar::binding::parse(&b.host, &b.methods, b.path_prefix.as_deref())
        .map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidInput,
            e.to_string(),
        )
    })?;
    s.secrets
        .set(&name, &b.value, &binding, now_ms())
        .map_err(secret_error)?;
    tracing::info!(target: "stockade::api", secret = %name, binding = %binding, "secret set");
    // A remote substrate's proxies run on its nodes: they get it too.
    s.runtime
        .substrate()
        .secret_set(&name, &b.value, &binding)
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/secrets/{name}`.
async fn remove_secret(
    State(s): State<Arc<ApiState>>,
    Params(name): Params<String>,
) -> ApiResult<StatusCode> {
    if s.secrets.remove(&name).map_err(secret_error)? {
        tracing::info!(target: "stockade::api", secret = %name, "secret removed");
        s.runtime.substrate().secret_removed(&name).await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("no secret {name:?}"),
        ))
    }
}

async fn artifacts(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Artifacts>> {
    let a = s.runtime.artifacts(&key).await?;
    Ok(Json(wire::Artifacts {
        artifacts: a.into_iter().map(answers::artifact).collect(),
    }))
}

/// A body as bytes: too large is 413, unreadable 400.
fn raw_body(body: Result<Bytes, BytesRejection>) -> ApiResult<Bytes> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                e.body_text(),
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::MalformedBody,
                e.body_text(),
            )
        }
    })
}

/// `?offset=&length=` of an artifact read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Chunk {
    #[serde(default)]
    offset: u64,
    length: Option<u32>,
}

async fn read_artifact(
    State(s): State<Arc<ApiState>>,
    Params((key, name)): Params<(String, String)>,
    chunk: Result<Query<Chunk>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(chunk) = chunk.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidInput,
            e.body_text(),
        )
    })?;
    let length = chunk.length.unwrap_or(1 << 20);
    let bytes = match s
        .runtime
        .read_artifact(&key, &name, chunk.offset, length)
        .await
    {
        Ok(b) => b,
        // A well-formed name that names no artifact is a 404 (a typed not-found does
        // not cross the WIT: the listing decides, on the error path only).
        Err(CallError::Facade(FacadeError::InvalidInput(m)))
            if stockade_grammar::names::artifact_name(&name).is_ok()
                && stockade_grammar::names::key(&key).is_ok() =>
        {
            let listed = s.runtime.artifacts(&key).await?;
            if listed.iter().any(|a| a.name == name) {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidInput,
                    m,
                ));
            }
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                ErrorCode::NotFound,
                format!("no artifact {name:?}"),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

async fn approve(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<wire::Approval>)> {
    let a: wire::ApprovalBody = parse_json(body)?;
    if a.argv.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidInput,
            "argv is empty",
        ));
    }
    stockade_grammar::names::key(&key)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, e))?;
    let now = now_ms();
    let expires_ms = now.saturating_add(s.approval_ttl_ms);
    let token = s
        .runtime
        .store()
        .record_approval(&key, &a.argv, now, expires_ms)
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Failed,
                e.to_string(),
            )
        })?;
    Ok((
        StatusCode::CREATED,
        Json(wire::Approval {
            token,
            key,
            argv: a.argv,
            expires_ms,
        }),
    ))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
        "method not allowed on this route",
    )
}

/// The body limit of the upload routes.
pub const UPLOAD_BODY_BYTES: usize = crate::upload::MAX_ARCHIVE_BYTES;

/// The router.
pub fn router(state: Arc<ApiState>, max_body_bytes: usize) -> Router {
    let s = "/v1/sandboxes/{key}";
    let uploads = UploadSlots::new();
    Router::new()
        .route("/v1/health", get(health))
        .route(&format!("{s}/exec"), post(exec))
        .route(&format!("{s}/exec/stream"), post(exec_stream))
        .route(&format!("{s}/detached"), post(start_detached))
        .route(
            &format!("{s}/detached/{{id}}"),
            get(detached_status).delete(stop_detached),
        )
        .route(&format!("{s}/ensure"), post(ensure))
        .route(&format!("{s}/abort"), post(abort))
        .route(&format!("{s}/checkpoint"), post(checkpoint))
        .route(
            &format!("{s}/snapshots"),
            post(snapshots::save).get(snapshots::list),
        )
        .route(
            &format!("{s}/snapshots/{{name}}"),
            axum::routing::delete(snapshots::delete),
        )
        .route(&format!("{s}/fork"), post(snapshots::fork))
        .route("/v1/sandboxes", get(sandboxes::list))
        .route(s, get(sandboxes::describe).delete(sandboxes::delete))
        .route(
            &format!("{s}/lifetime"),
            put(sandboxes::set_lifetime).delete(sandboxes::clear_lifetime),
        )
        .route(&format!("{s}/metadata"), put(sandboxes::set_metadata))
        .route(
            &format!("{s}/network"),
            put(sandboxes::set_network).delete(sandboxes::clear_network),
        )
        .route(&format!("{s}/denials"), get(denials))
        .route(&format!("{s}/artifacts"), get(artifacts))
        .route(&format!("{s}/artifacts/{{*name}}"), get(read_artifact))
        .route(&format!("{s}/approvals"), post(approve))
        .route(&format!("{s}/egress"), get(egress))
        .route(
            &format!("{s}/previews"),
            post(previews::expose).get(previews::previews),
        )
        .route(
            &format!("{s}/previews/{{port}}"),
            axum::routing::delete(previews::unexpose),
        )
        .route(&format!("{s}/pty"), get(pty::pty))
        .route(
            &format!("{s}/egress/pending"),
            get(egress_ask::pending_of_key),
        )
        .route("/v1/egress/pending", get(egress_ask::pending))
        .route("/v1/egress/pending/{id}", post(egress_ask::answer))
        .route("/v1/secrets", get(list_secrets))
        .route("/v1/secrets/{name}", put(set_secret).delete(remove_secret))
        .route("/v1/tokens", post(tenants::create).get(tenants::list))
        .route("/v1/tokens/{id}", axum::routing::delete(tenants::revoke))
        // A consumer route (api::auth): any consumer token learns its own scope.
        .route("/v1/tokens/self", get(tenants::own))
        // Uploads stream their own body, up to UPLOAD_BODY_BYTES, after taking one of
        // the server's upload slots (crate::upload); every other route the configured
        // limit.
        .route(
            &format!("{s}/files"),
            put(put_archive).layer(Extension(uploads.clone())),
        )
        .route(
            &format!("{s}/files/{{*path}}"),
            put(put_file).layer(Extension(uploads)),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), auth::auth))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_event_is_the_outcome_without_its_output() {
        let o = ExecOutcome {
            exit_code: 3,
            stdout: b"x".to_vec(),
            stderr: vec![],
            timed_out: false,
            truncated: false,
            killed: 1,
            denials: 0,
            admitted: 2,
            limits: vec![stockade_runtime::bindings::ResourceLimit::Pids],
        };
        let line = event_line(&exit_event(&o));
        assert_eq!(
            &line[..],
            &b"{\"admitted\":2,\"denials\":0,\"exit_code\":3,\"killed\":1,\"limits\":[\"pids\"],\"timed_out\":false,\"truncated\":false,\"type\":\"exit\"}\n"[..]
        );
    }
}
