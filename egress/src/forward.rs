//! A request forwarded (plain HTTP, or inside an intercepted tunnel): decided on host,
//! method and path, credentials added where a rule carries them, sent to the checked
//! address in the proxy's own framing, raced against the grant's revocation.

use std::sync::atomic::Ordering;

use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response, Uri};

use crate::answer::revoked_response;
use crate::audit::now_ms;
use crate::body::{Direction, Keep, ProxyBody};
use crate::conn::Conn;
use crate::framing::{body_may_be_ignored, closes, strip_hop_by_hop};
use crate::record::{Audit, Draft};
use crate::upstream::UpstreamError;
use crate::{audit, rules};

impl Conn {
    /// A request (plain HTTP, or inside an intercepted tunnel): decide on host,
    /// method and path; add the rule's credentials over TLS; forward to the checked
    /// address.
    pub(crate) async fn forward(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let (mut parts, body) = req.into_parts();
        let target = match self.target(&parts.uri) {
            Ok(t) => t,
            Err(why) => return self.invalid(&parts.method, why),
        };
        let request = rules::Request {
            host: &target.host,
            port: target.port,
            method: parts.method.as_str(),
            path: parts.uri.path(),
            tunnel: false,
        };
        let (open, rule) = match self.admit(&request, parts.uri.query()).await {
            Ok(admitted) => admitted,
            Err(denied) => return *denied,
        };
        // Credentials go only over TLS, only on requests a rule carrying them admits,
        // only while that grant is open (they live in it), only to the fenced run's own
        // connections.
        let mut credentials: Vec<(HeaderName, HeaderValue)> = if target.tls {
            open.grant
                .headers_for(&request)
                .into_iter()
                .filter_map(|(name, secret)| {
                    let value = open.secrets.get(secret)?.header().clone();
                    Some((HeaderName::from_bytes(name.as_bytes()).ok()?, value))
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut withheld = false;
        if !credentials.is_empty() && !self.held_by_fenced_run(&open) {
            credentials.clear();
            withheld = true;
        }
        let audit = Audit::new(
            &self.shared,
            &open,
            Draft {
                at_ms: now_ms(),
                method: parts.method.clone(),
                host: target.host.clone(),
                port: target.port,
                uri: Some(parts.uri.clone()),
                rule: rule as u32,
                via: if target.tls { "https" } else { "http" },
                status: 0,
                error: if withheld {
                    audit::CREDENTIALS_WITHHELD
                } else {
                    ""
                },
                credentials: credentials.iter().map(|(n, _)| n.clone()).collect(),
            },
        );
        let mut upstream = match self
            .upstream_for(&open, &target.host, target.port, target.tls)
            .await
        {
            Ok(u) => u,
            Err(f) => return self.target_failed(&open, &request, rule, f, Some(&audit)),
        };
        self.log_allow(
            &open,
            &request,
            rule,
            if target.tls { "https" } else { "http" },
        );

        // Origin-form to the upstream, with exactly the path that was decided on (a raw
        // `/allowed/x/../..` would reach what the decision resolved elsewhere).
        parts.uri = match forwarded_uri(&parts.uri) {
            Some(u) => u,
            None => {
                return self.invalid(&parts.method, "a request target the proxy cannot forward");
            }
        };
        parts.version = hyper::Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        // The proxy frames the body it forwards itself (from what it parsed), never with
        // the client's framing headers: no bytes outside the decided request can ride
        // along to the upstream.
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.remove(header::TRANSFER_ENCODING);
        // The Host the upstream sees is the host that was checked: a different Host
        // header would let a client reach another site behind the same front
        // (domain fronting).
        match target.host_header {
            Some(v) => {
                parts.headers.insert(header::HOST, v);
            }
            None => {
                parts.headers.remove(header::HOST);
            }
        }
        // A credential replaces whatever the command sent under that name.
        for (name, value) in credentials {
            parts.headers.insert(name, value);
        }
        // A body on a method that gives it no defined meaning (DELETE, an extension
        // method) may be ignored by the upstream and read as its next request: the
        // upstream is told this request is its connection's last, and it is not kept.
        let last = !body.is_end_stream() && body_may_be_ignored(&parts.method);
        if last {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let body = if body.is_end_stream() {
            audit.up_done.store(true, Ordering::SeqCst);
            ProxyBody::empty()
        } else {
            ProxyBody::fenced(body, &open.revoked, Some((audit.clone(), Direction::Up)))
        };
        let upstream_req = Request::from_parts(parts, body);

        // The wait for the answer ends when the grant is revoked without a waiter of its
        // own: the upstream connection's driver races the same grant's revocation
        // (`upstream::http1_client`), and its end fails this wait (a waiter of its own
        // per request cost a lock to register and one to leave). Revoked is 503, whatever
        // the wait ended with.
        let sent = async {
            upstream.sender.ready().await?;
            upstream.sender.send_request(upstream_req).await
        }
        .await;
        if open.revoked.is_cancelled() {
            audit.set(503, "revoked");
            return revoked_response();
        }
        let resp = match sent {
            Ok(resp) => resp,
            Err(e) => {
                let error = UpstreamError::Closed(e);
                audit.set(502, error.reason());
                return self.upstream_failed(&error);
            }
        };
        // The connection is kept for this client's next request to the same host only
        // when it is certainly in step with the upstream (docs/SECURITY.md, "The proxy
        // against its own clients"): the request body was all sent before the answer
        // came, the answer does not close, and its body ends cleanly (`Keep`). In doubt
        // it is dropped, and with it anything an upstream could read past the decided
        // request.
        let request_done = audit.up_done.load(Ordering::SeqCst);
        if !request_done {
            // Answered early: the rest of the body is not sent; the connection ends.
            audit.cut_up.store(true, Ordering::SeqCst);
        }
        let keep = (request_done && !last && !closes(&resp)).then(|| {
            let slot = self.upstream.clone();
            Keep::new(move || *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(upstream))
        });
        let (mut parts, mut body) = resp.into_parts();
        audit.set(parts.status.as_u16(), "");
        strip_hop_by_hop(&mut parts.headers);
        // Wait for the first piece of the body before answering, so the head and the
        // start of the body leave in one write (one wake-up for the client, not two).
        let first = if body.is_end_stream() {
            None
        } else {
            // As above: a revocation ends the driver, and the body with it.
            let frame = body.frame().await;
            if open.revoked.is_cancelled() {
                audit.set(503, "revoked");
                return revoked_response();
            }
            match frame {
                None => None,
                Some(Ok(frame)) => Some(frame),
                Some(Err(e)) => {
                    let error = UpstreamError::Closed(e);
                    audit.set(502, error.reason());
                    return self.upstream_failed(&error);
                }
            }
        };
        if let Some(data) = first.as_ref().and_then(Frame::data_ref) {
            audit.down.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        let ended = body.is_end_stream();
        let mut body = ProxyBody::fenced(body, &open.revoked, Some((audit, Direction::Down)));
        if let ProxyBody::Fenced {
            first: slot,
            keep: kept,
            ..
        } = &mut body
        {
            *slot = first;
            match keep {
                // The answer is all read: the connection is free now.
                Some(k) if ended => k.put_back(),
                k => *kept = k,
            }
        }
        Response::from_parts(parts, body)
    }
}

/// The origin-form target the upstream gets: exactly the path that was decided on
/// (`rules::forward_target`), then the original query. A path the normalization leaves
/// as it is (nearly every one) is forwarded as the client's own bytes, without a copy
/// or a second parse; `None`: no valid request target.
fn forwarded_uri(uri: &Uri) -> Option<Uri> {
    if let Some(pq) = uri.path_and_query()
        && matches!(rules::normalize_path(pq.path()), std::borrow::Cow::Borrowed(p) if p == pq.path())
    {
        return Some(Uri::from(pq.clone()));
    }
    let sent = rules::forward_target(uri.path_and_query().map_or("/", |pq| pq.as_str()));
    Uri::try_from(sent).ok()
}
