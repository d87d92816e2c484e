//! The egress fence seen from inside a container: the proxy at 127.0.0.1:3128 in the
//! container's netns admits what the open grant allows, denies the rest (recorded), and
//! a program that ignores the proxy reaches nothing.

use stockade_egress::rules::{Grant, RuleSpec};
use stockade_runtime::substrate::Housekeeping as _;
use stockade_runtime::substrate::Substrate;

use crate::support::{DEADLINE, harness, host_server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_admits_the_grant_and_denies_the_rest() {
    let h = harness(|_| {}).await;
    let port = host_server();
    let c = h.linux.ensure("egress").await.unwrap();
    let url = format!("http://127.0.0.2:{port}/x");
    let curl = format!("curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 {url}");
    let grant = Grant::parse(&[RuleSpec::new("127.0.0.2", &[], None)]).unwrap();
    h.linux.apply_grant(&c, "fence-1", grant).await.unwrap();
    assert_eq!(h.linux.open_grants(), vec![c.clone()]);
    let r = h.linux.run(&c, h.cmd(&curl), DEADLINE).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "200", "{r:?}");
    // Ignoring the proxy reaches nothing: the netns has only loopback.
    let direct = format!(
        "curl -s -o /dev/null -w '%{{http_code}}' --noproxy '*' --max-time 5 {url} || true"
    );
    let r = h.linux.run(&c, h.cmd(&direct), DEADLINE).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "000", "{r:?}");
    assert_eq!(h.linux.revoke_grant(&c).await.unwrap().denied, 0);
    assert!(h.linux.open_grants().is_empty());
    // No grant open: denied, and the denial is recorded for the key.
    let r = h.linux.run(&c, h.cmd(&curl), DEADLINE).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "403", "{r:?}");
    let denials = h.linux.denials("egress").await.unwrap();
    assert_eq!(denials.len(), 1, "{denials:?}");
    assert_eq!(denials[0].host, "127.0.0.2");
    h.finish().await;
}
