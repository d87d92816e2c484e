//! The proxy's own answers: 429/503 for a spent budget, 503 for a revoked grant, 502
//! for an upstream that could not be used, and the headers that say why.

use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};

use crate::body::ProxyBody;
use crate::budget::Limit;

/// The header that carries a denial's reason.
pub const DENIAL_HEADER: &str = "x-stockade-denial";
/// The header of a 502 that says why the upstream could not be used.
pub const UPSTREAM_ERROR_HEADER: &str = "x-stockade-upstream-error";
/// The header of a 429/503 that says which of the container's budgets was spent.
pub const LIMIT_HEADER: &str = "x-stockade-limit";

/// A request refused because the container spent its budget (`budget.rs`):
/// 429 for a rate, 503 for a cap; which one in `x-stockade-limit`. Logged by the budget
/// (at most a line a second), not here.
pub(crate) fn limited(limit: Limit) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(format!(
        "stockade: egress budget spent ({})\n",
        limit.as_str()
    )));
    *resp.status_mut() = match limit {
        Limit::ConnectRate | Limit::HandshakeRate => StatusCode::TOO_MANY_REQUESTS,
        Limit::Streams | Limit::Upstreams | Limit::Handshakes => StatusCode::SERVICE_UNAVAILABLE,
    };
    let h = resp.headers_mut();
    h.insert(
        HeaderName::from_static(LIMIT_HEADER),
        HeaderValue::from_static(limit.as_str()),
    );
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

pub(crate) fn revoked_response() -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full("stockade: egress grant revoked\n".into()));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// A 502: the reason (stable, kebab-case) in [`UPSTREAM_ERROR_HEADER`], what happened
/// in the body.
pub(crate) fn upstream_failed(reason: &'static str, detail: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(format!(
        "stockade: upstream failed ({reason}): {detail}\n"
    )));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    let h = resp.headers_mut();
    h.insert(
        HeaderName::from_static(UPSTREAM_ERROR_HEADER),
        HeaderValue::from_static(reason),
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
