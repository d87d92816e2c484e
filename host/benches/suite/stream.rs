//! Live output, through the HTTP API on real containers, side by side with
//! the buffered form in the same run:
//! * latency: a command prints the wall-clock time (`date +%s%N`, the host's clock:
//!   the container has no time namespace) and then sleeps 200 ms; the streamed event's
//!   arrival minus that time is how long a written byte takes to reach the client
//!   (goal ≤ 10 ms). Next to it, the time to the first byte against the buffered
//!   form's whole answer for the same command.
//! * throughput: `cat` of a 16 MB text file in `/workspace`, streamed and buffered
//!   (the output limit raised to 32 MiB for this section's substrate), in MB/s.
//!
//! The upload row moved to the `upload` section.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;

const BIG: usize = 16_000_000;

pub async fn run(_env: &Env) -> Vec<Row> {
    let env = Env::with(|c| c.substrate.output_limit = 32 << 20).await;
    let rows = tokio::task::block_in_place(|| measure(&env));
    env.shutdown().await;
    rows
}

fn measure(env: &Env) -> Vec<Row> {
    let mut http = env.http();
    let key = "bench-stream";
    let cmd = |script: &str| serde_json::json!({ "argv": ["sh", "-c", script] }).to_string();
    let (st, body) = http.request(
        "POST",
        &format!("/v1/sandboxes/{key}/exec"),
        Some(&cmd(&format!(
            "base64 -w 76 /dev/urandom | head -c {BIG} > /workspace/big"
        ))),
    );
    assert_eq!(st, 200, "{body}");
    let n = iters(30);
    let (mut lat, mut ttfb, mut buffered) = (vec![], vec![], vec![]);
    let print_then_sleep = cmd("date +%s%N; sleep 0.2");
    for i in 0..n + 2 {
        let t = Instant::now();
        let mut first: Option<(Duration, Duration)> = None;
        let last = http.stream(
            &format!("/v1/sandboxes/{key}/exec/stream"),
            &print_then_sleep,
            |ev, at| {
                if first.is_none() && ev["type"] == "stdout" {
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                    let written: u128 = ev["data"].as_str().unwrap().trim().parse().unwrap();
                    let written = Duration::from_nanos(written as u64);
                    let arrived = now.saturating_sub(at.elapsed());
                    first = Some((arrived.saturating_sub(written), at - t));
                }
            },
        );
        assert_eq!(last["exit_code"], 0, "{last}");
        let t = Instant::now();
        let (st, body) = http.request(
            "POST",
            &format!("/v1/sandboxes/{key}/exec"),
            Some(&print_then_sleep),
        );
        let d_buf = t.elapsed();
        assert_eq!(st, 200, "{body}");
        if i >= 2 {
            let (l, f) = first.expect("a first event");
            lat.push(l);
            ttfb.push(f);
            buffered.push(d_buf);
        }
    }
    let (lat, ttfb, buffered) = (Stats::of(lat), Stats::of(ttfb), Stats::of(buffered));
    detail("stream: a written byte reaches the client", &lat);
    detail("stream: time to the first byte", &ttfb);
    detail(
        "buffered: the whole answer (prints, sleeps 200 ms)",
        &buffered,
    );

    let m = iters(5).max(3);
    let (mut s_tp, mut b_tp) = (vec![], vec![]);
    let cat = cmd("cat /workspace/big");
    for _ in 0..m {
        let t = Instant::now();
        let mut got = 0usize;
        let last = http.stream(
            &format!("/v1/sandboxes/{key}/exec/stream"),
            &cat,
            |ev, _| {
                got += ev["data"].as_str().map(str::len).unwrap_or(0);
            },
        );
        let d = t.elapsed();
        assert_eq!(
            (got, &last["truncated"]),
            (BIG, &serde_json::json!(false)),
            "{last}"
        );
        s_tp.push(d);
        let t = Instant::now();
        let (st, body) = http.request("POST", &format!("/v1/sandboxes/{key}/exec"), Some(&cat));
        let d = t.elapsed();
        assert_eq!(st, 200);
        assert!(body.len() > BIG, "the buffered answer holds the output");
        b_tp.push(d);
    }
    let (s_tp, b_tp) = (Stats::of(s_tp), Stats::of(b_tp));
    detail("stream: cat of 16 MB", &s_tp);
    detail("buffered: cat of 16 MB", &b_tp);
    let mbps = |d: Duration| BIG as f64 / 1e6 / d.as_secs_f64();
    let _ = http.request("POST", &format!("/v1/sandboxes/{key}/abort"), None);
    vec![
        row(
            "13",
            "stream: a written byte reaches the client (median)",
            format!("{} (p95 {})", fmt_d(lat.median), fmt_d(lat.p95)),
            "–",
            "–",
            "≤ 10 ms",
            Some(lat.p95 <= Duration::from_millis(10)),
        ),
        row(
            "13",
            "stream: first byte of `date; sleep 0.2` (median)",
            fmt_d(ttfb.median),
            format!("buffered answer {}", fmt_d(buffered.median)),
            format!("{:.3}×", ratio(ttfb.median, buffered.median)),
            "–",
            None,
        ),
        row(
            "13",
            "stream: cat of a 16 MB text file (median)",
            format!("{:.0} MB/s ({})", mbps(s_tp.median), fmt_d(s_tp.median)),
            format!(
                "buffered {:.0} MB/s ({})",
                mbps(b_tp.median),
                fmt_d(b_tp.median)
            ),
            format!("{:.2}×", mbps(s_tp.median) / mbps(b_tp.median)),
            "–",
            None,
        ),
    ]
}
