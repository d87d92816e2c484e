//! One canonical line per decision (`CANONICAL-EGRESS-DECISION`, target
//! `stockade::egress`), with the fields the docs name.

use super::*;

#[test]
fn each_decision_logs_exactly_one_canonical_line() {
    capture_logs();
    // One thread runs everything, so this thread's buffer holds every line.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    {
        rt.block_on(async {
            let up = upstream().await;
            let p = proxy();
            p.fence
                .apply("fence-9", grant(&[("127.0.0.1", &["GET"], Some("/ok/"))]));
            let mut c = client(&p).await;
            assert_eq!(
                c.get(&format!("http://{}/ok/1", up.addr)).await.status,
                StatusCode::OK
            );
            assert_eq!(
                c.get(&format!("http://{}/no", up.addr)).await.status,
                StatusCode::FORBIDDEN
            );
        })
    }
    let text = LOG.with(|l| String::from_utf8(l.borrow().clone()).unwrap());
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("CANONICAL-EGRESS-DECISION"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    for want in [
        "decision=\"allow\"",
        "rule=0",
        "path=\"/ok/1\"",
        "fence=\"fence-9\"",
        "container=container-1",
    ] {
        assert!(
            lines[0].contains(want),
            "allow line lacks {want}: {}",
            lines[0]
        );
    }
    for want in [
        "decision=\"deny\"",
        "reason=\"path\"",
        "method=\"GET\"",
        "host=\"127.0.0.1\"",
    ] {
        assert!(
            lines[1].contains(want),
            "deny line lacks {want}: {}",
            lines[1]
        );
    }
}

/// One canonical decision line (docs/EGRESS.md): every decision's line has the one field
/// set. An allow, a deny and a request that is no proxy request at all (`invalid`, which
/// said `why` and named neither key nor fence before the line was built in one place)
/// each name the decision, the method, the key, the container and the fence open at the
/// time, and the fields of their kind: `rule`, `via`, `host`, `port`, `path` for an
/// allow, `reason`, `host`, `port`, `path` for a deny, `reason` for an invalid request.
#[test]
fn every_decision_line_has_the_one_field_set() {
    capture_logs();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let up = upstream().await;
        let p = proxy();
        p.fence
            .apply("fence-7", grant(&[("127.0.0.1", &["GET"], Some("/ok/"))]));
        let mut c = client(&p).await;
        let allowed = c.get(&format!("http://{}/ok/1", up.addr)).await.status;
        assert_eq!(allowed, StatusCode::OK);
        let denied = c.get(&format!("http://{}/no", up.addr)).await.status;
        assert_eq!(denied, StatusCode::FORBIDDEN);
        let invalid = raw_exchange(
            p.addr,
            b"GET /origin-form HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(invalid, [400]);
    });
    let text = LOG.with(|l| String::from_utf8(l.borrow().clone()).unwrap());
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("CANONICAL-EGRESS-DECISION"))
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    let common = [
        "method=\"GET\"",
        "key=key-1",
        "container=container-1",
        "fence=\"fence-7\"",
    ];
    let kinds: [(&str, &[&str]); 3] = [
        (
            "decision=\"allow\"",
            &[
                "rule=0",
                "via=\"http\"",
                "host=\"127.0.0.1\"",
                "port=",
                "path=\"/ok/1\"",
            ],
        ),
        (
            "decision=\"deny\"",
            &[
                "reason=\"path\"",
                "host=\"127.0.0.1\"",
                "port=",
                "path=\"/no\"",
            ],
        ),
        ("decision=\"invalid\"", &["reason=\"send absolute-form"]),
    ];
    for (line, (decision, own)) in lines.iter().zip(kinds) {
        for want in common.iter().chain([decision].iter()).chain(own) {
            assert!(line.contains(want), "{decision} line lacks {want}: {line}");
        }
    }
}
