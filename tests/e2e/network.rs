//! A key's network (docs/DESIGN.md §2, `set-network`) through the real binary, its
//! requests through the real proxy to an upstream on the test host's 127.0.0.2: a
//! fenced command that brings no grant runs under the key's network and reaches what it
//! names, only while it runs; a detached process of the key is denied even while a
//! command holds that grant open, and told why; a command's own grant goes first (an
//! empty one: no network); another key, a cleared network and a forgotten key have
//! none; bad bodies are a 400 that changes nothing. The CLI sets and shows it.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};
use stockade_tests::http;
use stockade_tests::nodes::http_upstream;

use crate::Server;

const DEADLINE: Duration = Duration::from_secs(20);

/// The paths the upstream saw so far (none waited for).
fn seen(rx: &mpsc::Receiver<String>) -> Vec<String> {
    rx.try_iter().collect()
}

#[test]
fn a_keys_network_is_the_grant_of_its_commands_without_one_and_never_a_detached_processes() {
    let (addr, rx) = http_upstream(std::net::Ipv4Addr::new(127, 0, 0, 2));
    let port = addr.port();
    let srv = Server::start();
    let (a, t) = (srv.addr.clone(), srv.token());
    let key = "net-a";
    let url = format!("http://127.0.0.2:{port}");
    // The answer's status line and headers (the denial's reason is one of them).
    let curl = |path: &str| format!("curl -s -D - -o /dev/null --max-time 10 {url}/{path}");
    let exec = |key: &str, body: Value| {
        let (status, text) = http(
            &a,
            "POST",
            &format!("/v1/sandboxes/{key}/exec"),
            Some(&t),
            &serde_json::to_vec(&body).unwrap(),
        );
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        v["stdout"].as_str().unwrap_or_default().to_lowercase()
    };
    let sh = |script: String| json!({ "argv": ["sh", "-c", script] });
    let network = |key: &str, method: &str, body: &[u8]| {
        http(
            &a,
            method,
            &format!("/v1/sandboxes/{key}/network"),
            Some(&t),
            body,
        )
    };
    let info = |key: &str| http(&a, "GET", &format!("/v1/sandboxes/{key}"), Some(&t), b"");

    // Bad bodies: a 400 each, and nothing changed (the key is not even known).
    for (body, code) in [
        (
            &br#"{"rules": [{"host": "exa mple.com"}]}"#[..],
            "invalid-input",
        ),
        (
            br#"{"rules": [{"host": "127.0.0.2", "methods": ["FETCH"]}]}"#,
            "invalid-input",
        ),
        (br#"{"rulez": []}"#, "malformed-json"),
        (br#"{"rules": "127.0.0.2"}"#, "malformed-json"),
        (b"not json", "malformed-json"),
    ] {
        let (status, text) = network(key, "PUT", body);
        assert_eq!(status, 400, "{text}");
        assert!(text.contains(code), "{text}");
    }
    assert_eq!(info(key).0, 404, "a refused network made the key known");

    // Before any network: a command that brings no grant is denied, no-rule.
    let out = exec(key, sh(curl("before")));
    assert!(
        out.contains(" 403") && out.contains("x-stockade-denial: no-rule"),
        "{out}"
    );

    let (status, text) = network(key, "PUT", br#"{"rules": [{"host": "127.0.0.2"}]}"#);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["network"]["rules"][0]["host"], "127.0.0.2", "{text}");
    let (status, text) = info(key);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("127.0.0.2"), "{text}");

    // A command that brings no grant reaches what the key's network names.
    let out = exec(key, sh(curl("fenced")));
    assert!(out.starts_with("http/1.1 200"), "{out}");
    // The upstream reports a request after answering it: waited for, not polled.
    assert_eq!(rx.recv_timeout(DEADLINE).as_deref(), Ok("/fenced"));
    let canonical = match crate::front() {
        crate::Front::Edge => vec![format!("\"key\":\"{key}\""), "\"grant\":\"network\"".into()],
        _ => vec![format!("key={key}"), "grant=network".into()],
    };
    let mut needles = vec!["CANONICAL-FENCE"];
    needles.extend(canonical.iter().map(String::as_str));
    srv.wait_log(&needles, DEADLINE);

    // A detached process is denied while a command holds the key's network open.
    let detached = json!({ "argv": ["sh", "-c", format!(
        "for i in $(seq 400); do [ -e /tmp/go ] && break; sleep 0.05; done; \
         curl -s -D /tmp/detached.txt -o /dev/null --max-time 10 {url}/detached; touch /tmp/done"
    )] });
    let (status, text) = http(
        &a,
        "POST",
        &format!("/v1/sandboxes/{key}/detached"),
        Some(&t),
        &serde_json::to_vec(&detached).unwrap(),
    );
    assert_eq!(status, 201, "{text}");
    let out = exec(
        key,
        sh(
            "touch /tmp/go; for i in $(seq 400); do [ -e /tmp/done ] && break; sleep 0.05; done; \
            cat /tmp/detached.txt"
                .into(),
        ),
    );
    assert!(
        out.contains(" 403") && out.contains("x-stockade-denial: detached"),
        "{out}"
    );

    // A command's own grant goes first: an empty one is no network.
    let mut own = sh(curl("own-empty"));
    own["grant"] = json!({ "rules": [] });
    let out = exec(key, own);
    assert!(
        out.contains(" 403") && out.contains("x-stockade-denial: no-rule"),
        "{out}"
    );
    // Another key has none of it.
    let out = exec("net-b", sh(curl("other-key")));
    assert!(
        out.contains(" 403") && out.contains("x-stockade-denial: no-rule"),
        "{out}"
    );
    assert_eq!(
        seen(&rx),
        Vec::<String>::new(),
        "only the fenced command reached it"
    );

    // Cleared: its commands have no rule again; the key is still known.
    let (status, text) = network(key, "DELETE", b"");
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["network"],
        Value::Null
    );
    let out = exec(key, sh(curl("cleared")));
    assert!(
        out.contains(" 403") && out.contains("x-stockade-denial: no-rule"),
        "{out}"
    );

    // Set again through the CLI (`stockade network`), which prints the key as `info`
    // does; then forgotten with its key (DELETE aborts and forgets): the key's next
    // life has none.
    let o = srv.cli(&["network", key, "--grant", "127.0.0.2"]);
    let printed = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(printed.contains("network 127.0.0.2"), "{printed}");
    let o = srv.cli(&["network", key, "--clear", "--grant", "x.test"]);
    assert!(
        !o.status.success(),
        "--clear with rules is refused by the CLI"
    );
    let o = srv.cli(&["info", key]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("network 127.0.0.2"));
    let (status, text) = http(&a, "DELETE", &format!("/v1/sandboxes/{key}"), Some(&t), b"");
    assert_eq!(status, 200, "{text}");
    let out = exec(key, sh(curl("forgotten")));
    assert!(
        out.contains(" 403") && out.contains("x-stockade-denial: no-rule"),
        "{out}"
    );
    assert_eq!(seen(&rx), Vec::<String>::new());
    srv.stop();
}
