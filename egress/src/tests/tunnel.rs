//! CONNECT: a blind tunnel to an allowed host, a host whose rules need to see inside,
//! private targets.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_to_an_allowed_host_tunnels_bytes_both_ways() {
    let far = echo().await;
    let up = upstream().await;
    let p = proxy();
    p.fence.apply("fence-1", grant(&[("127.0.0.1", &[], None)]));
    let (mut s, head) = raw_connect(p.addr, &far.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        round_trip(&mut s, b"ping through the tunnel").await,
        b"ping through the tunnel"
    );
    assert_eq!(
        round_trip(&mut s, b"and back again").await,
        b"and back again"
    );
    // A real client: curl's --proxytunnel sends CONNECT even for http://.
    let out = curl(&[
        "-p",
        "-x",
        &format!("http://{}", p.addr),
        &format!("http://{}/over/tunnel", up.addr),
    ])
    .await;
    assert!(out.contains("upstream saw GET /over/tunnel"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_matching_only_a_path_rule_needs_interception() {
    let far = echo().await;
    let p = proxy();
    p.fence.apply(
        "fence-1",
        grant(&[("127.0.0.1", &["GET"], Some("/allowed/"))]),
    );
    let (_s, head) = raw_connect(p.addr, &far.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(
        head.contains("x-stockade-denial: needs-interception"),
        "{head}"
    );
    let d = p.sink.last();
    assert_eq!(
        (d.method.as_str(), d.path.as_str(), d.reason.as_str()),
        ("CONNECT", "", "needs-interception")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_target_is_denied_unless_allowed() {
    let up = upstream().await;
    let far = echo().await;
    let p = proxy_with(false);
    p.fence.apply(
        "fence-1",
        grant(&[("127.0.0.1", &[], None), ("localhost", &[], None)]),
    );
    let mut c = client(&p).await;
    let a = c.get(&format!("http://{}/x", up.addr)).await;
    assert_eq!(
        (a.status, a.denial.as_deref()),
        (StatusCode::FORBIDDEN, Some("private-target"))
    );
    let a = c
        .get(&format!("http://localhost:{}/x", up.addr.port()))
        .await;
    assert_eq!(
        a.denial.as_deref(),
        Some("private-target"),
        "a name resolving to loopback"
    );
    let (_s, head) = raw_connect(p.addr, &far.to_string()).await;
    assert!(head.contains("x-stockade-denial: private-target"), "{head}");
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
    assert_eq!(p.fence.revoke(), 3);
}
