//! Benchmark 4: `detached-status` latency, in-process and over HTTP, vs the substrate's
//! `process_status` (the supervisor round trip it makes) and a bare `instance()`; and
//! side by side, the same call on a runtime whose pool resets released slots with
//! `madvise` only (`keep_resident_kib = 0`: before issue 25).

use std::sync::Arc;
use std::time::Instant;

use stockade_host::bindings::{DetachedState, ExecInput};
use stockade_host::runtime::{Compiled, Runtime};
use stockade_host::substrate::Substrate;

use crate::common::*;

pub async fn run(env: &Env) -> Vec<Row> {
    let key = "bench-status";
    let input = ExecInput {
        argv: vec!["sleep".into(), "1000".into()],
        ..true_input()
    };
    let id = env.rt.start_detached(key, &input).await.expect("start");
    let c = env.linux.current(key).await.unwrap().expect("container");
    let mut madvise_cfg = env.cfg.clone();
    madvise_cfg.engine.keep_resident_kib = 0;
    let madvise = Runtime::from_compiled(
        &Compiled::new(&madvise_cfg).expect("compile"),
        &madvise_cfg,
        env.linux.clone(),
        env.store.clone(),
    )
    .expect("runtime");
    let madvise = Arc::new(madvise);
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
    let mut before = vec![];
    for _ in 0..n {
        let t = Instant::now();
        let s = madvise.detached_status(key, &id).await.unwrap();
        before.push(t.elapsed());
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
    let before = Stats::of(before);
    detail("detached-status, library", &lib);
    detail("detached-status, library, madvise pool (before)", &before);
    detail("detached-status, HTTP API (keep-alive)", &api);
    detail("substrate process_status (supervisor round trip)", &sub);
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
            "status: detached-status in-process, madvise pool (before, median)",
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
