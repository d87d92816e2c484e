//! Benchmark 5: Per-call instantiation: `Runtime::instance()` (store + instantiate from the
//! `InstancePre`) with the pooling allocator as configured, vs the same pool resetting
//! released slots with `madvise` only (`keep_resident_kib = 0`, wasmtime's default, the
//! configuration before issue 25), vs on-demand; interleaved.
//!
//! Three figures per allocator: `instance()` alone (the row's figure, as before), a
//! whole cycle (`instance()` then its release: a call pays both), and a whole facade
//! call on the mock substrate (`detached-status` of an id nobody declared: one
//! instance, one record read, the guest's code dirtying its memory, the release).

use std::sync::Arc;
use std::time::{Duration, Instant};

use stockade_host::runtime::{Allocation, Compiled, Runtime};
use stockade_host::substrate::mock::Mock;

use crate::common::*;

/// One allocator's samples.
#[derive(Default)]
struct Samples {
    alone: Vec<Duration>,
    cycle: Vec<Duration>,
    call: Vec<Duration>,
}

async fn sample(rt: &Runtime, s: &mut Samples) {
    let t = Instant::now();
    let i = rt.instance().await.unwrap();
    s.alone.push(t.elapsed());
    drop(i);
    let t = Instant::now();
    drop(rt.instance().await.unwrap());
    s.cycle.push(t.elapsed());
    let t = Instant::now();
    let r = rt
        .detached_status("bench-instance", "3f2b8c1e-0000-4000-8000-00000000002a")
        .await;
    s.call.push(t.elapsed());
    assert!(r.is_ok(), "{r:?}");
}

pub async fn run(env: &Env) -> Vec<Row> {
    let mut od_cfg = env.cfg.clone();
    od_cfg.engine.pooling = false;
    let on_demand = Compiled::new(&od_cfg).expect("compile");
    assert_eq!(on_demand.allocation(), Allocation::OnDemand);
    let mut madvise_cfg = env.cfg.clone();
    madvise_cfg.engine.keep_resident_kib = 0;
    let madvise = Compiled::new(&madvise_cfg).expect("compile");
    let rt = |c: &Compiled, cfg| {
        Runtime::from_compiled(c, cfg, Arc::new(Mock::new(16)), env.store.clone()).unwrap()
    };
    let pooled_rt = rt(&env.compiled, &env.cfg);
    let madvise_rt = rt(&madvise, &madvise_cfg);
    let od_rt = rt(&on_demand, &od_cfg);
    println!(
        "  pooled runtime allocation: {:?}; keep_resident_kib {} (before: 0)",
        pooled_rt.allocation(),
        env.cfg.engine.keep_resident_kib
    );
    let (mut p, mut m, mut o) = (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..100 {
        sample(&pooled_rt, &mut p).await;
        sample(&madvise_rt, &mut m).await;
        sample(&od_rt, &mut o).await;
    }
    let (mut p, mut m, mut o) = (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..iters(3000) {
        sample(&pooled_rt, &mut p).await;
        sample(&madvise_rt, &mut m).await;
        sample(&od_rt, &mut o).await;
    }
    let stats = |s: Samples| (Stats::of(s.alone), Stats::of(s.cycle), Stats::of(s.call));
    let (p, m, o) = (stats(p), stats(m), stats(o));
    for (name, (alone, cycle, call)) in [
        ("pooled, reset in place", &p),
        ("pooled, madvise (before)", &m),
        ("on-demand", &o),
    ] {
        detail(&format!("instance(), {name}"), alone);
        detail(&format!("instance() + release, {name}"), cycle);
        detail(&format!("mock detached-status call, {name}"), call);
    }
    let pooled = pooled_rt.allocation() == Allocation::Pooling;
    vec![
        row(
            "5",
            format!(
                "instantiation: per-call instance, {} (median)",
                if pooled { "pooled" } else { "POOL UNAVAILABLE" }
            ),
            format!("{} (p95 {})", fmt_d(p.0.median), fmt_d(p.0.p95)),
            format!(
                "madvise pool {}, on-demand {}",
                fmt_d(m.0.median),
                fmt_d(o.0.median)
            ),
            format!("{:.2}×", ratio(p.0.median, m.0.median)),
            "≤ 5 µs pooled",
            Some(pooled && p.0.median.as_micros() <= 5),
        ),
        row(
            "5",
            "instantiation: instance + release, pooled (median)",
            format!("{} (p95 {})", fmt_d(p.1.median), fmt_d(p.1.p95)),
            format!("madvise pool {}", fmt_d(m.1.median)),
            format!("{:.2}×", ratio(p.1.median, m.1.median)),
            "–",
            None,
        ),
        row(
            "5",
            "instantiation: a whole call on the mock, pooled (median)",
            format!("{} (p95 {})", fmt_d(p.2.median), fmt_d(p.2.p95)),
            format!("madvise pool {}", fmt_d(m.2.median)),
            format!("{:.2}×", ratio(p.2.median, m.2.median)),
            "–",
            None,
        ),
    ]
}
