//! Egress that can ask (docs/EGRESS.md) through the real binary: a fenced `curl` in a real
//! container whose `ask = true` grant refuses it is held until the approver answers over
//! the API. Approved: 200 from a loopback upstream, and the same request again passes
//! without asking in that fence — but is asked again in the next. Refused: 403
//! `refused-by-approver`. Unanswered: 403 `ask-timeout`. The consumer's token lists but
//! cannot answer; a decision is answered once; the pending bound refuses the next at once
//! (`ask-full`); a fence that ends drops what it held.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stockade_tests::http;

use crate::Server;

/// A plain HTTP upstream on 127.0.0.2 answering `200 ok` to every request, but
/// `/go`, which answers `yes` once the test says so (`go`), and `/done`, which it
/// records (`done`): how a test and a script in the container wait on each other
/// without any call to the key (its calls run one at a time).
struct Upstream {
    base: String,
    go: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
}

impl Upstream {
    fn start() -> Upstream {
        let l = TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
        let base = format!("http://{}", l.local_addr().unwrap());
        let (go, done) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (g, d) = (go.clone(), done.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let (g, d) = (g.clone(), d.clone());
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut b = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut b) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&b[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&head);
                    let path = line.split_whitespace().nth(1).unwrap_or_default();
                    let body = if path == "/go" {
                        if g.load(Ordering::SeqCst) {
                            "yes"
                        } else {
                            "no!"
                        }
                    } else {
                        if path == "/done" {
                            d.store(true, Ordering::SeqCst);
                        }
                        "ok\n"
                    };
                    let _ = s.write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\n{body}"
                        )
                        .as_bytes(),
                    );
                });
            }
        });
        Upstream { base, go, done }
    }

    /// The rules that let a script wait on `/go` and say `/done` without asking.
    fn signal_rules(&self) -> Value {
        let host = self.base.trim_start_matches("http://");
        json!([
            { "host": host, "methods": ["GET"], "path_prefix": "/go" },
            { "host": host, "methods": ["GET"], "path_prefix": "/done" },
        ])
    }
}

/// What a script's curl prints for one request: the status and the denial header.
const CURL: &str = r#"probe() { curl -s -o /dev/null -D - --max-time 30 "$1" | tr -d '\r' | awk 'NR==1{s=$2} tolower($1)=="x-stockade-denial:"{d=$2} END{print s" "d}'; }"#;

/// Run `script` under an `ask` grant of `rules` on `key`, in a thread: its outcome.
fn exec_in_thread(
    srv: &Server,
    key: &str,
    rules: Value,
    script: &str,
    timeout_ms: Option<u64>,
) -> std::thread::JoinHandle<Value> {
    let (a, t) = (srv.addr.clone(), srv.token());
    let mut body = json!({
        "argv": ["sh", "-c", format!("{CURL}\n{script}")],
        "grant": { "rules": rules, "ask": true },
    });
    // A bound on every run: a test that goes wrong fails in a minute, not the default ten.
    body["timeout_ms"] = json!(timeout_ms.unwrap_or(60_000));
    let path = format!("/v1/sandboxes/{key}/exec");
    std::thread::spawn(move || {
        let (status, text) = http(
            &a,
            "POST",
            &path,
            Some(&t),
            &serde_json::to_vec(&body).unwrap(),
        );
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    })
}

/// The pending decisions (as `token` lists them), waiting up to 30 s for `n` of them.
fn pending(srv: &Server, token: &str, key: &str, n: usize) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, text) = http(
            &srv.addr,
            "GET",
            &format!("/v1/sandboxes/{key}/egress/pending"),
            Some(token),
            b"",
        );
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let list = v["pending"].as_array().cloned().unwrap_or_default();
        if list.len() >= n {
            return list;
        }
        assert!(Instant::now() < end, "{n} pending never appeared: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn answer(srv: &Server, token: &str, id: &str, decision: &str) -> (u16, String) {
    let body = serde_json::to_vec(&json!({ "decision": decision })).unwrap();
    http(
        &srv.addr,
        "POST",
        &format!("/v1/egress/pending/{id}"),
        Some(token),
        &body,
    )
}

fn stdout(outcome: &Value) -> String {
    outcome["stdout"].as_str().unwrap_or_default().to_string()
}

#[test]
fn an_asked_request_is_held_for_the_approver_and_widens_only_its_fence() {
    let up = Upstream::start();
    let srv = Server::start_with(|c| {
        c.egress.ask_timeout_s = 3;
        c.egress.ask_pending_per_container = 1;
        c.egress.ask_pending_total = 4;
    });
    let (t, approver) = (srv.token(), srv.approver_token());
    let key = "e2e-ask";
    let base = &up.base;
    // No rule names the upstream: the first request is held; once approved, the same
    // path (and below it) passes again in this fence without asking — were it held, no
    // one would answer and it would be 403 ask-timeout.
    let run = exec_in_thread(
        &srv,
        key,
        json!([]),
        &format!(
            "probe {base}/allowed/x; probe {base}/allowed/x/y?q=1; probe '{base}/other?ref=abc'"
        ),
        None,
    );
    let held = pending(&srv, &t, key, 1);
    assert_eq!(held.len(), 1, "{held:?}");
    let p = &held[0];
    assert_eq!(p["method"], "GET");
    assert_eq!(p["path"], "/allowed/x");
    assert_eq!(p["reason"], "no-rule");
    let id = p["id"].as_str().unwrap().to_string();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    assert!(p["widens"].as_str().unwrap().ends_with("/allowed/x"), "{p}");
    // The consumer's token lists but never answers.
    let (status, text) = answer(&srv, &t, &id, "approve");
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("approver-only"), "{text}");
    // The approver lists everything, and answers once.
    let (status, text) = http(&srv.addr, "GET", "/v1/egress/pending", Some(&approver), b"");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(&id), "{text}");
    let (status, text) = answer(&srv, &approver, &id, "approve");
    assert_eq!(status, 200, "{text}");
    let (status, text) = answer(&srv, &approver, &id, "refuse");
    assert_eq!(status, 409, "a second answer: {text}");
    assert!(text.contains("already-decided"), "{text}");
    // A guessed id is unknown.
    let guessed = uuid::Uuid::new_v4().to_string();
    let (status, _) = answer(&srv, &approver, &guessed, "approve");
    assert_eq!(status, 404);
    // `/other` is another path: held again (the approver sees its query); refused.
    let held = pending(&srv, &t, key, 1);
    assert_eq!(held[0]["path"], "/other?ref=abc", "{held:?}");
    let (status, text) = answer(&srv, &approver, held[0]["id"].as_str().unwrap(), "refuse");
    assert_eq!(status, 200, "{text}");
    let out = run.join().unwrap();
    assert_eq!(
        stdout(&out),
        "200 \n200 \n403 refused-by-approver\n",
        "{out}"
    );

    // The next fence knows nothing of that approval: asked again; nobody answers.
    let started = Instant::now();
    let run = exec_in_thread(
        &srv,
        key,
        json!([]),
        &format!("probe {base}/allowed/x"),
        None,
    );
    let held = pending(&srv, &t, key, 1);
    assert_eq!(held[0]["path"], "/allowed/x");
    let out = run.join().unwrap();
    assert_eq!(stdout(&out), "403 ask-timeout\n", "{out}");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "held for the timeout"
    );
    let (status, _) = answer(&srv, &approver, held[0]["id"].as_str().unwrap(), "approve");
    assert_eq!(status, 409, "a timed-out decision cannot be approved");

    // The bound: one pending per container; the next is refused at once, typed, while
    // the first is still held.
    let run = exec_in_thread(
        &srv,
        key,
        up.signal_rules(),
        &format!(
            "probe {base}/first > /tmp/first &\n\
             until [ \"$(curl -s --max-time 5 {base}/go)\" = yes ]; do sleep 0.02; done\n\
             probe {base}/second; curl -s --max-time 5 {base}/done >/dev/null; wait; cat /tmp/first"
        ),
        None,
    );
    let held = pending(&srv, &t, key, 1);
    assert_eq!(held[0]["path"], "/first", "{held:?}");
    up.go.store(true, Ordering::SeqCst);
    let end = Instant::now() + Duration::from_secs(30);
    while !up.done.load(Ordering::SeqCst) {
        assert!(Instant::now() < end, "the second request never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        pending(&srv, &t, key, 1).len(),
        1,
        "the first is still held"
    );
    answer(&srv, &approver, held[0]["id"].as_str().unwrap(), "refuse");
    let out = run.join().unwrap();
    assert_eq!(
        stdout(&out),
        "403 ask-full\n403 refused-by-approver\n",
        "{out}"
    );

    // A fence that ends (the exec's timeout) drops what it held: none is pending, and
    // it can never be approved.
    let run = exec_in_thread(
        &srv,
        key,
        json!([]),
        &format!("probe {base}/late"),
        Some(1_500),
    );
    let held = pending(&srv, &t, key, 1);
    let out = run.join().unwrap();
    assert_eq!(out["timed_out"], true, "{out}");
    let (status, text) = answer(&srv, &approver, held[0]["id"].as_str().unwrap(), "approve");
    assert_eq!(status, 409, "{text}");
    let (_, text) = http(&srv.addr, "GET", "/v1/egress/pending", Some(&approver), b"");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["pending"],
        json!([])
    );
    // Nothing of it is left: no container, cgroup or mount once the server stops.
    assert!(srv.stop().success());
}

#[test]
fn the_cli_lists_and_answers_pending_decisions() {
    let up = Upstream::start();
    let srv = Server::start_with(|c| c.egress.ask_timeout_s = 30);
    let key = "e2e-ask-cli";
    let run = exec_in_thread(
        &srv,
        key,
        json!([]),
        &format!("probe {}/cli", up.base),
        None,
    );
    let held = pending(&srv, &srv.token(), key, 1);
    let id = held[0]["id"].as_str().unwrap();
    let o = srv.cli(&["egress", "pending"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(
        listed.starts_with(id) && listed.contains(" GET 127.0.0.2:"),
        "{listed}"
    );
    let o = srv.cli(&["egress", "approve", id]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("approved GET 127.0.0.2:"));
    let o = srv.cli(&["egress", "refuse", id]);
    assert!(!o.status.success(), "answered once");
    assert_eq!(stdout(&run.join().unwrap()), "200 \n");
    assert!(srv.stop().success());
}
