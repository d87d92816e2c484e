//! `stockade node` (docs/NODE.md) through the real binary on loopback, with
//! its own data directory and cgroup root, driven by a signing HTTPS client that pins
//! the certificate the node made (`<data_dir>/node/cert.pem`): authentication (401),
//! ownership (403), `run`'s NDJSON, grant leases, idempotent retries, the ticket gate.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::Signal;
use serde_json::{Value, json};
use stockade_node_protocol::auth;
use stockade_node_protocol::{IDEMPOTENCY_HEADER, PREFIX};
use stockade_runtime::config::Config;
use stockade_tests::{TempDir, require_root_and_cgroup_v2, stockade_exe};

/// A running `stockade node` on a free loopback port.
struct NodeProc {
    child: Child,
    addr: SocketAddr,
    dir: TempDir,
    cgroup_root: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl NodeProc {
    fn start(tweak: impl FnOnce(&mut Config)) -> NodeProc {
        let v2 = require_root_and_cgroup_v2();
        let dir = TempDir::new("node");
        let cgroup_root = v2.join(format!("stockade-node-t-{}", uuid::Uuid::new_v4().simple()));
        let mut cfg = Config::embedded();
        cfg.substrate.data_dir = dir.path().join("data");
        cfg.substrate.cgroup_root = cgroup_root.display().to_string();
        cfg.substrate.idle_timeout_ms = 0;
        cfg.substrate.warm = 0;
        cfg.egress.allow_private_targets = true;
        cfg.api.shutdown_deadline_ms = 2_000;
        cfg.node.listen = "127.0.0.1:0".into();
        cfg.node.name = "node-t".into();
        tweak(&mut cfg);
        let cfg_path = dir.path().join("wasmtime.toml");
        std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
        let mut child = Command::new(stockade_exe())
            .args(["node", "--config"])
            .arg(&cfg_path)
            .env_remove("STOCKADE_DATA_DIR")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn stockade node");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && let Some(rest) = line.split("serving on https://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                    sent = true;
                }
                eprintln!("[node] {line}");
                kept.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the node did not start within 60 s");
        NodeProc {
            child,
            addr: addr.parse().expect("the node's address"),
            dir,
            cgroup_root,
            log,
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn client(&self) -> NodeClient {
        NodeClient::new(
            self.addr,
            &self.data_dir().join("node/cert.pem"),
            &self.data_dir().join("node/secret"),
        )
    }

    fn logged(&self, what: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(what))
    }

    /// SIGTERM, the exit within a deadline, and no container cgroup left.
    fn stop(mut self) {
        let _ = stockade_tests::kill(self.child.id() as i32, Signal::TERM);
        let status = wait_exit(&mut self.child, Duration::from_secs(30));
        assert!(status.success(), "the node exited {status:?}");
        if let Ok(rd) = std::fs::read_dir(&self.cgroup_root) {
            let left: Vec<_> = rd
                .filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name())
                .collect();
            assert!(left.is_empty(), "container cgroups left behind: {left:?}");
        }
    }
}

impl Drop for NodeProc {
    /// Whatever a failed test left of this node's own: its process (by pid), its
    /// cgroup tree, its v1 limit directories, its containers' mounts.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = stockade_tests::kill(self.child.id() as i32, Signal::TERM);
            let end = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() {
                if Instant::now() > end {
                    let _ = stockade_tests::kill(self.child.id() as i32, Signal::KILL);
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        remove_cgroup_tree(&self.cgroup_root);
        use stockade_linux::{cgroup, limits};
        let plan = limits::Plan::detect(cgroup::detect_v2().as_deref());
        if let Some(name) = self.cgroup_root.file_name() {
            for parent in limits::v1_roots(&plan, &name.to_string_lossy()) {
                remove_cgroup_tree(&parent);
            }
        }
        for m in stockade_tests::mounts_under(&self.data_dir()).iter().rev() {
            let _ = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH);
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let _ = std::fs::remove_dir(dir);
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            Instant::now() < end,
            "the node did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One request as sent: every signed field can be set (or broken) by the test.
#[derive(Clone)]
struct Req {
    call: String,
    key: String,
    body: Vec<u8>,
    idempotency: String,
    time_ms: u64,
    nonce: String,
    /// Sign with this secret instead of the node's.
    secret: Option<Vec<u8>>,
    /// Sign this key instead of the one sent.
    sign_key: Option<String>,
    /// Sign this body instead of the one sent.
    sign_body: Option<Vec<u8>>,
    /// Send no signature header.
    no_signature: bool,
}

/// A signing HTTPS client that trusts exactly the node's certificate.
struct NodeClient {
    addr: SocketAddr,
    secret: Vec<u8>,
    tls: Arc<rustls::ClientConfig>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

impl NodeClient {
    fn new(addr: SocketAddr, cert: &Path, secret: &Path) -> NodeClient {
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::CertificateDer::from_pem_file(cert).unwrap();
        let secret = std::fs::read_to_string(secret)
            .unwrap()
            .trim()
            .as_bytes()
            .to_vec();
        // The front's own pinning (only this certificate, signatures checked).
        let tls = stockade_remote::client::pinned_config(der).unwrap();
        NodeClient {
            addr,
            secret,
            tls: Arc::new(tls),
        }
    }

    fn req(&self, call: &str, key: &str, body: &Value) -> Req {
        Req {
            call: call.into(),
            key: key.into(),
            body: serde_json::to_vec(body).unwrap(),
            idempotency: String::new(),
            time_ms: now_ms(),
            nonce: auth::nonce(),
            secret: None,
            sign_key: None,
            sign_body: None,
            no_signature: false,
        }
    }

    /// Send `r` as it is: (status, de-chunked body).
    fn send(&self, r: &Req) -> (u16, Vec<u8>) {
        let mut raw = self.head(r, r.body.len());
        raw.extend_from_slice(&r.body);
        let mut tls = self.connect();
        tls.write_all(&raw).unwrap();
        tls.flush().unwrap();
        let mut out = Vec::new();
        match tls.read_to_end(&mut out) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
            Err(e) => panic!("reading the answer: {e}"),
        }
        stockade_tests::nodes::parse_response(&out).unwrap()
    }

    /// A TLS connection to the node.
    fn connect(&self) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        let tcp = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(3)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let name = rustls_pki_types::ServerName::try_from("stockade-node").unwrap();
        let conn = rustls::ClientConnection::new(self.tls.clone(), name).unwrap();
        rustls::StreamOwned::new(conn, tcp)
    }

    /// `r`'s request line and headers, declaring a body of `content_length` bytes.
    fn head(&self, r: &Req, content_length: usize) -> Vec<u8> {
        let path = format!("{PREFIX}{}", r.call);
        let sig = auth::Signed {
            time_ms: r.time_ms,
            nonce: &r.nonce,
            method: "POST",
            path: &path,
            key: r.sign_key.as_deref().unwrap_or(&r.key),
            idempotency: &r.idempotency,
            body: r.sign_body.as_deref().unwrap_or(&r.body),
        }
        .sign(r.secret.as_deref().unwrap_or(&self.secret));
        let mut raw = format!(
            "POST {path} HTTP/1.1\r\nhost: stockade-node\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}: {}\r\n{}: {}\r\n{}: {}\r\n",
            content_length,
            auth::TIME_HEADER,
            r.time_ms,
            auth::NONCE_HEADER,
            r.nonce,
            auth::KEY_HEADER,
            r.key,
        );
        if !r.no_signature {
            raw.push_str(&format!("{}: {sig}\r\n", auth::SIGNATURE_HEADER));
        }
        if !r.idempotency.is_empty() {
            raw.push_str(&format!("{IDEMPOTENCY_HEADER}: {}\r\n", r.idempotency));
        }
        raw.push_str("\r\n");
        raw.into_bytes()
    }

    /// A fresh, correctly signed call: (status, its JSON).
    fn call(&self, call: &str, key: &str, body: Value) -> (u16, Value) {
        let (s, b) = self.send(&self.req(call, key, &body));
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// The `ok` of a call that must succeed.
    fn ok(&self, call: &str, key: &str, body: Value) -> Value {
        let (s, v) = self.call(call, key, body);
        assert_eq!(s, 200, "{call}: {v}");
        v.get("ok")
            .cloned()
            .unwrap_or_else(|| panic!("{call}: {v}"))
    }

    /// `run`'s NDJSON lines.
    fn run_lines(&self, r: &Req) -> (u16, Vec<Value>) {
        let (s, b) = self.send(r);
        let lines = String::from_utf8_lossy(&b)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect();
        (s, lines)
    }
}

fn sh(script: &str) -> Value {
    json!({"argv": ["/bin/sh", "-c", script], "cwd": "/workspace", "env": [], "stdin": ""})
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The node process's resident set, in bytes (`VmRSS` of /proc/PID/status).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// What became of a request whose body was sent but for its last byte.
#[derive(Debug, PartialEq)]
enum Held {
    /// The node answered (this status) without waiting for the rest.
    Answered(u16),
    /// The connection was cut before an answer could be read.
    Cut,
    /// No answer: the node is reading (holding) the body.
    Reading,
}

/// `n` connections, each sending `r`'s head declaring `declared` bytes and all but the
/// last byte of them; each then waits up to `wait` for an answer. The streams stay open
/// (the node keeps what it read) until the returned sender is dropped; the receiver
/// gives each one's outcome once its bytes are sent and its wait is over.
fn hold_bodies(
    c: &NodeClient,
    reqs: Vec<Req>,
    declared: usize,
    wait: Duration,
) -> (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<Held>) {
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    let (out_tx, out_rx) = std::sync::mpsc::channel();
    for r in reqs {
        let head = c.head(&r, declared);
        let mut tls = c.connect();
        let (out_tx, release_rx) = (out_tx.clone(), release_rx.clone());
        std::thread::spawn(move || {
            tls.sock
                .set_write_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            tls.sock.set_read_timeout(Some(wait)).unwrap();
            let chunk = vec![b' '; 1 << 20];
            let mut left = declared - 1;
            let mut sent = tls.write_all(&head).is_ok();
            while sent && left > 0 {
                let n = left.min(chunk.len());
                sent = tls
                    .write_all(&chunk[..n])
                    .and_then(|()| tls.flush())
                    .is_ok();
                left -= n;
            }
            let mut out = Vec::new();
            let held = match tls.read_to_end(&mut out) {
                _ if !out.is_empty() => stockade_tests::nodes::parse_response(&out)
                    .map(|(s, _)| Held::Answered(s))
                    .unwrap_or(Held::Cut),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    Held::Reading
                }
                _ => Held::Cut,
            };
            let _ = out_tx.send(held);
            // Hold the connection (and what the node read of it) until released.
            let _ = release_rx.lock().unwrap().recv();
            drop(tls);
        });
    }
    (release_tx, out_rx)
}

#[test]
fn attack_unsigned_and_forged_bodies_are_not_buffered_before_authentication() {
    const DECLARED: usize = 23 << 20;
    const UNSIGNED: usize = 24;
    const FORGED: usize = 10;
    const UNVERIFIED_BODIES: usize = 4;
    let node = NodeProc::start(|_| {});
    let c = node.client();
    let pid = node.child.id();
    c.ok("ensure", "alpha", json!({}));
    let before = rss(pid);

    // Unsigned (no signature header): refused from the headers, the bodies unread.
    let unsigned: Vec<Req> = (0..UNSIGNED)
        .map(|_| Req {
            no_signature: true,
            ..c.req("ensure", "alpha", &json!({}))
        })
        .collect();
    let (release_unsigned, outcomes) = hold_bodies(&c, unsigned, DECLARED, Duration::from_secs(5));
    let unsigned: Vec<Held> = (0..UNSIGNED)
        .map(|_| outcomes.recv_timeout(Duration::from_secs(120)).unwrap())
        .collect();
    let grown = rss(pid).saturating_sub(before);
    eprintln!("unsigned: {unsigned:?}; the node grew {} MiB", grown >> 20);
    assert!(
        grown < 48 << 20,
        "{UNSIGNED} unsigned {DECLARED}-byte bodies held open grew the node by {} MiB",
        grown >> 20
    );
    assert!(
        unsigned.iter().all(|h| *h != Held::Reading),
        "an unsigned request's body was read: {unsigned:?}"
    );
    // A signed request is served meanwhile.
    c.ok("ensure", "alpha", json!({}));

    // Forged (well-formed, in time, fresh nonce, another secret's signature): the
    // signature covers the body, so some are read, but never more than the bound;
    // past it, 503 at once.
    let forged: Vec<Req> = (0..FORGED)
        .map(|_| Req {
            secret: Some(b"not the node's secret, not the node's secret".to_vec()),
            ..c.req("ensure", "alpha", &json!({}))
        })
        .collect();
    let (release_forged, outcomes) = hold_bodies(&c, forged, DECLARED, Duration::from_secs(5));
    let forged: Vec<Held> = (0..FORGED)
        .map(|_| outcomes.recv_timeout(Duration::from_secs(120)).unwrap())
        .collect();
    let grown = rss(pid).saturating_sub(before);
    eprintln!("forged: {forged:?}; the node grew {} MiB", grown >> 20);
    let reading = forged.iter().filter(|h| **h == Held::Reading).count();
    assert!(
        reading <= UNVERIFIED_BODIES,
        "{reading} forged bodies read at once: {forged:?}"
    );
    assert!(
        grown < ((UNVERIFIED_BODIES * DECLARED) as u64) + (48 << 20),
        "{FORGED} forged bodies grew the node by {} MiB",
        grown >> 20
    );
    assert!(
        node.logged("bodies not yet verified are being read"),
        "the bound's refusal is logged"
    );
    c.ok("ensure", "alpha", json!({}));
    drop(release_unsigned);
    drop(release_forged);
    node.stop();
}

#[test]
fn a_replayed_expired_or_missigned_request_is_401_and_changes_nothing() {
    let node = NodeProc::start(|_| {});
    let c = node.client();
    // A good request works once; the same bytes again are a replay.
    let first = c.req("ensure", "alpha", &json!({}));
    let (s, _) = c.send(&first);
    assert_eq!(s, 200);
    let (s, body) = c.send(&first);
    assert_eq!(s, 401, "a replay: {}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(v.get("error").is_some(), "an error body: {v}");
    // Each of these would make beta a container: none is made.
    let fresh = || c.req("ensure", "beta", &json!({}));
    let mut expired = fresh();
    expired.time_ms -= 31_000;
    let mut future = fresh();
    future.time_ms += 31_000;
    let mut missigned = fresh();
    missigned.secret = Some(b"not the node's secret, not the node's secret".to_vec());
    let mut other_key = fresh();
    other_key.sign_key = Some("alpha".into());
    let mut other_body = fresh();
    other_body.sign_body = Some(b"{\"x\":1}".to_vec());
    let mut no_signature = fresh();
    no_signature.no_signature = true;
    for (what, r) in [
        ("expired", expired),
        ("from the future", future),
        ("mis-signed", missigned),
        ("signed for another key", other_key),
        ("signed over another body", other_body),
        ("unsigned", no_signature),
    ] {
        let (s, b) = c.send(&r);
        assert_eq!(s, 401, "{what}: {}", String::from_utf8_lossy(&b));
    }
    assert_eq!(
        c.ok("current", "beta", json!({})),
        Value::Null,
        "nothing made for beta"
    );
    assert!(
        node.logged("request refused"),
        "a canonical line per refusal"
    );
    node.stop();
}

#[test]
fn a_container_named_by_another_key_is_403() {
    let node = NodeProc::start(|_| {});
    let c = node.client();
    let mine = c.ok("ensure", "alpha", json!({}));
    let mine = mine.as_str().unwrap().to_owned();
    for (call, body) in [
        ("kill-all", json!({"container": mine})),
        ("stop", json!({"container": mine})),
        ("list-processes", json!({"container": mine})),
        (
            "start-process",
            json!({"container": mine, "cmd": sh("true")}),
        ),
        (
            "run",
            json!({"container": mine, "cmd": sh("true"), "timeout_ms": 5000}),
        ),
    ] {
        let (s, v) = c.call(call, "beta", body);
        assert_eq!(s, 403, "{call} by another key: {v}");
    }
    // A container no key was answered: refused too.
    let (s, _) = c.call("stop", "alpha", json!({"container": "not-a-container"}));
    assert_eq!(s, 403);
    // Nothing happened to it: its owner still has it, and may stop it.
    assert_eq!(c.ok("current", "alpha", json!({})), json!(mine));
    assert_eq!(
        c.ok("stop", "alpha", json!({"container": mine})),
        Value::Null
    );
    node.stop();
}

#[test]
fn run_streams_output_and_heartbeats_then_its_result() {
    let node = NodeProc::start(|cfg| cfg.node.heartbeat_ms = 200);
    let c = node.client();
    let id = c.ok("ensure", "alpha", json!({}));
    let r = c.req(
        "run",
        "alpha",
        &json!({"container": id, "cmd": sh("echo one; sleep 1; echo two >&2; sleep 1; exit 3"), "timeout_ms": 30000}),
    );
    let (s, lines) = c.run_lines(&r);
    assert_eq!(s, 200);
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| l.as_object().unwrap().keys().next().unwrap().as_str())
        .collect();
    let at = |k: &str| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("no {k}: {kinds:?}"))
    };
    assert_eq!(
        lines[at("stdout")]["stdout"],
        json!(b64("one\n")),
        "{lines:?}"
    );
    assert_eq!(
        lines[at("stderr")]["stderr"],
        json!(b64("two\n")),
        "{lines:?}"
    );
    assert!(at("stdout") < at("stderr"), "{kinds:?}");
    // Heartbeats while nothing else was sent: between the two outputs, and after.
    let beats_between = kinds[at("stdout")..at("stderr")]
        .iter()
        .filter(|k| **k == "heartbeat")
        .count();
    assert!(
        beats_between >= 2,
        "heartbeats between the outputs: {kinds:?}"
    );
    assert_eq!(*kinds.last().unwrap(), "result", "{kinds:?}");
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "result" || **k == "error")
            .count(),
        1
    );
    let result = &lines.last().unwrap()["result"];
    assert_eq!(result["exit_code"], json!(3), "{result}");
    assert_eq!(result["timed_out"], json!(false));
    assert_eq!(result["stdout"], json!(""), "the output went in the lines");
    node.stop();
}

#[test]
fn an_unrevoked_grant_is_closed_by_its_lease_after_a_kill_all() {
    let node = NodeProc::start(|cfg| cfg.node.lease_grace_ms = 1_500);
    let c = node.client();
    let id = c.ok("ensure", "alpha", json!({}));
    let pid = c.ok(
        "start-process",
        "alpha",
        json!({"container": id, "cmd": sh("sleep 600")}),
    );
    let rules = json!([{"host": "example.com"}]);
    let applied = Instant::now();
    c.ok(
        "apply-grant",
        "alpha",
        json!({"container": id, "fence": uuid::Uuid::new_v4().to_string(), "rules": rules}),
    );
    assert_eq!(c.ok("open-grants", "", json!({})), json!([id]));
    // The front "dies": nobody revokes. The node does, within the lease.
    let end = Instant::now() + Duration::from_secs(20);
    while c.ok("open-grants", "", json!({})) != json!([]) {
        assert!(
            Instant::now() < end,
            "the grant is still open past its lease"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        applied.elapsed() >= Duration::from_millis(1_500),
        "not before the grace"
    );
    let st = c.ok(
        "process-status",
        "alpha",
        json!({"container": id, "id": pid}),
    );
    assert!(
        st.is_null() || st["running"] == json!(false),
        "the started process was killed first: {st}"
    );
    assert!(node.logged("lease expired"), "its canonical line");
    node.stop();
}

#[test]
fn a_retried_call_with_its_idempotency_key_gets_the_first_answer() {
    let node = NodeProc::start(|_| {});
    let c = node.client();
    let id = c.ok("ensure", "alpha", json!({}));
    // A start-process retried (a new nonce, the same idempotency key): one process.
    let mut start = c.req(
        "start-process",
        "alpha",
        &json!({"container": id, "cmd": sh("sleep 600")}),
    );
    start.idempotency = "start-1".into();
    let (s1, a1) = c.send(&start);
    start.nonce = auth::nonce();
    start.time_ms = now_ms();
    let (s2, a2) = c.send(&start);
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(a1, a2, "the first answer");
    let listed = c.ok("list-processes", "alpha", json!({"container": id}));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // A run retried while it is going, and after: it ran once, both got its result.
    let mut run = c.req(
        "run",
        "alpha",
        &json!({"container": id, "cmd": sh("sleep 1; echo x >> /workspace/ran; exit 7"), "timeout_ms": 30000}),
    );
    run.idempotency = "run-1".into();
    let retry = {
        let mut r = run.clone();
        r.nonce = auth::nonce();
        r
    };
    let c2 = node.client();
    let first = std::thread::spawn(move || c2.run_lines(&run));
    let (s, second) = c.run_lines(&retry);
    let (s0, first) = first.join().unwrap();
    assert_eq!((s0, s), (200, 200));
    for lines in [&first, &second] {
        assert_eq!(
            lines.last().unwrap()["result"]["exit_code"],
            json!(7),
            "{lines:?}"
        );
    }
    let mut later = retry.clone();
    later.nonce = auth::nonce();
    later.time_ms = now_ms();
    let (_, third) = c.run_lines(&later);
    assert_eq!(
        third.last().unwrap()["result"]["exit_code"],
        json!(7),
        "{third:?}"
    );
    let count = c.req(
        "run",
        "alpha",
        &json!({"container": id, "cmd": sh("wc -l < /workspace/ran"), "timeout_ms": 30000}),
    );
    let (_, lines) = c.run_lines(&count);
    assert_eq!(
        lines[0]["stdout"],
        json!(b64("1\n")),
        "it ran once: {lines:?}"
    );
    node.stop();
}

#[test]
fn ensure_answers_over_capacity_when_the_gate_is_full() {
    let node = NodeProc::start(|cfg| {
        cfg.substrate.ceiling = 1;
        cfg.substrate.warm = 0;
    });
    let c = node.client();
    let a = c.ok("ensure", "alpha", json!({}));
    let (s, v) = c.call("ensure", "beta", json!({}));
    assert_eq!(s, 200, "a substrate error is an answer");
    assert_eq!(v["error"]["kind"], json!("over-capacity"), "{v}");
    let h = c.ok("health", "", json!({}));
    assert_eq!(
        (h["live"].clone(), h["ceiling"].clone()),
        (json!(1), json!(1)),
        "{h}"
    );
    assert_eq!(h["node"], json!("node-t"));
    // A freed ticket admits the next key.
    c.ok("stop", "alpha", json!({"container": a}));
    assert!(c.ok("ensure", "beta", json!({})).is_string());
    node.stop();
}

/// One HTTP request a test's front received: (path, lower-case headers, body).
type Received = (String, Vec<(String, String)>, Vec<u8>);

/// A front that answers 204 to each request and hands it to the test.
fn fake_front() -> (SocketAddr, std::sync::mpsc::Receiver<Received>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some((k, v)) = h.trim_end().split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                }
            }
            let len = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let _ = conn.write_all(
                b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
            if tx.send((path, headers, body)).is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

#[test]
fn a_container_that_stops_on_its_own_is_told_to_the_front_signed() {
    let (front, received) = fake_front();
    let node = NodeProc::start(|cfg| cfg.node.front_url = format!("http://{front}"));
    let c = node.client();
    let id = c.ok("ensure", "alpha", json!({}));
    let id = id.as_str().unwrap().to_owned();
    // Killed from outside (not asked to stop): every process of its cgroup.
    std::fs::write(node.cgroup_root.join(&id).join("cgroup.kill"), "1").unwrap();
    let (path, headers, body) = received
        .recv_timeout(Duration::from_secs(30))
        .expect("the front was told within 30 s");
    assert_eq!(path, "/v1/nodes/events");
    let h = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {k}: {headers:?}"))
    };
    assert_eq!(h(auth::NODE_HEADER), "node-t");
    assert_eq!(
        h(auth::KEY_HEADER),
        "alpha",
        "signed with the container's key"
    );
    let event: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(event, json!({"node": "node-t", "stopped": id}));
    let (time, nonce, sig) = (
        h(auth::TIME_HEADER),
        h(auth::NONCE_HEADER),
        h(auth::SIGNATURE_HEADER),
    );
    let signed = auth::Signed {
        time_ms: time.parse().unwrap(),
        nonce: &nonce,
        method: "POST",
        path: &path,
        key: "alpha",
        idempotency: "",
        body: &body,
    };
    assert_eq!(
        auth::verify(&signed, &sig, &c.secret, now_ms()),
        Ok(()),
        "signed with the node's secret"
    );
    assert_eq!(c.ok("current", "alpha", json!({})), Value::Null);
    node.stop();
}
