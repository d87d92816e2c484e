//! Containers that stop on their own (docs/NODE.md "Call back"): the node forgets
//! their lease, retires their owner, and — when `node.front_url` is set — tells the
//! front, `POST {front_url}/v1/nodes/events` with a [`NodeEvent`], signed like a node
//! request (with the container's key, and `x-stockade-node: NAME`), so the front can
//! send the guest `on-stop`.
//!
//! The front URL may be `http://` (a front on the same host or a private link) or
//! `https://`, verified against this machine's trust roots plus
//! `egress.extra_ca_files` (the front is not pinned: it is the node's own operator's).
//! A call back is tried [`ATTEMPTS`] times, each freshly signed; a front that never
//! answers loses the event (logged): its next call on that container gets the
//! substrate's answer (gone) anyway.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::sync::broadcast::error::RecvError;

use super::lease::LeaseEvent;
use super::state::{Node, now_ms};
use stockade_node_protocol::auth::{self, Signed};
use stockade_node_protocol::{EVENTS_PATH, NodeEvent};
use stockade_runtime::substrate::Event;

/// Tries per event.
pub const ATTEMPTS: u32 = 3;
/// One try's deadline.
const TRY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where call backs go.
#[derive(Clone)]
pub struct Front {
    /// `http` or `https`.
    https: bool,
    /// Host (for the connection, the `Host` header and TLS).
    host: String,
    /// Port.
    port: u16,
    /// The events path under the front's base path.
    path: String,
    /// TLS to the front.
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// A front URL that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("node.front_url {url:?}: {why}")]
pub struct BadFrontUrl {
    url: String,
    why: String,
}

impl Front {
    /// Parse `node.front_url` (`http://HOST[:PORT][/BASE]` or `https://…`).
    pub fn parse(url: &str, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Front, BadFrontUrl> {
        let bad = |why: &str| BadFrontUrl {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let uri: hyper::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("the scheme must be http or https")),
        };
        let host = uri
            .host()
            .ok_or_else(|| bad("no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if uri.query().is_some() {
            return Err(bad("a query is not allowed"));
        }
        let path = format!("{}{EVENTS_PATH}", uri.path().trim_end_matches('/'));
        if https && tls.is_none() {
            return Err(bad("https needs a TLS configuration"));
        }
        Ok(Front {
            https,
            host,
            port,
            path,
            tls,
        })
    }

    /// One signed POST of `event` for `key`; its status.
    async fn post(&self, node: &Node, key: &str, body: &Bytes) -> Result<u16, String> {
        let nonce = auth::nonce();
        let time_ms = now_ms();
        let signature = Signed {
            time_ms,
            nonce: &nonce,
            method: "POST",
            path: &self.path,
            key,
            idempotency: "",
            body,
        }
        .sign(&node.secret);
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let authority = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let req = hyper::Request::post(self.path.as_str())
            .header(hyper::header::HOST, authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(auth::TIME_HEADER, time_ms.to_string())
            .header(auth::NONCE_HEADER, nonce.as_str())
            .header(auth::KEY_HEADER, key)
            .header(auth::SIGNATURE_HEADER, signature)
            .header(auth::NODE_HEADER, node.name.as_str())
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())?;
        if self.https {
            let tls = self.tls.clone().expect("checked by parse");
            let name = rustls_pki_types::ServerName::try_from(self.host.clone())
                .map_err(|e| format!("server name: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            send(TokioIo::new(stream), req).await
        } else {
            send(TokioIo::new(tcp), req).await
        }
    }
}

async fn send<I>(io: I, req: hyper::Request<Full<Bytes>>) -> Result<u16, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    Ok(status)
}

/// The task that follows the substrate's events.
pub fn spawn(node: Arc<Node>, front: Option<Front>) -> tokio::task::JoinHandle<()> {
    let mut events = node.substrate.subscribe();
    tokio::spawn(async move {
        loop {
            let container = match events.recv().await {
                Ok(Event::Stopped(c)) => c,
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(target: "stockade::node", missed = n, "stop events missed");
                    continue;
                }
                Err(RecvError::Closed) => return,
            };
            let key = node.owners().owner(&container).map(str::to_owned);
            node.owners().retire(&container);
            node.leases.on(&container, LeaseEvent::Revoked);
            let (Some(front), Some(key)) = (front.clone(), key) else {
                continue;
            };
            let node = node.clone();
            tokio::spawn(async move { tell(&node, &front, &key, &container).await });
        }
    })
}

async fn tell(node: &Node, front: &Front, key: &str, container: &str) {
    let body = Bytes::from(
        serde_json::to_vec(&NodeEvent {
            node: node.name.clone(),
            stopped: container.to_owned(),
        })
        .expect("events serialize"),
    );
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(TRY_TIMEOUT, front.post(node, key, &body)).await {
            Ok(Ok(s)) if (200..300).contains(&s) => {
                tracing::info!(target: "stockade::node", container, key, attempt, "front told: container stopped");
                return;
            }
            Ok(Ok(s)) => last = format!("status {s}"),
            Ok(Err(e)) => last = e,
            Err(_) => last = "timed out".into(),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt))).await;
        }
    }
    tracing::warn!(target: "stockade::node", container, key, error = %last, "the front was not told a container stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_urls_parse_to_where_events_go() {
        let rows = [
            (
                "http://127.0.0.1:8787",
                Some((false, "127.0.0.1", 8787, "/v1/nodes/events")),
            ),
            (
                "http://front.example/",
                Some((false, "front.example", 80, "/v1/nodes/events")),
            ),
            (
                "http://[::1]:9/base/",
                Some((false, "::1", 9, "/base/v1/nodes/events")),
            ),
            ("ftp://x", None),
            ("http://x/?q=1", None),
            ("not a url", None),
        ];
        for (url, want) in rows {
            let got = Front::parse(url, None)
                .ok()
                .map(|f| (f.https, f.host.clone(), f.port, f.path.clone()));
            let want = want.map(|(h, host, p, path)| (h, host.to_owned(), p, path.to_owned()));
            assert_eq!(got, want, "{url}");
        }
        assert!(
            Front::parse("https://front.example", None).is_err(),
            "https needs TLS"
        );
    }
}
