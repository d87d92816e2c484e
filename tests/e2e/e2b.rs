//! The E2B-compatible API (docs/E2B.md) driven by the unmodified Python `e2b` SDK,
//! pinned in tests/python-requirements.txt and installed by scripts/setup (nothing is
//! installed at test time): `tests/e2b/drive.py`, configured only by the environment
//! (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`, `E2B_VALIDATE_API_KEY`), creates a sandbox, runs
//! commands (output, streaming, a non-zero exit), writes and reads a file, starts,
//! lists and kills a background command, lists and kills sandboxes; a wrong key is
//! AuthenticationException, an unknown id and another tenant's are NotFoundException.

use std::path::Path;

use crate::Server;

/// The venv's python with the `e2b` SDK; a missing one fails loudly, never passes.
fn python_with_e2b() -> String {
    let py = std::env::var("STOCKADE_PYTHON").unwrap_or_else(|_| {
        panic!(
            "STOCKADE_PYTHON is not set: run `bash scripts/setup` (it installs \
             tests/python-requirements.txt, the e2b SDK among them, into target/pyenv) and \
             set STOCKADE_PYTHON=$PWD/target/pyenv/bin/python"
        )
    });
    // `from e2b import Sandbox`, not `import e2b`: run from tests/, the directory
    // tests/e2b would import as an empty namespace package.
    let probe = std::process::Command::new(&py)
        .args(["-c", "from e2b import Sandbox"])
        .output()
        .expect("run STOCKADE_PYTHON");
    assert!(
        probe.status.success(),
        "{py} has no `e2b` SDK: run `bash scripts/setup` (tests/python-requirements.txt pins it)\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    py
}

#[test]
fn the_unmodified_e2b_sdk_creates_runs_writes_reads_and_kills() {
    let py = python_with_e2b();
    let s = Server::start();
    drive(&py, &s, "the e2b SDK driver");
    s.stop();
}

/// The same driver under a second `e2b` version: 2.31.0, the one `openai-agents[e2b]`
/// pins (tests/agents-requirements.txt, in target/pyenv-agents), which checks the API
/// key's shape before sending it unless `E2B_VALIDATE_API_KEY=false` (which `stockade e2b
/// env` prints for that reason).
#[test]
fn the_e2b_sdk_openai_agents_pins_drives_the_same_checks() {
    let py = crate::clients::agents_python();
    let probe = std::process::Command::new(&py)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('e2b'))",
        ])
        .output()
        .expect("run the agents venv's python");
    assert_eq!(
        String::from_utf8_lossy(&probe.stdout).trim(),
        "2.31.0",
        "target/pyenv-agents holds another e2b: run `bash scripts/setup` \
         (tests/agents-requirements.txt)\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let s = Server::start();
    drive(&py, &s, "the e2b SDK driver (e2b 2.31.0)");
    s.stop();
}

/// What `eval "$(stockade e2b env)"` sets for `s`, checked: (name, value), in order.
pub fn e2b_env(s: &Server) -> Vec<(String, String)> {
    let base = format!("http://{}", s.addr);
    let env = s.cli(&["e2b", "env"]);
    assert!(
        env.status.success(),
        "{}",
        String::from_utf8_lossy(&env.stderr)
    );
    let env = String::from_utf8(env.stdout).unwrap();
    let vars: Vec<(String, String)> = env
        .lines()
        .map(|l| {
            let (k, v) = l
                .strip_prefix("export ")
                .and_then(|l| l.split_once('='))
                .unwrap_or_else(|| panic!("not an export line: {l:?}"));
            (k.to_string(), v.trim_matches('\'').to_string())
        })
        .collect();
    let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "E2B_API_URL",
            "E2B_SANDBOX_URL",
            "E2B_API_KEY",
            "E2B_VALIDATE_API_KEY"
        ],
        "{env}"
    );
    assert_eq!(vars[0].1, format!("{base}/e2b"), "{env}");
    assert_eq!(vars[2].1, s.token(), "{env}");
    assert_eq!(vars[3].1, "false", "{env}");
    vars
}

/// Run tests/e2b/drive.py with `py` against `s`, in an environment that is what `eval
/// "$(stockade e2b env)"` sets and nothing else (PATH aside); it must pass every check.
fn drive(py: &str, s: &Server, what: &str) {
    let drive = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2b/drive.py");
    let out = std::process::Command::new(py)
        .arg(&drive)
        .arg(format!("http://{}", s.addr))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(e2b_env(s))
        .output()
        .expect("run the e2b driver");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    assert!(text.contains("e2b: all checks passed"), "{what}: {text}");
}

/// One raw HTTP/1.0 request (the answer close-delimited, never chunked): (status,
/// content type, body).
fn raw(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.0\r\nhost: {addr}\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an answer");
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let ctype = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    (status, ctype, out[split + 4..].to_vec())
}

/// A Connect envelope.
fn envelope(flag: u8, json: &[u8]) -> Vec<u8> {
    let mut e = vec![flag];
    e.extend_from_slice(&(json.len() as u32).to_be_bytes());
    e.extend_from_slice(json);
    e
}

#[test]
fn malformed_requests_are_refused_in_e2bs_shapes_and_run_nothing() {
    let s = Server::start();
    let token = s.token();
    let a = s.addr.clone();
    let key = [
        ("x-api-key", token.as_str()),
        ("content-type", "application/json"),
    ];

    // A create that is not a JSON object, or names another template: refused, nothing made.
    for (body, want) in [
        (&b"[]"[..], 400),
        (b"{\"templateID\":7}", 400),
        (b"{\"templateID\":\"gpu\"}", 404),
    ] {
        let (status, _, text) = raw(&a, "POST", "/e2b/v2/sandboxes", &key, body);
        assert_eq!(status, want, "{}", String::from_utf8_lossy(&text));
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(v["code"], want, "E2B's error shape: {v}");
    }
    let (status, _, text) = raw(&a, "GET", "/e2b/v2/sandboxes", &key, b"");
    assert_eq!((status, text.as_slice()), (200, &b"[]"[..]));
    // No key, a wrong one: 401.
    for k in ["", "stk_0000000000000000_0000"] {
        let (status, _, _) = raw(&a, "POST", "/e2b/v2/sandboxes", &[("x-api-key", k)], b"{}");
        assert_eq!(status, 401, "{k:?}");
    }
    // A route this slice does not serve: E2B's 404, with or without a key.
    let none: &[(&str, &str)] = &[];
    for h in [&key[..], none] {
        let (status, _, text) = raw(
            &a,
            "POST",
            "/e2b/sandboxes/aaaaaaaaaaaaaaaaaaaa/timeout",
            h,
            b"{}",
        );
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            (status, v["code"].clone()),
            (404, serde_json::json!(404)),
            "{v}"
        );
    }

    let (status, _, text) = raw(
        &a,
        "POST",
        "/e2b/v2/sandboxes",
        &key,
        b"{\"templateID\":\"base\"}",
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let id = v["sandboxID"].as_str().unwrap().to_string();
    assert!(
        id.len() >= 16
            && id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
        "{id}"
    );

    // Start with a body that is not exactly one message envelope: the stream's end
    // carries invalid_argument, and the command in it never ran.
    let touch = br#"{"process":{"cmd":"/bin/sh","args":["-c","touch /workspace/ran"]}}"#;
    let one = envelope(0, touch);
    let mut two = one.clone();
    two.extend_from_slice(&one);
    let envd = [
        ("x-access-token", token.as_str()),
        ("e2b-sandbox-id", id.as_str()),
        ("content-type", "application/connect+json"),
    ];
    for (what, body) in [
        ("two envelopes", two.clone()),
        ("compressed", envelope(1, touch)),
        ("cut short", one[..one.len() - 3].to_vec()),
        ("a short header", vec![0, 0]),
        ("not a StartRequest", envelope(0, b"{\"process\":7}")),
    ] {
        let (status, ctype, body) =
            raw(&a, "POST", "/e2b/envd/process.Process/Start", &envd, &body);
        assert_eq!(
            (status, ctype.as_str()),
            (200, "application/connect+json"),
            "{what}"
        );
        assert_eq!(body[0], 2, "{what}: only the end-of-stream envelope");
        let trailer: serde_json::Value = serde_json::from_slice(&body[5..]).unwrap();
        assert_eq!(
            trailer["error"]["code"], "invalid_argument",
            "{what}: {trailer}"
        );
    }
    // Another sandbox id, a missing access token: not_found, unauthenticated.
    let other = [
        ("x-access-token", token.as_str()),
        ("e2b-sandbox-id", "aaaaaaaaaaaaaaaaaaaa"),
    ];
    let (_, _, body) = raw(&a, "POST", "/e2b/envd/process.Process/Start", &other, &one);
    assert!(
        String::from_utf8_lossy(&body).contains("not_found"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (_, _, body) = raw(
        &a,
        "POST",
        "/e2b/envd/process.Process/Start",
        &envd[1..],
        &one,
    );
    assert!(
        String::from_utf8_lossy(&body).contains("unauthenticated"),
        "{}",
        String::from_utf8_lossy(&body)
    );

    // A file path outside the workspace: 400 before any call.
    let (status, _, _) = raw(
        &a,
        "GET",
        "/e2b/envd/files?path=/etc/passwd",
        &envd[..2],
        b"",
    );
    assert_eq!(status, 400);
    let (status, _, _) = raw(
        &a,
        "GET",
        "/e2b/envd/files?path=/home/user/../../etc/passwd",
        &envd[..2],
        b"",
    );
    assert_eq!(status, 400);
    // Nothing ran: /workspace/ran does not exist.
    let (status, _, text) = raw(
        &a,
        "GET",
        "/e2b/envd/files?path=/home/user/ran",
        &envd[..2],
        b"",
    );
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&text));
    // And a well-formed Start runs, its stream a start, data, end, then the trailer.
    let echo = envelope(
        0,
        br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]}}"#,
    );
    let (status, _, body) = raw(&a, "POST", "/e2b/envd/process.Process/Start", &envd, &echo);
    assert_eq!(status, 200);
    let mut rest = body.as_slice();
    let mut events = vec![];
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        events.push((
            rest[0],
            serde_json::from_slice::<serde_json::Value>(&rest[5..5 + len]).unwrap(),
        ));
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty());
    assert!(
        events[0].1["event"]["start"]["pid"].as_u64().is_some(),
        "{events:?}"
    );
    assert_eq!(events[1].1["event"]["data"]["stdout"], "aGkK", "{events:?}");
    let n = events.len();
    assert_eq!(events[n - 2].1["event"]["end"]["exitCode"], 0, "{events:?}");
    assert_eq!(events[n - 1], (2, serde_json::json!({})), "{events:?}");
    s.stop();
}

#[test]
fn a_sandbox_outlives_a_restart_of_the_server() {
    let mut s = Server::start();
    let token = s.token();
    let key = [("x-api-key", token.as_str())];
    let (status, _, text) = raw(&s.addr, "POST", "/e2b/v2/sandboxes", &key, b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let id = v["sandboxID"].as_str().unwrap().to_string();

    // The same data directory, a new process.
    let _ = stockade_tests::kill(s.child.id() as i32, rustix::process::Signal::TERM);
    crate::wait_exit(&mut s.child, std::time::Duration::from_secs(30));
    let (child, addr, log) =
        stockade_tests::spawn_server_logged(&s.dir.path().join("wasmtime.toml"));
    (s.child, s.addr, s.log) = (child, addr, log);

    let (status, _, text) = raw(&s.addr, "GET", &format!("/e2b/sandboxes/{id}"), &key, b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
    let envd = [
        ("x-access-token", token.as_str()),
        ("e2b-sandbox-id", id.as_str()),
    ];
    let echo = envelope(
        0,
        br#"{"process":{"cmd":"/bin/sh","args":["-c","echo again"]}}"#,
    );
    let (status, _, body) = raw(
        &s.addr,
        "POST",
        "/e2b/envd/process.Process/Start",
        &envd,
        &echo,
    );
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&body).contains("YWdhaW4K"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (status, _, _) = raw(
        &s.addr,
        "DELETE",
        &format!("/e2b/sandboxes/{id}"),
        &key,
        b"",
    );
    assert_eq!(status, 204);
    let (status, _, _) = raw(&s.addr, "GET", &format!("/e2b/sandboxes/{id}"), &key, b"");
    assert_eq!(status, 404);
    s.stop();
}
