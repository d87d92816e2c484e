//! Benchmark `audit`: what the egress audit costs the proxy's request path.
//! Keep-alive GETs through the real proxy to a loopback upstream, with three sinks side
//! by side, interleaved round by round: none (the floor), the store written on the
//! request path (`Store::record_admitted` in the sink: how every row was written before
//! the batching writer) and the store as the proxy's sink today (queued, written in
//! batches by its thread). Each round opens a fresh fence so every request is recorded
//! (the rate bound's burst is 1000 a fence). Then the sink call alone, both ways.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stockade_egress::budget::{Budget, Limits};
use stockade_egress::rules::{Grant, RuleSpec};
use stockade_egress::{Admitted, Denial, DenialSink, Fence, ProxyOptions};
use stockade_store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// Records nothing (the floor).
struct Floor;
impl DenialSink for Floor {
    fn record(&self, _: &str, _: &str, d: Denial) {
        panic!("the audit bench was denied: {d:?}");
    }
}

/// The store written on the request path (the sink before the batching writer).
struct OnPath(Arc<Store>);
impl DenialSink for OnPath {
    fn record(&self, key: &str, container: &str, d: Denial) {
        self.0.record_denial(key, container, &d).unwrap();
    }
    fn record_admitted(&self, key: &str, container: &str, a: Admitted) {
        self.0.record_admitted(key, container, &a).unwrap();
    }
}

const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";

/// A keep-alive upstream answering every GET with a small JSON body.
async fn upstream() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = find(&buf, b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        if s.write_all(ANSWER).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Read one answer (headers and a content-length body) from `s`.
async fn answer(s: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                buf.drain(..end + 4 + len);
                return;
            }
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the proxy closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `n` keep-alive GETs through a fresh proxy with `sink`; each request's latency.
async fn through(sink: Arc<dyn DenialSink>, up: SocketAddr, n: usize, out: &mut Vec<Duration>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = listener.local_addr().unwrap();
    let fence = Fence::new("bench-audit", "bench-audit");
    fence.apply(
        "bench-audit",
        Grant::parse(&[RuleSpec::new("127.0.0.1", &[], None)]).unwrap(),
    );
    let unpaced = Limits {
        connect_burst: 1e9,
        connects_per_second: 1e9,
        handshake_burst: 1e9,
        handshakes_per_second: 1e9,
        request_burst: 1e9,
        requests_per_second: 1e9,
        accept_burst: 1e9,
        accepts_per_second: 1e9,
        ..Limits::default()
    };
    let task = stockade_egress::serve_with(
        listener,
        fence.clone(),
        // The upstream is on loopback.
        ProxyOptions {
            allow_private_targets: true,
            ..ProxyOptions::default()
        },
        sink,
        None,
        None,
        Budget::new(unpaced),
    );
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    let req = format!("GET http://{up}/index.json HTTP/1.1\r\nHost: {up}\r\n\r\n");
    let mut buf = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        s.write_all(req.as_bytes()).await.unwrap();
        answer(&mut s, &mut buf).await;
        if i >= 20 {
            out.push(t.elapsed());
        }
    }
    drop(s);
    assert_eq!(fence.revoke(), 0, "no request was denied");
    task.abort();
}

pub async fn run(_env: &Env) -> Vec<Row> {
    let dir = std::env::temp_dir().join(format!("stockade-bench-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let on_path_store = Arc::new(Store::open(&dir.join("on-path.db")).unwrap());
    let queued_store = Arc::new(Store::open(&dir.join("queued.db")).unwrap());
    let up = upstream().await;
    let sinks: [(&str, Arc<dyn DenialSink>); 3] = [
        ("none", Arc::new(Floor)),
        ("on-path", Arc::new(OnPath(on_path_store.clone()))),
        ("queued", queued_store.clone()),
    ];
    // Fewer than the fence's burst of 1000 rows: every request is recorded.
    let per_round = 520;
    let rounds = iters(12).max(3);
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for r in 0..rounds {
        for k in 0..3 {
            let i = (r + k) % 3;
            through(sinks[i].1.clone(), up, per_round, &mut samples[i]).await;
        }
    }
    let expect = rounds * per_round;
    let (a, b) = (
        on_path_store.admitted("bench-audit").unwrap().len(),
        queued_store.admitted("bench-audit").unwrap().len(),
    );
    assert_eq!((a, b), (expect, expect), "every request has its row");

    // The sink call alone: on the request path against queued, interleaved by chunks.
    let record = Admitted {
        fence: "f".into(),
        method: "GET".into(),
        host: "registry.example".into(),
        port: 443,
        path: "/pkg/index.json".into(),
        via: "https".into(),
        status: 200,
        bytes_down: 4096,
        ..Admitted::default()
    };
    let (mut sync_call, mut queued_call) = (vec![], vec![]);
    for _ in 0..iters(40).max(5) {
        for _ in 0..50 {
            let t = Instant::now();
            on_path_store
                .record_admitted("bench-call", "c", &record)
                .unwrap();
            sync_call.push(t.elapsed());
        }
        for _ in 0..50 {
            let a = record.clone();
            let t = Instant::now();
            DenialSink::record_admitted(&*queued_store, "bench-call", "c", a);
            queued_call.push(t.elapsed());
        }
    }
    let t = Instant::now();
    let flushed = queued_store.flush().unwrap();
    let flush = t.elapsed();

    let [none, on_path, queued] = samples.map(Stats::of);
    let (sync_call, queued_call) = (Stats::of(sync_call), Stats::of(queued_call));
    detail("keep-alive GET, no audit", &none);
    detail("keep-alive GET, audit written on the path", &on_path);
    detail("keep-alive GET, audit queued (batching)", &queued);
    detail("sink call, INSERT + trims on the path", &sync_call);
    detail("sink call, queued", &queued_call);
    println!(
        "  flush of {flushed} queued rows at the end: {}",
        fmt_d(flush)
    );
    drop(sinks);
    drop((on_path_store, queued_store));
    let _ = std::fs::remove_dir_all(&dir);

    let cost = |s: &Stats| s.median.saturating_sub(none.median);
    vec![
        row(
            "audit",
            "proxy keep-alive GET, audit queued, p50",
            fmt_d(queued.median),
            format!("{} no audit", fmt_d(none.median)),
            format!("{:.2}×", ratio(queued.median, none.median)),
            "≤ 1.05× no audit",
            Some(ratio(queued.median, none.median) <= 1.05),
        ),
        row(
            "audit",
            "proxy keep-alive GET, audit on the path (before), p50",
            fmt_d(on_path.median),
            format!("{} no audit", fmt_d(none.median)),
            format!("{:.2}×", ratio(on_path.median, none.median)),
            "– (before)",
            None,
        ),
        row(
            "audit",
            "audit's cost per request, queued vs on the path",
            fmt_d(cost(&queued)),
            fmt_d(cost(&on_path)),
            format!(
                "{:.2}×",
                ratio(
                    cost(&queued).max(Duration::from_nanos(1)),
                    cost(&on_path).max(Duration::from_nanos(1))
                )
            ),
            "–",
            None,
        ),
        row(
            "audit",
            "sink call, queued, p50",
            fmt_d(queued_call.median),
            format!("{} on the path", fmt_d(sync_call.median)),
            format!("{:.2}×", ratio(queued_call.median, sync_call.median)),
            "–",
            None,
        ),
    ]
}
