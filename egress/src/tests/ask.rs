//! Egress that can ask (docs/EGRESS.md), at the proxy: a request an `ask` grant refuses is
//! held until the approver's answer; approved, it proceeds and the same request passes
//! again in that fence; a CONNECT to a host no rule names is intercepted (never
//! blind) so each request inside is asked about; without interception it is denied;
//! a fence that closes answers what it held 403 and none of it can be approved.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::intercept::{PemFile, https, intercepting, pki};
use super::{DEADLINE, Proxy, curl, proxy, raw_connect, upstream, upstream_on};
use crate::ask::{Answer, AnswerError, AskLimits, Asks, Pending};
use crate::rules::Grant;

fn asking(p: &Proxy, timeout: Duration) -> Arc<Asks> {
    let asks = Asks::new(AskLimits {
        per_container: 4,
        total: 8,
        timeout,
    });
    p.fence.set_asks(asks.clone());
    p.fence
        .apply("fence-1", Grant::parse(&[]).unwrap().with_ask(true));
    asks
}

/// The one pending decision, waiting for it with the deadline.
async fn held(asks: &Asks) -> Pending {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(p) = asks.pending(None).into_iter().next() {
            return p;
        }
        assert!(Instant::now() < end, "nothing was held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_https_request_passes_and_passes_again_in_its_fence() {
    let k = pki();
    let up = upstream_on(Some(k.server.clone())).await;
    let (p, authority) = intercepting(vec![k.ca.clone()]);
    let ca = PemFile::new(authority.cert_pem());
    // Were the second request held, nobody would answer it: 403 ask-timeout.
    let asks = asking(&p, Duration::from_secs(2));
    let p = Arc::new(p);
    let first = {
        let (p, ca_path, up_addr) = (p.clone(), ca.path().to_owned(), up.addr);
        tokio::spawn(async move {
            let url = format!("https://127.0.0.1:{}/held/x?q=1&r=two", up_addr.port());
            let proxy = format!("http://{}", p.addr);
            curl(&["-x", &proxy, "--cacert", &ca_path, &url]).await
        })
    };
    let pending = held(&asks).await;
    // The approver sees the path as requested, its query included (the wire's
    // `PendingDecision::path`); the widening is the path alone.
    assert_eq!(
        (
            pending.method.as_str(),
            pending.path.as_str(),
            pending.port,
            pending.reason.as_str(),
            pending.widens.ends_with("/held/x"),
        ),
        ("GET", "/held/x?q=1&r=two", up.addr.port(), "no-rule", true)
    );
    asks.answer(&pending.id, Answer::Approve).unwrap();
    let out = first.await.unwrap();
    assert!(
        out.contains("200") && out.contains("upstream saw GET /held/x"),
        "{out}"
    );
    let again = https(&p, &ca, &up, &[], "/held/x/below").await;
    assert!(again.contains("200"), "{again}");
    assert!(asks.pending(None).is_empty());
    // Another method is another request: held, and refused.
    let post = {
        let (p, ca_path, up_addr) = (p.clone(), ca.path().to_owned(), up.addr);
        tokio::spawn(async move {
            let url = format!("https://127.0.0.1:{}/held/x", up_addr.port());
            let proxy = format!("http://{}", p.addr);
            curl(&["-x", &proxy, "--cacert", &ca_path, "-X", "POST", &url]).await
        })
    };
    let pending = held(&asks).await;
    assert_eq!(pending.method, "POST");
    asks.answer(&pending.id, Answer::Refuse).unwrap();
    let out = post.await.unwrap();
    assert!(
        out.contains("x-stockade-denial: refused-by-approver"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_interception_a_connect_is_denied_not_held_nor_blind() {
    let up = upstream().await;
    let p = proxy();
    let asks = asking(&p, Duration::from_secs(30));
    let (_s, head) = raw_connect(p.addr, &up.addr.to_string()).await;
    assert!(
        head.starts_with("HTTP/1.1 403") && head.contains("no-rule"),
        "{head}"
    );
    assert!(asks.pending(None).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_fence_answers_what_it_held_and_none_is_approved_later() {
    let up = upstream().await;
    let p = Arc::new(proxy());
    let asks = asking(&p, Duration::from_secs(30));
    let request = {
        let (p, url) = (p.clone(), format!("http://{}/held", up.addr));
        tokio::spawn(async move {
            let proxy = format!("http://{}", p.addr);
            curl(&["-x", &proxy, &url]).await
        })
    };
    let pending = held(&asks).await;
    p.fence.revoke();
    let out = request.await.unwrap();
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("x-stockade-denial: no-grant"),
        "{out}"
    );
    assert!(matches!(
        asks.answer(&pending.id, Answer::Approve),
        Err(AnswerError::Decided {
            outcome: "fence-closed",
            ..
        })
    ));
    assert!(asks.pending(None).is_empty());
}
