//! `stockade serve --mock` (docs/MOCK.md): the whole API over the mock substrate, with
//! the same guest deciding; scripted outcomes, faults on demand and each key's trace
//! through the mock-only routes; and those routes absent from a normal server.
//! These tests start their own `stockade serve --mock` (no root, no containers) and never
//! use the front: they run once, with front (a) (the skip files list them); the test that
//! the routes are absent elsewhere runs on every front.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::{Value, json};
use stockade_tests::{TempDir, http, stockade_exe};

const DEADLINE: Duration = Duration::from_secs(20);

/// A running `stockade serve --mock` on a free loopback port, in its own data dir.
pub struct MockServer {
    child: Child,
    pub addr: String,
    dir: TempDir,
    /// From spawning the process to its "serving on" line.
    pub started_in: Duration,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl MockServer {
    pub fn start(extra: &[&str]) -> Self {
        Self::start_as(None, extra)
    }

    /// Started as `uid` (and gid) when given: a CI runner without root.
    pub fn start_as(uid: Option<u32>, extra: &[&str]) -> Self {
        let dir = TempDir::new("e2e-mock");
        let data = dir.path().join("data");
        let mut cmd = Command::new(stockade_exe());
        cmd.args(["serve", "--mock", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args(extra)
            .env_remove("STOCKADE_DATA_DIR")
            .env_remove("STOCKADE_SUBSTRATE")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(uid) = uid {
            std::fs::create_dir_all(&data).unwrap();
            for p in [dir.path(), &data] {
                rustix::fs::chown(
                    p,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(uid)),
                )
                .unwrap();
            }
            cmd.uid(uid).gid(uid);
        }
        let t0 = Instant::now();
        let mut child = cmd.spawn().expect("spawn stockade serve --mock");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("serving on http://").nth(1) {
                    let _ = tx.send((
                        rest.split_whitespace().next().unwrap_or("").to_string(),
                        Instant::now(),
                    ));
                }
                eprintln!("[mock server] {line}");
                kept.lock().unwrap().push(line);
            }
        });
        let Ok((addr, at)) = rx.recv_timeout(DEADLINE) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "stockade serve --mock did not start within {DEADLINE:?}: {:?}",
                log.lock().unwrap()
            );
        };
        Self {
            child,
            addr,
            dir,
            started_in: at - t0,
            log,
        }
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("data/api-token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// A JSON call with the operator's token: (status, body as JSON, or the text).
    pub fn call(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let body = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let (st, text) = http(&self.addr, method, path, Some(&self.token()), &body);
        (
            st,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        let _ = stockade_tests::kill(self.child.id() as i32, Signal::TERM);
        let end = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Up without root and fast (the start is measured: docs/MOCK.md quotes it), the loud
/// line said, the whole API answering through the guest: the built-in vocabulary for
/// what no rule scripts, and the trace of what the fence did.
#[test]
fn serve_mock_starts_fast_without_root_and_answers_the_api() {
    let s = MockServer::start_as(Some(65534), &[]);
    eprintln!("stockade serve --mock was serving after {:?}", s.started_in);
    assert!(
        s.started_in < Duration::from_secs(5),
        "up in {:?} (well under a second on an idle machine; the bound allows a loaded one)",
        s.started_in
    );
    assert!(
        s.log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("TEST DOUBLE")),
        "the loud line: {:?}",
        s.log.lock().unwrap()
    );
    let (st, out) = s.call(
        "POST",
        "/v1/sandboxes/k/exec",
        json!({"argv": ["echo", "hi"]}),
    );
    assert_eq!(
        (st, &out["exit_code"], &out["stdout"]),
        (200, &json!(0), &json!("hi\n")),
        "{out}"
    );
    // Unscripted, `sh -c 'exit 3'` is outside the vocabulary: exit 0.
    let (_, out) = s.call(
        "POST",
        "/v1/sandboxes/k/exec",
        json!({"argv": ["sh", "-c", "exit 3"]}),
    );
    assert_eq!(out["exit_code"], 0, "{out}");
    let (st, t) = s.call("GET", "/v1/mock/trace/k", Value::Null);
    assert_eq!(st, 200, "{t}");
    let ops: Vec<&str> = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["op"].as_str().unwrap())
        .collect();
    let fence = ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"];
    assert_eq!(ops, [fence, fence].concat(), "{t}");
    let (st, t) = s.call("GET", "/v1/mock/trace/other", Value::Null);
    assert_eq!(
        (st, t["calls"].as_array().map(Vec::len)),
        (200, Some(0)),
        "a key never called"
    );
}

/// A script from a file at start, replaced through the route; a bad one is a typed 400
/// that leaves the last one in force.
#[test]
fn scripted_outcomes_come_from_the_file_and_the_route() {
    let dir = TempDir::new("e2e-mock-script");
    let file = dir.path().join("script.json");
    std::fs::write(
        &file,
        json!({"rules": [
            {"argv": ["sh", "-c", "exit 3"], "exit_code": 3, "stderr": "three\n"},
            {"argv": ["pytest", "**"], "match": "glob", "stdout": "2 passed\n", "duration_ms": 50},
        ]})
        .to_string(),
    )
    .unwrap();
    let s = MockServer::start(&["--mock-script", file.to_str().unwrap()]);
    let exec = |argv: Value| {
        s.call("POST", "/v1/sandboxes/k/exec", json!({"argv": argv}))
            .1
    };
    let out = exec(json!(["sh", "-c", "exit 3"]));
    assert_eq!(
        (&out["exit_code"], &out["stderr"]),
        (&json!(3), &json!("three\n")),
        "{out}"
    );
    let t0 = Instant::now();
    let out = exec(json!(["pytest", "-q", "tests/"]));
    assert_eq!(out["stdout"], "2 passed\n", "{out}");
    assert!(
        t0.elapsed() >= Duration::from_millis(50),
        "the run lasts its duration"
    );

    let (st, body) = s.call(
        "PUT",
        "/v1/mock/script",
        json!({"rules": [{"argv": ["git", "fetch"], "match": "prefix", "exit_code": 128}], "default": {"exit_code": 1}}),
    );
    assert_eq!(st, 200, "{body}");
    assert_eq!(exec(json!(["git", "fetch", "origin"]))["exit_code"], 128);
    assert_eq!(
        exec(json!(["sh", "-c", "exit 3"]))["exit_code"],
        1,
        "the old rules are gone: the default"
    );
    let (_, doc) = s.call("GET", "/v1/mock/script", Value::Null);
    assert_eq!(doc["default"], json!({"exit_code": 1}), "{doc}");

    for (bad, code) in [
        (
            json!({"rules": [{"argv": ["x"], "exitcode": 1}]}),
            "invalid-input",
        ),
        (
            json!({"rules": [{"argv": ["x"], "match": "regex"}]}),
            "invalid-input",
        ),
        (json!([1]), "invalid-input"),
    ] {
        let (st, e) = s.call("PUT", "/v1/mock/script", bad.clone());
        assert_eq!(
            (st, e["error"]["code"].as_str()),
            (400, Some(code)),
            "{bad}: {e}"
        );
    }
    let (st, e) = {
        let (st, text) = http(
            &s.addr,
            "PUT",
            "/v1/mock/script",
            Some(&s.token()),
            b"{nope",
        );
        (st, serde_json::from_str::<Value>(&text).unwrap())
    };
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (400, Some("malformed-json")),
        "{e}"
    );
    assert_eq!(
        exec(json!(["git", "fetch"]))["exit_code"],
        128,
        "a refused script changed nothing"
    );
    assert_eq!(s.call("GET", "/v1/mock/script", Value::Null).1, doc);
}

/// Output chunks over time reach a streamed exec as they are written.
#[test]
fn scripted_chunks_stream_as_they_are_written() {
    let s = MockServer::start(&[]);
    let (st, _) = s.call(
        "PUT",
        "/v1/mock/script",
        json!({"rules": [{"argv": ["build"], "exit_code": 2, "chunks": [
            {"at_ms": 0, "stdout": "compiling\n"}, {"at_ms": 700, "stderr": "error\n"}]}]}),
    );
    assert_eq!(st, 200);
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(DEADLINE)).unwrap();
    let body = json!({"argv": ["build"]}).to_string();
    write!(
        c,
        "POST /v1/sandboxes/k/exec/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        s.token(),
        body.len()
    )
    .unwrap();
    let mut events = Vec::new();
    for line in BufReader::new(c).lines().map_while(Result::ok) {
        if let Ok(v) = serde_json::from_str::<Value>(line.trim())
            && v.is_object()
        {
            events.push((Instant::now(), v));
        }
    }
    let kinds: Vec<&str> = events
        .iter()
        .map(|(_, e)| e["type"].as_str().unwrap_or("?"))
        .collect();
    assert!(kinds.ends_with(&["stdout", "stderr", "exit"]), "{events:?}");
    let n = events.len();
    let (first, last) = (events[n - 3].0, events[n - 2].0);
    assert!(
        last - first >= Duration::from_millis(500),
        "the second chunk came {:?} after the first",
        last - first
    );
    assert_eq!(events[n - 1].1["exit_code"], 2);
}

/// A detached process's scripted life; an injected fault for a key, and the trace that
/// shows what the fence did about it.
#[test]
fn a_detached_life_and_faults_for_a_key_are_seen_through_the_api() {
    let s = MockServer::start(&[]);
    s.call(
        "PUT",
        "/v1/mock/script",
        json!({"rules": [{"argv": ["worker"], "detached": {"runs_ms": 300, "exit_code": 4}}]}),
    );
    let (st, started) = s.call(
        "POST",
        "/v1/sandboxes/k/detached",
        json!({"argv": ["worker"]}),
    );
    assert_eq!(st, 201, "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let status = |key: &str, id: &str| {
        s.call(
            "GET",
            &format!("/v1/sandboxes/{key}/detached/{id}"),
            Value::Null,
        )
        .1
    };
    assert_eq!(status("k", &id)["state"], "running");
    let end = Instant::now() + DEADLINE;
    while status("k", &id)["state"] == "running" {
        assert!(Instant::now() < end, "the worker never exited");
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(status("k", &id), json!({"state": "exited", "code": 4}));

    // A dispatcher's poll loop: the key's container becomes unreachable on the next
    // status call; another key's is not touched.
    let (_, other) = s.call(
        "POST",
        "/v1/sandboxes/o/detached",
        json!({"argv": ["server"]}),
    );
    let (_, p) = s.call(
        "POST",
        "/v1/sandboxes/p/detached",
        json!({"argv": ["server"]}),
    );
    let p = p["id"].as_str().unwrap().to_string();
    let (st, armed) = s.call(
        "POST",
        "/v1/mock/faults",
        json!({"op": "process-status", "fault": "unreachable", "key": "p"}),
    );
    assert_eq!(st, 200, "{armed}");
    assert_eq!(
        status("o", other["id"].as_str().unwrap())["state"],
        "running"
    );
    assert_eq!(
        status("p", &p),
        json!({"state": "gone", "reason": "container-unreachable"})
    );
    let (_, t) = s.call("GET", "/v1/mock/trace/p", Value::Null);
    let ops: Vec<&str> = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["ensure", "start-process", "process-status"], "{t}");

    // The next N calls, any key: a failed kill-all fails the exec, then it heals.
    let (st, _) = s.call(
        "POST",
        "/v1/mock/faults",
        json!({"op": "ensure", "fault": "over-capacity", "times": 2}),
    );
    assert_eq!(st, 200);
    for _ in 0..2 {
        let (st, e) = s.call("POST", "/v1/sandboxes/q/exec", json!({"argv": ["true"]}));
        assert_eq!(
            (st, e["error"]["code"].as_str()),
            (429, Some("over-capacity")),
            "{e}"
        );
    }
    assert_eq!(
        s.call("POST", "/v1/sandboxes/q/exec", json!({"argv": ["true"]}))
            .0,
        200
    );
    // Until cleared.
    s.call(
        "POST",
        "/v1/mock/faults",
        json!({"op": "run", "fault": "failed", "times": "always"}),
    );
    assert_ne!(
        s.call("POST", "/v1/sandboxes/q/exec", json!({"argv": ["true"]}))
            .0,
        200
    );
    assert_eq!(s.call("DELETE", "/v1/mock/faults", Value::Null).0, 200);
    assert_eq!(
        s.call("POST", "/v1/sandboxes/q/exec", json!({"argv": ["true"]}))
            .0,
        200
    );

    // Bad input: a typed 400, nothing armed.
    for bad in [
        json!({"op": "fork", "fault": "failed"}),
        json!({"op": "run", "fault": "boom"}),
        json!({"op": "run"}),
    ] {
        let (st, e) = s.call("POST", "/v1/mock/faults", bad.clone());
        assert_eq!(
            (st, e["error"]["code"].as_str()),
            (400, Some("invalid-input")),
            "{bad}: {e}"
        );
    }
    assert_eq!(
        s.call("POST", "/v1/sandboxes/q/exec", json!({"argv": ["true"]}))
            .0,
        200
    );
    // The trace can be reset.
    assert_eq!(s.call("DELETE", "/v1/mock/trace/q", Value::Null).0, 200);
    assert_eq!(
        s.call("GET", "/v1/mock/trace/q", Value::Null).1["calls"],
        json!([])
    );
}

/// The mock routes take the operator's token.
#[test]
fn the_mock_routes_take_the_operators_token() {
    let s = MockServer::start(&[]);
    for (method, path) in [
        ("GET", "/v1/mock/trace/k"),
        ("PUT", "/v1/mock/script"),
        ("POST", "/v1/mock/faults"),
        ("DELETE", "/v1/mock/faults"),
        ("POST", "/v1/mock/control"),
    ] {
        let (st, _) = http(&s.addr, method, path, None, b"{}");
        assert_eq!(st, 401, "{method} {path} without a token");
        let (st, _) = http(&s.addr, method, path, Some("wrong"), b"{}");
        assert_eq!(st, 401, "{method} {path} with a wrong token");
    }
    // A scoped token: the operator's routes refuse it by name (it must not script or
    // fault another tenant's sandbox).
    let (st, made) = s.call("POST", "/v1/tokens", json!({"keys": "ci-*"}));
    assert_eq!(st, 201, "{made}");
    let scoped = made["token"].as_str().unwrap();
    for (method, path) in [
        ("GET", "/v1/mock/trace/ci-1"),
        ("PUT", "/v1/mock/script"),
        ("POST", "/v1/mock/faults"),
    ] {
        let (st, text) = http(&s.addr, method, path, Some(scoped), b"{}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (st, e["error"]["code"].as_str()),
            (403, Some("operator-only")),
            "{method} {path} with a scoped token: {text}"
        );
    }
}

/// Outside mock mode the routes do not exist: the same answer, byte for byte, as a route
/// that never did.
#[test]
fn the_mock_routes_do_not_exist_on_a_normal_server() {
    let srv = crate::Server::start();
    let t = srv.token();
    let unknown = http(&srv.addr, "GET", "/v1/no/such/route", Some(&t), b"");
    assert_eq!(unknown.0, 404, "{unknown:?}");
    for (method, path) in [
        ("GET", "/v1/mock/trace/k"),
        ("PUT", "/v1/mock/script"),
        ("POST", "/v1/mock/faults"),
        ("DELETE", "/v1/mock/faults"),
        ("POST", "/v1/mock/control"),
        ("GET", "/v1/mock/script"),
    ] {
        let got = http(
            &srv.addr,
            method,
            path,
            Some(&t),
            b"{\"op\":\"run\",\"fault\":\"failed\"}",
        );
        assert_eq!(got, unknown, "{method} {path}");
        assert_eq!(
            http(&srv.addr, method, path, None, b"{}").0,
            http(&srv.addr, method, "/v1/no/such/route", None, b"{}").0,
            "{method} {path} without a token"
        );
    }
    srv.stop();
}

/// Why a conformance scenario cannot run through the API (it looks inside the mock or
/// the store, or drives what no route does), or `None`.
fn api_unreachable_step(scenario: &Value) -> Option<String> {
    for step in scenario["steps"].as_array().unwrap() {
        if let Some(c) = step.get("check") {
            return Some(format!("a state check ({c}) looks inside the mock"));
        }
        if step["approve"]["expired"] == true {
            return Some("an expired approval cannot be made through the API".into());
        }
        if step["input"]["grant"]["rules"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r.get("headers").is_some()))
        {
            return Some(
                "the API answers a secret it does not hold before the guest (409 secret-not-set)"
                    .into(),
            );
        }
        if let Some(c @ "on-stop") = step["call"].as_str() {
            return Some(format!("{c} is no call of the API the scenario's way"));
        }
        if let Some(c @ ("expire" | "forget")) = step["call"].as_str() {
            // A lifetime's end is the server's own loop; the API's DELETE aborts
            // before it forgets.
            return Some(format!("{c} is no call of the API the scenario's way"));
        }
    }
    None
}

/// A path segment as the scenario means it (an id `../x` is one segment).
fn seg(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// A scenario step's call through the API, answered in the scenario file's vocabulary
/// (`{"ok": …}`, `{"err": NAME}`, `{"trap": true}`).
fn api_call(s: &MockServer, step: &Value, key: &str, id: &str) -> Value {
    let (key, id) = (seg(key), seg(id));
    let sb = format!("/v1/sandboxes/{key}");
    let (method, path, body) = match step["call"].as_str().unwrap() {
        "exec" | "start-detached" => {
            let input = &step["input"];
            let mut body = json!({"argv": input["argv"]});
            for f in ["cwd", "timeout_ms", "grant", "approval", "stdin"] {
                if let Some(v) = input.get(f) {
                    body[f] = v.clone();
                }
            }
            if let Some(env) = input.get("env").and_then(Value::as_array) {
                body["env"] = env
                    .iter()
                    .map(|p| (p[0].as_str().unwrap().to_string(), p[1].clone()))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
            }
            let path = if step["call"] == "exec" {
                format!("{sb}/exec")
            } else {
                format!("{sb}/detached")
            };
            ("POST", path, body)
        }
        "detached-status" => ("GET", format!("{sb}/detached/{id}"), Value::Null),
        "stop-detached" => ("DELETE", format!("{sb}/detached/{id}"), Value::Null),
        "ensure" => ("POST", format!("{sb}/ensure"), Value::Null),
        "abort" => ("POST", format!("{sb}/abort"), Value::Null),
        "checkpoint" => ("POST", format!("{sb}/checkpoint"), Value::Null),
        "save-snapshot" => (
            "POST",
            format!("{sb}/snapshots"),
            json!({"name": step["name"]}),
        ),
        "snapshots" => ("GET", format!("{sb}/snapshots"), Value::Null),
        "fork" => (
            "POST",
            format!("{sb}/fork"),
            json!({"source": step["source"], "name": step["name"]}),
        ),
        "delete-snapshot" => (
            "DELETE",
            format!(
                "{sb}/snapshots/{}",
                seg(step["name"].as_str().unwrap_or_default())
            ),
            Value::Null,
        ),
        "set-lifetime" if step["lifetime"].is_null() => {
            ("DELETE", format!("{sb}/lifetime"), Value::Null)
        }
        "set-lifetime" => ("PUT", format!("{sb}/lifetime"), step["lifetime"].clone()),
        "set-metadata" => {
            let m: serde_json::Map<String, Value> = step["metadata"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_str().unwrap().to_string(), p[1].clone()))
                .collect();
            ("PUT", format!("{sb}/metadata"), json!({ "metadata": m }))
        }
        "set-network" if step["network"].is_null() => {
            ("DELETE", format!("{sb}/network"), Value::Null)
        }
        "set-network" => ("PUT", format!("{sb}/network"), step["network"].clone()),
        "describe" => ("GET", sb.clone(), Value::Null),
        "denials" => ("GET", format!("{sb}/denials"), Value::Null),
        "artifacts" => ("GET", format!("{sb}/artifacts"), Value::Null),
        "read-artifact" => {
            let name = seg(step["name"].as_str().unwrap_or_default());
            let mut q = Vec::new();
            for f in ["offset", "length"] {
                if let Some(n) = step.get(f) {
                    q.push(format!("{f}={n}"));
                }
            }
            (
                "GET",
                format!("{sb}/artifacts/{name}?{}", q.join("&")),
                Value::Null,
            )
        }
        other => panic!("no API call for {other}"),
    };
    let (st, got) = s.call(method, &path, body);
    if !(200..300).contains(&st) {
        return match got["error"]["code"].as_str() {
            Some("trap") => json!({"trap": true}),
            // The API's 404 for the guest's refusal of a fork from no such snapshot.
            Some("not-found") if step["call"] == "fork" => json!({"err": "invalid-input"}),
            // The API's 404 for a key that is not known: the guest's none.
            Some("not-found") if step["call"] == "describe" => json!({"ok": null}),
            Some(code) => json!({"err": code}),
            None => json!({"err": format!("HTTP {st}: {got}")}),
        };
    }
    let ok = match step["call"].as_str().unwrap() {
        "exec" => got,
        "start-detached" => got["id"].clone(),
        "detached-status" => match got["state"].as_str() {
            Some("running") => json!("running"),
            Some("exited") => json!({"exited": got["code"]}),
            Some("gone") => json!({"gone": got["reason"]}),
            _ => got,
        },
        "denials" => json!(got["denials"].as_array().unwrap().iter().map(|d| json!({"host": d["host"], "method": d["method"], "path": d["path"], "reason": d["reason"]})).collect::<Vec<_>>()),
        // The bytes themselves (the scenarios' are text).
        "read-artifact" => match got {
            Value::String(t) => json!(t),
            other => json!(other.to_string()),
        },
        "save-snapshot" => got["name"].clone(),
        // A known key in the scenario file's vocabulary: metadata as sorted pairs, a
        // network as its rules' hosts and its ask.
        "describe" => json!({
            "key": got["key"],
            "running": got["running"],
            "lifetime": got["lifetime"],
            "metadata": got["metadata"].as_object().map(|m| m.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>()),
            "network": match &got["network"] {
                Value::Null => Value::Null,
                n => json!({
                    "rules": n["rules"].as_array().unwrap().iter().map(|r| r["host"].clone()).collect::<Vec<_>>(),
                    "ask": n.get("ask").cloned().unwrap_or(json!(false)),
                }),
            },
        }),
        "snapshots" => json!(
            got["snapshots"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["name"].clone())
                .collect::<Vec<_>>()
        ),
        "artifacts" => json!(got["artifacts"].as_array().unwrap().iter().map(|a| json!({"name": a["name"], "size": a["size"]})).collect::<Vec<_>>()),
        _ => Value::Null,
    };
    json!({"ok": ok})
}

/// One scenario through `stockade serve --mock`'s API: faults through its routes, the
/// key's trace for the step's `trace`.
fn run_scenario_over_api(scenario: &Value, dir: &std::path::Path) -> Result<(), String> {
    use stockade_tests::scenarios::{matches, outcome_name};
    let mut cfg = stockade_runtime::config::Config::embedded();
    if let Some(f) = scenario.get("floor") {
        cfg.floor.rules = serde_json::from_value(f.clone()).unwrap();
    }
    cfg.substrate.ceiling = scenario
        .get("ceiling")
        .and_then(Value::as_u64)
        .unwrap_or(16) as u32;
    cfg.substrate.idle_timeout_ms = 0;
    let path = dir.join("wasmtime.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let s = MockServer::start(&["--config", path.to_str().unwrap()]);
    let approver = std::fs::read_to_string(s.dir.path().join("data/approver-token")).unwrap();
    let mut saved: std::collections::HashMap<String, String> = Default::default();
    let subst =
        |v: &str, saved: &std::collections::HashMap<String, String>| match v.strip_prefix('$') {
            Some(n) => saved.get(n).cloned().unwrap_or_else(|| v.to_string()),
            None => v.to_string(),
        };
    for (i, step) in scenario["steps"].as_array().unwrap().iter().enumerate() {
        let at = format!("step {i} {step}");
        if let Some(f) = step.get("fault") {
            let times = f.get("times").cloned().unwrap_or(json!("always"));
            let body = json!({"op": f["op"], "fault": f["error"], "skip": f.get("skip").cloned().unwrap_or(json!(0)), "times": times});
            let (st, e) = s.call("POST", "/v1/mock/faults", body);
            if st != 200 {
                return Err(format!("{at}: arming: {st} {e}"));
            }
            continue;
        }
        if step.get("mock").is_some() {
            let mut body = json!({});
            for f in ["mock", "key", "container", "id", "code", "name", "bytes"] {
                if let Some(v) = step.get(f) {
                    body[f] = match v.as_str() {
                        Some(t) => json!(subst(t, &saved)),
                        None => v.clone(),
                    };
                }
            }
            let (st, e) = s.call("POST", "/v1/mock/control", body);
            if st != 200 {
                return Err(format!("{at}: control: {st} {e}"));
            }
            continue;
        }
        if step.get("clear_faults").is_some() {
            s.call("DELETE", "/v1/mock/faults", Value::Null);
            continue;
        }
        if let Some(a) = step.get("approve") {
            let body = json!({"argv": a["argv"]}).to_string();
            let (st, text) = http(
                &s.addr,
                "POST",
                &format!("/v1/sandboxes/{}/approvals", a["key"].as_str().unwrap()),
                Some(approver.trim()),
                body.as_bytes(),
            );
            let v: Value = serde_json::from_str(&text).unwrap_or_default();
            if st != 201 {
                return Err(format!("{at}: approving: {st} {text}"));
            }
            saved.insert(
                step["save"].as_str().unwrap().to_string(),
                v["token"].as_str().unwrap().to_string(),
            );
            continue;
        }
        let key = subst(step["key"].as_str().unwrap_or_default(), &saved);
        let id = subst(step["id"].as_str().unwrap_or_default(), &saved);
        // An empty key: no route names its trace (the guest refuses it before any call;
        // the in-process suite checks that its trace is empty).
        if !key.is_empty() {
            s.call(
                "DELETE",
                &format!("/v1/mock/trace/{}", seg(&key)),
                Value::Null,
            );
        }
        let mut step = step.clone();
        if let Some(input) = step.get_mut("input")
            && let Some(a) = input.get("approval").and_then(Value::as_str)
        {
            input["approval"] = json!(subst(a, &saved));
        }
        let got = api_call(&s, &step, &key, &id);
        if let (Some(name), Some(Value::String(v))) =
            (step.get("save").and_then(Value::as_str), got.get("ok"))
        {
            saved.insert(name.to_string(), v.clone());
        }
        if let Some(want) = step.get("outcome").and_then(Value::as_str)
            && outcome_name(&got) != want
        {
            return Err(format!("{at}: outcome {got}, expected {want}"));
        }
        if let Some(want) = step.get("expect") {
            let want: Value = serde_json::from_str(&{
                let mut t = want.to_string();
                for (n, v) in &saved {
                    t = t.replace(&format!("\"${n}\""), &format!("\"{v}\""));
                }
                t
            })
            .unwrap();
            if !matches(&want, &got) {
                return Err(format!("{at}: expected {want}, got {got}"));
            }
        }
        if let Some(want) = step.get("trace")
            && !key.is_empty()
        {
            let (_, t) = s.call("GET", &format!("/v1/mock/trace/{}", seg(&key)), Value::Null);
            let ops: Vec<Value> = t["calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["op"].clone())
                .collect();
            // A set-network the API took answers the key as it is now, which asks the
            // substrate for its container (`current`): the guest's call made nothing.
            let mut want = want.clone();
            if step["call"] == "set-network"
                && step["expect"].get("ok").is_some()
                && let Some(w) = want.as_array_mut()
            {
                w.push(json!("current"));
            }
            if Value::Array(ops.clone()) != want {
                return Err(format!("{at}: trace {ops:?}, expected {want}"));
            }
        }
    }
    Ok(())
}

/// The conformance scenarios (tests/scenarios/conformance.json) through the API of
/// `stockade serve --mock`, each on its own server: what a consumer sees through the
/// mock routes is what the conformance suite checks in-process. Scenarios that look
/// inside the mock or the store (or meet an API check before the guest) are left out,
/// each with its reason (printed): 38 of 44 run today (a step's count of the store's
/// records is left to the in-process suite).
#[test]
fn the_conformance_scenarios_run_through_the_mock_api() {
    let dir = TempDir::new("e2e-mock-conformance");
    let (mut ran, mut left, mut failed) = (0, Vec::new(), Vec::new());
    // A step's count of the store's records has no route: the step runs, its outcome
    // and trace are checked, its count is left to the in-process suite (said below).
    let unchecked_counts = stockade_tests::scenarios::all()
        .iter()
        .filter(|sc| api_unreachable_step(sc).is_none())
        .flat_map(|sc| sc["steps"].as_array().unwrap().clone())
        .filter(|st| st.get("records").is_some())
        .count();
    for sc in stockade_tests::scenarios::all() {
        let name = sc["name"].as_str().unwrap().to_string();
        if let Some(why) = api_unreachable_step(&sc) {
            left.push(format!("{name}: {why}"));
            continue;
        }
        ran += 1;
        if let Err(e) = run_scenario_over_api(&sc, dir.path()) {
            failed.push(format!("{name}: {e}"));
        }
    }
    eprintln!(
        "{ran} scenarios through the API ({unchecked_counts} record counts left to the in-process suite); left out:\n  {}",
        left.join("\n  ")
    );
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(ran >= 35, "only {ran} scenarios ran through the API");
}

/// The E2B layer and `/mcp` over the mock: the unmodified E2B SDK and the MCP SDK
/// (target/pyenv, tests/python-requirements.txt) see a scripted outcome.
#[test]
fn the_e2b_sdk_and_an_mcp_client_see_the_script() {
    let s = MockServer::start(&[]);
    let (st, _) = s.call(
        "PUT",
        "/v1/mock/script",
        // E2B runs a command line through a shell (its last argument); MCP an argv.
        json!({"rules": [
            {"argv": ["**", "deploy *"], "match": "glob", "exit_code": 3, "stderr": "refused\n"},
            {"argv": ["deploy"], "match": "prefix", "exit_code": 3, "stderr": "refused\n"},
        ]}),
    );
    assert_eq!(st, 200);
    let data = s.dir.path().join("data");
    let env = Command::new(stockade_exe())
        .args(["e2b", "env"])
        .env("STOCKADE_SERVER", format!("http://{}", s.addr))
        .env("STOCKADE_DATA_DIR", &data)
        .env_remove("STOCKADE_TOKEN")
        .output()
        .unwrap();
    assert!(
        env.status.success(),
        "{}",
        String::from_utf8_lossy(&env.stderr)
    );
    let vars: Vec<(String, String)> = String::from_utf8(env.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
        .collect();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = root.join("../target/pyenv/bin/python");
    let out = Command::new(&py)
        .arg(root.join("e2b/mock.py"))
        .arg(format!("http://{}", s.addr))
        .arg(s.token())
        .current_dir(std::env::temp_dir())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}: run `bash scripts/setup`", py.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the SDKs' driver failed:\n{text}");
    assert!(text.contains("mock: all checks passed"), "{text}");
}

/// Direct control: an artifact a test puts is listed and read through the API; a
/// container that dies from outside leaves its detached process gone; bad input is a
/// typed 400 that does nothing.
#[test]
fn direct_control_puts_artifacts_and_kills_containers_from_outside() {
    let s = MockServer::start(&[]);
    let (st, _) = s.call(
        "POST",
        "/v1/mock/control",
        json!({"mock": "put-artifact", "key": "k", "name": "report.txt", "bytes": "hello"}),
    );
    assert_eq!(st, 200);
    let (_, list) = s.call("GET", "/v1/sandboxes/k/artifacts", Value::Null);
    assert_eq!(
        list["artifacts"],
        json!([{"name": "report.txt", "size": 5}]),
        "{list}"
    );
    let (st, text) = http(
        &s.addr,
        "GET",
        "/v1/sandboxes/k/artifacts/report.txt",
        Some(&s.token()),
        b"",
    );
    assert_eq!((st, text.as_str()), (200, "hello"));

    let (_, started) = s.call(
        "POST",
        "/v1/sandboxes/k/detached",
        json!({"argv": ["server"]}),
    );
    let id = started["id"].as_str().unwrap().to_string();
    for bad in [
        json!({"mock": "stop-container", "key": "nobody"}),
        json!({"mock": "exit-process", "key": "k", "id": "no-such-id", "code": 1}),
        json!({"mock": "reboot", "key": "k"}),
    ] {
        let (st, e) = s.call("POST", "/v1/mock/control", bad.clone());
        assert_eq!(
            (st, e["error"]["code"].as_str()),
            (400, Some("invalid-input")),
            "{bad}: {e}"
        );
    }
    let status = || {
        s.call(
            "GET",
            &format!("/v1/sandboxes/k/detached/{id}"),
            Value::Null,
        )
        .1
    };
    assert_eq!(
        status()["state"],
        "running",
        "a refused control did nothing"
    );
    let (st, _) = s.call(
        "POST",
        "/v1/mock/control",
        json!({"mock": "stop-container", "key": "k"}),
    );
    assert_eq!(st, 200);
    // The host hears of the death on its own (on-stop): wait for it with a deadline.
    let end = Instant::now() + DEADLINE;
    while status()["state"] == "running" {
        assert!(Instant::now() < end, "the process outlived its container");
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(status()["state"], "gone", "{}", status());
}
