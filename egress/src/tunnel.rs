//! CONNECT: a blind tunnel (bytes spliced both ways) when the rules need not see
//! inside, an intercepted one (TLS terminated with the container CA's leaf, every
//! request inside decided) when they do.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::OwnedSemaphorePermit;

use crate::answer::limited;
use crate::audit::{DecisionLine, now_ms};
use crate::body::ProxyBody;
use crate::conn::{Conn, Origin};
use crate::fence::Open;
use crate::h1::serve_http;
use crate::h2::serve_h2;
use crate::record::{Audit, Draft};
use crate::rules::{self, Reason, Tunnel};
use crate::upstream::{HANDSHAKE_TIMEOUT, UpstreamError, connect};
use crate::{bounded, tls};

impl Conn {
    /// CONNECT: decide on host and port. A tunnel whose rules need to see inside is
    /// intercepted (TLS terminated with a leaf from the container's CA, every request
    /// decided); otherwise, after connecting, bytes are spliced both ways until either
    /// side closes or the grant is revoked.
    pub(crate) async fn tunnel(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let Some(authority) = req.uri().authority().cloned() else {
            return self.invalid(req.method(), "CONNECT needs host:port");
        };
        // Tunnels are the container's way to make the server connect and shake hands:
        // rate-limited before anything is decided, minted or connected.
        if let Err(limit) = self.shared.budget.connect() {
            return limited(limit);
        }
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(443);
        let request = rules::Request {
            host,
            port,
            method: "CONNECT",
            path: "",
            tunnel: true,
        };
        let open = self.shared.fence.current();
        let decision = rules::decide_tunnel(
            open.as_ref().map(|o| &o.grant),
            host,
            port,
            self.shared.tls.is_some(),
        );
        // An `ask` grant whose rules name no such host: the tunnel is intercepted and
        // every request inside is decided (and asked about) one by one, so an approval
        // is never a blind hole.
        let asking = |o: &Open| {
            o.grant.ask() && self.shared.tls.is_some() && self.shared.fence.0.asks.get().is_some()
        };
        let decision = match (decision, &open) {
            (Tunnel::Deny(Reason::NoRule), Some(o)) if asking(o) => Tunnel::Intercept {
                rule: o.grant.len(),
            },
            (d, _) => d,
        };
        // A handshake to come is within the container's budget before anything else
        // is spent on it: refused here, the CONNECT costs no attribution (the reading
        // of a TCP table, most of what it costs), no leaf and no TLS.
        let working = match (&decision, &open) {
            (Tunnel::Intercept { .. }, Some(_)) => {
                if let Err(limit) = self.shared.budget.handshake_rate() {
                    return limited(limit);
                }
                match self.shared.budget.client_handshake().await {
                    Ok(w) => Some(w),
                    Err(limit) => return limited(limit),
                }
            }
            _ => None,
        };
        let (open, rule) = match (decision, open) {
            (Tunnel::Deny(reason), open) => return self.deny(open.as_deref(), &request, reason),
            (Tunnel::Intercept { .. } | Tunnel::Blind { .. }, Some(open))
                if self.detached(&open) =>
            {
                return self.deny(Some(&open), &request, Reason::Detached);
            }
            (Tunnel::Intercept { rule }, Some(open)) => {
                return self.intercept(req, open, &request, rule, working);
            }
            (Tunnel::Blind { rule }, Some(open)) => (open, rule),
            (_, None) => return self.deny(None, &request, Reason::NoGrant),
        };
        let audit = Audit::new(
            &self.shared,
            &open,
            Draft {
                at_ms: now_ms(),
                method: hyper::Method::CONNECT,
                host: host.into(),
                port,
                uri: None,
                rule: rule as u32,
                via: "tunnel",
                status: 200,
                error: "",
                credentials: Vec::new(),
            },
        );
        let (mut stream, place) = match connect(&self.shared, &open, host, port).await {
            Ok(s) => s,
            Err(f) => return self.target_failed(&open, &request, rule, f, Some(&audit)),
        };
        self.log_allow(&open, &request, rule, "tunnel");
        let on_upgrade = hyper::upgrade::on(&mut req);
        let revoked = open.revoked.clone();
        let shutdown = self.shared.shutdown.clone();
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _place = place;
            let upgraded = tokio::select! {
                biased;
                _ = revoked.cancelled() => return,
                _ = shutdown.cancelled() => return,
                u = on_upgrade => match u {
                    Ok(u) => u,
                    Err(_) => return,
                },
            };
            let mut client = Counted::new(TokioIo::new(upgraded));
            // Dropping both ends on revocation closes the tunnel for the client.
            let ended = tokio::select! {
                biased;
                _ = revoked.cancelled() => "revoked",
                _ = shutdown.cancelled() => "shutdown",
                r = tokio::io::copy_bidirectional(&mut client, &mut stream) => match r {
                    Ok(_) => "",
                    Err(_) => "reset",
                },
            };
            audit.up.store(client.read, Ordering::Relaxed);
            audit.down.store(client.written, Ordering::Relaxed);
            audit.set(0, ended);
        });
        Response::new(ProxyBody::empty())
    }

    /// An intercepted CONNECT: answer 200, then terminate the command's TLS with a
    /// leaf for the host it asked for and serve the requests inside, each decided as
    /// plain HTTP is. The whole connection ends when the grant that admitted the
    /// CONNECT is revoked.
    pub(crate) fn intercept(
        &self,
        mut req: Request<Incoming>,
        open: Arc<Open>,
        request: &rules::Request<'_>,
        rule: usize,
        working: Option<OwnedSemaphorePermit>,
    ) -> Response<ProxyBody> {
        let Some(tls) = self.shared.tls.clone() else {
            return self.deny(Some(&open), request, Reason::NeedsInterception);
        };
        let host = request
            .host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(request.host);
        let (config, minted) = match tls.authority.server_config(host) {
            Ok(c) => c,
            Err(e) => return self.upstream_failed(&UpstreamError::Mint(e)),
        };
        let fence = &self.shared.fence.0;
        DecisionLine {
            decision: "allow",
            rule: Some(rule),
            reason: None,
            via: Some("intercept"),
            host: Some(request.host),
            port: Some(request.port),
            method: "CONNECT",
            path: Some(""),
            fence: &open.id,
            minted: Some(minted),
        }
        .emit(&fence.key, &fence.container, None);
        let on_upgrade = hyper::upgrade::on(&mut req);
        let shared = self.shared.clone();
        let peer = self.peer;
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // The tunnel's requests come from this connection's holder: attributed once.
        let fenced = self
            .fenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let origin = Origin::new(&request.host.to_ascii_lowercase(), request.port);
        tokio::spawn(async move {
            let _slot = slot;
            let revoked = open.revoked.clone();
            let shutdown = shared.shutdown.clone();
            let stop = async move {
                tokio::select! {
                    _ = revoked.cancelled() => {}
                    _ = shutdown.cancelled() => {}
                }
            };
            let serve = async move {
                let Ok(upgraded) = on_upgrade.await else {
                    return;
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                // A bounded number of this container's handshakes run at once: the
                // place taken before the CONNECT was answered (an ask's interception
                // waits for one).
                let working = match working {
                    Some(w) => Some(w),
                    None => shared.budget.handshake().await,
                };
                let accepted = tokio::time::timeout(
                    HANDSHAKE_TIMEOUT,
                    acceptor.accept(TokioIo::new(upgraded)),
                )
                .await;
                drop(working);
                let stream = match accepted {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        // A client that does not trust the container's CA (or pins
                        // its certificates) ends here: say so once.
                        tracing::info!(target: "stockade::egress", host = bounded::field(&origin.host), error = %e, "an intercepted client refused the handshake");
                        return;
                    }
                    Err(_) => return,
                };
                let h2 = stream.get_ref().1.alpn_protocol() == Some(tls::ALPN_H2);
                let inner = if h2 {
                    Conn::new_h2(shared, origin, peer)
                } else {
                    Conn::new(shared, Some(origin), peer)
                };
                *inner.fenced.lock().unwrap_or_else(|p| p.into_inner()) = fenced;
                if h2 {
                    serve_h2(TokioIo::new(stream), inner).await;
                } else {
                    serve_http(TokioIo::new(stream), inner, std::future::pending()).await;
                }
            };
            tokio::select! {
                _ = serve => {}
                _ = stop => {}
            }
        });
        Response::new(ProxyBody::empty())
    }
}

/// A tunnel's client side, counting the bytes each way for the audit.
pub(crate) struct Counted<T> {
    pub(crate) inner: T,
    pub(crate) read: u64,
    pub(crate) written: u64,
}

impl<T> Counted<T> {
    pub(crate) fn new(inner: T) -> Self {
        Counted {
            inner,
            read: 0,
            written: 0,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.read += (buf.filled().len() - before) as u64;
        r
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.written += n as u64;
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
