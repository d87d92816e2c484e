//! E2B's domain form (`E2B_DOMAIN`, docs/E2B.md "The domain form"): one HTTPS
//! listener routed by `Host`, as E2B's own edge is.
//!
//! * `api.{domain}` is the control plane: the very router `/e2b` serves, the path
//!   prefixed with it (envd's `/envd/…` excepted: envd is a sandbox's own Host).
//! * `49983-{id}.{domain}` is sandbox `id`'s envd: the router `/e2b/envd` serves, with
//!   `E2b-Sandbox-Id: {id}` set from the Host (one implementation: the header the
//!   explicit-URL form sends). **The Host wins**: a request's own `E2b-Sandbox-Id` is
//!   replaced, so a header naming another sandbox cannot move a request the Host
//!   addressed (and the access token is still checked against the Host's id).
//! * `{P}-{id}.{domain}` for another port P is `get_host(P)`: a proxy onto sandbox
//!   `id`'s preview door for P (docs/PREVIEW.md), opened with the server's token on
//!   that sandbox's key only. A request is inbound only: it never touches the fence.
//!   When the create said `allowPublicTraffic: false`, the request must carry
//!   `e2b-traffic-access-token` (the sandbox's [`access::traffic_token`]), else 403.
//! * Any other Host: E2B's 404, never the native API.
//!
//! Parsing the Host is pure ([`route`], table-tested); the listener ([`serve`]) is
//! bounded: [`MAX_CONNECTIONS`] at once (past it a new connection is closed at once),
//! a TLS handshake within [`HANDSHAKE_TIMEOUT`], a request head within
//! [`HEADER_TIMEOUT`] (also the keep-alive idle bound).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use super::{E2b, E2bError, access, ids};

/// envd's port: `49983-{id}.{domain}` is the sandbox's envd (the SDK's `envd_port`).
pub const ENVD_PORT: u16 = 49983;
/// Most connections the domain listener holds at once (each holds descriptors, and
/// an upgraded one its splice): past it a new connection is closed at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Longest a TLS handshake may take: a client that connects and says nothing, or
/// stalls mid-handshake, holds its slot this long at most.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a request head may take, counted from when the connection waits for one
/// (a fresh connection and a kept-alive one between requests).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a connection to a preview door may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a Host names (pure: [`route`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `api.{domain}`: the control plane.
    Api,
    /// `49983-{id}.{domain}`: sandbox `id`'s envd.
    Envd(String),
    /// `{port}-{id}.{domain}`: sandbox `id`'s port (`get_host(port)`).
    Port(u16, String),
    /// Anything else.
    Unknown,
}

/// What `host` (a request's `Host`) names under `domain` (lower case, a valid DNS
/// name: [`valid_domain`]). Strict: case-insensitive; an optional `:port` (decimal)
/// and one trailing dot are allowed; exactly one label before the domain; the port
/// decimal, 1-65535, no leading zero; the id a well-formed sandbox id. Anything else
/// (userinfo, an address, two labels, an empty label) is [`Target::Unknown`].
pub fn route(host: Option<&str>, domain: &str) -> Target {
    let Some(host) = host else {
        return Target::Unknown;
    };
    if host.len() > 300 || host.contains('@') || host.starts_with('[') {
        return Target::Unknown;
    }
    let host = host.to_ascii_lowercase();
    let name = match host.rsplit_once(':') {
        Some((name, port)) => {
            if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
                return Target::Unknown;
            }
            name
        }
        None => host.as_str(),
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    let Some(label) = name
        .strip_suffix(domain)
        .and_then(|rest| rest.strip_suffix('.'))
    else {
        return Target::Unknown;
    };
    if label == "api" {
        return Target::Api;
    }
    let Some((port, id)) = label.split_once('-') else {
        return Target::Unknown;
    };
    if port.is_empty()
        || port.len() > 5
        || port.starts_with('0')
        || !port.bytes().all(|b| b.is_ascii_digit())
        || !ids::valid_id(id)
    {
        return Target::Unknown;
    }
    match port.parse::<u16>() {
        Ok(ENVD_PORT) => Target::Envd(id.to_string()),
        Ok(p) if p > 0 => Target::Port(p, id.to_string()),
        _ => Target::Unknown,
    }
}

/// Is `d` a DNS name a domain form can serve (pure)? Lower-case labels of
/// `[a-z0-9-]`, none empty, none starting or ending with `-`, at most 63 bytes each,
/// at most 200 in all (room for `49983-{id}.` before it in 253).
pub fn valid_domain(d: &str) -> bool {
    !d.is_empty()
        && d.len() <= 200
        && d.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// A domain form's settings, checked.
#[derive(Clone)]
pub struct Settings {
    /// The domain (lower case).
    pub domain: String,
    /// The HTTPS listener's address.
    pub listen: SocketAddr,
    /// Its TLS configuration (the certificate and key read, matched).
    pub tls: Arc<rustls::ServerConfig>,
}

/// The domain form's settings from its four values (`[e2b]`'s `domain`,
/// `tls_listen`, `tls_cert`, `tls_key`, or the gateway's flags, named by `names` in
/// that order): all or none. None given: `Ok(None)` (off). Some but not all, a
/// domain that is not a DNS name, an address that is not `ADDR:PORT`, an unreadable
/// or empty PEM, a key that does not match: an error naming the key.
pub fn configure(
    domain: Option<&str>,
    listen: Option<&str>,
    cert: Option<&Path>,
    key: Option<&Path>,
    names: [&str; 4],
) -> Result<Option<Settings>, String> {
    let given = [
        domain.is_some(),
        listen.is_some(),
        cert.is_some(),
        key.is_some(),
    ];
    if given.iter().all(|g| !g) {
        return Ok(None);
    }
    if let Some(i) = given.iter().position(|g| !g) {
        return Err(format!(
            "{} is missing: the E2B domain form needs all of {} (or none)",
            names[i],
            names.join(", ")
        ));
    }
    let (domain, listen, cert, key) = (
        domain.unwrap_or_default(),
        listen.unwrap_or_default(),
        cert.unwrap_or(Path::new("")),
        key.unwrap_or(Path::new("")),
    );
    if !valid_domain(domain) {
        return Err(format!(
            "{} {domain:?}: not a DNS name (lower-case labels of a-z, 0-9 and -)",
            names[0]
        ));
    }
    let listen: SocketAddr = listen
        .parse()
        .map_err(|_| format!("{} {listen:?}: not ADDR:PORT", names[1]))?;
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|x| format!("{} {}: {x}", names[2], cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{} {}: no PEM certificate in it",
            names[2],
            cert.display()
        ));
    }
    let pkey = rustls_pki_types::PrivateKeyDer::from_pem_file(key).map_err(|x| match x {
        rustls_pki_types::pem::Error::NoItemsFound => {
            format!("{} {}: no PEM private key in it", names[3], key.display())
        }
        other => format!("{} {}: {other}", names[3], key.display()),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|x| x.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, pkey)
        .map_err(|x| {
            format!(
                "{} {} and {} {}: {x}",
                names[2],
                cert.display(),
                names[3],
                key.display()
            )
        })?;
    // HTTP/1.1 only (the listener's): a client offering h2 falls back to it.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Settings {
        domain: domain.to_string(),
        listen,
        tls: Arc::new(tls),
    }))
}

/// What the domain listener's router shares.
struct Domain {
    e: Arc<E2b>,
    domain: String,
    /// The E2B layer's router (`super::router`): the only routes a Host reaches.
    inner: Router,
}

/// The domain form's router: every request dispatched by its Host onto `inner` (the
/// E2B layer's router, `super::router`), a preview door, or E2B's 404.
pub fn router(e: Arc<E2b>, domain: &str, inner: Router) -> Router {
    Router::new()
        .fallback(dispatch)
        .with_state(Arc::new(Domain {
            e,
            domain: domain.to_string(),
            inner,
        }))
}

async fn dispatch(State(d): State<Arc<Domain>>, mut req: Request) -> Response {
    let host = super::header(req.headers(), "host").map(str::to_owned);
    let target = route(host.as_deref(), &d.domain);
    let prefix = match &target {
        Target::Api => super::API_PREFIX,
        Target::Envd(id) => {
            // The Host wins: whatever `E2b-Sandbox-Id` the request carried is replaced.
            let h = req.headers_mut();
            h.remove("e2b-sandbox-id");
            if let Ok(v) = HeaderValue::from_str(id) {
                h.insert("e2b-sandbox-id", v);
            }
            super::ENVD_PREFIX
        }
        Target::Port(port, id) => {
            let (port, id) = (*port, id.clone());
            let resp = match to_port(&d.e, &id, port, req).await {
                Ok(r) => r,
                Err(err) => err.into_response(),
            };
            tracing::info!(target: "stockade::e2b", sandbox = %id, port, status = resp.status().as_u16(), "domain: a request to a sandbox's port");
            return resp;
        }
        Target::Unknown => {
            return E2bError::new(
                StatusCode::NOT_FOUND,
                "no such host: this server answers api.<domain> and <port>-<sandbox id>.<domain>",
            )
            .into_response();
        }
    };
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    // `api.<domain>` is the control plane only: envd is a sandbox's own Host, never
    // reached by naming it in the path (and a header) on the API's.
    if target == Target::Api
        && (req.uri().path() == "/envd" || req.uri().path().starts_with("/envd/"))
    {
        return E2bError::new(
            StatusCode::NOT_FOUND,
            "envd is served at 49983-<sandbox id>.<domain>, not under api.<domain>",
        )
        .into_response();
    }
    let Ok(uri) = format!("{prefix}{pq}").parse::<Uri>() else {
        return E2bError::new(StatusCode::BAD_REQUEST, "a path that is not a URI path")
            .into_response();
    };
    *req.uri_mut() = uri;
    match d.inner.clone().oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// A request to sandbox `id`'s `port` (`get_host(port)`): its traffic token checked
/// when its traffic is not public, then forwarded to its preview door for the port,
/// opened with the server's token on its key (the door answered again when open).
async fn to_port(e: &E2b, id: &str, port: u16, req: Request) -> Result<Response, E2bError> {
    let s = (ids::valid_id(id))
        .then(|| e.table().by_id.get(id).cloned())
        .flatten()
        .ok_or_else(|| E2bError::no_sandbox(id))?;
    if !s.policy.public {
        let ok = super::header(req.headers(), "e2b-traffic-access-token")
            .is_some_and(|t| access::verify_traffic(&e.secret, id, t));
        if !ok {
            return Err(E2bError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "sandbox {id}'s traffic is not public: the e2b-traffic-access-token header is missing or wrong"
                ),
            ));
        }
    }
    if s.paused {
        return Err(E2bError::new(
            StatusCode::BAD_GATEWAY,
            format!("sandbox {id} is paused: connect resumes it"),
        ));
    }
    let Some(token) = &e.server_token else {
        return Err(E2bError::new(
            StatusCode::BAD_GATEWAY,
            "this layer has no server token to open doors with",
        ));
    };
    let door = e
        .client(token)
        .expose(&s.key, u32::from(port))
        .await
        .map_err(|x| match x {
            // The guest refuses a door onto a key with no running container (409): the
            // port has nothing to answer, as E2B's 502.
            stockade_client::Error::Api { status: 409, .. } => E2bError::new(
                StatusCode::BAD_GATEWAY,
                format!("sandbox {id} is not running: port {port} has no door"),
            ),
            other => E2bError::of_client(other),
        })?;
    forward(req, &door.url).await
}

/// Hop-by-hop headers: the listener's, never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn is_upgrade(h: &HeaderMap) -> bool {
    h.get(header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
        && h.contains_key(header::UPGRADE)
}

/// Forward `req` to the door at `url` (`http://{listen}/p/{token}/`, or the Host
/// form): its path under the door's, `Host` the door's, this layer's headers (the
/// traffic token, the sandbox id, the access token) not passed on; an upgrade
/// (WebSocket) spliced both ways once the door answers 101.
async fn forward(mut req: Request, url: &str) -> Result<Response, E2bError> {
    let bad = |m: String| E2bError::new(StatusCode::BAD_GATEWAY, m);
    let door: Uri = url
        .parse()
        .map_err(|_| bad(format!("the door's URL {url:?} is not a URL")))?;
    let authority = door
        .authority()
        .filter(|_| door.scheme_str() == Some("http"))
        .ok_or_else(|| bad(format!("the door's URL {url:?} is not http://")))?
        .clone();
    let port = authority.port_u16().unwrap_or(80);
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect((authority.host().trim_matches(['[', ']']), port)),
    )
    .await
    .map_err(|_| bad("the preview door did not answer".into()))?
    .map_err(|x| bad(format!("the preview door did not answer: {x}")))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|x| bad(format!("the preview door: {x}")))?;
    tokio::spawn(conn.with_upgrades());
    let upgrade = is_upgrade(req.headers());
    let inbound = upgrade.then(|| hyper::upgrade::on(&mut req));
    let slot = req.extensions().get::<Slot>().cloned();
    let (mut parts, body) = req.into_parts();
    let base = door.path().trim_end_matches('/');
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{base}{pq}")
        .parse()
        .map_err(|_| E2bError::new(StatusCode::BAD_REQUEST, "a path that is not a URI path"))?;
    for h in HOP_BY_HOP {
        if !(upgrade && (h == "connection" || h == "upgrade")) {
            parts.headers.remove(h);
        }
    }
    for h in [
        "e2b-traffic-access-token",
        "e2b-sandbox-id",
        "x-access-token",
    ] {
        parts.headers.remove(h);
    }
    if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
        parts.headers.insert(header::HOST, v);
    }
    let mut resp = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|x| bad(format!("the preview door: {x}")))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(inbound) = inbound
    {
        let outbound = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            // The splice holds its connection's listener slot until it ends; the door's
            // listener ends it when idle (docs/PREVIEW.md, UPGRADE_IDLE).
            let _slot = slot;
            if let (Ok(a), Ok(b)) = (inbound.await, outbound.await) {
                splice(TokioIo::new(a), TokioIo::new(b)).await;
            }
        });
    }
    Ok(resp.map(Body::new))
}

/// Copy both ways until either side ends (a WebSocket has no half-close worth
/// keeping): dropping both ends closes both sockets.
async fn splice<A, B>(a: A, b: B)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    tokio::select! {
        _ = tokio::io::copy(&mut ar, &mut bw) => {}
        _ = tokio::io::copy(&mut br, &mut aw) => {}
    }
}

/// A connection's listener slot, carried in its requests' extensions so an upgrade
/// spliced from it holds it on.
#[derive(Clone)]
struct Slot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// Serve `app` (the domain router: [`router`]) over TLS on `listener` until the task
/// is dropped: HTTP/1.1, bounded (the module's doc).
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, app: Router) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(target: "stockade::e2b", error = %e, "domain listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(target: "stockade::e2b", %peer, "domain listener: connection refused, {MAX_CONNECTIONS} open");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let slot = Slot(Arc::new(slot));
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(target: "stockade::e2b", %peer, error = %e, "domain listener: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(target: "stockade::e2b", %peer, "domain listener: TLS handshake timed out");
                    return;
                }
            };
            let svc = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(slot.clone());
                app.clone().oneshot(req.map(Body::new))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tls), svc)
                .with_upgrades()
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "abcdefghij0123456789";

    #[test]
    fn a_host_names_the_api_envd_a_port_or_nothing() {
        let d = "e2b.test";
        let envd = || Target::Envd(ID.into());
        let port = |p| Target::Port(p, ID.into());
        for (host, want) in [
            (Some("api.e2b.test"), Target::Api),
            (Some("API.E2B.Test"), Target::Api),
            (Some("api.e2b.test:443"), Target::Api),
            (Some("api.e2b.test."), Target::Api),
            (Some(&*format!("49983-{ID}.e2b.test")), envd()),
            (Some(&*format!("49983-{ID}.e2b.test:443")), envd()),
            (Some(&*format!("8000-{ID}.e2b.test")), port(8000)),
            (Some(&*format!("1-{ID}.e2b.test")), port(1)),
            (Some(&*format!("65535-{ID}.e2b.test")), port(65535)),
            // Nothing, the bare domain, another domain, a suffix that is no label.
            (None, Target::Unknown),
            (Some(""), Target::Unknown),
            (Some("e2b.test"), Target::Unknown),
            (Some("api.other.test"), Target::Unknown),
            (Some("api.xe2b.test"), Target::Unknown),
            (Some(&*format!("8000-{ID}.xe2b.test")), Target::Unknown),
            // Two labels, userinfo, an address, a bad port suffix.
            (Some("api.api.e2b.test"), Target::Unknown),
            (Some(&*format!("8000-{ID}.x.e2b.test")), Target::Unknown),
            (Some("user@api.e2b.test"), Target::Unknown),
            (Some("[::1]:443"), Target::Unknown),
            (Some("127.0.0.1"), Target::Unknown),
            (Some("api.e2b.test:"), Target::Unknown),
            (Some("api.e2b.test:x"), Target::Unknown),
            (Some("api.e2b.test:443:443"), Target::Unknown),
            // Ports: zero, a leading zero, past 65535, not decimal, none.
            (Some(&*format!("0-{ID}.e2b.test")), Target::Unknown),
            (Some(&*format!("08000-{ID}.e2b.test")), Target::Unknown),
            (Some(&*format!("65536-{ID}.e2b.test")), Target::Unknown),
            (Some(&*format!("+80-{ID}.e2b.test")), Target::Unknown),
            (Some(&*format!("-{ID}.e2b.test")), Target::Unknown),
            (Some(&*format!("{ID}.e2b.test")), Target::Unknown),
            // Ids: short, long, not [a-z0-9] (upper case is folded: DNS is).
            (Some("8000-abc.e2b.test"), Target::Unknown),
            (Some(&*format!("8000-{ID}x.e2b.test")), Target::Unknown),
            (
                Some(&*format!("8000-{}_.e2b.test", &ID[..19])),
                Target::Unknown,
            ),
            (
                Some(&*format!("8000-{}-.e2b.test", &ID[..19])),
                Target::Unknown,
            ),
        ] {
            assert_eq!(route(host, d), want, "{host:?}");
        }
    }

    #[test]
    fn a_domain_is_a_dns_name() {
        for (d, want) in [
            ("e2b.test", true),
            ("stockade.example.com", true),
            ("localhost", true),
            ("a-b.c0", true),
            ("", false),
            ("E2B.test", false),
            ("e2b..test", false),
            (".e2b.test", false),
            ("e2b.test.", false),
            ("-a.test", false),
            ("a-.test", false),
            ("a_b.test", false),
            ("https://e2b.test", false),
            ("e2b.test:443", false),
            ("*.e2b.test", false),
            (&"a".repeat(64), false),
            (&["abc"; 60].join("."), false),
        ] {
            assert_eq!(valid_domain(d), want, "{d:?}");
        }
    }

    #[test]
    fn the_four_keys_are_all_or_none_and_an_error_names_the_key() {
        let names = ["domain", "tls_listen", "tls_cert", "tls_key"];
        assert!(configure(None, None, None, None, names).unwrap().is_none());
        let dir = std::env::temp_dir().join(format!("stockade-domain-{}", ids::new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["api.e2b.test".into()]).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "not a pem\n").unwrap();
        let missing = dir.join("missing.pem");
        let (c, k) = (Some(cert.as_path()), Some(key.as_path()));
        let ok = configure(Some("e2b.test"), Some("127.0.0.1:0"), c, k, names).unwrap();
        assert_eq!(ok.unwrap().domain, "e2b.test");
        for (args, named) in [
            ((Some("e2b.test"), None, c, k), "tls_listen is missing"),
            ((None, Some("127.0.0.1:0"), c, k), "domain is missing"),
            (
                (Some("e2b.test"), Some("127.0.0.1:0"), None, k),
                "tls_cert is missing",
            ),
            (
                (Some("e2b.test"), Some("127.0.0.1:0"), c, None),
                "tls_key is missing",
            ),
            (
                (Some("E2B..test"), Some("127.0.0.1:0"), c, k),
                "domain \"E2B..test\"",
            ),
            (
                (Some("e2b.test"), Some("localhost"), c, k),
                "tls_listen \"localhost\"",
            ),
            (
                (
                    Some("e2b.test"),
                    Some("127.0.0.1:0"),
                    Some(missing.as_path()),
                    k,
                ),
                "tls_cert ",
            ),
            (
                (
                    Some("e2b.test"),
                    Some("127.0.0.1:0"),
                    Some(garbage.as_path()),
                    k,
                ),
                "tls_cert ",
            ),
            (
                (
                    Some("e2b.test"),
                    Some("127.0.0.1:0"),
                    c,
                    Some(garbage.as_path()),
                ),
                "tls_key ",
            ),
            (
                (
                    Some("e2b.test"),
                    Some("127.0.0.1:0"),
                    c,
                    Some(cert.as_path()),
                ),
                "tls_key ",
            ),
        ] {
            let (d, l, c, k) = args;
            let err = configure(d, l, c, k, names).err().expect(named);
            assert!(
                err.starts_with(named),
                "{err:?} should start with {named:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
