//! Credentials (DESIGN §5) through the real binary: secrets set by the approver (CLI and
//! API), a grant whose rule names one, the credential reaching a local HTTPS upstream, the
//! egress audit (API and `stockade egress`), and no trace of the value in the server's log,
//! its answers or the container.

use serde_json::{Value, json};
use stockade_tests::http;
use stockade_tests::https::HttpsUpstream;

use crate::Server;

fn ca_file(dir: &std::path::Path, pem: &str) -> std::path::PathBuf {
    let p = dir.join("upstream-ca.pem");
    std::fs::write(&p, pem).unwrap();
    p
}

#[test]
fn a_secret_reaches_the_upstream_and_nothing_else_sees_it() {
    let up = HttpsUpstream::start("127.0.0.2");
    let ca_dir = stockade_tests::TempDir::new("e2e-ca");
    let ca = ca_file(ca_dir.path(), &up.ca_pem);
    let srv = Server::start_with(|c| c.egress.extra_ca_files = vec![ca]);
    let (t, approver, a) = (srv.token(), srv.approver_token(), srv.addr.clone());
    let secret = format!("Bearer e2e-{}", uuid::Uuid::new_v4().simple());

    // Set by the approver through the CLI (the value on stdin, never in argv), bound
    // to the upstream's GETs under /api/ (DESIGN §5).
    let bound_host = up.addr.to_string();
    let o = srv.cli_with_stdin(
        &[
            "secret",
            "set",
            "api-token",
            "--host",
            &bound_host,
            "--method",
            "get",
            "--path",
            "/api/",
        ],
        format!("{secret}\n").as_bytes(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "secret api-token set\n");
    let o = srv.cli(&["secret", "list"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("api-token  (api)  GET {bound_host}/api/\n")
    );
    // The consumer cannot set, list or remove secrets.
    let body =
        serde_json::to_vec(&json!({ "value": "x", "host": "api.example.com", "methods": ["GET"] }))
            .unwrap();
    for (method, path, body) in [
        ("GET", "/v1/secrets", &b""[..]),
        ("PUT", "/v1/secrets/other", &body[..]),
        ("DELETE", "/v1/secrets/api-token", &b""[..]),
    ] {
        let (status, text) = http(&a, method, path, Some(&t), body);
        assert_eq!(status, 403, "{method} {path}: {text}");
        assert!(text.contains("approver-only"), "{text}");
    }
    // The approver lists names and sources, never values.
    let (status, text) = http(&a, "GET", "/v1/secrets", Some(&approver), b"");
    assert_eq!(status, 200, "{text}");
    let listed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(listed["secrets"][0]["name"], "api-token");
    assert_eq!(listed["secrets"][0]["source"], "api");
    assert!(!text.contains(&secret));
    // A value that would split a request is refused, and changes nothing.
    let bad = serde_json::to_vec(
        &json!({ "value": "a\r\nX-Injected: 1", "host": bound_host, "methods": ["GET"] }),
    )
    .unwrap();
    let (status, text) = http(&a, "PUT", "/v1/secrets/api-token", Some(&approver), &bad);
    assert_eq!(status, 400, "{text}");
    assert!(
        !text.contains("X-Injected"),
        "the error never echoes a value: {text}"
    );

    // A grant naming a secret the server does not hold: 409, nothing runs.
    let exec = |grant: Value, script: &str| -> (u16, String) {
        let body = serde_json::to_vec(&json!({
            "argv": ["sh", "-c", script],
            "env": { "BASE": up.base() },
            "grant": grant,
        }))
        .unwrap();
        http(&a, "POST", "/v1/sandboxes/e2e-cred/exec", Some(&t), &body)
    };
    let host = up.addr.to_string();
    let (status, text) = exec(
        json!({ "rules": [{ "host": host, "headers": { "Authorization": { "secret": "missing" } } }] }),
        "touch /workspace/ran",
    );
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("secret-not-set"), "{text}");

    // The credential on the rule's requests only; the command sees none of it.
    let (status, text) = exec(
        json!({ "rules": [
            { "host": host, "methods": ["GET"], "path_prefix": "/api/",
              "headers": { "Authorization": { "secret": "api-token" } } },
            { "host": host, "methods": ["GET"], "path_prefix": "/public/" }
        ] }),
        r#"curl -s -w ' %{http_code}\n' --max-time 5 "$BASE/api/x"
curl -s -o /dev/null -w '%{http_code}\n' --max-time 5 "$BASE/public/y"
curl -s -o /dev/null -w '%{http_code}\n' --max-time 5 "$BASE/elsewhere"
ls /workspace; env"#,
    );
    assert_eq!(status, 200, "{text}");
    let outcome: Value = serde_json::from_str(&text).unwrap();
    let stdout = outcome["stdout"].as_str().unwrap_or_default();
    assert!(stdout.starts_with("ok\n 200\n200\n403\n"), "{outcome}");
    assert!(
        !stdout.contains("ran"),
        "the refused exec ran nothing: {stdout}"
    );
    assert!(
        !text.contains(&secret),
        "the exec's answer holds the secret"
    );
    let seen = up.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].path, "/api/x");
    assert_eq!(seen[0].authorization.as_deref(), Some(secret.as_str()));
    assert_eq!(seen[1].authorization, None);

    // The audit: the API's timeline and the CLI's lines.
    let (status, text) = http(&a, "GET", "/v1/sandboxes/e2e-cred/egress", Some(&t), b"");
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains(&secret));
    let events: Value = serde_json::from_str(&text).unwrap();
    let events = events["egress"].as_array().unwrap();
    let summary: Vec<(String, String, String)> = events
        .iter()
        .map(|e| {
            (
                e["decision"].as_str().unwrap().to_string(),
                e["path"].as_str().unwrap().to_string(),
                e["credentials"].to_string(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "allow".to_string(),
                "/api/x".to_string(),
                "[\"authorization\"]".to_string()
            ),
            (
                "allow".to_string(),
                "/public/y".to_string(),
                "[]".to_string()
            ),
            (
                "deny".to_string(),
                "/elsewhere".to_string(),
                "null".to_string()
            ),
        ],
        "{events:?}"
    );
    let o = srv.cli(&["egress", "e2e-cred"]);
    let lines = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // An admitted row names the upstream's host:port (the test server's port is random).
    assert!(
        lines.lines().any(|l| l.contains("allow GET 127.0.0.2:")
            && l.contains("/api/x  https 200")
            && l.contains("+authorization")),
        "{lines}"
    );
    assert!(
        lines.contains("deny  GET 127.0.0.2/elsewhere  path"),
        "{lines}"
    );
    assert!(!lines.contains(&secret));

    // The secret is removed by the approver; the next fence naming it is a 409.
    let o = srv.cli(&["secret", "rm", "api-token"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (status, _) = exec(
        json!({ "rules": [{ "host": host, "headers": { "Authorization": { "secret": "api-token" } } }] }),
        "true",
    );
    assert_eq!(status, 409);

    // Nothing the server logged holds the value.
    let status = srv.log.clone();
    let stopped = srv.stop();
    assert!(stopped.success());
    let log = status.lock().unwrap().join("\n");
    assert!(
        log.contains("CANONICAL-EGRESS-DECISION"),
        "the log was captured"
    );
    assert!(!log.contains(&secret), "the server's log holds the secret");
}

/// A secret's binding (DESIGN §5) through the real binary with the consumer token only: a
/// secret the approver bound to one upstream's `GET /api/` cannot be sent anywhere else.
/// Each grant that would carry it outside its binding (an attacker's host, another port, no
/// port, a wider path, another method, a wildcard) is refused 400 before anything runs: no
/// container for the new key, nothing in its egress audit, nothing at the attacker's
/// upstream. An old secret (set before bindings) is refused too.
#[test]
fn a_consumer_cannot_send_a_secret_outside_its_binding() {
    let up = HttpsUpstream::start("127.0.0.2");
    let attacker = HttpsUpstream::start("127.0.0.3");
    let ca_dir = stockade_tests::TempDir::new("e2e-ca");
    let ca = ca_file(ca_dir.path(), &up.ca_pem);
    let ca2 = ca_dir.path().join("attacker-ca.pem");
    std::fs::write(&ca2, &attacker.ca_pem).unwrap();
    // No warm containers: any container under the cgroup root is one a refused exec
    // made.
    let srv = Server::start_with(|c| {
        c.egress.extra_ca_files = vec![ca, ca2];
        c.substrate.warm = 0;
    });
    let (t, approver, a) = (srv.token(), srv.approver_token(), srv.addr.clone());
    let secret = format!("e2e-bound-{}", uuid::Uuid::new_v4().simple());
    let host = up.addr.to_string();
    let set = serde_json::to_vec(&json!({
        "value": secret, "host": host, "methods": ["GET"], "path_prefix": "/api/",
    }))
    .unwrap();
    let (status, text) = http(&a, "PUT", "/v1/secrets/s", Some(&approver), &set);
    assert_eq!(status, 204, "{text}");
    // A binding the grammar refuses is a 400 that never echoes the value.
    for (what, bad) in [
        (
            "a wildcard host",
            json!({ "value": secret, "host": "*.example.com", "methods": ["GET"] }),
        ),
        (
            "no methods",
            json!({ "value": secret, "host": host, "methods": [] }),
        ),
        (
            "TRACE",
            json!({ "value": secret, "host": host, "methods": ["TRACE"] }),
        ),
        ("no binding at all", json!({ "value": secret })),
    ] {
        let body = serde_json::to_vec(&bad).unwrap();
        let (status, text) = http(&a, "PUT", "/v1/secrets/s", Some(&approver), &body);
        assert_eq!(status, 400, "{what}: {text}");
        assert!(!text.contains(&secret), "{what}: the value echoed: {text}");
    }

    let attack = attacker.addr.to_string();
    let script = r#"curl -s -o /dev/null -w '%{http_code}\n' --max-time 5 "$TARGET/api/x"; echo ran > /workspace/ran"#;
    let cred = json!({ "Authorization": { "secret": "s" } });
    let ip_only = attack.split(':').next().unwrap().to_string();
    let rows: Vec<(&str, Value)> = vec![
        (
            "the attack's grant: any method to the attacker",
            json!({ "host": attack, "headers": cred }),
        ),
        (
            "GET /api/ at the attacker",
            json!({ "host": attack, "methods": ["GET"], "path_prefix": "/api/", "headers": cred }),
        ),
        (
            "the attacker without a port (443)",
            json!({ "host": ip_only, "methods": ["GET"], "headers": cred }),
        ),
        (
            "the bound host without its port (443)",
            json!({ "host": "127.0.0.2", "methods": ["GET"], "path_prefix": "/api/", "headers": cred }),
        ),
        (
            "the bound host, the whole path",
            json!({ "host": host, "methods": ["GET"], "headers": cred }),
        ),
        (
            "the bound host, a method it does not bind",
            json!({ "host": host, "methods": ["GET", "POST"], "path_prefix": "/api/", "headers": cred }),
        ),
    ];
    for (i, (what, rule)) in rows.into_iter().enumerate() {
        let key = format!("e2e-bind-{i}");
        let target = if what.contains("attacker") {
            attacker.base()
        } else {
            up.base()
        };
        let body = serde_json::to_vec(&json!({
            "argv": ["sh", "-c", script],
            "env": { "TARGET": target },
            "grant": { "rules": [rule] },
        }))
        .unwrap();
        let (status, text) = http(
            &a,
            "POST",
            &format!("/v1/sandboxes/{key}/exec"),
            Some(&t),
            &body,
        );
        assert_eq!(status, 400, "{what}: {text}");
        assert!(text.contains("invalid-input"), "{what}: {text}");
        assert!(text.contains("rule 0"), "{what}: names the rule: {text}");
        assert!(!text.contains(&secret), "{what}: the value echoed: {text}");
        // Nothing ran: no container for the new key, nothing in its audit.
        srv.assert_clean();
        let (status, audit) = http(
            &a,
            "GET",
            &format!("/v1/sandboxes/{key}/egress"),
            Some(&t),
            b"",
        );
        assert_eq!(status, 200, "{audit}");
        assert_eq!(
            serde_json::from_str::<Value>(&audit).unwrap()["egress"],
            json!([]),
            "{what}"
        );
    }
    assert!(
        attacker.seen().is_empty(),
        "the attacker saw {:?}",
        attacker.seen()
    );
    assert!(up.seen().is_empty(), "{:?}", up.seen());

    // Inside the binding: the credential reaches the bound upstream.
    let body = serde_json::to_vec(&json!({
        "argv": ["sh", "-c", r#"curl -s -o /dev/null -w '%{http_code}\n' --max-time 5 "$TARGET/api/x""#],
        "env": { "TARGET": up.base() },
        "grant": { "rules": [
            { "host": host, "methods": ["GET"], "path_prefix": "/api/x", "headers": cred }
        ] },
    }))
    .unwrap();
    let (status, text) = http(
        &a,
        "POST",
        "/v1/sandboxes/e2e-bind-ok/exec",
        Some(&t),
        &body,
    );
    assert_eq!(status, 200, "{text}");
    let outcome: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(outcome["stdout"], "200\n", "{outcome}");
    let seen = up.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].authorization.as_deref(), Some(secret.as_str()));
    assert!(srv.stop().success());
}
