//! `/mcp` (MCP over Streamable HTTP) on a real `stockade serve`:
//! * the MCP Python SDK's streamable HTTP client drives it (`tests/mcp/drive_http.py`:
//!   initialize, tools/list, an exec whose output arrives as progress, errors);
//! * the official conformance suite (`@modelcontextprotocol/conformance`, pinned,
//!   installed by `scripts/setup` under `target/`) runs its server scenarios, with
//!   `tests/mcp/conformance-expected-failures.yml` (each row says why);
//! * attacks: no token, the approver's, a wrong one, a foreign Origin, a forged or
//!   ended session id, a session presented with another token, a wrong revision, a
//!   batch: each refused with its status, and no command ran;
//! * a flood of `initialize` calls keeps the session table bounded;
//! * a caller that disconnects mid-exec, or cancels it, ends the command.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::Server;

/// One raw HTTP/1.1 request with extra headers; (status, headers lowercased, body).
pub(crate) fn call(
    addr: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Vec<(String, String)>, String) {
    let body = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(body).unwrap()
    };
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} /mcp HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// Is `line` the canonical line of a fence of `key`? `stockade serve` logs it through
/// tracing (`key=K`), the edge Worker as a JSON line (`"key":"K"`).
fn fence_line_of(line: &str, key: &str) -> bool {
    line.contains("CANONICAL-FENCE")
        && (line.contains(&format!("key={key}")) || line.contains(&format!("\"key\":\"{key}\"")))
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// (what, method, headers, body, status)
type Row<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, Value, u16);

pub(crate) const ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");
pub(crate) const JSON: (&str, &str) = ("content-type", "application/json");

fn initialize() -> Value {
    json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "e2e", "version": "0" } } })
}

/// A session opened with `token`: its id.
pub(crate) fn open_session(addr: &str, token: &str) -> String {
    let auth = format!("Bearer {token}");
    let (status, h, body) = call(
        addr,
        "POST",
        &[ACCEPT, JSON, ("authorization", &auth)],
        &initialize(),
    );
    assert_eq!(status, 200, "initialize: {body}");
    header(&h, "mcp-session-id")
        .expect("initialize answers a session id")
        .to_string()
}

/// A `tools/call` of exec that would leave a mark in `/workspace` if it ran.
fn mark(n: usize) -> Value {
    json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "exec",
        "arguments": { "key": "mcp-attack", "argv": ["touch", format!("/workspace/pwned-{n}")] } } })
}

fn python() -> String {
    std::env::var("STOCKADE_PYTHON").unwrap_or_else(|_| {
        panic!(
            "STOCKADE_PYTHON is not set: run `bash scripts/test` (it installs the MCP Python SDK into a venv), or set it to a python with `pip install mcp`"
        )
    })
}

#[test]
fn a_real_mcp_client_drives_mcp_over_streamable_http() {
    let s = Server::start();
    let drive = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/drive_http.py");
    let out = std::process::Command::new(python())
        .arg(&drive)
        .arg(format!("http://{}/mcp", s.addr))
        .arg(s.token())
        .output()
        .expect("run the MCP client");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the MCP client failed:\n{text}");
    assert!(text.contains("mcp-http: all checks passed"), "{text}");
    s.stop();
}

#[test]
fn mcp_over_http_refuses_every_forgery_and_runs_nothing() {
    let s = Server::start();
    let a = s.addr.clone();
    let (token, approver) = (s.token(), s.approver_token());
    let (auth, wrong, appr) = (
        format!("Bearer {token}"),
        format!("Bearer {token}x"),
        format!("Bearer {approver}"),
    );
    let sid = open_session(&a, &token);
    assert_eq!(sid.len(), 64, "two UUIDv4s: {sid}");
    assert!(sid.bytes().all(|b| b.is_ascii_hexdigit()), "{sid}");
    let other = open_session(&a, &token);
    assert_ne!(sid, other, "every session id is new");
    let forged = format!(
        "{}{}",
        &sid[..63],
        if sid.ends_with('0') { "1" } else { "0" }
    );
    let ended = open_session(&a, &token);
    let (st, _, _) = call(
        &a,
        "DELETE",
        &[("authorization", &auth), ("mcp-session-id", &ended)],
        &Value::Null,
    );
    assert_eq!(st, 204, "DELETE ends a session");
    let port = a.rsplit(':').next().unwrap();
    let evil = format!("http://evil.example:{port}");
    let own = format!("http://localhost:{port}");
    let batch = json!([mark(90), mark(91)]);
    let rows: Vec<Row> = vec![
        (
            "no token",
            "POST",
            vec![ACCEPT, JSON, ("mcp-session-id", &sid)],
            mark(1),
            401,
        ),
        (
            "a wrong token",
            "POST",
            vec![
                ACCEPT,
                JSON,
                ("authorization", &wrong),
                ("mcp-session-id", &sid),
            ],
            mark(2),
            401,
        ),
        (
            "the approver's token, with a live session (another token's)",
            "POST",
            vec![
                ACCEPT,
                JSON,
                ("authorization", &appr),
                ("mcp-session-id", &sid),
            ],
            mark(3),
            401,
        ),
        (
            "the approver's token opening a session",
            "POST",
            vec![ACCEPT, JSON, ("authorization", &appr)],
            initialize(),
            401,
        ),
        (
            "a foreign Origin (DNS rebinding)",
            "POST",
            vec![
                ACCEPT,
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", &sid),
                ("origin", &evil),
            ],
            mark(4),
            403,
        ),
        (
            "a foreign Origin opening a session",
            "POST",
            vec![ACCEPT, JSON, ("authorization", &auth), ("origin", &evil)],
            initialize(),
            403,
        ),
        (
            "the null Origin",
            "POST",
            vec![
                ACCEPT,
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", &sid),
                ("origin", "null"),
            ],
            mark(5),
            403,
        ),
        (
            "no session id",
            "POST",
            vec![ACCEPT, JSON, ("authorization", &auth)],
            mark(6),
            400,
        ),
        (
            "a forged session id (one digit off)",
            "POST",
            vec![
                ACCEPT,
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", &forged),
            ],
            mark(7),
            404,
        ),
        (
            "an ended session",
            "POST",
            vec![
                ACCEPT,
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", &ended),
            ],
            mark(8),
            404,
        ),
        (
            "an unknown revision",
            "POST",
            vec![
                ACCEPT,
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", &sid),
                ("mcp-protocol-version", "1999-01-01"),
            ],
            mark(10),
            400,
        ),
        (
            "a batch",
            "POST",
            vec![
                ACCEPT,
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", &sid),
            ],
            batch,
            400,
        ),
        (
            "no Accept of both answers",
            "POST",
            vec![
                ("accept", "application/json"),
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", &sid),
            ],
            mark(11),
            406,
        ),
        (
            "not JSON",
            "POST",
            vec![
                ACCEPT,
                ("content-type", "text/plain"),
                ("authorization", &auth),
                ("mcp-session-id", &sid),
            ],
            mark(12),
            415,
        ),
        (
            "GET: no server stream is offered",
            "GET",
            vec![
                ("accept", "text/event-stream"),
                ("authorization", &auth),
                ("mcp-session-id", &sid),
            ],
            Value::Null,
            405,
        ),
        (
            "GET without a token",
            "GET",
            vec![("accept", "text/event-stream")],
            Value::Null,
            401,
        ),
        (
            "DELETE of a forged session",
            "DELETE",
            vec![("authorization", &auth), ("mcp-session-id", &forged)],
            Value::Null,
            404,
        ),
        (
            "DELETE of a live session with the approver's token",
            "DELETE",
            vec![("authorization", &appr), ("mcp-session-id", &sid)],
            Value::Null,
            401,
        ),
    ];
    for (what, method, headers, body, want) in &rows {
        let (st, h, text) = call(&a, method, headers, body);
        assert_eq!(st, *want, "{what}: {text}");
        if *want == 401 {
            assert_eq!(header(&h, "www-authenticate"), Some("Bearer"), "{what}");
        }
    }
    // The live sessions survived every attempt on them, and this server's own origin
    // is accepted: the session still runs a command.
    let ls = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "exec", "arguments": { "key": "mcp-attack", "argv": ["ls", "-a", "/workspace"] } } });
    let (st, _, text) = call(
        &a,
        "POST",
        &[
            ACCEPT,
            JSON,
            ("authorization", &auth),
            ("mcp-session-id", &sid),
            ("origin", &own),
            ("mcp-protocol-version", "2025-11-25"),
        ],
        &ls,
    );
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("a JSON answer");
    let listing = v["result"]["structuredContent"]["stdout"]
        .as_str()
        .unwrap_or_default();
    assert!(listing.contains(".."), "the listing ran: {v}");
    assert!(
        !listing.contains("pwned"),
        "a refused call ran a command: {listing}"
    );
    let (st, _, _) = call(
        &a,
        "POST",
        &[
            ACCEPT,
            JSON,
            ("authorization", &auth),
            ("mcp-session-id", &other),
        ],
        &json!({ "jsonrpc": "2.0", "id": 4, "method": "ping" }),
    );
    assert_eq!(st, 200, "the other session lives too");
    s.stop();
}

#[test]
fn a_flood_of_initialize_calls_keeps_the_sessions_bounded() {
    let s = Server::start();
    let (a, token) = (s.addr.clone(), s.token());
    let auth = format!("Bearer {token}");
    let max = stockade_host::mcp::session::MAX_SESSIONS;
    let rss = || {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let first = open_session(&a, &token);
    let started = std::time::Instant::now();
    for _ in 0..max + 50 {
        open_session(&a, &token);
    }
    let full = rss();
    // Ten times the bound more: the table holds no more, and neither should the process.
    for _ in 0..max * 10 {
        open_session(&a, &token);
    }
    let last = open_session(&a, &token);
    eprintln!(
        "mcp flood: {} initialize calls in {:?}; server RSS {full} at the bound, {} after {} more",
        max * 11 + 52,
        started.elapsed(),
        rss(),
        max * 10 + 1
    );
    let ping = json!({ "jsonrpc": "2.0", "id": 9, "method": "ping" });
    let alive = |sid: &str| {
        call(
            &a,
            "POST",
            &[
                ACCEPT,
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", sid),
            ],
            &ping,
        )
        .0
    };
    assert_eq!(alive(&last), 200, "the newest session works");
    assert_eq!(
        alive(&first),
        404,
        "past {max} sessions the least recently used is gone: the table does not grow"
    );
    s.stop();
}

/// A front that adds the consumer's bearer token to every request it forwards to
/// `/mcp`: the conformance suite's client has no way to send one. Streams both ways
/// (SSE passes as it arrives). Runs until the test's runtime is dropped.
fn token_adding_front(
    rt: &tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    server: String,
    token: String,
) {
    use axum::body::Body;
    use axum::extract::Request;
    listener.set_nonblocking(true).unwrap();
    let listener = {
        let _in = rt.enter();
        tokio::net::TcpListener::from_std(listener).expect("the front's listener")
    };
    let forward = move |mut req: Request| {
        let (server, token) = (server.clone(), token.clone());
        async move {
            req.headers_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("a header value"),
            );
            let tcp = tokio::net::TcpStream::connect(&server)
                .await
                .expect("connect");
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .expect("handshake");
            tokio::spawn(conn);
            let resp = send.send_request(req).await.expect("forward");
            resp.map(Body::new)
        }
    };
    let app = axum::Router::new().fallback(forward);
    rt.spawn(async move { axum::serve(listener, app).await });
}

/// Every check that did not pass, one line each (scenario: id: status: why), from the
/// results the suite saved under `dir`.
fn failed_checks(dir: &Path) -> String {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let scenario = entry.file_name().to_string_lossy().to_string();
        let Ok(text) = std::fs::read_to_string(entry.path().join("checks.json")) else {
            continue;
        };
        let checks: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        for c in checks.as_array().into_iter().flatten() {
            if c["status"] == "FAILURE" || c["status"] == "WARNING" {
                lines.push(format!(
                    "{scenario}: {}: {}: {}",
                    c["id"], c["status"], c["errorMessage"]
                ));
            }
        }
    }
    lines.sort();
    lines.join("\n")
}

/// The conformance package's entry point, and a Node new enough to run it.
fn conformance() -> (String, String) {
    let node = std::env::var("STOCKADE_NODE").unwrap_or_else(|_| {
        panic!("STOCKADE_NODE is not set: run `bash scripts/test` (scripts/setup installs a Node >= 22 for the MCP conformance suite)")
    });
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-conformance");
    let entry = root.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        entry.exists(),
        "{} is missing: run `bash scripts/setup` (it installs @modelcontextprotocol/conformance)",
        entry.display()
    );
    (node, entry.display().to_string())
}

#[test]
fn the_mcp_conformance_suite_passes_but_for_features_stockade_does_not_offer() {
    let (node, entry) = conformance();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The front's origin is configured, as an operator would for a front of theirs.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let front = listener.local_addr().unwrap().to_string();
    let origin = format!("http://{front}");
    let s = Server::start_with(|c| c.api.mcp_origins = vec![origin]);
    token_adding_front(&rt, listener, s.addr.clone(), s.token());
    let expected =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/conformance-expected-failures.yml");
    let out_dir = s.dir.path().join("conformance");
    let out = std::process::Command::new(&node)
        .arg(&entry)
        .args(["server", "--url", &format!("http://{front}/mcp")])
        .arg("--expected-failures")
        .arg(&expected)
        .arg("-o")
        .arg(&out_dir)
        .output()
        .expect("run the conformance suite");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(
        out.status.success() && text.contains("all failures are expected"),
        "the conformance suite failed:\n{text}\nfailed checks:\n{}",
        failed_checks(&out_dir)
    );
    drop(rt);
    s.stop();
}

#[test]
fn a_caller_that_disconnects_mid_exec_ends_the_command() {
    let s = Server::start();
    let (a, token) = (s.addr.clone(), s.token());
    let sid = open_session(&a, &token);
    let call = json!({ "jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "_meta": { "progressToken": "p" }, "name": "exec",
        "arguments": { "key": "mcp-gone", "argv": ["sh", "-c", "echo started; sleep 60"] } } });
    let body = serde_json::to_vec(&call).unwrap();
    let mut c = std::net::TcpStream::connect(&a).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {a}\r\naccept: application/json, text/event-stream\r\ncontent-type: application/json\r\nauthorization: Bearer {token}\r\nmcp-session-id: {sid}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&body).unwrap();
    // Read until the command's first output arrives as progress: it runs, mid-fence.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("notifications/progress") {
        let n = c.read(&mut buf).expect("the stream");
        assert!(
            n > 0,
            "the stream ended: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(text.contains("text/event-stream"), "{text}");
    assert!(text.contains("started"), "{text}");
    let dropped = std::time::Instant::now();
    drop(c);
    // The fence ends (its canonical line) long before the command's 60 s would.
    let deadline = dropped + Duration::from_secs(15);
    loop {
        let ended = s
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| fence_line_of(l, "mcp-gone"));
        if ended {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned exec still runs 15 s after its caller left"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "mcp disconnect: the fence ended {:?} after the caller left",
        dropped.elapsed()
    );
    s.stop();
}

#[test]
fn a_cancelled_exec_ends_its_command_and_its_stream() {
    let s = Server::start();
    let (a, token) = (s.addr.clone(), s.token());
    let auth = format!("Bearer {token}");
    let sid = open_session(&a, &token);
    let exec = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "_meta": { "progressToken": 1 }, "name": "exec",
        "arguments": { "key": "mcp-cancel", "argv": ["sh", "-c", "echo started; sleep 60"] } } });
    let body = serde_json::to_vec(&exec).unwrap();
    let mut c = std::net::TcpStream::connect(&a).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {a}\r\nconnection: close\r\naccept: application/json, text/event-stream\r\ncontent-type: application/json\r\nauthorization: Bearer {token}\r\nmcp-session-id: {sid}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&body).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("started") {
        let n = c.read(&mut buf).expect("the stream");
        assert!(
            n > 0,
            "the stream ended: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    // Another session's cancellation of the same id is no cancellation.
    let other = open_session(&a, &token);
    let cancel = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": { "requestId": 7, "reason": "the user pressed Esc" } });
    let with = |sid: &str| {
        call(
            &a,
            "POST",
            &[
                ACCEPT,
                JSON,
                ("authorization", &auth),
                ("mcp-session-id", sid),
            ],
            &cancel,
        )
        .0
    };
    assert_eq!(with(&other), 202);
    let asked = std::time::Instant::now();
    assert_eq!(with(&sid), 202);
    // The stream ends (its last event the cancellation answer), long before 60 s.
    let _ = c.read_to_end(&mut seen);
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(
        asked.elapsed() < Duration::from_secs(15),
        "the stream ran on after the cancellation"
    );
    assert!(text.contains("-32800"), "{text}");
    // And the fence ended: its canonical line.
    let deadline = asked + Duration::from_secs(15);
    while !s
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| fence_line_of(l, "mcp-cancel"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the cancelled exec's fence never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "mcp cancel: the stream and the fence ended {:?} after the cancellation",
        asked.elapsed()
    );
    s.stop();
}
