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
