//! The upstream side: resolve, check the address, connect (within the container's
//! budget), TLS verified against the trust roots, and the HTTP/1 connection kept for
//! the next request to the same host under the same grant.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::body::*;
use crate::budget::{self};
use crate::conn::*;
use crate::fence::*;
use crate::rules::{self, Reason};
use crate::tls::{self};

/// How long a name may take to resolve before the request is refused.
pub(crate) const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to an upstream may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a TLS handshake (with the command's client, or upstream) may take.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Drives one upstream HTTP connection until it closes or its grant is revoked.
pub(crate) type Driver = Pin<Box<dyn Future<Output = ()> + Send>>;

/// An upstream HTTP connection kept for the next request on the same client
/// connection, valid only for the grant and host it was admitted for.
pub(crate) struct Upstream {
    pub(crate) open: Arc<Open>,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) tls: bool,
    pub(crate) sender: hyper::client::conn::http1::SendRequest<ProxyBody>,
}

/// Why an admitted request could not be completed.
pub(crate) enum Failure {
    Denied(Reason),
    Revoked,
    /// The upstream could not be used: a stable reason (the 502's header) and what
    /// happened.
    Upstream {
        reason: &'static str,
        detail: String,
    },
}

pub(crate) fn upstream(reason: &'static str, detail: impl Into<String>) -> Failure {
    Failure::Upstream {
        reason,
        detail: detail.into(),
    }
}

impl Conn {
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
                .map_err(|l| upstream("budget", format!("{host}: {}", l.as_str())))?;
        }
        let (stream, place) = self.connect(open, host, port).await?;
        let revoked = open.revoked.clone();
        let (sender, driver) = if tls {
            let stream = self.handshake_upstream(open, host, stream).await?;
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

    /// TLS to the upstream, verified against this machine's roots (and the configured
    /// extra CAs) for the name that was decided on.
    pub(crate) async fn handshake_upstream(
        &self,
        open: &Open,
        host: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Failure> {
        let Some(tls) = &self.shared.tls else {
            return Err(upstream("upstream-tls", "interception is off"));
        };
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let bare = bare.strip_suffix('.').unwrap_or(bare);
        let name = rustls_pki_types::ServerName::try_from(bare.to_owned())
            .map_err(|e| upstream("upstream-tls", format!("{host}: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(tls.upstream.clone());
        let handshake = tokio::select! {
            biased;
            _ = open.revoked.cancelled() => return Err(Failure::Revoked),
            r = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
                let _working = self.shared.budget.handshake().await;
                connector.connect(name, stream).await
            }) => r,
        };
        match handshake {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(upstream(tls::handshake_reason(&e), format!("{host}: {e}"))),
            Err(_) => Err(upstream(
                "upstream-tls",
                format!("{host}: handshake timed out"),
            )),
        }
    }

    /// Resolve `host`, pick an address the options allow, connect to exactly it; the
    /// socket's place in the container's budget comes with it (none left: refused
    /// before anything is resolved or opened).
    pub(crate) async fn connect(
        &self,
        open: &Open,
        host: &str,
        port: u16,
    ) -> Result<(TcpStream, budget::Place), Failure> {
        let place = self.shared.budget.upstream().map_err(|l| {
            upstream(
                "budget",
                format!("{host}: the container's {} are spent", l.as_str()),
            )
        })?;
        let target = match resolve(host, port, self.shared.opts.allow_private_targets).await {
            Ok(t) => t,
            Err(Reason::ResolveFailed) => {
                return Err(upstream(
                    "resolve-failed",
                    format!("{host} did not resolve"),
                ));
            }
            Err(reason) => return Err(Failure::Denied(reason)),
        };
        let stream = tokio::select! {
            biased;
            _ = open.revoked.cancelled() => return Err(Failure::Revoked),
            r = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)) => r,
        };
        match stream {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                Ok((s, place))
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(upstream(
                "connect-refused",
                format!("connect {target}: {e}"),
            )),
            Ok(Err(e)) => Err(upstream("connect-failed", format!("connect {target}: {e}"))),
            Err(_) => Err(upstream(
                "connect-timeout",
                format!("connect {target}: timed out"),
            )),
        }
    }
}

/// An HTTP/1 client connection on `io`: its sender, and its driver, which ends when
/// the connection does or `revoked` fires.
pub(crate) async fn http1_client<I>(
    io: I,
    revoked: CancellationToken,
) -> Result<(hyper::client::conn::http1::SendRequest<ProxyBody>, Driver), Failure>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| upstream("upstream-closed", e.to_string()))?;
    let driver: Driver = Box::pin(async move {
        tokio::select! {
            _ = connection => {}
            _ = revoked.cancelled() => {}
        }
    });
    Ok((sender, driver))
}

/// Resolve (unless `host` is an IP literal) and pick the address to connect to.
pub(crate) async fn resolve(
    host: &str,
    port: u16,
    allow_private: bool,
) -> Result<SocketAddr, Reason> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return rules::pick_target([SocketAddr::new(ip, port)], allow_private);
    }
    match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((bare, port))).await {
        Ok(Ok(addrs)) => rules::pick_target(addrs, allow_private),
        Ok(Err(_)) | Err(_) => Err(Reason::ResolveFailed),
    }
}

/// An upstream connection on its way back to its client connection, once the answer it
/// carries has ended cleanly.
pub(crate) struct Keep {
    pub(crate) slot: Arc<Mutex<Option<Upstream>>>,
    pub(crate) upstream: Upstream,
}

impl Keep {
    pub(crate) fn put_back(self) {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.upstream);
    }
}
