//! The upstream side: resolve, check the address, connect (within the container's
//! budget), TLS verified against the trust roots, and the HTTP/1 connection kept for
//! the next request to the same host under the same grant.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::body::ProxyBody;
use crate::budget::{self, Limit};
use crate::fence::Open;
use crate::rules::{self, Reason};
use crate::shared::Shared;
use crate::tls;

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
    /// The target turned out to be one the options refuse (a private address): a
    /// denial after all.
    Denied(Reason),
    /// The grant that admitted it was revoked meanwhile.
    Revoked,
    /// The upstream could not be used.
    Upstream(UpstreamError),
}

impl From<UpstreamError> for Failure {
    fn from(e: UpstreamError) -> Failure {
        Failure::Upstream(e)
    }
}

/// Why an admitted request's upstream could not be used. Its [`reason`] is the 502's
/// `x-stockade-upstream-error` header and the audit record's error (docs/EGRESS.md's
/// table), its message the 502's body and the `egress upstream failed` line.
///
/// [`reason`]: UpstreamError::reason
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The container's upstream sockets (or handshakes) are spent.
    #[error("{host}: the container's {} are spent", .limit.as_str())]
    BudgetSpent {
        /// The host decided on.
        host: String,
        /// Which of the container's budgets.
        limit: Limit,
    },
    /// The container's TLS handshakes are over their rate.
    #[error("{host}: {}", .limit.as_str())]
    BudgetRate {
        /// The host decided on.
        host: String,
        /// Which rate.
        limit: Limit,
    },
    /// The name did not resolve (within [`RESOLVE_TIMEOUT`]).
    #[error("{host} did not resolve")]
    ResolveFailed {
        /// The host decided on.
        host: String,
    },
    /// The upstream refused the TCP connection.
    #[error("connect {target}: {source}")]
    ConnectRefused {
        /// The checked address.
        target: SocketAddr,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// Connecting failed otherwise.
    #[error("connect {target}: {source}")]
    ConnectFailed {
        /// The checked address.
        target: SocketAddr,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// Connecting took longer than [`CONNECT_TIMEOUT`].
    #[error("connect {target}: timed out")]
    ConnectTimeout {
        /// The checked address.
        target: SocketAddr,
    },
    /// TLS upstream without interception (no trust roots to verify with).
    #[error("interception is off")]
    InterceptionOff,
    /// The host is no name a certificate can be verified for.
    #[error("{host}: {source}")]
    ServerName {
        /// The host decided on.
        host: String,
        /// Why it is not a server name.
        source: rustls_pki_types::InvalidDnsNameError,
    },
    /// The TLS handshake failed: the certificate did not verify, no protocol in
    /// common, or another TLS error.
    #[error("{host}: {source}")]
    Handshake {
        /// The host decided on.
        host: String,
        /// What failed (a rustls error inside, when it was TLS).
        source: std::io::Error,
    },
    /// The TLS handshake took longer than [`HANDSHAKE_TIMEOUT`].
    #[error("{host}: handshake timed out")]
    HandshakeTimeout {
        /// The host decided on.
        host: String,
    },
    /// The upstream broke the HTTP exchange.
    #[error("{0}")]
    Closed(#[source] hyper::Error),
    /// The container's leaf for the host could not be minted.
    #[error("{0}")]
    Mint(#[source] tls::TlsError),
}

impl UpstreamError {
    /// The stable, kebab-case reason: the 502's `x-stockade-upstream-error` header and
    /// the audit record's error.
    pub fn reason(&self) -> &'static str {
        match self {
            UpstreamError::BudgetSpent { .. } | UpstreamError::BudgetRate { .. } => "budget",
            UpstreamError::ResolveFailed { .. } => "resolve-failed",
            UpstreamError::ConnectRefused { .. } => "connect-refused",
            UpstreamError::ConnectFailed { .. } => "connect-failed",
            UpstreamError::ConnectTimeout { .. } => "connect-timeout",
            UpstreamError::InterceptionOff
            | UpstreamError::ServerName { .. }
            | UpstreamError::HandshakeTimeout { .. } => "upstream-tls",
            UpstreamError::Handshake { source, .. } => tls::handshake_reason(source),
            UpstreamError::Closed(_) => "upstream-closed",
            UpstreamError::Mint(_) => "mint-failed",
        }
    }
}

/// TLS to the upstream, verified against this machine's roots (and the configured
/// extra CAs) for the name that was decided on.
pub(crate) async fn handshake(
    shared: &Shared,
    open: &Open,
    host: &str,
    stream: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Failure> {
    let Some(tls) = &shared.tls else {
        return Err(UpstreamError::InterceptionOff.into());
    };
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let bare = bare.strip_suffix('.').unwrap_or(bare);
    let name = rustls_pki_types::ServerName::try_from(bare.to_owned()).map_err(|source| {
        UpstreamError::ServerName {
            host: host.to_owned(),
            source,
        }
    })?;
    let connector = tokio_rustls::TlsConnector::from(tls.upstream.clone());
    let handshake = tokio::select! {
        biased;
        _ = open.revoked.cancelled() => return Err(Failure::Revoked),
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            let _working = shared.budget.handshake().await;
            connector.connect(name, stream).await
        }) => r,
    };
    match handshake {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(source)) => Err(UpstreamError::Handshake {
            host: host.to_owned(),
            source,
        }
        .into()),
        Err(_) => Err(UpstreamError::HandshakeTimeout {
            host: host.to_owned(),
        }
        .into()),
    }
}

/// Resolve `host`, pick an address the options allow, connect to exactly it; the
/// socket's place in the container's budget comes with it (none left: refused
/// before anything is resolved or opened).
pub(crate) async fn connect(
    shared: &Shared,
    open: &Open,
    host: &str,
    port: u16,
) -> Result<(TcpStream, budget::Place), Failure> {
    let place = shared
        .budget
        .upstream()
        .map_err(|limit| UpstreamError::BudgetSpent {
            host: host.to_owned(),
            limit,
        })?;
    let target = match resolve(host, port, shared.opts.allow_private_targets).await {
        Ok(t) => t,
        Err(Reason::ResolveFailed) => {
            return Err(UpstreamError::ResolveFailed {
                host: host.to_owned(),
            }
            .into());
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
        Ok(Err(source)) if source.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(UpstreamError::ConnectRefused { target, source }.into())
        }
        Ok(Err(source)) => Err(UpstreamError::ConnectFailed { target, source }.into()),
        Err(_) => Err(UpstreamError::ConnectTimeout { target }.into()),
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
        .map_err(UpstreamError::Closed)?;
    let driver: Driver = Box::pin(async move {
        // Biased: no random draw on each of the many polls a connection gets.
        tokio::select! {
            biased;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each upstream failure names the reason docs/EGRESS.md's table gives it (the
    /// 502's header, the audit's error), and says what happened without a value the
    /// proxy holds. (`Closed` wraps a hyper error no test can build alone; its reason
    /// is guarded end to end by the intercept tests' `upstream-closed`.)
    #[test]
    fn each_upstream_failure_names_its_documented_reason() {
        let addr: SocketAddr = "192.0.2.1:443".parse().unwrap();
        let io = |kind| std::io::Error::new(kind, "x");
        let tls_io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let host = || "api.example.com".to_owned();
        let rows: Vec<(UpstreamError, &str, &str)> = vec![
            (
                UpstreamError::BudgetSpent {
                    host: host(),
                    limit: Limit::Upstreams,
                },
                "budget",
                "api.example.com: the container's upstreams are spent",
            ),
            (
                UpstreamError::BudgetRate {
                    host: host(),
                    limit: Limit::HandshakeRate,
                },
                "budget",
                "api.example.com: handshake-rate",
            ),
            (
                UpstreamError::ResolveFailed { host: host() },
                "resolve-failed",
                "api.example.com did not resolve",
            ),
            (
                UpstreamError::ConnectRefused {
                    target: addr,
                    source: io(std::io::ErrorKind::ConnectionRefused),
                },
                "connect-refused",
                "connect 192.0.2.1:443: x",
            ),
            (
                UpstreamError::ConnectFailed {
                    target: addr,
                    source: io(std::io::ErrorKind::Other),
                },
                "connect-failed",
                "connect 192.0.2.1:443: x",
            ),
            (
                UpstreamError::ConnectTimeout { target: addr },
                "connect-timeout",
                "connect 192.0.2.1:443: timed out",
            ),
            (
                UpstreamError::InterceptionOff,
                "upstream-tls",
                "interception is off",
            ),
            (
                UpstreamError::ServerName {
                    host: host(),
                    source: rustls_pki_types::ServerName::try_from("a b").unwrap_err(),
                },
                "upstream-tls",
                "api.example.com: ",
            ),
            (
                UpstreamError::Handshake {
                    host: host(),
                    source: tls_io(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::UnknownIssuer,
                    )),
                },
                "upstream-certificate",
                "api.example.com: ",
            ),
            (
                UpstreamError::Handshake {
                    host: host(),
                    source: tls_io(rustls::Error::NoApplicationProtocol),
                },
                "upstream-alpn",
                "api.example.com: ",
            ),
            (
                UpstreamError::Handshake {
                    host: host(),
                    source: io(std::io::ErrorKind::ConnectionReset),
                },
                "upstream-tls",
                "api.example.com: x",
            ),
            (
                UpstreamError::HandshakeTimeout { host: host() },
                "upstream-tls",
                "api.example.com: handshake timed out",
            ),
            (
                UpstreamError::Mint(tls::TlsError::Rustls(rustls::Error::General("m".into()))),
                "mint-failed",
                "tls: unexpected error: m",
            ),
        ];
        for (error, reason, message) in rows {
            assert_eq!(error.reason(), reason, "{error:?}");
            assert!(error.to_string().starts_with(message), "{error}");
        }
    }
}
