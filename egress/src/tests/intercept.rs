//! The proxy over HTTPS (docs/EGRESS.md, "HTTPS: interception"): interception decides
//! method and path inside TLS, adds credentials only where a rule carries them, audits
//! what it admitted, keeps a host-only rule a blind tunnel, and says why an upstream
//! could not be used. The upstream is a rustls server with its own CA; the clients are
//! curl and rustls.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    DEADLINE, Proxy, Upstream, curl, dead_port, decided_request_rows, exchange_statuses,
    ignoring_upstream_on, proxy_tls, raw_connect, upstream_on,
};
use crate::rules::{Grant, RuleSpec};
use crate::secrets::{MemoryStore, Resolved, Secrets};
use crate::tls::{self, Authority};
use crate::{Attribution, FenceCounts, Interception, MAX_CONNECTIONS, ProxyOptions};

/// A CA of the test's own and a server configuration for `127.0.0.1`/`localhost`
/// signed by it: the "real" upstream the proxy verifies.
pub(super) fn pki() -> tls::LocalPki {
    tls::LocalPki::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap()
}

/// Attribution by a fixed answer: the test decides whether the connection is the
/// fenced run's.
struct Says(bool);

impl Attribution for Says {
    fn holds(&self, tree: &str, _peer: SocketAddr, _listener: SocketAddr) -> bool {
        assert!(!tree.is_empty());
        self.0
    }
}

/// A proxy intercepting with a fresh container CA, trusting `upstream_trusts` upstream
/// (and not this machine's roots); every connection is the fenced run's.
pub(super) fn intercepting(
    upstream_trusts: Vec<CertificateDer<'static>>,
) -> (Proxy, Arc<Authority>) {
    intercepting_as(upstream_trusts, true)
}

fn intercepting_as(
    upstream_trusts: Vec<CertificateDer<'static>>,
    fenced: bool,
) -> (Proxy, Arc<Authority>) {
    let authority = Arc::new(Authority::generate("container-1").unwrap());
    let p = proxy_tls(
        ProxyOptions {
            allow_private_targets: true,
            max_connections: MAX_CONNECTIONS,
        },
        Some(Interception {
            authority: authority.clone(),
            upstream: tls::upstream_config_with(false, upstream_trusts).unwrap(),
            attribution: Some(Arc::new(Says(fenced))),
        }),
    );
    (p, authority)
}

/// A file holding `pem` for curl's `--cacert`, removed on drop.
pub(super) struct PemFile(std::path::PathBuf);

impl PemFile {
    pub(super) fn new(pem: &str) -> PemFile {
        let p = std::env::temp_dir().join(format!("stockade-ca-{}.pem", uuid::Uuid::new_v4()));
        std::fs::write(&p, pem).unwrap();
        PemFile(p)
    }

    pub(super) fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for PemFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn spec(host: &str, methods: &[&str], path: Option<&str>) -> RuleSpec {
    RuleSpec::new(host, methods, path)
}

fn with_header(mut r: RuleSpec, header: &str, secret: &str) -> RuleSpec {
    r.headers.push((header.into(), secret.into()));
    r
}

/// curl through the proxy to `https://127.0.0.1:PORT{path}`, trusting `ca`.
pub(super) async fn https(
    p: &Proxy,
    ca: &PemFile,
    up: &Upstream,
    extra: &[&str],
    path: &str,
) -> String {
    let url = format!("https://127.0.0.1:{}{path}", up.addr.port());
    let proxy = format!("http://{}", p.addr);
    let mut args = vec!["-x", proxy.as_str(), "--cacert", ca.path()];
    args.extend_from_slice(extra);
    args.push(url.as_str());
    curl(&args).await
}

fn resolved(pairs: &[(&str, &str)]) -> Resolved {
    let s = Secrets::new(Arc::new(MemoryStore::default()), Default::default());
    for (n, v) in pairs {
        // Any binding: this helper resolves values, the binding check is not its job.
        let b = stockade_grammar::binding::parse("bound.example", &["GET".into()], None).unwrap();
        s.set(n, v, &b, 1).unwrap();
    }
    let names: Vec<&str> = pairs.iter().map(|(n, _)| *n).collect();
    s.resolve(&names).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_and_path_rules_are_decided_inside_https() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let (p, authority) = intercepting(vec![k.ca.clone()]);
    let ca = PemFile::new(authority.cert_pem());
    let host = format!("127.0.0.1:{}", up.addr.port());
    p.fence.apply(
        "fence-1",
        Grant::parse(&[spec(&host, &["GET"], Some("/allowed/"))]).unwrap(),
    );
    let ok = https(&p, &ca, &up, &[], "/allowed/x?q=1").await;
    assert!(
        ok.contains("200") && ok.contains("upstream saw GET /allowed/x?q=1"),
        "{ok}"
    );
    let path = https(&p, &ca, &up, &[], "/secret").await;
    assert!(
        path.contains("403") && path.contains("x-stockade-denial: path"),
        "{path}"
    );
    let method = https(&p, &ca, &up, &["-X", "POST"], "/allowed/x").await;
    assert!(method.contains("x-stockade-denial: method"), "{method}");
    let dots = https(&p, &ca, &up, &["--path-as-is"], "/allowed/../secret").await;
    assert!(dots.contains("x-stockade-denial: path"), "{dots}");
    // Without interception the same rule cannot be checked inside TLS.
    assert_eq!(p.sink.reasons(), ["path", "method", "path"]);
    // The audit: the one admitted request, its status and bytes.
    let a = p.sink.admitted();
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        (
            a[0].method.as_str(),
            a[0].path.as_str(),
            a[0].via.as_str(),
            a[0].status
        ),
        ("GET", "/allowed/x", "https", 200)
    );
    assert!(a[0].bytes_down > 0 && a[0].error.is_empty(), "{:?}", a[0]);
    assert_eq!(a[0].fence, "fence-1");
}

/// A client that offers h2 gets h2 inside the tunnel, every stream decided on its own
/// (the upstream is reached over HTTP/1.1); one that offers only HTTP/1.1 gets that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_client_gets_h2_and_the_same_decisions() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let (p, authority) = intercepting(vec![k.ca.clone()]);
    let ca = PemFile::new(authority.cert_pem());
    let host = format!("127.0.0.1:{}", up.addr.port());
    p.fence.apply(
        "f",
        Grant::parse(&[spec(&host, &["GET"], Some("/allowed/"))]).unwrap(),
    );
    let base = format!("https://127.0.0.1:{}", up.addr.port());
    let proxy = format!("http://{}", p.addr);
    // Three streams on one h2 connection: two admitted, one denied.
    let out = curl(&[
        "-x",
        &proxy,
        "--cacert",
        ca.path(),
        "--http2",
        "--parallel",
        &format!("{base}/allowed/a"),
        &format!("{base}/allowed/b"),
        &format!("{base}/secret"),
    ])
    .await;
    assert_eq!(out.matches("HTTP/2 200").count(), 2, "{out}");
    assert!(
        out.contains("HTTP/2 403") && out.contains("x-stockade-denial: path"),
        "{out}"
    );
    assert!(
        out.contains("upstream saw GET /allowed/a") && out.contains("upstream saw GET /allowed/b"),
        "{out}"
    );
    let h1 = curl(&[
        "-x",
        &proxy,
        "--cacert",
        ca.path(),
        "--http1.1",
        &format!("{base}/allowed/c"),
    ])
    .await;
    assert!(h1.contains("HTTP/1.1 200"), "{h1}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_rule_on_https_needs_interception_when_it_is_off() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let p = proxy_tls(
        ProxyOptions {
            allow_private_targets: true,
            max_connections: MAX_CONNECTIONS,
        },
        None,
    );
    let ca = PemFile::new(&k.ca_pem);
    let host = format!("127.0.0.1:{}", up.addr.port());
    p.fence
        .apply("f", Grant::parse(&[spec(&host, &["GET"], None)]).unwrap());
    let out = https(&p, &ca, &up, &[], "/x").await;
    assert!(
        out.contains("x-stockade-denial: needs-interception"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_reach_the_upstream_only_on_matching_requests_during_the_fence() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let (p, authority) = intercepting(vec![k.ca.clone()]);
    let ca = PemFile::new(authority.cert_pem());
    let host = format!("127.0.0.1:{}", up.addr.port());
    let grant = Grant::parse(&[
        with_header(
            spec(&host, &["GET"], Some("/api/")),
            "Authorization",
            "api-token",
        ),
        spec(&host, &[], Some("/public/")),
    ])
    .unwrap();
    p.fence.apply_with_secrets(
        "fence-1",
        grant.clone(),
        resolved(&[("api-token", "Bearer s3cret-value")]),
    );
    p.fence.begin_run().unwrap();
    let with = https(
        &p,
        &ca,
        &up,
        &["-H", "Authorization: Bearer forged-by-the-command"],
        "/api/repos",
    )
    .await;
    assert!(
        with.contains("authorization: Bearer s3cret-value"),
        "{with}"
    );
    assert!(!with.contains("forged-by-the-command"), "{with}");
    let without = https(&p, &ca, &up, &[], "/public/index").await;
    assert!(
        without.contains("200") && !without.contains("authorization"),
        "{without}"
    );
    // Over plain HTTP a credential is never added.
    let plain_up = super::upstream().await;
    let plain_host = format!("127.0.0.1:{}", plain_up.addr.port());
    p.fence.apply_with_secrets(
        "fence-2",
        Grant::parse(&[with_header(
            spec(&plain_host, &["GET"], None),
            "Authorization",
            "api-token",
        )])
        .unwrap(),
        resolved(&[("api-token", "Bearer s3cret-value")]),
    );
    let plain = curl(&[
        "-x",
        &format!("http://{}", p.addr),
        &format!("http://{plain_host}/api/x"),
    ])
    .await;
    assert!(
        plain.contains("200") && !plain.contains("s3cret"),
        "{plain}"
    );
    // After the fence: nothing is admitted, nothing is added.
    p.fence.revoke();
    let after = https(&p, &ca, &up, &[], "/api/repos").await;
    assert!(!after.contains("s3cret"), "{after}");
    // The audit names the header, never its value.
    let a = p.sink.admitted();
    let creds: Vec<(&str, Vec<String>)> = a
        .iter()
        .map(|r| (r.path.as_str(), r.credentials.clone()))
        .collect();
    assert!(
        creds.contains(&("/api/repos", vec!["authorization".to_string()])),
        "{creds:?}"
    );
    assert!(creds.contains(&("/public/index", vec![])), "{creds:?}");
    assert!(!format!("{a:?}").contains("s3cret"));
}

/// A connection the fenced run does not hold (a detached process's, during the fence)
/// is admitted by the shared grant but gets no credential; before the run starts no
/// connection does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_is_not_the_fenced_runs_gets_no_credentials() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let (p, authority) = intercepting_as(vec![k.ca.clone()], false);
    let ca = PemFile::new(authority.cert_pem());
    let host = format!("127.0.0.1:{}", up.addr.port());
    let grant = Grant::parse(&[with_header(
        spec(&host, &["GET"], None),
        "Authorization",
        "t",
    )])
    .unwrap();
    p.fence
        .apply_with_secrets("f", grant, resolved(&[("t", "Bearer s3cret-value")]));
    p.fence.begin_run().unwrap();
    let out = https(&p, &ca, &up, &[], "/api").await;
    assert!(out.contains("200") && !out.contains("s3cret"), "{out}");
    let a = p.sink.admitted();
    assert_eq!(a[0].error, "credentials-withheld", "{a:?}");
    assert!(a[0].credentials.is_empty());
    // With attribution saying yes but no run started: still nothing.
    let (p, authority) = intercepting_as(vec![k.ca.clone()], true);
    let ca = PemFile::new(authority.cert_pem());
    let grant = Grant::parse(&[with_header(
        spec(&host, &["GET"], None),
        "Authorization",
        "t",
    )])
    .unwrap();
    p.fence
        .apply_with_secrets("f", grant, resolved(&[("t", "Bearer s3cret-value")]));
    let out = https(&p, &ca, &up, &[], "/api").await;
    assert!(out.contains("200") && !out.contains("s3cret"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_only_rule_stays_a_blind_tunnel() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let (p, _authority) = intercepting(vec![k.ca.clone()]);
    // The client trusts only the upstream's own CA: it can complete a handshake only
    // if what it talks to is the upstream itself, not the proxy.
    let upstream_ca = PemFile::new(&k.ca_pem);
    let host = format!("127.0.0.1:{}", up.addr.port());
    p.fence
        .apply("f", Grant::parse(&[spec(&host, &[], None)]).unwrap());
    let out = https(&p, &upstream_ca, &up, &["-X", "DELETE"], "/anything").await;
    assert!(out.contains("upstream saw DELETE /anything"), "{out}");
    // A pinned rule wins over a method rule for the same host.
    let mut pinned = spec(&host, &[], None);
    pinned.intercept = false;
    p.fence.apply(
        "g",
        Grant::parse(&[spec(&host, &["GET"], None), pinned]).unwrap(),
    );
    let out = https(&p, &upstream_ca, &up, &["-X", "PUT"], "/pinned").await;
    assert!(out.contains("upstream saw PUT /pinned"), "{out}");
    p.fence.revoke();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while p.sink.admitted().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "tunnel records");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = p.sink.admitted();
    assert!(
        a.iter().all(|r| r.via == "tunnel" && r.method == "CONNECT"),
        "{a:?}"
    );
    assert!(
        a.iter().all(|r| r.bytes_up > 0 && r.bytes_down > 0),
        "{a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_cannot_be_used_is_a_502_with_the_reason() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    // The proxy trusts nothing upstream: the upstream's certificate does not verify.
    let (p, authority) = intercepting(vec![]);
    let ca = PemFile::new(authority.cert_pem());
    let host = format!("127.0.0.1:{}", up.addr.port());
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    p.fence.apply(
        "f",
        Grant::parse(&[
            spec(&host, &["GET"], None),
            spec(&format!("127.0.0.1:{closed}"), &["GET"], None),
            spec("nothing.invalid", &["GET"], None),
        ])
        .unwrap(),
    );
    let cert = https(&p, &ca, &up, &[], "/x").await;
    assert!(cert.contains("502"), "{cert}");
    assert!(
        cert.contains("x-stockade-upstream-error: upstream-certificate"),
        "{cert}"
    );
    let proxy = format!("http://{}", p.addr);
    let refused = curl(&[
        "-x",
        &proxy,
        "--cacert",
        ca.path(),
        &format!("https://127.0.0.1:{closed}/x"),
    ])
    .await;
    assert!(
        refused.contains("x-stockade-upstream-error: connect-refused"),
        "{refused}"
    );
    let unresolved = curl(&[
        "-x",
        &proxy,
        "--cacert",
        ca.path(),
        "https://nothing.invalid/x",
    ])
    .await;
    assert!(
        unresolved.contains("x-stockade-upstream-error: resolve-failed"),
        "{unresolved}"
    );
    let errors: Vec<(u16, String)> = p
        .sink
        .admitted()
        .iter()
        .map(|a| (a.status, a.error.clone()))
        .collect();
    assert_eq!(
        errors,
        [
            (502, "upstream-certificate".to_string()),
            (502, "connect-refused".to_string()),
            (502, "resolve-failed".to_string())
        ]
    );
}

/// The raw-socket table (`decided_request_rows`), inside an intercepted tunnel: the same
/// requests get the same answers, and the upstream sees only what was decided on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_decided_request_reaches_the_upstream_over_tls() {
    let k = pki();
    let mut up = upstream_on(Some(k.server.clone())).await;
    let (p, authority) = intercepting(vec![k.ca.clone()]);
    let host = format!("127.0.0.1:{}", up.addr.port());
    p.fence.apply(
        "f",
        Grant::parse(&[spec(&host, &[], Some("/allowed/"))]).unwrap(),
    );
    let client = client_trusting(authority.cert_pem());
    for (what, raw, want) in decided_request_rows(&host, "") {
        let got = tls_exchange(p.addr, &host, &client, raw.as_bytes()).await;
        assert_eq!(&got[..], want, "{what}: answered {got:?}");
    }
    let mut seen = Vec::new();
    while let Ok(path) = up.seen.try_recv() {
        seen.push(path);
    }
    assert_eq!(
        seen,
        ["/allowed/x", "/allowed/lf", "/allowed/y"],
        "{seen:?}"
    );
}

/// A body on GET smuggles nothing (docs/SECURITY.md, "The proxy against its own
/// clients"): the raw-socket table inside an intercepted tunnel, against an upstream that
/// reads GET requests' heads only (as Python's `http.server` does): a body on GET is
/// refused, never read upstream as a second request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_decided_request_reaches_an_upstream_that_ignores_get_bodies_over_tls() {
    let k = pki();
    let mut up = ignoring_upstream_on(Some(k.server.clone()), false).await;
    let (p, authority) = intercepting(vec![k.ca.clone()]);
    let host = format!("127.0.0.1:{}", up.addr.port());
    p.fence.apply(
        "f",
        Grant::parse(&[spec(&host, &[], Some("/allowed/"))]).unwrap(),
    );
    let client = client_trusting(authority.cert_pem());
    let mut answers = Vec::new();
    for (what, raw, want) in decided_request_rows(&host, "") {
        answers.push((
            what,
            tls_exchange(p.addr, &host, &client, raw.as_bytes()).await,
            want,
        ));
    }
    let mut seen = Vec::new();
    while let Ok(path) = up.seen.try_recv() {
        seen.push(path);
    }
    assert!(
        !seen.iter().any(|p| p.contains("secret")),
        "a request nobody decided on reached the upstream: {seen:?}"
    );
    assert!(seen.iter().all(|p| p.starts_with("/allowed/")), "{seen:?}");
    for (what, got, want) in answers {
        assert_eq!(&got[..], want, "{what}: answered {got:?}");
    }
}

/// A flood hides no credentialed request: while a flood of admitted requests (to a dead
/// port) keeps the audit's rate bound spent, a request that carries a credential is still
/// recorded; the fence's summary row counts what was left out, and the counts cover
/// everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentialed_request_is_recorded_during_a_flood() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let (p, authority) = intercepting(vec![k.ca.clone()]);
    let ca = PemFile::new(authority.cert_pem());
    let host = format!("127.0.0.1:{}", up.addr.port());
    let dead = dead_port();
    let grant = Grant::parse(&[
        with_header(spec(&host, &["GET"], Some("/api/")), "Authorization", "t"),
        spec(&format!("127.0.0.1:{dead}"), &[], None),
    ])
    .unwrap();
    p.fence
        .apply_with_secrets("fence-1", grant, resolved(&[("t", "Bearer s3cret-value")]));
    p.fence.begin_run().unwrap();
    // The flood: batches of pipelined plain-HTTP requests on one connection, each a
    // 502, until the credentialed request is done; past the burst (1000) first.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (addr, halt) = (p.addr, stop.clone());
    let flood = tokio::spawn(async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let batch =
            format!("GET http://127.0.0.1:{dead}/x HTTP/1.1\r\nHost: 127.0.0.1:{dead}\r\n\r\n")
                .repeat(100);
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        while total < 1500 || !halt.load(std::sync::atomic::Ordering::SeqCst) {
            s.write_all(batch.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            while String::from_utf8_lossy(&got)
                .matches("HTTP/1.1 502")
                .count()
                < 100
            {
                let n = tokio::time::timeout(DEADLINE, s.read(&mut buf))
                    .await
                    .expect("the flood is answered in time")
                    .unwrap();
                assert!(n > 0, "the proxy closed the connection");
                got.extend_from_slice(&buf[..n]);
            }
            total += 100;
        }
        total
    });
    // Past the burst before the credentialed request goes.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while p.sink.admitted().len() < 1000 {
        assert!(tokio::time::Instant::now() < deadline, "the flood in time");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let out = https(&p, &ca, &up, &[], "/api/repos").await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let flooded = flood.await.unwrap();
    assert!(out.contains("authorization: Bearer s3cret-value"), "{out}");
    let counts = p.fence.revoke_counts();
    assert_eq!(
        counts,
        FenceCounts {
            admitted: flooded as u32 + 1,
            denied: 0
        }
    );
    let rows = p.sink.admitted();
    assert!(
        rows.iter()
            .any(|a| a.path == "/api/repos" && a.credentials == ["authorization"]),
        "the credentialed request has its record"
    );
    let summary: Vec<_> = rows.iter().filter(|a| a.via == "summary").collect();
    let records = rows.len() - summary.len();
    assert!(records < flooded, "the bound left records out: {records}");
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert_eq!(summary[0].suppressed as usize, flooded + 1 - records);
}

/// A revoked grant cuts off the intercepted connection it admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_grant_closes_an_intercepted_connection() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let (p, authority) = intercepting(vec![k.ca.clone()]);
    let host = format!("127.0.0.1:{}", up.addr.port());
    p.fence
        .apply("f", Grant::parse(&[spec(&host, &["GET"], None)]).unwrap());
    let client = client_trusting(authority.cert_pem());
    let mut s = tls_connect(p.addr, &host, &client).await;
    let req = format!("GET /one HTTP/1.1\r\nHost: {host}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(DEADLINE, s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
    p.fence.revoke();
    // The connection ends: EOF or a reset, within the deadline.
    let ended = tokio::time::timeout(DEADLINE, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the intercepted connection outlived its grant"
    );
}

fn client_trusting(pem: &str) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    tls::upstream_config_with(false, vec![der]).unwrap()
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn tls_connect(proxy: SocketAddr, host: &str, client: &Arc<rustls::ClientConfig>) -> Tls {
    let (s, head) = raw_connect(proxy, host).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio::time::timeout(
        DEADLINE,
        tokio_rustls::TlsConnector::from(client.clone()).connect(name, s),
    )
    .await
    .unwrap()
    .unwrap()
}

async fn tls_exchange(
    proxy: SocketAddr,
    host: &str,
    client: &Arc<rustls::ClientConfig>,
    bytes: &[u8],
) -> Vec<u16> {
    let mut s = tls_connect(proxy, host, client).await;
    exchange_statuses(&mut s, bytes).await
}
