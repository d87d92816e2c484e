//! The framing table and the smuggling fuzz: only the request that was decided ever
//! reaches an upstream, whatever bytes a client sends (ambiguous framing, bodies on
//! bodiless methods, a body answered early, upstreams that ignore GET bodies).

use super::*;
use crate::framing::{body_error, framing_error};

#[test]
fn ambiguous_framing_is_refused() {
    let h = |pairs: &[(&str, &str)]| {
        let mut m = hyper::HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    };
    let rows: &[(&[(&str, &str)], bool)] = &[
        (&[("content-length", "4")], true),
        (&[("transfer-encoding", "chunked")], true),
        (&[("transfer-encoding", "CHUNKED")], true),
        (
            &[("content-length", "4"), ("transfer-encoding", "chunked")],
            false,
        ),
        (&[("content-length", "0"), ("content-length", "0")], false),
        (&[("content-length", "+4")], false),
        (&[("content-length", "")], false),
        (&[("transfer-encoding", "gzip, chunked")], false),
        (
            &[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked"),
            ],
            false,
        ),
        (&[], true),
    ];
    for (headers, ok) in rows {
        assert_eq!(framing_error(&h(headers)).is_none(), *ok, "{headers:?}");
    }
}

/// What reaches the upstream is only what was decided on (docs/EGRESS.md, "The
/// decision"). A table of raw requests (ambiguous framing, a smuggled second request,
/// obsolete folding, bare LF, encoded separators, dot segments) through a proxy whose
/// grant admits only `/allowed/`; the upstream never sees anything else, and an admitted
/// path arrives as the proxy resolved it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_decided_request_reaches_the_upstream() {
    let mut up = upstream().await;
    let p = proxy();
    p.fence
        .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
    let u = up.addr.to_string();
    let rows = decided_request_rows(&u, &format!("http://{u}"));
    for (what, raw, want) in &rows {
        let got = raw_exchange(p.addr, raw.as_bytes()).await;
        // Exactly the one answer: nothing after it was parsed as another request.
        assert_eq!(&got[..], *want, "{what}: answered {got:?}");
    }
    let mut seen = Vec::new();
    while let Ok(path) = up.seen.try_recv() {
        seen.push(path);
    }
    assert!(
        !seen.iter().any(|p| p.contains("secret")),
        "a request nobody decided on reached the upstream: {seen:?}"
    );
    // The three admitted: the CL+TE one (hyper frames it by Transfer-Encoding, as
    // RFC 9112 §6.1 allows, drops Content-Length and closes the connection after
    // it), the bare-LF one, and the resolved one.
    assert_eq!(
        seen,
        ["/allowed/x", "/allowed/lf", "/allowed/y"],
        "the upstream saw {seen:?}"
    );
}

/// Fuzzing (docs/INVARIANTS.md, "The failure surface"): arbitrary raw requests (a grammar
/// of tricky request lines, headers, framings and bodies, then random byte overwrites and
/// truncation) through a proxy whose grant admits only `/allowed/`. The proxy never dies,
/// answers or closes every connection, and the upstream never sees a path outside the
/// prefix, a dot segment or an encoded separator. `PROPTEST_CASES` sets the number of
/// requests (256 by default; the long run is in the README).
#[test]
fn arbitrary_raw_requests_never_reach_past_the_decision() {
    fuzz_raw_requests(false);
}

/// The same fuzzing against an upstream that reads GET requests' heads only: a body it
/// ignores would be its next request.
#[test]
fn arbitrary_raw_requests_never_reach_past_the_decision_of_an_upstream_ignoring_get_bodies() {
    fuzz_raw_requests(true);
}

fn fuzz_raw_requests(ignoring_upstream: bool) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (mut up, p) = rt.block_on(async {
        let up = if ignoring_upstream {
            ignoring_upstream_on(None, false).await
        } else {
            upstream().await
        };
        let p = proxy();
        p.fence
            .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
        (up, p)
    });
    let u = up.addr.to_string();

    let segment = prop_oneof![
        Just("allowed"),
        Just("secret.txt"),
        Just(".."),
        Just("."),
        Just("%2e%2e"),
        Just("%2F"),
        Just("%2f"),
        Just("%5C"),
        Just(";x"),
        Just(""),
        Just("x"),
        Just("%00"),
    ];
    let target = (
        prop_oneof![
            12 => Just("http://{U}/allowed"),
            4 => Just("http://{U}"),
            1 => Just("http://{U}:99999"),
            1 => Just("HTTP://{U}"),
            1 => Just("http://user@{U}"),
            1 => Just(""),
            1 => Just("{U}"),
        ],
        proptest::collection::vec(segment, 0..6),
        prop_oneof![
            6 => Just(""),
            1 => Just("?a=%2F"),
            1 => Just("#frag"),
            1 => Just("?../secret.txt"),
        ],
    )
        .prop_map(|(base, segs, q)| format!("{base}/{}{q}", segs.join("/")));
    let header = prop_oneof![
        20 => Just("Host: {U}"),
        10 => Just("Connection: close"),
        1 => Just("Host: evil.example"),
        1 => Just("Content-Length: 0"),
        1 => Just("Content-Length: 5"),
        1 => Just("Content-Length: 100"),
        1 => Just("Content-Length: -1"),
        1 => Just("Content-Length: 1, 1"),
        1 => Just("Transfer-Encoding: chunked"),
        1 => Just("Transfer-Encoding: gzip, chunked"),
        1 => Just("Transfer-Encoding : chunked"),
        1 => Just(" folded: continuation"),
        1 => Just("Connection: keep-alive"),
        1 => Just("Expect: 100-continue"),
        1 => Just("Upgrade: websocket"),
        1 => Just("Proxy-Authorization: Basic x"),
        1 => Just("X-\u{0}: nul"),
        1 => Just(": no-name"),
    ];
    let body = prop_oneof![
        6 => Just(String::new()),
        1 => Just("hello".to_string()),
        1 => Just("0\r\n\r\n".to_string()),
        1 => Just("5\r\nhello\r\n0\r\n\r\n".to_string()),
        1 => Just("zz\r\n".to_string()),
        2 => Just("0\r\n\r\nGET http://{U}/secret.txt HTTP/1.1\r\nHost: {U}\r\n\r\n".to_string()),
        2 => Just("GET http://{U}/allowed/../secret.txt HTTP/1.1\r\nHost: {U}\r\n\r\n".to_string()),
        1 => "\\PC{0,40}",
    ];
    let request = (
        prop_oneof![
            8 => Just("GET"),
            4 => Just("POST"),
            1 => Just("CONNECT"),
            1 => Just("get"),
            1 => Just("G ET"),
        ],
        target,
        prop_oneof![
            8 => Just("HTTP/1.1"),
            2 => Just("HTTP/1.0"),
            1 => Just("HTTP/2"),
            1 => Just("HTTP/1.1 x"),
        ],
        proptest::collection::vec(header, 0..6),
        prop_oneof![8 => Just("\r\n"), 2 => Just("\n"), 1 => Just("\r")],
        body,
        prop_oneof![
            3 => Just(vec![]),
            1 => proptest::collection::vec((any::<usize>(), any::<u8>()), 1..3),
        ],
        prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)],
        0..2u8,
    )
        .prop_map(
            |(method, target, version, headers, eol, body, flips, cut, repeat)| {
                let mut text = format!("{method} {target} {version}{eol}");
                for h in headers {
                    text.push_str(h);
                    text.push_str(eol);
                }
                text.push_str(eol);
                text.push_str(&body);
                if repeat == 1 {
                    text = text.repeat(2);
                }
                let mut bytes = text.replace("{U}", &u).into_bytes();
                for (at, b) in flips {
                    if !bytes.is_empty() {
                        let i = at % bytes.len();
                        bytes[i] = b;
                    }
                }
                if let Some(c) = cut
                    && !bytes.is_empty()
                {
                    bytes.truncate(c % (bytes.len() + 1));
                }
                bytes
            },
        );

    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let addr = p.addr;
    let result = runner.run(&request, |bytes| {
        rt.block_on(async {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let _ = s.write_all(&bytes).await;
            // The client is done: a request the bytes left open ends here.
            let _ = s.shutdown().await;
            let mut sink = Vec::new();
            let read = tokio::time::timeout(DEADLINE, s.read_to_end(&mut sink)).await;
            prop_assert!(
                read.is_ok(),
                "the proxy neither answered nor closed: {:?}",
                String::from_utf8_lossy(&bytes)
            );
            prop_assert!(!p.task.is_finished(), "the proxy died");
            Ok(())
        })
    });
    let mut seen = Vec::new();
    while let Ok(path) = up.seen.try_recv() {
        seen.push(path);
    }
    result.unwrap();
    eprintln!("{} of {cases} requests reached the upstream", seen.len());
    let bad: Vec<_> = seen
        .iter()
        .filter(|path| {
            let lower = path.to_ascii_lowercase();
            !path.starts_with("/allowed/")
                || path.split('/').any(|seg| seg == ".." || seg == ".")
                || lower.contains("%2f")
                || lower.contains("%5c")
                || lower.contains("%2e")
                || path.contains(';')
        })
        .collect();
    assert!(bad.is_empty(), "the upstream saw {bad:?} (of {seen:?})");
    // Still serving: an ordinary allowed request goes through.
    let got = rt.block_on(raw_exchange(
        addr,
        format!("GET http://{u}/allowed/ok HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    ));
    assert_eq!(got, [200]);
    drop(p);
}

/// A body on GET smuggles nothing (docs/SECURITY.md, "The proxy against its own
/// clients"): the raw-socket table against an upstream that ignores GET bodies (as
/// Python's `http.server` does). A body on GET used to be forwarded on the kept
/// connection and read by the upstream as `GET /secret.txt`, a request nobody decided on;
/// bodies on GET, HEAD, OPTIONS and TRACE are refused now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_decided_request_reaches_an_upstream_that_ignores_get_bodies() {
    let mut up = ignoring_upstream_on(None, false).await;
    let p = proxy();
    p.fence
        .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
    let u = up.addr.to_string();
    let mut answers = Vec::new();
    for (what, raw, want) in decided_request_rows(&u, &format!("http://{u}")) {
        answers.push((what, raw_exchange(p.addr, raw.as_bytes()).await, want));
    }
    let seen = drain(&mut up.seen);
    assert!(
        !seen.iter().any(|p| p.contains("secret")),
        "a request nobody decided on reached the upstream: {seen:?}"
    );
    assert!(seen.iter().all(|p| p.starts_with("/allowed/")), "{seen:?}");
    for (what, got, want) in answers {
        assert_eq!(&got[..], want, "{what}: answered {got:?}");
    }
}

#[test]
fn a_body_on_a_bodiless_method_is_refused() {
    let empty = http_body_util::Empty::<Bytes>::new();
    let some = http_body_util::Full::new(Bytes::from_static(b"GET /secret.txt"));
    let rows: &[(Method, bool, bool)] = &[
        (Method::GET, false, true),
        (Method::GET, true, false),
        (Method::HEAD, true, false),
        (Method::OPTIONS, true, false),
        (Method::TRACE, true, false),
        (Method::POST, true, true),
        (Method::PUT, true, true),
        (Method::DELETE, true, true),
        (Method::HEAD, false, true),
    ];
    for (method, with_body, ok) in rows {
        let refused = if *with_body {
            body_error(method, &some)
        } else {
            body_error(method, &empty)
        };
        assert_eq!(refused.is_none(), *ok, "{method} with a body: {with_body}");
    }
}

/// An upstream that answers before the request body has arrived is
/// done with the request, so the rest of the body would be read as a new request by
/// one that does not read bodies. The proxy sends no more of it (the upstream
/// connection ends) and does not keep the connection for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_of_a_body_answered_early_never_reaches_the_upstream() {
    let mut up = ignoring_upstream_on(None, true).await;
    let p = proxy();
    p.fence
        .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
    let u = up.addr.to_string();
    let smuggled = format!("GET /secret.txt HTTP/1.1\r\nHost: {u}\r\n\r\n");
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    s.write_all(
        format!(
            "POST http://{u}/allowed/upload HTTP/1.1\r\nHost: {u}\r\nContent-Length: {}\r\n\r\n",
            smuggled.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let first = next_answer(&mut s).await;
    assert!(
        first.starts_with("HTTP/1.1 200"),
        "answered on the head: {first}"
    );
    // The body, then the next request on the same connection: on a kept upstream
    // connection the upstream would read both, in order.
    let after = format!("GET http://{u}/allowed/after HTTP/1.1\r\nHost: {u}\r\n\r\n");
    let _ = s.write_all(format!("{smuggled}{after}").as_bytes()).await;
    let _ = next_answer(&mut s).await;
    let seen = drain(&mut up.seen);
    assert!(
        !seen.iter().any(|p| p.contains("secret")),
        "the rest of the body reached the upstream as a request: {seen:?}"
    );
    assert_eq!(seen.first().map(String::as_str), Some("/allowed/upload"));
}

/// A body on DELETE (or an extension method), which an upstream
/// may ignore, goes on a connection the upstream is told to close after it: an
/// upstream that ignores the body does not read it as its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_an_upstream_may_ignore_ends_its_connection() {
    let mut up = ignoring_upstream_on(None, true).await;
    let p = proxy();
    p.fence
        .apply("f", grant(&[("127.0.0.1", &[], Some("/allowed/"))]));
    let u = up.addr.to_string();
    let inner = format!("GET /secret.txt HTTP/1.1\r\nHost: {u}\r\n\r\n");
    for method in ["DELETE", "PROPFIND"] {
        let got = raw_exchange(
            p.addr,
            format!(
                "{method} http://{u}/allowed/x HTTP/1.1\r\nHost: {u}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{inner}",
                inner.len()
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(got, [200], "{method}");
    }
    // A request after them reaches the upstream: what came before it did, too.
    let got = raw_exchange(
        p.addr,
        format!("GET http://{u}/allowed/last HTTP/1.1\r\nHost: {u}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert_eq!(got, [200]);
    let seen = drain(&mut up.seen);
    assert!(
        !seen.iter().any(|p| p.contains("secret")),
        "the ignored body was read as a request: {seen:?}"
    );
    assert_eq!(seen, ["/allowed/x", "/allowed/x", "/allowed/last"]);
}
