//! Fuzzing the API's JSON bodies: arbitrary bytes, arbitrary JSON and
//! command bodies with arbitrary field values, POSTed to the real router (served on
//! loopback) over the real guest and the mock substrate (ceiling 16). The server never
//! answers 5xx, and keeps answering; a refused body (4xx) made no substrate call (a full
//! ticket gate's 429 made only its `ensure`), and no refusal changed a record, container
//! or process; whatever was accepted closed its fence and left no
//! undeclared process. `PROPTEST_CASES` sets the number of requests (256 by default).

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use stockade_host::api::{ApiState, router};
use stockade_tests::MockHarness;

const TOKEN: &str = "consumer-token";
const APPROVER: &str = "approver-token";

/// Every field name the bodies know, and a few they do not.
const FIELDS: &[&str] = &[
    "argv",
    "cwd",
    "env",
    "timeout_ms",
    "grant",
    "rules",
    "host",
    "methods",
    "path_prefix",
    "approval",
    "stdin",
    "stdin_base64",
    "extra",
    "",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,20}".prop_map(Value::String),
        Just(json!("echo")),
        Just(json!("example.com")),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(
                (
                    prop_oneof![
                        3 => proptest::sample::select(FIELDS).prop_map(str::to_string),
                        1 => "\\PC{0,8}",
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A command body whose fields are present or not, each well-typed or not.
fn command_body() -> impl Strategy<Value = Value> {
    let argv = prop_oneof![
        4 => Just(json!(["echo", "hi"])),
        2 => Just(json!(["background"])),
        1 => Just(json!(["git", "push", "origin"])),
        1 => Just(json!([])),
        1 => Just(json!([""])),
        2 => proptest::collection::vec("\\PC{0,12}", 0..4).prop_map(|v| json!(v)),
        1 => json_value(),
    ];
    let rule = prop_oneof![
        6 => (
            prop_oneof![
                4 => Just("example.com".to_string()),
                1 => Just("*.example.com".to_string()),
                1 => Just("a.com:0".to_string()),
                1 => Just("1.2.3".to_string()),
                1 => Just("[::1]:443".to_string()),
                1 => "\\PC{0,20}",
            ],
            proptest::collection::vec(
                prop_oneof![Just("GET".to_string()), Just("get".to_string()), "\\PC{0,6}"],
                0..3
            ),
            proptest::option::weighted(0.4, prop_oneof![
                Just("/allowed/".to_string()),
                Just("/a?b".to_string()),
                Just("no-slash".to_string()),
                "\\PC{0,12}",
            ]),
        )
            .prop_map(|(host, methods, path_prefix)| {
                json!({ "host": host, "methods": methods, "path_prefix": path_prefix })
            }),
        1 => json_value(),
    ];
    // Each optional field: mostly absent, and when present mostly well-typed.
    let field = |p: f64, good: Value| {
        proptest::option::weighted(p, prop_oneof![3 => Just(good), 1 => json_value()])
    };
    (
        argv,
        field(0.3, json!("/workspace")),
        field(0.3, json!({ "A": "b" })),
        proptest::option::weighted(
            0.3,
            prop_oneof![
                Just(json!(1000)),
                Just(json!(0)),
                Just(json!(-1)),
                Just(json!(u64::MAX)),
                Just(json!(1.5)),
            ],
        ),
        proptest::option::weighted(
            0.5,
            proptest::collection::vec(rule, 0..3).prop_map(|r| json!({ "rules": r })),
        ),
        field(0.1, json!("not-a-token")),
        proptest::option::weighted(0.05, json_value()),
    )
        .prop_map(|(argv, cwd, env, timeout, grant, approval, extra)| {
            let mut o = serde_json::Map::new();
            o.insert("argv".into(), argv);
            for (k, v) in [
                ("cwd", cwd),
                ("env", env),
                ("timeout_ms", timeout),
                ("grant", grant),
                ("approval", approval),
                ("extra", extra),
            ] {
                if let Some(v) = v {
                    o.insert(k.into(), v);
                }
            }
            Value::Object(o)
        })
}

/// One request: a path, a token and body bytes.
fn request() -> impl Strategy<Value = (String, &'static str, Vec<u8>)> {
    let key = prop_oneof![
        6 => Just("k".to_string()),
        1 => Just("other".to_string()),
        1 => Just("..".to_string()),
        1 => Just("a%2Fb".to_string()),
        1 => Just("x".repeat(300)),
        1 => "[a-zA-Z0-9%._-]{0,12}",
    ];
    let endpoint = prop_oneof![
        4 => Just(("exec", TOKEN)),
        2 => Just(("detached", TOKEN)),
        1 => Just(("approvals", APPROVER)),
    ];
    let body = prop_oneof![
        8 => command_body().prop_map(|v| v.to_string().into_bytes()),
        2 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..300),
        1 => command_body().prop_flat_map(|v| {
            let text = v.to_string().into_bytes();
            let n = text.len();
            (Just(text), 0..=n).prop_map(|(t, cut)| t[..cut].to_vec())
        }),
    ];
    (key, endpoint, body)
        .prop_map(|(key, (what, token), body)| (format!("/v1/sandboxes/{key}/{what}"), token, body))
}

/// POST `body` to `path`; the status and the body of the answer.
async fn post(addr: std::net::SocketAddr, path: &str, token: &str, body: &[u8]) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: stockade\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut got))
        .await
        .expect("the server answers")
        .unwrap();
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

/// What a request may change, as the harness sees it.
#[derive(Debug, PartialEq)]
struct Seen {
    records: Vec<(String, String, String)>,
    tracked: BTreeSet<(String, String, String, bool)>,
    live: usize,
    open: Vec<String>,
}

fn seen(h: &MockHarness) -> Seen {
    Seen {
        records: h.store.all_records().expect("records"),
        tracked: h
            .mock
            .tracked()
            .into_iter()
            .map(|(k, c, p)| (k, c, p.id, p.running))
            .collect(),
        live: h.mock.live(),
        open: h.mock.open_grants_now(),
    }
}

#[test]
fn api_bodies_never_crash_and_a_refused_one_changes_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let h = MockHarness::new();
    let addr = rt.block_on(async {
        let state = Arc::new(ApiState {
            runtime: h.rt.clone(),
            token: TOKEN.into(),
            approver_token: APPROVER.into(),
            approval_ttl_ms: 60_000,
            secrets: stockade_egress::secrets::Secrets::new(
                h.rt.store().clone(),
                Default::default(),
            ),
            tenants: stockade_host::tenants::Tenants::load(h.rt.store().clone(), 4).unwrap(),
        });
        let app = router(state, 64 * 1024);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    });
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let statuses = std::sync::Mutex::new(std::collections::BTreeMap::<u16, u32>::new());
    let result = runner.run(&request(), |(path, token, body)| {
        let before = seen(&h);
        h.mock.clear_trace();
        let (status, answer) = rt.block_on(post(addr, &path, token, &body));
        *statuses.lock().unwrap().entry(status).or_default() += 1;
        let what = format!(
            "{path} {:?} -> {status} {answer}",
            String::from_utf8_lossy(&body)
        );
        let over_capacity = status == 429 && answer.contains("\"over-capacity\"");
        prop_assert!(status < 500, "a server error: {what}");
        prop_assert!(
            h.mock.open_grants_now().is_empty(),
            "a grant is open: {what}"
        );
        if status >= 400 {
            prop_assert!(
                answer.contains("\"code\""),
                "a refusal without a typed error: {what}"
            );
            if !over_capacity {
                prop_assert_eq!(
                    h.mock.ops(),
                    Vec::<&str>::new(),
                    "a refused body reached the substrate: {}",
                    what
                );
            }
            prop_assert_eq!(
                &seen(&h),
                &before,
                "a refused body changed something: {}",
                what
            );
        } else {
            let declared: BTreeSet<(String, String, String)> = h
                .store
                .all_records()
                .expect("records")
                .into_iter()
                .filter_map(|(k, n, c)| {
                    n.strip_prefix("detached/").map(|id| (k, c, id.to_string()))
                })
                .collect();
            for (k, c, p) in h.mock.tracked() {
                prop_assert!(
                    !p.running || declared.contains(&(k.clone(), c.clone(), p.id.clone())),
                    "an undeclared process runs after {}: {} {} {}",
                    what,
                    k,
                    c,
                    p.id
                );
            }
        }
        Ok(())
    });
    let statuses = statuses.into_inner().unwrap();
    eprintln!("API fuzz statuses: {statuses:?}");
    result.unwrap();
    // Still serving.
    let (status, _) = rt.block_on(post(
        addr,
        "/v1/sandboxes/k/exec",
        TOKEN,
        br#"{"argv":["echo","ok"]}"#,
    ));
    assert_eq!(status, 200);
    assert!(
        statuses.keys().any(|s| *s < 300) && statuses.keys().any(|s| *s >= 400),
        "the fuzz must reach both answers: {statuses:?}"
    );
}
