//! Request head and body framing rules (pure): what the proxy refuses because a
//! proxy and an upstream could disagree about where a request ends, and the
//! hop-by-hop headers it never forwards.

use hyper::body::Body;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Response};

/// Request framing the proxy refuses, as RFC 9112 and hardened proxies do (pure):
/// ambiguity between a proxy and an upstream about where a request ends is how a
/// second request is smuggled past a decision.
pub fn framing_error(headers: &hyper::HeaderMap) -> Option<&'static str> {
    let lengths = headers.get_all(header::CONTENT_LENGTH).iter().count();
    let encodings: Vec<&HeaderValue> = headers.get_all(header::TRANSFER_ENCODING).iter().collect();
    if lengths > 0 && !encodings.is_empty() {
        return Some("Content-Length together with Transfer-Encoding");
    }
    if lengths > 1 {
        return Some("more than one Content-Length");
    }
    if let Some(v) = headers.get(header::CONTENT_LENGTH)
        && !v
            .to_str()
            .is_ok_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
    {
        return Some("a Content-Length that is not a number");
    }
    match encodings.as_slice() {
        [] => None,
        [one] if one.as_bytes().eq_ignore_ascii_case(b"chunked") => None,
        _ => Some("a Transfer-Encoding other than a single `chunked`"),
    }
}

/// A body on a request whose method gives a body no meaning: GET, HEAD, OPTIONS and
/// TRACE (pure). Many upstreams (Python's `http.server` among them) read such a
/// request's head only and the body as the next request on the connection: a second
/// request nobody decided on. `Content-Length: 0` is no body.
pub fn body_error<B: Body>(method: &Method, body: &B) -> Option<&'static str> {
    let bodiless = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method);
    (bodiless && !body.is_end_stream()).then_some("a body on GET, HEAD, OPTIONS or TRACE")
}

/// A method whose body an upstream may ignore without being wrong (RFC 9110 gives it
/// no defined meaning, or the method is not a standard one): anything but POST, PUT
/// and PATCH (GET, HEAD, OPTIONS and TRACE never carry one here: [`body_error`]).
pub(crate) fn body_may_be_ignored(method: &Method) -> bool {
    ![Method::POST, Method::PUT, Method::PATCH].contains(method)
}

/// `host[:port]` of an authority, without any `userinfo@`.
pub(crate) fn host_and_port(authority: &hyper::http::uri::Authority) -> &str {
    let a = authority.as_str();
    a.rsplit_once('@').map_or(a, |(_, hp)| hp)
}

/// Headers that describe one hop, not the message: never forwarded.
pub(crate) const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
];

/// Strip hop-by-hop headers, those `Connection` names, and every `Proxy-*` header
/// (credentials meant for this proxy never reach the upstream). One pass over the names
/// finds them; most messages carry none, and then nothing is removed (removing each of
/// the seven names by lookup, twice per request, was measured at a tenth of the proxy's
/// own work).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let found = headers
        .keys()
        .any(|k| HOP_BY_HOP.contains(k) || k.as_str().starts_with("proxy-"));
    if !found {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    let strip: Vec<HeaderName> = headers
        .keys()
        .filter(|k| HOP_BY_HOP.contains(k) || k.as_str().starts_with("proxy-") || named.contains(k))
        .cloned()
        .collect();
    for name in strip {
        headers.remove(name);
    }
}

/// Does this answer end its connection (HTTP/1.0, or `Connection: close`)?
pub(crate) fn closes<B>(resp: &Response<B>) -> bool {
    resp.version() < hyper::Version::HTTP_11
        || resp.headers().get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().map_or(true, |s| {
                s.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))
            })
        })
}
