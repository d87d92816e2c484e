//! One client connection and the decision each request on it gets: admitted by the
//! grant open at that moment, or denied (counted, recorded, answered 403).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;

use crate::answer::{DENIAL_HEADER, revoked_response, upstream_failed};
use crate::ask::{Full, Outcome, Pending};
use crate::audit::{DecisionLine, Denial, now_ms, take};
use crate::body::ProxyBody;
use crate::bounded;
use crate::fence::Open;
use crate::framing::{body_error, framing_error, host_and_port};
use crate::record::Audit;
use crate::rules::{self, Decision, Reason};
use crate::shared::{Shared, Slot};
use crate::upstream::{Driver, Failure, Upstream, UpstreamError, connect, handshake, http1_client};

/// The host an intercepted tunnel was opened to: every request inside goes there.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub(crate) host: Arc<str>,
    pub(crate) port: u16,
    /// The `Host` header every request inside gets, made once per tunnel.
    pub(crate) host_header: Option<HeaderValue>,
}

impl Origin {
    pub(crate) fn new(host: &str, port: u16) -> Origin {
        let host_header = if port == 443 {
            HeaderValue::from_str(host)
        } else {
            HeaderValue::from_str(&format!("{host}:{port}"))
        };
        Origin {
            host: host.into(),
            port,
            host_header: host_header.ok(),
        }
    }
}

pub(crate) struct Conn {
    pub(crate) shared: Arc<Shared>,
    /// `Some`: the decrypted inside of an intercepted tunnel to this host.
    pub(crate) origin: Option<Origin>,
    /// The client's address (of the outer connection, for a tunnel).
    pub(crate) peer: SocketAddr,
    /// When the client connection was accepted (at the latest): what attribution
    /// read after it holds for this connection.
    pub(crate) accepted: std::time::Instant,
    /// Whether the fenced run's tree holds this connection, per fence (attributed
    /// once, on the first request that would carry credentials).
    pub(crate) fenced: Mutex<Option<(String, bool)>>,
    /// Requests on one HTTP/1 connection are sequential, so this lock is never
    /// contended and never held across an await (take, use, put back).
    pub(crate) upstream: Arc<Mutex<Option<Upstream>>>,
    /// A new upstream connection for [`serve_http`] to drive.
    pub(crate) new_driver: Mutex<Option<Driver>>,
    /// Requests run concurrently (h2): each upstream connection's driver is a task.
    pub(crate) concurrent: bool,
    /// The client connection's place under the connection cap, shared with the tunnel
    /// it may become (hyper hands an upgraded connection over and forgets it).
    pub(crate) slot: Mutex<Option<Arc<Slot>>>,
}

/// What a request is sent to, once decided.
pub(crate) struct Target {
    /// Shared with the audit record (and, inside a tunnel, with every request of it).
    pub(crate) host: Arc<str>,
    pub(crate) port: u16,
    /// The upstream is reached over TLS (an intercepted tunnel).
    pub(crate) tls: bool,
    /// The `Host` header the upstream gets: the host that was decided on (`None`: not
    /// a valid header value; the request goes without one).
    pub(crate) host_header: Option<HeaderValue>,
}

impl Conn {
    pub(crate) fn new(shared: Arc<Shared>, origin: Option<Origin>, peer: SocketAddr) -> Arc<Conn> {
        Arc::new(Conn {
            shared,
            origin,
            peer,
            accepted: std::time::Instant::now(),
            fenced: Mutex::new(None),
            upstream: Arc::new(Mutex::new(None)),
            new_driver: Mutex::new(None),
            concurrent: false,
            slot: Mutex::new(None),
        })
    }

    /// The inside of an intercepted tunnel that speaks h2.
    pub(crate) fn new_h2(shared: Arc<Shared>, origin: Origin, peer: SocketAddr) -> Arc<Conn> {
        Arc::new(Conn {
            shared,
            origin: Some(origin),
            peer,
            accepted: std::time::Instant::now(),
            fenced: Mutex::new(None),
            upstream: Arc::new(Mutex::new(None)),
            new_driver: Mutex::new(None),
            concurrent: true,
            slot: Mutex::new(None),
        })
    }

    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        // Paced per container: what the server does per request is outside the
        // container's CPU limit (`budget.rs`).
        self.shared.budget.request().await;
        // Before any other work or line: a 30 kB method is not decided or logged whole
        // (`bounded.rs`).
        if req.method().as_str().len() > bounded::MAX_METHOD {
            return self.invalid(req.method(), "an extension method longer than 32 bytes");
        }
        let why = framing_error(req.headers()).or_else(|| body_error(req.method(), req.body()));
        if let Some(why) = why {
            // Where this request ends is in doubt: nothing after it on this
            // connection is read as another request.
            let mut resp = self.invalid(req.method(), why);
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return resp;
        }
        match (req.method() == Method::CONNECT, &self.origin) {
            (true, None) => self.tunnel(req).await,
            (true, Some(_)) => self.invalid(req.method(), "CONNECT inside a tunnel"),
            (false, _) => self.forward(req).await,
        }
    }

    /// Is this connection held by the open fence's run (not a detached process)?
    /// Decided once per fence per connection; no attribution, or anything unclear, is
    /// "no".
    pub(crate) fn held_by_fenced_run(&self, open: &Open) -> bool {
        let mut cached = self.fenced.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((fence, fenced)) = cached.as_ref()
            && *fence == open.id
        {
            return *fenced;
        }
        let tree = open.tree.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let attribution = self.shared.attribution.clone();
        let fenced = match (tree, attribution, self.shared.listener) {
            // What was read of the tree before this run began was read of an earlier
            // run's processes (a kept tree's id is given again): only a reading made
            // since both the connection and the run answers.
            (Some(tree), Some(a), Some(listener)) => {
                a.holds_since(&tree.id, self.peer, listener, self.accepted.max(tree.began))
            }
            _ => false,
        };
        // Exclusive: the request is denied `detached` (a throttled line), not logged here.
        if !fenced && !self.shared.exclusive {
            let fence = &self.shared.fence.0;
            tracing::warn!(target: "stockade::egress", key = %fence.key, container = %fence.container, fence = open.id.as_str(), peer = %self.peer, "credentials withheld: the connection is not the fenced command's");
        }
        *cached = Some((open.id.clone(), fenced));
        fenced
    }

    /// Where a request goes: for the proxy's own connections the absolute-form
    /// `http://` URI; inside an intercepted tunnel, the tunnel's host (the request's
    /// own authority is never used).
    pub(crate) fn target(&self, uri: &Uri) -> Result<Target, &'static str> {
        match &self.origin {
            Some(o) => {
                if !uri.path().starts_with('/') {
                    return Err("a request target that is not a path");
                }
                Ok(Target {
                    host: o.host.clone(),
                    port: o.port,
                    tls: true,
                    host_header: o.host_header.clone(),
                })
            }
            None => match (uri.scheme(), uri.authority()) {
                (Some(scheme), Some(a)) if *scheme == hyper::http::uri::Scheme::HTTP => {
                    Ok(Target {
                        host: a.host().into(),
                        port: a.port_u16().unwrap_or(80),
                        tls: false,
                        host_header: HeaderValue::from_str(host_and_port(a)).ok(),
                    })
                }
                _ => Err(
                    "send absolute-form http:// requests to this proxy (https goes through CONNECT)",
                ),
            },
        }
    }

    /// The one decision a request gets, against the grant open right now: the grant
    /// that admits it and by which rule, or the 403 that denies it (logged, counted,
    /// recorded). Under an `ask` grant a refusal for want of a rule is first checked
    /// against what the approver already approved in this fence, then held for the
    /// approver ([`crate::ask`]).
    /// `query` is the request's query, shown to the approver (never decided on).
    pub(crate) async fn admit(
        &self,
        request: &rules::Request<'_>,
        query: Option<&str>,
    ) -> Result<(Arc<Open>, usize), Box<Response<ProxyBody>>> {
        let open = self.shared.fence.current();
        match rules::decide(open.as_ref().map(|o| &o.grant), request) {
            Decision::Allow { rule } => {
                let open = open.expect("decide admits nothing without a grant");
                if self.detached(&open) {
                    return Err(Box::new(self.deny(Some(&open), request, Reason::Detached)));
                }
                Ok((open, rule))
            }
            Decision::Deny(reason) => match open {
                Some(open) if open.grant.ask() && reason.askable() => {
                    self.ask(open, request, query, reason).await
                }
                open => Err(Box::new(self.deny(open.as_deref(), request, reason))),
            },
        }
    }

    /// A request the `ask` grant `open` refused for `reason`: admitted by an earlier
    /// approval of this fence, or held until the approver answers (bounded in number
    /// and time; the fence's end drops it). A detached process never asks.
    async fn ask(
        &self,
        open: Arc<Open>,
        request: &rules::Request<'_>,
        query: Option<&str>,
        reason: Reason,
    ) -> Result<(Arc<Open>, usize), Box<Response<ProxyBody>>> {
        let base = open.grant.len();
        if let Some(rule) = self.widened_rule(&open, request) {
            if self.detached(&open) {
                return Err(Box::new(self.deny(Some(&open), request, Reason::Detached)));
            }
            return Ok((open, base + rule));
        }
        let fence = &self.shared.fence.0;
        let (Some(asks), Some(spec)) = (fence.asks.get(), rules::widening(request)) else {
            return Err(Box::new(self.deny(Some(&open), request, reason)));
        };
        if self.detached(&open) {
            return Err(Box::new(self.deny(Some(&open), request, Reason::Detached)));
        }
        let pending = Pending {
            id: String::new(),
            key: fence.key.clone(),
            fence: open.id.clone(),
            method: bounded::owned(request.method),
            host: bounded::owned(request.host),
            port: request.port,
            path: crate::ask::requested_path(request.path, query),
            reason: reason.as_str().to_owned(),
            at_ms: 0,
            expires_ms: 0,
            widens: format!(
                "{} {}{}",
                request.method,
                spec.host,
                spec.path_prefix.as_deref().unwrap_or("/")
            ),
        };
        let (pending, waiting) = match asks.hold(&fence.container, pending) {
            Ok(held) => held,
            Err(full) => {
                let bound = match full {
                    Full::Container => "container",
                    Full::Server => "server",
                };
                tracing::warn!(target: "stockade::egress::ask", key = %fence.key, container = %fence.container, fence = open.id.as_str(), bound, "egress ask refused at once: the pending decisions are at their bound");
                return Err(Box::new(self.deny(Some(&open), request, Reason::AskFull)));
            }
        };
        tracing::info!(target: "stockade::egress::ask", id = pending.id.as_str(), key = %fence.key, container = %fence.container, fence = open.id.as_str(), method = pending.method.as_str(), host = pending.host.as_str(), port = pending.port, path = pending.path.as_str(), reason = pending.reason.as_str(), widens = pending.widens.as_str(), "egress request held for the approver");
        let outcome = waiting.wait(&open.revoked).await;
        tracing::info!(target: "stockade::egress::ask", id = pending.id.as_str(), key = %fence.key, container = %fence.container, fence = open.id.as_str(), outcome = outcome.as_str(), "CANONICAL-EGRESS-ASK");
        let reason = match outcome {
            Outcome::Approved => {
                // Only while this very grant is open: an approval that raced the
                // fence's end widens nothing and admits nothing.
                let still_open = self
                    .shared
                    .fence
                    .current()
                    .is_some_and(|now| Arc::ptr_eq(&now, &open));
                if still_open {
                    self.widen(&open, spec);
                    if let Some(rule) = self.widened_rule(&open, request) {
                        return Ok((open, base + rule));
                    }
                    // The widening admits what it was made for (table-tested); should it
                    // not, the request is denied as the rules denied it.
                    reason
                } else {
                    Reason::NoGrant
                }
            }
            Outcome::Refused => Reason::RefusedByApprover,
            Outcome::TimedOut => Reason::AskTimeout,
            Outcome::FenceClosed => Reason::NoGrant,
        };
        Err(Box::new(self.deny(Some(&open), request, reason)))
    }

    /// The rule of this fence's approvals that admits the request, if any.
    fn widened_rule(&self, open: &Open, request: &rules::Request<'_>) -> Option<usize> {
        let widened = open.widened.lock().unwrap_or_else(|p| p.into_inner());
        match rules::decide(Some(&widened), request) {
            Decision::Allow { rule } => Some(rule),
            Decision::Deny(_) => None,
        }
    }

    /// Add an approval's rule to this fence's approvals (once).
    fn widen(&self, open: &Open, spec: rules::RuleSpec) {
        let mut widened = open.widened.lock().unwrap_or_else(|p| p.into_inner());
        if widened.specs().contains(&spec) {
            return;
        }
        let mut specs = widened.specs().to_vec();
        specs.push(spec);
        match rules::Grant::parse(&specs) {
            Ok(g) => *widened = g,
            Err(e) => {
                tracing::warn!(target: "stockade::egress::ask", error = %e, "an approval's rule did not parse: the fence is not widened")
            }
        }
    }

    /// Is the open grant the fenced run's alone, and this connection not held by its
    /// tree (a detached process's, or opened before the run began)?
    pub(crate) fn detached(&self, open: &Open) -> bool {
        self.shared.exclusive && !self.held_by_fenced_run(open)
    }

    /// An admitted request whose target could not be used: a private address (denied),
    /// a grant revoked meanwhile (cut off), or the upstream itself failing (502 with
    /// the reason in a header; the audit record says why).
    pub(crate) fn target_failed(
        &self,
        open: &Open,
        request: &rules::Request<'_>,
        rule: usize,
        failure: Failure,
        audit: Option<&Audit>,
    ) -> Response<ProxyBody> {
        match failure {
            Failure::Denied(reason) => {
                // Not an admitted request after all: a denial, not an audit record.
                if let Some(a) = audit {
                    a.discard();
                }
                self.deny(Some(open), request, reason)
            }
            Failure::Revoked => {
                if let Some(a) = audit {
                    a.set(503, "revoked");
                }
                revoked_response()
            }
            Failure::Upstream(error) => {
                self.log_allow(open, request, rule, "upstream-failed");
                if let Some(a) = audit {
                    a.set(502, error.reason());
                }
                self.upstream_failed(&error)
            }
        }
    }

    /// Log, count and record a denial; answer 403.
    pub(crate) fn deny(
        &self,
        open: Option<&Open>,
        req: &rules::Request<'_>,
        reason: Reason,
    ) -> Response<ProxyBody> {
        let fence = &self.shared.fence.0;
        let fence_id = open.map_or("none", |o| o.id.as_str());
        if let Some(open) = open {
            open.denials.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(suppressed) = take(&self.shared.throttle) {
            // What the client chose is kept to a bound, in the line and the record.
            let (host, method, path) = (
                bounded::field(req.host),
                bounded::field(req.method),
                bounded::field(req.path),
            );
            DecisionLine {
                decision: "deny",
                rule: None,
                reason: Some(reason.as_str()),
                via: None,
                host: Some(host),
                port: Some(req.port),
                method,
                path: Some(path),
                fence: fence_id,
                minted: None,
            }
            .emit(&fence.key, &fence.container, Some(suppressed));
            self.shared.sink.record(
                &fence.key,
                &fence.container,
                Denial {
                    at_ms: now_ms(),
                    host: host.to_owned(),
                    method: method.to_owned(),
                    path: path.to_owned(),
                    rule_set: fence_id.to_owned(),
                    reason: reason.as_str().to_owned(),
                },
            );
        }
        let mut resp = Response::new(ProxyBody::full(format!(
            "stockade: egress to {} denied: {reason}\n",
            bounded::field(req.host)
        )));
        *resp.status_mut() = StatusCode::FORBIDDEN;
        let h = resp.headers_mut();
        h.insert(
            HeaderName::from_static(DENIAL_HEADER),
            HeaderValue::from_static(reason.as_str()),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }

    /// The allow line: rate-bounded per container as denials are (the audit keeps the
    /// records); the line after a gap says how many were left out.
    pub(crate) fn log_allow(
        &self,
        open: &Open,
        req: &rules::Request<'_>,
        rule: usize,
        via: &'static str,
    ) {
        let Some(suppressed) = take(&self.shared.allow_throttle) else {
            return;
        };
        let fence = &self.shared.fence.0;
        DecisionLine {
            decision: "allow",
            rule: Some(rule),
            reason: None,
            via: Some(via),
            host: Some(req.host),
            port: Some(req.port),
            method: req.method,
            path: Some(req.path),
            fence: &open.id,
            minted: None,
        }
        .emit(&fence.key, &fence.container, Some(suppressed));
    }

    /// A 502 for an upstream that could not be used, with its line (rate-bounded per
    /// container; the detail, which names what the client chose, kept to a bound).
    pub(crate) fn upstream_failed(&self, error: &UpstreamError) -> Response<ProxyBody> {
        let reason = error.reason();
        let detail = error.to_string();
        let detail = bounded::field(&detail);
        if let Some(suppressed) = take(&self.shared.failure_throttle) {
            let fence = &self.shared.fence.0;
            tracing::warn!(target: "stockade::egress", reason, error = detail, key = %fence.key, container = %fence.container, suppressed, "egress upstream failed");
        }
        upstream_failed(reason, detail)
    }

    /// A request that is not a proxy request at all (no grant question to answer).
    pub(crate) fn invalid(&self, method: &Method, why: &'static str) -> Response<ProxyBody> {
        // Rate-bounded per container as denials are: a client can send these as fast
        // as it can write.
        if let Some(suppressed) = take(&self.shared.invalid_throttle) {
            let fence = &self.shared.fence.0;
            let open = self.shared.fence.current();
            DecisionLine {
                decision: "invalid",
                rule: None,
                reason: Some(why),
                via: None,
                host: None,
                port: None,
                method: method.as_str(),
                path: None,
                fence: open.as_ref().map_or("none", |o| o.id.as_str()),
                minted: None,
            }
            .emit(&fence.key, &fence.container, Some(suppressed));
        }
        let mut resp = Response::new(ProxyBody::full(format!("stockade: {why}\n")));
        *resp.status_mut() = StatusCode::BAD_REQUEST;
        resp
    }

    /// The kept upstream connection if it fits, otherwise resolve, check, connect
    /// (and, for an intercepted tunnel, a TLS handshake verified against the trust
    /// roots).
    pub(crate) async fn upstream_for(
        &self,
        open: &Arc<Open>,
        host: &str,
        port: u16,
        tls: bool,
    ) -> Result<Upstream, Failure> {
        let kept = self
            .upstream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(u) = kept
            && Arc::ptr_eq(&u.open, open)
            && u.port == port
            && u.tls == tls
            && u.host.eq_ignore_ascii_case(host)
            && !u.sender.is_closed()
        {
            // Same grant, same host: the address was checked when it was connected.
            return Ok(u);
        }
        if tls {
            self.shared
                .budget
                .handshake_rate()
                .map_err(|limit| UpstreamError::BudgetRate {
                    host: host.to_owned(),
                    limit,
                })?;
        }
        let (stream, place) = connect(&self.shared, open, host, port).await?;
        let revoked = open.revoked.clone();
        let (sender, driver) = if tls {
            let stream = handshake(&self.shared, open, host, stream).await?;
            http1_client(TokioIo::new(stream), revoked).await?
        } else {
            http1_client(TokioIo::new(stream), revoked).await?
        };
        // The socket's place in the budget lives as long as the connection does.
        let driver: Driver = Box::pin(async move {
            let _place = place;
            driver.await
        });
        if self.concurrent {
            tokio::spawn(driver);
        } else {
            *self.new_driver.lock().unwrap_or_else(|p| p.into_inner()) = Some(driver);
        }
        Ok(Upstream {
            open: open.clone(),
            host: host.to_owned(),
            port,
            tls,
            sender,
        })
    }
}
