//! A request's checks and answers, as every route makes them: the signature, time and
//! nonce ([`verify`]), the body's parse ([`parse`]), the container's owner ([`own`]),
//! and a refusal or an answer as the wire says it ([`Refusal`], [`answer`]).

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::idempotency::Stored;
use crate::owners::Ownership;
use std::time::Duration;

use tokio::sync::SemaphorePermit;

use crate::state::{Node, UNVERIFIED_BODIES, now_ms};
use stockade_node_protocol::auth::{self, Signed};
use stockade_node_protocol::{self as protocol, Answer, WireError};
use stockade_runtime::substrate::{Command, SubstrateError};

/// A request refused before the substrate: its status and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 400, 401, 403, 404, 408, 413 or 503.
    pub status: StatusCode,
    /// The wire error's kind.
    pub kind: &'static str,
    /// Why (for the log and the front's message).
    pub message: String,
}

impl Refusal {
    pub(crate) fn new(
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

    pub(crate) fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, "invalid", message)
    }

    pub(crate) fn stored(&self) -> Stored {
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

pub(crate) fn json_bytes<T: Serialize>(v: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("answers serialize"))
}

pub(crate) fn respond(s: Stored, content_type: &'static str) -> Response {
    let mut r = Response::new(Body::from(s.body));
    *r.status_mut() = StatusCode::from_u16(s.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub(crate) const JSON: &str = "application/json";

pub(crate) const NDJSON: &str = "application/x-ndjson";

pub(crate) fn refused(call: &str, key: &str, r: &Refusal) -> Response {
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

pub(crate) fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A refusal of the signature's checks: 401 naming why.
fn unauthorized(e: auth::Refused) -> Refusal {
    Refusal::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string())
}

/// The signing headers, well-formed: (time in ms, nonce, signature).
fn signing_headers(headers: &HeaderMap) -> Result<(u64, &str, &str), Refusal> {
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
    Ok((time_ms, nonce, signature))
}

/// Before a body is read: the signing headers present and well-formed, the time
/// inside the window and the nonce not seen (nor the cache full), or the 401 that
/// refuses the request unread (a body is megabytes an unauthenticated client may hold
/// open: docs/SECURITY.md, "The node against unauthenticated bodies"). No nonce slot
/// is taken: [`verify`] takes it once the signature over the body matches. The answer
/// is how long the body may take to arrive: until the request's time leaves the
/// window, past which [`verify`] would refuse it anyway.
pub(crate) fn precheck(node: &Node, headers: &HeaderMap) -> Result<Duration, Refusal> {
    let (time_ms, nonce, signature) = signing_headers(headers)?;
    let now = now_ms();
    auth::precheck(time_ms, nonce, signature, now).map_err(unauthorized)?;
    node.nonces
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .check(nonce, now)
        .map_err(unauthorized)?;
    let until = time_ms.saturating_add(auth::WINDOW.as_millis() as u64);
    Ok(Duration::from_millis(until.saturating_sub(now)))
}

/// A permit to read a body not yet verified ([`Node::unverified`]), or the 503 that
/// refuses the request at once: what unauthenticated clients can make a node hold is
/// [`UNVERIFIED_BODIES`] bodies, not one per connection.
pub(crate) fn unverified_permit(node: &Node) -> Result<SemaphorePermit<'_>, Refusal> {
    node.unverified.try_acquire().map_err(|_| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unreachable",
            format!("{UNVERIFIED_BODIES} bodies not yet verified are being read: try again"),
        )
    })
}

/// The body that did not arrive before its request's time left the window.
pub(crate) fn too_slow(deadline: Duration) -> Refusal {
    Refusal::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid",
        format!("the body did not arrive within {deadline:?} (the request's time window)"),
    )
}

/// Step 2: the signature, the time, then the nonce.
pub(crate) fn verify(
    node: &Node,
    headers: &HeaderMap,
    path: &str,
    body: &[u8],
) -> Result<(String, String), Refusal> {
    verify_as(node, headers, "POST", path, body)
}

/// [`verify`] for a request of `method` (`run-pty` is a `GET`: a WebSocket upgrade).
pub(crate) fn verify_as(
    node: &Node,
    headers: &HeaderMap,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(String, String), Refusal> {
    let (time_ms, nonce, signature) = signing_headers(headers)?;
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

/// The first attempt's answer (a failed one if it went away without one).
pub(crate) async fn wait(mut rx: watch::Receiver<Option<Stored>>) -> Stored {
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

pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| Refusal::invalid(format!("the body: {e}")))
}

pub(crate) fn own(node: &Node, container: &str, key: &str) -> Result<(), Refusal> {
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

pub(crate) fn answer<T: Serialize>(r: stockade_runtime::substrate::Result<T>) -> Bytes {
    json_bytes(&Answer::from_result(r))
}

pub(crate) fn check_cmd(cmd: &Command) -> stockade_runtime::substrate::Result<()> {
    if cmd.argv.is_empty() {
        return Err(SubstrateError::Invalid("argv is empty".into()));
    }
    Ok(())
}
