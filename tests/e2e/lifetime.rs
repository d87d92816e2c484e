//! A key's lifetime, metadata and listing (docs/DESIGN.md §2) through the real binary:
//! a lifetime that ends in an abort stops the container and forgets the key; one that
//! ends in a checkpoint keeps the key known and its `/workspace` for the next call;
//! metadata is described and listed; bad input is a 400 and changes nothing.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stockade_tests::http;

use crate::Server;

/// Poll `check` until it is true, at most `within` (a deadline, not a sleep).
fn until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("not within {within:?}: {what}");
}

fn exec(a: &str, t: &str, key: &str, script: &str) -> (u16, String) {
    let body = serde_json::to_vec(&json!({ "argv": ["sh", "-c", script] })).unwrap();
    http(
        a,
        "POST",
        &format!("/v1/sandboxes/{key}/exec"),
        Some(t),
        &body,
    )
}

#[test]
fn a_lifetime_ends_its_key_as_it_says_and_metadata_is_described_and_listed() {
    let srv = Server::start();
    let (a, t) = (srv.addr.clone(), srv.token());
    let key = "life-a";
    let (status, text) = exec(&a, &t, key, "echo kept > /workspace/f");
    assert_eq!(status, 200, "{text}");
    let info = |k: &str| http(&a, "GET", &format!("/v1/sandboxes/{k}"), Some(&t), b"");
    // Not known yet: a key that only ran is the 404 of a key nobody holds.
    assert_eq!(info(key).0, 404);

    // Metadata and a far lifetime: described, listed.
    let (status, text) = http(
        &a,
        "PUT",
        &format!("/v1/sandboxes/{key}/metadata"),
        Some(&t),
        br#"{"metadata": {"team": "ci", "run": "7"}}"#,
    );
    assert_eq!(status, 200, "{text}");
    let (status, text) = http(
        &a,
        "PUT",
        &format!("/v1/sandboxes/{key}/lifetime"),
        Some(&t),
        br#"{"ends_in_ms": 3600000, "on_end": "checkpoint"}"#,
    );
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["running"], true);
    assert_eq!(v["metadata"], json!({"team": "ci", "run": "7"}));
    assert_eq!(v["lifetime"]["on_end"], "checkpoint");
    let (status, text) = http(&a, "GET", "/v1/sandboxes?prefix=life-", Some(&t), b"");
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["sandboxes"].as_array().unwrap().len(), 1, "{text}");
    assert_eq!(v["sandboxes"][0]["key"], key);

    // Bad input: a 400, and nothing changed.
    for (path, body) in [
        ("lifetime", &br#"{"ends_in_ms": 1, "ends_at_ms": 1}"#[..]),
        ("lifetime", br#"{"on_end": "pause", "ends_in_ms": 1}"#),
        ("lifetime", br#"{"ends_in_ms": 1.5}"#),
        ("lifetime", br#"{"ends_in_ms": 1, "extra": 1}"#),
        ("metadata", br#"{"metadata": {"": "x"}}"#),
        ("metadata", br#"{"metadata": {"a": 1}}"#),
        ("metadata", b"not json"),
    ] {
        let (status, text) = http(
            &a,
            "PUT",
            &format!("/v1/sandboxes/{key}/{path}"),
            Some(&t),
            body,
        );
        assert_eq!(
            status,
            400,
            "{path} {}: {text}",
            String::from_utf8_lossy(body)
        );
    }
    assert_eq!(
        http(&a, "GET", "/v1/sandboxes?order=1", Some(&t), b"").0,
        400
    );
    let (_, text) = info(key);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["metadata"], json!({"team": "ci", "run": "7"}), "{text}");
    assert_eq!(v["lifetime"]["on_end"], "checkpoint", "{text}");

    // A lifetime ending in a checkpoint: the container stops, the key stays known
    // with no lifetime, and its workspace is there for the next call.
    let (status, text) = http(
        &a,
        "PUT",
        &format!("/v1/sandboxes/{key}/lifetime"),
        Some(&t),
        br#"{"ends_in_ms": 0, "on_end": "checkpoint"}"#,
    );
    assert_eq!(status, 200, "{text}");
    until(
        "the checkpoint at the lifetime's end",
        Duration::from_secs(20),
        || {
            let (_, text) = info(key);
            let v: Value = serde_json::from_str(&text).unwrap_or_default();
            v["running"] == false && v["lifetime"].is_null()
        },
    );
    let (status, text) = exec(&a, &t, key, "cat /workspace/f");
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("kept"),
        "the checkpoint kept the workspace: {text}"
    );

    // A lifetime ending in an abort: the container stops, the key is forgotten.
    let (status, text) = http(
        &a,
        "PUT",
        &format!("/v1/sandboxes/{key}/lifetime"),
        Some(&t),
        br#"{"ends_in_ms": 300}"#,
    );
    assert_eq!(status, 200, "{text}");
    until(
        "the abort at the lifetime's end",
        Duration::from_secs(20),
        || info(key).0 == 404,
    );
    let (status, text) = http(&a, "GET", "/v1/sandboxes?prefix=life-", Some(&t), b"");
    assert_eq!((status, text.as_str()), (200, r#"{"sandboxes":[]}"#));

    // DELETE: a known key aborted and forgotten; an unknown one the 404.
    let (status, _) = http(
        &a,
        "PUT",
        "/v1/sandboxes/life-b/metadata",
        Some(&t),
        br#"{"metadata": {}}"#,
    );
    assert_eq!(status, 200);
    let (status, text) = http(&a, "DELETE", "/v1/sandboxes/life-b", Some(&t), b"");
    assert_eq!((status, text.as_str()), (200, r#"{"forgotten":"life-b"}"#));
    assert_eq!(
        http(&a, "DELETE", "/v1/sandboxes/life-b", Some(&t), b"").0,
        404
    );
    assert!(srv.stop().success());
}
