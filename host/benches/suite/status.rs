//! Benchmark 4: `detached-status` latency, in-process and over HTTP, vs the substrate's
//! `process_status` (for a running process the host's read of its leaf's `cgroup.events`;
//! the supervisor round trip otherwise) and a bare `instance()`; and
//! side by side, the same call with the per-call instance as it once was
//! ([`Before`](crate::instance::Before): the guest with std's WASI imported, bindgen's
//! per-instance export type checks), in the same engine, pool and substrate.

use std::time::Instant;

use stockade_runtime::bindings::{DetachedState, ExecInput};
use stockade_runtime::runtime::Runtime;
use stockade_runtime::substrate::Substrate;

use crate::common::*;
use crate::instance::Before;

pub async fn run(env: &Env) -> Vec<Row> {
    let key = "bench-status";
    let input = ExecInput {
        argv: vec!["sleep".into(), "1000".into()],
        ..true_input()
    };
    let id = env.rt.start_detached(key, &input).await.expect("start");
    let c = env.linux.current(key).await.unwrap().expect("container");
    let before = Runtime::from_compiled(
        &env.compiled,
        &env.cfg,
        env.linux.clone(),
        env.store.clone(),
    )
    .expect("runtime");
    let before = Before::new(before).expect("the guest with WASI (host/runtime/build.rs)");
    let mut http = env.http();
    let path = format!("/v1/sandboxes/{key}/detached/{id}");
    for _ in 0..50 {
        assert_eq!(
            env.rt.detached_status(key, &id).await.unwrap(),
            DetachedState::Running
        );
    }
    let n = iters(2000);
    let (mut lib, mut api, mut sub, mut inst) = (vec![], vec![], vec![], vec![]);
    let mut before_t = vec![];
    for _ in 0..n {
        let t = Instant::now();
        let s = before.detached_status(key, &id).await;
        before_t.push(t.elapsed());
        assert_eq!(s, DetachedState::Running);

        let t = Instant::now();
        let s = env.rt.detached_status(key, &id).await.unwrap();
        lib.push(t.elapsed());
        assert_eq!(s, DetachedState::Running);

        let d = tokio::task::block_in_place(|| {
            let t = Instant::now();
            let (st, body) = http.request("GET", &path, None);
            let d = t.elapsed();
            assert_eq!(st, 200, "{body}");
            d
        });
        api.push(d);

        let t = Instant::now();
        let p = env.linux.process_status(&c, &id).await.unwrap();
        sub.push(t.elapsed());
        assert!(p.is_some());

        let t = Instant::now();
        let i = env.rt.instance().await.unwrap();
        inst.push(t.elapsed());
        drop(i);
    }
    env.rt.stop_detached(key, &id).await.unwrap();
    env.rt.abort(key).await.unwrap();
    let (lib, api, sub, inst) = (
        Stats::of(lib),
        Stats::of(api),
        Stats::of(sub),
        Stats::of(inst),
    );
    let before = Stats::of(before_t);
    detail("detached-status, library", &lib);
    detail(
        "detached-status, library, before (WASI guest, bindgen load)",
        &before,
    );
    detail("detached-status, HTTP API (keep-alive)", &api);
    detail("substrate process_status (running: its leaf read)", &sub);
    detail("a fresh instance alone", &inst);
    vec![
        row(
            "4",
            "status: detached-status in-process (median)",
            format!("{} (p95 {})", fmt_d(lib.median), fmt_d(lib.p95)),
            format!("substrate process_status {}", fmt_d(sub.median)),
            format!("{:.2}×", ratio(lib.median, sub.median)),
            "≤ 1.5× the substrate call",
            Some(ratio(lib.median, sub.median) <= 1.5),
        ),
        row(
            "4",
            "status: detached-status in-process, before (WASI guest, bindgen load; median)",
            format!("{} (p95 {})", fmt_d(before.median), fmt_d(before.p95)),
            format!("substrate process_status {}", fmt_d(sub.median)),
            format!("{:.2}×", ratio(before.median, sub.median)),
            "–",
            None,
        ),
        row(
            "4",
            "status: detached-status over HTTP (median)",
            format!("{} (p95 {})", fmt_d(api.median), fmt_d(api.p95)),
            format!("in-process {}", fmt_d(lib.median)),
            format!("{:.2}×", ratio(api.median, lib.median)),
            "–",
            None,
        ),
    ]
}
