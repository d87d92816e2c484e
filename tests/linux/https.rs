//! HTTPS under the fence (DESIGN §5) on real containers, seen by real clients (curl,
//! python `urllib`, node's `https` through a CONNECT, `git ls-remote`) against a local
//! rustls upstream with its own CA that the proxy is configured to trust.

use std::path::PathBuf;

use stockade_egress::secrets::Secrets;
use stockade_runtime::bindings::{CredentialHeader, Grant, Rule};
use stockade_runtime::substrate::Substrate;
use stockade_tests::https::{GIT_HEAD, HttpsUpstream};

use crate::facade::{Fx, fx, out, wait_for};

/// A PEM file the test writes (the upstream's CA for `egress.extra_ca_files`).
struct PemFile(PathBuf);

impl PemFile {
    fn new(pem: &str) -> PemFile {
        let p =
            std::env::temp_dir().join(format!("stockade-https-ca-{}.pem", uuid::Uuid::new_v4()));
        std::fs::write(&p, pem).unwrap();
        PemFile(p)
    }
}

impl Drop for PemFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A runtime whose proxy trusts `up`'s CA upstream (interception is the default).
async fn fx_trusting(up: &HttpsUpstream) -> (Fx, PemFile) {
    let ca = PemFile::new(&up.ca_pem);
    let path = ca.0.clone();
    let f = fx(move |c| {
        assert!(c.egress.interception, "interception is on by default");
        c.egress.extra_ca_files = vec![path];
    })
    .await;
    (f, ca)
}

fn rule(host: &str, methods: &[&str], path: Option<&str>) -> Rule {
    Rule {
        host: host.into(),
        methods: methods.iter().map(|m| m.to_string()).collect(),
        path_prefix: path.map(str::to_string),
        headers: vec![],
        intercept: true,
    }
}

fn with_secret(mut r: Rule, header: &str, secret: &str) -> Rule {
    r.headers.push(CredentialHeader {
        name: header.into(),
        secret: secret.into(),
    });
    r
}

/// node's `https` through a CONNECT to the proxy (node 20's `fetch` does not use
/// `HTTPS_PROXY`; a proxy agent does exactly this), trusting `NODE_EXTRA_CA_CERTS`.
const NODE: &str = r#"const http = require('http'), https = require('https');
const p = new URL(process.env.HTTPS_PROXY);
const [host, port] = process.env.TARGET.split(':');
const get = (path) => new Promise((ok) => {
  const c = http.request({ host: p.hostname, port: p.port, method: 'CONNECT', path: process.env.TARGET });
  c.on('connect', (res, socket) => {
    if (res.statusCode !== 200) return ok('connect ' + res.statusCode);
    https.get({ host, port, path, socket, agent: false }, (r) => {
      r.resume();
      r.on('end', () => ok(String(r.statusCode) + ' ' + (r.headers['x-stockade-denial'] || '')));
    }).on('error', (e) => ok('error ' + e.message));
  });
  c.on('error', (e) => ok('error ' + e.message));
  c.end();
});
(async () => { console.log('node', await get('/allowed/node')); console.log('node', await get('/nope')); })();
"#;

/// python's `urllib` (through `https_proxy`, trusting `SSL_CERT_FILE`).
const PYTHON: &str = r#"import os, urllib.request, urllib.error
base = os.environ["BASE"]
print("python", urllib.request.urlopen(base + "/allowed/py", timeout=5).status)
try:
    urllib.request.urlopen(base + "/nope", timeout=5)
except urllib.error.HTTPError as e:
    print("python", e.code, e.headers.get("x-stockade-denial"))
"#;

/// Allowed method and path pass for every client; another path or method gets 403
/// with the reason from inside TLS; the CA is trusted through the environment and
/// through the system bundle alike; the CA's key is nowhere in the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_are_decided_inside_https() {
    let up = HttpsUpstream::start("127.0.0.2");
    let (f, _ca) = fx_trusting(&up).await;
    let script = r#"c() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@"; echo; }
c "$BASE/allowed/curl"
c "$BASE/other"
c -X POST "$BASE/allowed/x"
curl -s -D - -o /dev/null --max-time 5 "$BASE/secret" | tr -d '\r' | grep -i '^x-stockade-denial'
env -u SSL_CERT_FILE -u CURL_CA_BUNDLE curl -s -o /dev/null -w 'system bundle %{http_code}\n' --max-time 5 "$BASE/allowed/system"
python3 -c "$PYTHON"
node -e "$NODE"
git ls-remote "$BASE/repo.git" 2>&1
grep -l 'PRIVATE KEY' /etc/stockade/* /etc/ssl/certs/ca-certificates.crt || echo "no key in the container"
"#;
    let mut input = f.sh(script);
    input.env.extend([
        ("BASE".to_string(), up.base()),
        ("TARGET".to_string(), up.addr.to_string()),
        ("PYTHON".to_string(), PYTHON.to_string()),
        ("NODE".to_string(), NODE.to_string()),
    ]);
    input.grant = Some(Grant {
        rules: vec![
            rule(&up.addr.to_string(), &["GET"], Some("/allowed/")),
            rule(&up.addr.to_string(), &["GET"], Some("/repo.git/")),
        ],
        ask: false,
    });
    let o = f.rt.exec("https", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        format!(
            "200\n403\n403\nx-stockade-denial: path\nsystem bundle 200\npython 200\npython 403 path\n\
             node 200 \nnode 403 path\n{GIT_HEAD}\tHEAD\n{GIT_HEAD}\trefs/heads/main\nno key in the container\n"
        ),
        "stderr: {}",
        out(&o.stderr)
    );
    let seen: Vec<String> = up
        .seen()
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(
        seen,
        [
            "GET /allowed/curl",
            "GET /allowed/system",
            "GET /allowed/py",
            "GET /allowed/node",
            "GET /repo.git/info/refs"
        ],
        "denied requests never reach the upstream"
    );
    // The audit: what was admitted, for the key; the exec counted its denials.
    let admitted = f.store.admitted("https").unwrap();
    assert_eq!(admitted.len(), 5, "{admitted:?}");
    assert!(
        admitted
            .iter()
            .all(|a| a.via == "https" && a.status == 200 && a.bytes_down > 0),
        "{admitted:?}"
    );
    assert_eq!(o.denials, 5, "{o:?}");
    f.finish().await;
}

/// A credential reaches the upstream only on the requests its rule admits, only during
/// the fence, only from the fenced command: a detached process making the same request
/// during the fence is denied `detached` (the open grant is the fenced run's alone,
/// invariant 3). Nothing in the container, its environment or its files ever holds the
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_reach_the_upstream_but_never_the_container_or_a_detached_process() {
    let up = HttpsUpstream::start("127.0.0.2");
    let (f, _ca) = fx_trusting(&up).await;
    let secret = format!("Bearer linux-{}", uuid::Uuid::new_v4().simple());
    // Bound by the approver to the upstream's GETs under /api/ (DESIGN §5).
    let binding = stockade_runtime::config::SecretBindingConfig {
        host: up.addr.to_string(),
        methods: vec!["GET".into()],
        path_prefix: Some("/api/".into()),
    }
    .parse()
    .unwrap();
    Secrets::new(f.store.clone(), Default::default())
        .set("api-token", &secret, &binding, 1)
        .unwrap();
    let host = up.addr.to_string();
    // A detached process, started with no grant, asks for /api/detached again and
    // again and notes each answer.
    let mut detached = f.sh(
        r#"while true; do curl -s -o /dev/null -w '%{http_connect}:%{http_code}\n' --max-time 5 "$BASE/api/detached" >> /tmp/detached.log; sleep 0.05; done"#,
    );
    detached.env.push(("BASE".into(), up.base()));
    detached.timeout_ms = None;
    f.rt.start_detached("cred", &detached).await.unwrap();
    // Between fences: refused (no grant, so nothing to add a credential to).
    let o = f
        .rt
        .exec(
            "cred",
            &f.sh("for i in $(seq 200); do [ -s /tmp/detached.log ] && break; sleep 0.05; done; head -1 /tmp/detached.log"),
        )
        .await
        .unwrap();
    assert_eq!(out(&o.stdout), "403:000\n", "the CONNECT refused: {o:?}");
    // The fence: the command's own request carries the credential (replacing the one it
    // forged); it waits until the detached process asked twice more during the fence (the
    // second ask began inside it) and prints that answer: the open grant is the fenced
    // run's alone, the detached CONNECT is denied `detached` (invariant 3; under the
    // sharing DESIGN §2.1 accepts it would be admitted). Then it prints everything it can
    // see of environments and command lines.
    let script = r#"curl -s -o /dev/null -w '%{http_code}\n' --max-time 5 -H 'Authorization: Bearer forged' "$BASE/api/fenced"
curl -s -o /dev/null -w '%{http_code}\n' --max-time 5 "$BASE/public/page"
n=$(wc -l < /tmp/detached.log)
for i in $(seq 200); do [ "$(wc -l < /tmp/detached.log)" -ge $((n + 2)) ] && break; sleep 0.05; done
sed -n "$((n + 2))p" /tmp/detached.log
env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' '
"#;
    let mut input = f.sh(script);
    input.env.push(("BASE".into(), up.base()));
    input.grant = Some(Grant {
        rules: vec![
            with_secret(
                rule(&host, &["GET"], Some("/api/")),
                "Authorization",
                "api-token",
            ),
            rule(&host, &["GET"], Some("/public/")),
        ],
        ask: false,
    });
    let o = f.rt.exec("cred", &input).await.unwrap();
    let text = out(&o.stdout);
    assert!(
        text.starts_with("200\n200\n403:000\n"),
        "{text}\n{}",
        out(&o.stderr)
    );
    assert!(!text.contains(&secret) && !out(&o.stderr).contains(&secret));
    // What the upstream got.
    let seen = up.seen();
    let fenced: Vec<_> = seen.iter().filter(|s| s.path == "/api/fenced").collect();
    assert_eq!(fenced.len(), 1, "{seen:?}");
    assert_eq!(fenced[0].authorization.as_deref(), Some(secret.as_str()));
    let public: Vec<_> = seen.iter().filter(|s| s.path == "/public/page").collect();
    assert_eq!(
        public[0].authorization, None,
        "a rule without the header adds none"
    );
    let from_detached: Vec<_> = seen.iter().filter(|s| s.path == "/api/detached").collect();
    assert!(
        from_detached.is_empty(),
        "the detached process reached the upstream: {from_detached:?}"
    );
    // Its CONNECTs during the fence are recorded as `detached` denials under the fence.
    let denials = f.rt.denials("cred").await.unwrap();
    assert!(
        denials.iter().any(|d| d.method == "CONNECT"
            && format!("{:?}", d.reason)
                .to_ascii_lowercase()
                .contains("detached")),
        "{denials:?}"
    );
    // After the fence: the detached process is refused again, with nothing added.
    let c = f.linux.current("cred").await.unwrap().unwrap();
    let log = f
        .data
        .join("containers")
        .join(&c)
        .join("fs/tmp/detached.log");
    let lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let n = lines();
    wait_for("the detached process asked again", || lines() > n + 2).await;
    let tail = std::fs::read_to_string(&log).unwrap();
    assert!(tail.lines().last() == Some("403:000"), "{tail}");
    // The container's files: its root as its supervisor sees it, its storage.
    let pid = f.linux.supervisor_pid(&c).unwrap();
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    for dir in ["etc", "workspace", "tmp", "artifacts", "run"] {
        assert_no_file_holds(&root.join(dir), &secret);
    }
    // The records and the audit name the header, never the value.
    let admitted = f.store.admitted("cred").unwrap();
    assert!(!format!("{admitted:?}").contains(&secret));
    assert!(
        admitted
            .iter()
            .any(|a| a.path == "/api/fenced" && a.credentials == ["authorization"]),
        "{admitted:?}"
    );
    assert!(
        admitted.iter().all(|a| a.path != "/api/detached"),
        "nothing of the detached process was admitted: {admitted:?}"
    );
    f.finish().await;
}

fn assert_no_file_holds(dir: &std::path::Path, needle: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            assert_no_file_holds(&p, needle);
        } else if meta.is_file() && meta.len() < 16 << 20 {
            let bytes = std::fs::read(&p).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(needle),
                "{} holds the secret",
                p.display()
            );
        }
    }
}

/// A host-only rule stays a blind tunnel: a client that trusts only the upstream's own
/// CA completes its handshake (it talks to the upstream, not the proxy). An upstream
/// whose certificate the proxy does not trust is a 502 with the reason, recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_only_rule_tunnels_blind_and_an_untrusted_upstream_is_a_502() {
    let up = HttpsUpstream::start("127.0.0.2");
    let untrusted = HttpsUpstream::start("127.0.0.2");
    let (f, _ca) = fx_trusting(&up).await;
    let script = r#"printf '%s' "$UPSTREAM_CA" > /tmp/upstream-ca.pem
curl -s -o /dev/null -w 'blind %{http_code}\n' --max-time 5 --cacert /tmp/upstream-ca.pem -X DELETE "$BASE/anything"
curl -s -D - -o /dev/null --max-time 5 "$UNTRUSTED/x" | tr -d '\r' | grep -i -e '^HTTP.* 502' -e '^x-stockade-upstream-error'
"#;
    let mut input = f.sh(script);
    input.env.extend([
        ("UPSTREAM_CA".to_string(), up.ca_pem.clone()),
        ("BASE".to_string(), up.base()),
        ("UNTRUSTED".to_string(), untrusted.base()),
    ]);
    input.grant = Some(Grant {
        rules: vec![
            rule(&up.addr.to_string(), &[], None),
            rule(&untrusted.addr.to_string(), &["GET"], None),
        ],
        ask: false,
    });
    let o = f.rt.exec("blind", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        // curl offers h2 and gets it inside the intercepted tunnel.
        "blind 200\nHTTP/2 502 \nx-stockade-upstream-error: upstream-certificate\n",
        "stderr: {}",
        out(&o.stderr)
    );
    assert_eq!(
        up.seen()[0].method,
        "DELETE",
        "the tunnel carried any method"
    );
    assert!(
        untrusted.seen().is_empty(),
        "nothing reached the untrusted upstream"
    );
    // A tunnel is recorded when it ends (the fence's revoke cut it).
    wait_for("the tunnel's audit record", || {
        f.store
            .admitted("blind")
            .unwrap()
            .iter()
            .any(|a| a.via == "tunnel")
    })
    .await;
    let admitted = f.store.admitted("blind").unwrap();
    let rows: Vec<(&str, u16, &str)> = admitted
        .iter()
        .map(|a| (a.via.as_str(), a.status, a.error.as_str()))
        .collect();
    // The tunnel ended when curl closed it (cleanly or with a reset), or when the
    // fence's revoke cut it first: its record says which.
    assert!(
        rows.iter()
            .any(|r| r.0 == "tunnel" && r.1 == 200 && matches!(r.2, "" | "reset" | "revoked")),
        "{rows:?}"
    );
    assert!(
        rows.contains(&("https", 502, "upstream-certificate")),
        "{rows:?}"
    );
    f.finish().await;
}

/// A legitimate client's parallel requests, each its own intercepted CONNECT, all at
/// once.
const PARALLEL: &str = r#"import os, threading, urllib.request
base, n = os.environ["BASE"], int(os.environ["N"])
start, got = threading.Barrier(n), []
def get(i):
    start.wait()
    try:
        got.append(str(urllib.request.urlopen(base + "/allowed/%d" % i, timeout=20).status))
    except Exception as e:
        got.append("%s %s" % (type(e).__name__, e))
ts = [threading.Thread(target=get, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print("\n".join(sorted(got)))
"#;

/// A container limited to half a CPU may have 2 TLS handshakes in progress at once
/// (`budget::Limits::for_cpus`); a client opening 12 HTTPS connections at once (a
/// package manager's parallel downloads) is within its rates, and each CONNECT past
/// the 2 waits for its place (`budget::HANDSHAKE_WAIT`) rather than being refused
/// `503 handshakes`: every request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_connects_from_a_half_cpu_container_wait_for_their_handshakes() {
    const N: usize = 12;
    let up = HttpsUpstream::start("127.0.0.2");
    let ca = PemFile::new(&up.ca_pem);
    let path = ca.0.clone();
    let f = fx(move |c| {
        c.egress.extra_ca_files = vec![path];
        c.substrate.limits.cpus = 0.5;
    })
    .await;
    let limits = stockade_egress::budget::Limits::for_cpus(0.5, 2);
    assert!(
        limits.handshakes < N && (2 * N) as f64 <= limits.handshake_burst,
        "more at once than the handshakes in progress, within the rate: {limits:?}"
    );
    let mut input = f.argv(&["python3", "-c", PARALLEL]);
    input.env.extend([
        ("BASE".to_string(), up.base()),
        ("N".to_string(), N.to_string()),
    ]);
    input.grant = Some(Grant {
        rules: vec![rule(&up.addr.to_string(), &["GET"], Some("/allowed/"))],
        ask: false,
    });
    let o = f.rt.exec("parallel", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "200\n".repeat(N),
        "stderr: {}",
        out(&o.stderr)
    );
    assert_eq!(up.seen().len(), N);
    f.finish().await;
}
