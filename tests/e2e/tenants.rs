//! docs/TENANTS.md through the real binary: two tenants made by the operator's token
//! (`stockade token create`), every route tried across them. Another tenant's key is the
//! same 404, byte for byte, as a key nobody holds, on every keyed route (streams, doors
//! and the terminal included), in the pending decisions and through `/mcp`; a tenant holds
//! at most its share of the ceiling; only the operator makes tokens; a revoked token
//! is a wrong one everywhere.

use serde_json::{Value, json};
use stockade_tests::http;

use crate::Server;
use crate::mcp_http::{ACCEPT, JSON, call, open_session};

/// `stockade token create …` through the CLI (the operator's token from the data
/// directory): (token, id).
fn create(srv: &Server, keys: &str, ceiling: &str) -> (String, String) {
    let out = srv.cli(&[
        "--json",
        "token",
        "create",
        "--keys",
        keys,
        "--ceiling",
        ceiling,
    ]);
    assert!(
        out.status.success(),
        "token create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("token create --json");
    (
        v["token"].as_str().unwrap().to_string(),
        v["id"].as_str().unwrap().to_string(),
    )
}

fn exec(a: &str, token: &str, key: &str, argv: &[&str]) -> (u16, String) {
    let body = serde_json::to_vec(&json!({ "argv": argv })).unwrap();
    http(
        a,
        "POST",
        &format!("/v1/sandboxes/{key}/exec"),
        Some(token),
        &body,
    )
}

/// A route template with its parameters filled for `key`.
fn fill(template: &str, key: &str, id: &str) -> String {
    template
        .replace("{key}", key)
        .replace("{id}", id)
        .replace("{name}", "notes.txt")
        .replace("{port}", "8000")
        .replace("{*path}", "notes.txt")
}

#[test]
fn a_tenant_reaches_only_its_keys_on_every_route_and_holds_only_its_share() {
    let srv = Server::start();
    let a = srv.addr.clone();
    let operator = srv.token();
    let (ta, _ta_id) = create(&srv, "ta-*", "1");
    let (tb, tb_id) = create(&srv, "tb-*", "2");

    // Overlapping keys are refused: two tokens never reach one key.
    let out = srv.cli(&["token", "create", "--keys", "ta-x*"]);
    assert!(!out.status.success(), "an overlapping token was made");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("overlap"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Each tenant runs in its own keys; B leaves a detached process and a file.
    let (status, text) = exec(&a, &ta, "ta-1", &["true"]);
    assert_eq!(status, 200, "{text}");
    let (status, text) = exec(
        &a,
        &tb,
        "tb-1",
        &["sh", "-c", "echo secret-of-b > /workspace/notes.txt"],
    );
    assert_eq!(status, 200, "{text}");
    let body = serde_json::to_vec(&json!({ "argv": ["sleep", "300"] })).unwrap();
    let (status, text) = http(&a, "POST", "/v1/sandboxes/tb-1/detached", Some(&tb), &body);
    assert_eq!(status, 201, "{text}");
    let b_id = serde_json::from_str::<Value>(&text).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Every keyed route: A on B's live key answers exactly what A on a key nobody
    // holds answers, and that is the API's 404 (the approver's routes: its 403, for
    // any key, before the key is read).
    let body = serde_json::to_vec(&json!({ "argv": ["cat", "/workspace/notes.txt"] })).unwrap();
    let mut tried = 0;
    for (method, template) in stockade_host::api::ROUTES {
        if !template.contains("{key}") {
            continue;
        }
        let theirs = http(&a, method, &fill(template, "tb-1", &b_id), Some(&ta), &body);
        let nobodys = http(
            &a,
            method,
            &fill(template, "tz-none", &b_id),
            Some(&ta),
            &body,
        );
        assert_eq!(
            theirs, nobodys,
            "{method} {template}: B's key tells itself apart"
        );
        let want = if stockade_host::api::APPROVER_ROUTES.contains(template) {
            403
        } else {
            404
        };
        assert_eq!(theirs.0, want, "{method} {template}: {}", theirs.1);
        tried += 1;
    }
    assert!(tried >= 18, "every keyed route was tried ({tried})");

    // A fork names a second key in its body: B's snapshot, as A's source, is refused
    // with the same bytes (but the name) as a source nobody holds, and A's key (its
    // container stopped first: a fork is onto a key with none) gets none of B's files.
    let (status, text) = http(
        &a,
        "POST",
        "/v1/sandboxes/tb-1/snapshots",
        Some(&tb),
        br#"{"name": "s1"}"#,
    );
    assert_eq!(status, 200, "{text}");
    let (status, text) = http(&a, "POST", "/v1/sandboxes/ta-1/abort", Some(&ta), b"");
    assert_eq!(status, 200, "{text}");
    let fork = |source: &str| {
        let body = serde_json::to_vec(&json!({ "source": source, "name": "s1" })).unwrap();
        http(&a, "POST", "/v1/sandboxes/ta-1/fork", Some(&ta), &body)
    };
    let (theirs, nobodys) = (fork("tb-1"), fork("tz-none"));
    assert_eq!(theirs.0, 404, "A forked B's snapshot: {}", theirs.1);
    assert_eq!(
        (theirs.0, theirs.1.replace("tb-1", "tz-none")),
        nobodys,
        "B's snapshot tells itself apart"
    );
    let (status, text) = exec(&a, &ta, "ta-1", &["cat", "/workspace/notes.txt"]);
    assert_eq!(status, 200, "{text}");
    assert!(
        !text.contains("secret-of-b"),
        "A's key has B's file: {text}"
    );

    // The listing of known keys: B's is not A's, whatever prefix A asks for.
    let (status, text) = http(
        &a,
        "PUT",
        "/v1/sandboxes/tb-1/metadata",
        Some(&tb),
        br#"{"metadata": {"owner": "b"}}"#,
    );
    assert_eq!(status, 200, "{text}");
    for q in ["", "?prefix=tb-", "?prefix=t"] {
        let (status, text) = http(&a, "GET", &format!("/v1/sandboxes{q}"), Some(&ta), b"");
        assert_eq!((status, text.as_str()), (200, r#"{"sandboxes":[]}"#), "{q}");
    }
    let (status, text) = http(&a, "GET", "/v1/sandboxes", Some(&tb), b"");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(r#""key":"tb-1""#), "{text}");

    // B's process and file are untouched; B still reaches them.
    let (status, text) = http(
        &a,
        "GET",
        &format!("/v1/sandboxes/tb-1/detached/{b_id}"),
        Some(&tb),
        b"",
    );
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("running"), "{text}");
    let (status, text) = exec(&a, &tb, "tb-1", &["cat", "/workspace/notes.txt"]);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("secret-of-b"), "{text}");

    // The pending decisions: a tenant's list holds its own keys only; asking for
    // another's is the empty list a key nobody holds gives.
    for q in [
        "/v1/egress/pending?key=tb-1",
        "/v1/egress/pending?key=tz-none",
    ] {
        let (status, text) = http(&a, "GET", q, Some(&ta), b"");
        assert_eq!((status, text.as_str()), (200, "{\"pending\":[]}"), "{q}");
    }

    // `/mcp` with A's token: A's tools reach A's keys, and B's key is the API's 404.
    let auth = format!("Bearer {ta}");
    let session = open_session(&a, &ta);
    let tool = |key: &str| {
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "exec", "arguments": { "key": key, "argv": ["cat", "/workspace/notes.txt"] } } })
    };
    let headers = [
        ACCEPT,
        JSON,
        ("authorization", auth.as_str()),
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let (status, _, text) = call(&a, "POST", &headers, &tool("tb-1"));
    assert_eq!(status, 200, "{text}");
    assert!(
        !text.contains("secret-of-b"),
        "A read B's file through /mcp: {text}"
    );
    assert!(
        text.contains("not-found") || text.contains("no such sandbox"),
        "{text}"
    );

    // The share: A holds one live container (ta-1); a second key is over its share,
    // the key it holds is not, and aborting it frees the place.
    let (status, text) = exec(&a, &ta, "ta-2", &["true"]);
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("over-capacity"), "{text}");
    assert_eq!(exec(&a, &ta, "ta-1", &["true"]).0, 200);
    let (status, text) = http(&a, "POST", "/v1/sandboxes/ta-1/abort", Some(&ta), b"");
    assert_eq!(status, 200, "{text}");
    let (status, text) = exec(&a, &ta, "ta-2", &["true"]);
    assert_eq!(status, 200, "{text}");

    // Only the operator makes, lists and revokes tokens.
    let mk = serde_json::to_vec(&json!({ "keys": "tc-*" })).unwrap();
    let (status, text) = http(&a, "POST", "/v1/tokens", Some(&ta), &mk);
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("operator-only"), "{text}");
    assert_eq!(http(&a, "GET", "/v1/tokens", Some(&ta), b"").0, 403);
    assert_eq!(http(&a, "GET", "/v1/tokens", Some(&operator), b"").0, 200);

    // Revoked: B's token is a wrong token on every route and on /mcp.
    let out = srv.cli(&["token", "revoke", &tb_id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, text) = exec(&a, &tb, "tb-1", &["true"]);
    assert_eq!(status, 401, "{text}");
    let auth_b = format!("Bearer {tb}");
    let (status, _, text) = call(
        &a,
        "POST",
        &[ACCEPT, JSON, ("authorization", &auth_b)],
        &json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "e2e", "version": "0" } } }),
    );
    assert_eq!(status, 401, "{text}");
    let list = srv.cli(&["token", "list"]);
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.contains("ta-*") && list.contains("tb-*") && list.contains("revoked"),
        "{list}"
    );

    // The operator still reaches every key, B's process included.
    let (status, text) = http(
        &a,
        "DELETE",
        &format!("/v1/sandboxes/tb-1/detached/{b_id}"),
        Some(&operator),
        b"",
    );
    assert_eq!(status, 200, "{text}");
    for k in ["ta-2", "tb-1"] {
        assert_eq!(
            http(
                &a,
                "POST",
                &format!("/v1/sandboxes/{k}/abort"),
                Some(&operator),
                b""
            )
            .0,
            200
        );
    }
    assert!(srv.stop().success());
}
