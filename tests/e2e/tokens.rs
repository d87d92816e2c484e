//! docs/SECURITY.md, "Which token a route takes", through the real binary: which token a
//! route takes is decided by the route the request matched, never by how its path ends. The
//! approver token cannot write a file or read an artifact whose path ends in `/approvals`;
//! the consumer token can (they are its routes); the approvals route takes the approver's.

use serde_json::json;
use stockade_tests::http;

use crate::Server;

/// (what, method, path, token, body, status)
type Row<'a> = (&'a str, &'a str, String, &'a str, &'a [u8], u16);

#[test]
fn the_token_follows_the_matched_route_not_the_paths_ending() {
    let srv = Server::start();
    let (t, approver, a) = (srv.token(), srv.approver_token(), srv.addr.clone());
    let k = "/v1/sandboxes/e2e-tokens";
    let approval = serde_json::to_vec(&json!({ "argv": ["true"] })).unwrap();
    let rows: &[Row] = &[
        (
            "the approver token cannot write a file named …/approvals",
            "PUT",
            format!("{k}/files/notes/approvals"),
            &approver,
            b"from the approver",
            401,
        ),
        (
            "the approver token cannot read an artifact named …/approvals",
            "GET",
            format!("{k}/artifacts/x/approvals"),
            &approver,
            b"",
            401,
        ),
        (
            "the approver token cannot list artifacts",
            "GET",
            format!("{k}/artifacts"),
            &approver,
            b"",
            401,
        ),
        (
            "the consumer token cannot approve",
            "POST",
            format!("{k}/approvals"),
            &t,
            &approval,
            403,
        ),
        (
            "the consumer token writes its file named …/approvals",
            "PUT",
            format!("{k}/files/notes/approvals"),
            &t,
            b"from the consumer",
            201,
        ),
        (
            "the consumer token reads its artifacts",
            "GET",
            format!("{k}/artifacts"),
            &t,
            b"",
            200,
        ),
        (
            "the approver token approves",
            "POST",
            format!("{k}/approvals"),
            &approver,
            &approval,
            201,
        ),
        (
            "the approver token lists secrets",
            "GET",
            "/v1/secrets".to_string(),
            &approver,
            b"",
            200,
        ),
        (
            "the consumer token cannot list secrets",
            "GET",
            "/v1/secrets".to_string(),
            &t,
            b"",
            403,
        ),
        (
            "no route matched: the consumer token's 404",
            "GET",
            "/v1/nothing/approvals".to_string(),
            &t,
            b"",
            404,
        ),
        (
            "no route matched: the approver token is not a consumer's",
            "GET",
            "/v1/nothing/approvals".to_string(),
            &approver,
            b"",
            401,
        ),
    ];
    for (what, method, path, token, body, want) in rows {
        let (status, text) = http(&a, method, path, Some(token), body);
        assert_eq!(status, *want, "{what}: {text}");
    }
    // Only the consumer's bytes were written.
    let body =
        serde_json::to_vec(&json!({ "argv": ["cat", "/workspace/notes/approvals"] })).unwrap();
    let (status, text) = http(&a, "POST", &format!("{k}/exec"), Some(&t), &body);
    assert_eq!(status, 200, "{text}");
    let outcome: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(outcome["stdout"], "from the consumer", "{outcome}");
    assert!(srv.stop().success());
}
