//! Benchmark 5: Per-call instantiation: `Runtime::instance()` (store + instantiate from the
//! `InstancePre`) with the pooling allocator vs on-demand, interleaved.

use std::sync::Arc;
use std::time::Instant;

use stockade_host::runtime::{Allocation, Compiled, Runtime};
use stockade_host::substrate::mock::Mock;

use crate::common::*;

pub async fn run(env: &Env) -> Vec<Row> {
    let mut cfg = env.cfg.clone();
    cfg.engine.pooling = false;
    let on_demand = Compiled::new(&cfg).expect("compile");
    assert_eq!(on_demand.allocation(), Allocation::OnDemand);
    let pooled_rt = Runtime::from_compiled(
        &env.compiled,
        &env.cfg,
        Arc::new(Mock::new(16)),
        env.store.clone(),
    )
    .unwrap();
    let od_rt =
        Runtime::from_compiled(&on_demand, &cfg, Arc::new(Mock::new(16)), env.store.clone())
            .unwrap();
    println!("  pooled runtime allocation: {:?}", pooled_rt.allocation());
    for _ in 0..200 {
        drop(pooled_rt.instance().await.unwrap());
        drop(od_rt.instance().await.unwrap());
    }
    let n = iters(5000);
    let (mut p, mut o) = (vec![], vec![]);
    for _ in 0..n {
        let t = Instant::now();
        let i = pooled_rt.instance().await.unwrap();
        p.push(t.elapsed());
        drop(i);
        let t = Instant::now();
        let i = od_rt.instance().await.unwrap();
        o.push(t.elapsed());
        drop(i);
    }
    let (p, o) = (Stats::of(p), Stats::of(o));
    detail("instance(), pooling allocator", &p);
    detail("instance(), on-demand allocator", &o);
    let pooled = pooled_rt.allocation() == Allocation::Pooling;
    vec![row(
        "5",
        format!(
            "instantiation: per-call instance, {} (median)",
            if pooled { "pooled" } else { "POOL UNAVAILABLE" }
        ),
        format!("{} (p95 {})", fmt_d(p.median), fmt_d(p.p95)),
        format!("on-demand {}", fmt_d(o.median)),
        format!("{:.2}×", ratio(p.median, o.median)),
        "≤ 20 µs pooled",
        Some(pooled && p.median.as_micros() <= 20),
    )]
}
