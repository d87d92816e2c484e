//! The HTTP API through a raw client: malformed input gets the right 4xx and the
//! server keeps serving.

use stockade_tests::http;

use crate::Server;

/// (what, method, path, token, body, status, error code)
type Row<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Option<&'a str>,
    Vec<u8>,
    u16,
    &'a str,
);

#[test]
fn bad_requests_get_the_right_4xx_and_the_server_keeps_serving() {
    let srv = Server::start();
    let t = srv.token();
    let a = &srv.addr;
    let rows: Vec<Row> = vec![
        (
            "malformed JSON",
            "POST",
            "/v1/sandboxes/k/exec",
            Some(&t),
            b"{bad".to_vec(),
            400,
            "malformed-json",
        ),
        (
            "non-UTF-8 body",
            "POST",
            "/v1/sandboxes/k/exec",
            Some(&t),
            vec![b'"', 0xff, 0xfe, b'"'],
            400,
            "malformed-json",
        ),
        (
            "unknown field",
            "POST",
            "/v1/sandboxes/k/exec",
            Some(&t),
            br#"{"argv":["true"],"nope":1}"#.to_vec(),
            400,
            "malformed-json",
        ),
        (
            "empty argv",
            "POST",
            "/v1/sandboxes/k/exec",
            Some(&t),
            br#"{"argv":[]}"#.to_vec(),
            400,
            "invalid-input",
        ),
        (
            "a grant rule that does not parse",
            "POST",
            "/v1/sandboxes/k/exec",
            Some(&t),
            br#"{"argv":["true"],"grant":{"rules":[{"host":"a b"}]}}"#.to_vec(),
            400,
            "invalid-input",
        ),
        (
            "an oversized body",
            "POST",
            "/v1/sandboxes/k/exec",
            Some(&t),
            vec![b' '; 25 << 20],
            413,
            "payload-too-large",
        ),
        (
            "an unknown route",
            "GET",
            "/v1/nope",
            Some(&t),
            vec![],
            404,
            "not-found",
        ),
        (
            "a wrong method",
            "PUT",
            "/v1/sandboxes/k/exec",
            Some(&t),
            vec![],
            405,
            "method-not-allowed",
        ),
        (
            "no token",
            "POST",
            "/v1/sandboxes/k/exec",
            None,
            br#"{"argv":["true"]}"#.to_vec(),
            401,
            "unauthorized",
        ),
        (
            "a wrong token",
            "POST",
            "/v1/sandboxes/k/exec",
            Some("nope"),
            br#"{"argv":["true"]}"#.to_vec(),
            401,
            "unauthorized",
        ),
        (
            "an artifact name with ..",
            "GET",
            "/v1/sandboxes/k/artifacts/a/../../etc/passwd",
            Some(&t),
            vec![],
            400,
            "invalid-input",
        ),
        (
            "a key with a bad character",
            "POST",
            "/v1/sandboxes/k%20y/exec",
            Some(&t),
            br#"{"argv":["true"]}"#.to_vec(),
            400,
            "invalid-input",
        ),
    ];
    for (what, m, p, tok, body, status, code) in rows {
        let (s, b) = http(a, m, p, tok, &body);
        assert_eq!(s, status, "{what}: {b}");
        assert!(b.contains(code), "{what}: body {b} lacks code {code}");
    }
    let (s, b) = http(
        a,
        "POST",
        "/v1/sandboxes/k/exec",
        Some(&t),
        br#"{"argv":["echo","still","serving"]}"#,
    );
    assert_eq!(s, 200, "{b}");
    assert!(b.contains("still serving"), "{b}");
    let (s, _) = http(a, "GET", "/v1/health", None, b"");
    assert_eq!(s, 200);
    assert!(srv.stop().success());
}

#[test]
fn the_openapi_document_lists_exactly_the_real_routes_and_they_answer() {
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    let mut documented: Vec<(String, String)> = vec![];
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for m in ops
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "parameters")
        {
            documented.push((m.to_uppercase(), path.clone()));
        }
    }
    let mut real: Vec<(String, String)> = stockade_host::api::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    documented.sort();
    real.sort();
    assert_eq!(documented, real, "docs/openapi.json and api::ROUTES differ");
    // And every documented route is really served (not a 404/405 from the router).
    let srv = Server::start();
    let t = srv.token();
    for (m, p) in &real {
        let path = p
            .replace("{key}", "probe")
            .replace("{id}", "00000000-0000-4000-8000-000000000000")
            .replace("{name}", "x");
        let (s, b) = http(&srv.addr, m, &path, Some(&t), b"{}");
        // The router's own answers name no route; a handler's 404 (a missing artifact)
        // is a served route.
        assert!(
            !(s == 405 || s == 404 && b.contains("no such route")),
            "{m} {path} is not served: {s} {b}"
        );
    }
    assert!(srv.stop().success());
}

/// A configuration file with no `[floor]` runs with the embedded floor (it once ran
/// with none, and said nothing): `git push` needs an approval. An explicit empty list
/// is honoured, and said at start.
#[test]
fn a_configuration_without_a_floor_section_keeps_the_default_floor() {
    let srv = Server::start_from_file(|t| {
        t.remove("floor");
    });
    let t = srv.token();
    let body = br#"{"argv":["git","push","origin","main"]}"#;
    let (st, out) = http(&srv.addr, "POST", "/v1/sandboxes/k/exec", Some(&t), body);
    assert_eq!(st, 403, "a floor command ran without approval: {out}");
    assert!(out.contains("needs-approval"), "{out}");
    assert!(srv.stop().success());

    let srv = Server::start_from_file(|t| {
        t["floor"]
            .as_table_mut()
            .unwrap()
            .insert("rules".into(), toml::Value::Array(vec![]));
    });
    srv.wait_log(
        &[
            "floor.rules is empty",
            "a list with a security meaning is empty",
        ],
        std::time::Duration::from_secs(10),
    );
    assert!(srv.stop().success());
}

/// A consumer does not approve its own floor commands. Approvals take the
/// approver token (the consumer token is refused), and an approval admits its command
/// once.
#[test]
fn approvals_take_the_approver_token_and_are_used_once() {
    let srv = Server::start_with(|c| c.floor.rules = vec![vec!["echo".into(), "floor".into()]]);
    let t = srv.token();
    let approver = std::fs::read_to_string(srv.data_dir().join("approver-token"))
        .unwrap()
        .trim()
        .to_string();
    assert_ne!(approver, t);
    let a = &srv.addr;
    let body = br#"{"argv":["echo","floor"]}"#;
    let (st, out) = http(a, "POST", "/v1/sandboxes/k/approvals", Some(&t), body);
    assert_eq!(st, 403, "the consumer token approved: {out}");
    assert!(out.contains("approver-only"), "{out}");
    let (st, out) = http(
        a,
        "POST",
        "/v1/sandboxes/k/approvals",
        Some(&approver),
        body,
    );
    assert_eq!(st, 201, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let token = v["token"].as_str().unwrap().to_string();
    assert!(v["expires_ms"].as_u64().unwrap() > 0);
    // The approver token is no consumer token.
    let (st, _) = http(a, "GET", "/v1/sandboxes/k/denials", Some(&approver), b"");
    assert_eq!(st, 401);
    let exec = format!(r#"{{"argv":["echo","floor"],"approval":"{token}"}}"#);
    let (st, out) = http(a, "POST", "/v1/sandboxes/k/exec", Some(&t), exec.as_bytes());
    assert_eq!(st, 200, "{out}");
    let (st, out) = http(a, "POST", "/v1/sandboxes/k/exec", Some(&t), exec.as_bytes());
    assert_eq!(st, 403, "an approval admitted twice: {out}");
    assert!(out.contains("needs-approval"), "{out}");
    assert!(srv.stop().success());
}
