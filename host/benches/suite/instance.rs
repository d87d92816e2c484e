//! Benchmark 5: Per-call instantiation: `Runtime::instance()` (store + instantiate from the
//! `InstancePre`) with the pooling allocator as configured, vs the per-call instance as it
//! once was ([`Before`]: the guest with std's WASI imported, and
//! bindgen's `StockadePre`, which type-checks every export on every instance) in the same
//! engine and pool, vs on-demand; interleaved.
//!
//! Three figures per runtime: `instance()` alone (the row's figure, as before), a
//! whole cycle (`instance()` then its release: a call pays both), and a whole facade
//! call on the mock substrate (`detached-status` of an id nobody declared: one
//! instance, one record read, the guest's code dirtying its memory, the release).

use std::sync::Arc;
use std::time::{Duration, Instant};

use stockade_runtime::bindings::{DetachedState, Stockade, StockadePre};
use stockade_runtime::imports::Ctx;
use stockade_runtime::runtime::{Allocation, Compiled, Runtime};
use stockade_runtime::substrate::mock::Mock;
use wasmtime::Store as WasmStore;
use wasmtime::component::{Component, HasSelf, Linker};

use crate::common::*;

/// The per-call instance before this cut, over a runtime's engine and store: the
/// guest as the linker made it (19 WASI functions lowered; here they trap, since the
/// host links no WASI any more, so no `WasiCtx` is built: a little faster than it
/// was), instantiated through bindgen's `StockadePre` (all 13 exports type-checked per
/// instance).
pub struct Before {
    rt: Runtime,
    pre: StockadePre<Ctx>,
}

impl Before {
    /// `None` when the build made no guest with WASI (`STOCKADE_GUEST_PREBUILT`).
    /// `STOCKADE_BENCH_BEFORE_GUEST` names another component to run this way.
    pub fn new(rt: Runtime) -> Option<Self> {
        let path = std::env::var("STOCKADE_BENCH_BEFORE_GUEST")
            .unwrap_or_else(|_| stockade_runtime::bindings::GUEST_WITH_WASI_PATH.to_owned());
        if path.is_empty() {
            return None;
        }
        let bytes = std::fs::read(path).expect("the guest with WASI");
        let component = Component::new(rt.engine(), bytes).expect("compile");
        let mut linker: Linker<Ctx> = Linker::new(rt.engine());
        Stockade::add_to_linker::<Ctx, HasSelf<Ctx>>(&mut linker, |c| c).unwrap();
        linker.define_unknown_imports_as_traps(&component).unwrap();
        let pre = StockadePre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
        Some(Self { rt, pre })
    }

    pub async fn instance(&self) -> (WasmStore<Ctx>, Stockade) {
        let mut store = self.rt.call_store();
        let inst = self.pre.instantiate_async(&mut store).await.unwrap();
        (store, inst)
    }

    /// `detached-status` as the runtime called it before (nothing to settle: the
    /// call is read-only).
    pub async fn detached_status(&self, key: &str, id: &str) -> DetachedState {
        let (mut store, inst) = self.instance().await;
        inst.stockade_sandbox_facade()
            .call_detached_status(&mut store, key, id)
            .await
            .unwrap()
            .unwrap()
    }
}

/// One runtime's samples.
#[derive(Default)]
struct Samples {
    alone: Vec<Duration>,
    cycle: Vec<Duration>,
    call: Vec<Duration>,
}

const KEY: &str = "bench-instance";
const ID: &str = "3f2b8c1e-0000-4000-8000-00000000002a";

async fn sample(rt: &Runtime, s: &mut Samples) {
    let t = Instant::now();
    let i = rt.instance().await.unwrap();
    s.alone.push(t.elapsed());
    drop(i);
    let t = Instant::now();
    drop(rt.instance().await.unwrap());
    s.cycle.push(t.elapsed());
    let t = Instant::now();
    let r = rt.detached_status(KEY, ID).await;
    s.call.push(t.elapsed());
    assert!(r.is_ok(), "{r:?}");
}

async fn sample_before(b: &Before, s: &mut Samples) {
    let t = Instant::now();
    let i = b.instance().await;
    s.alone.push(t.elapsed());
    drop(i);
    let t = Instant::now();
    drop(b.instance().await);
    s.cycle.push(t.elapsed());
    let t = Instant::now();
    b.detached_status(KEY, ID).await;
    s.call.push(t.elapsed());
}

pub async fn run(env: &Env) -> Vec<Row> {
    let mut od_cfg = env.cfg.clone();
    od_cfg.engine.pooling = false;
    let on_demand = Compiled::new(&od_cfg).expect("compile");
    assert_eq!(on_demand.allocation(), Allocation::OnDemand);
    let rt = |c: &Compiled, cfg| {
        Runtime::from_compiled(c, cfg, Arc::new(Mock::new(16)), env.store.clone()).unwrap()
    };
    let pooled_rt = rt(&env.compiled, &env.cfg);
    let od_rt = rt(&on_demand, &od_cfg);
    let before = Before::new(rt(&env.compiled, &env.cfg)).expect(
        "the guest with WASI (built by host/runtime/build.rs unless STOCKADE_GUEST_PREBUILT is set)",
    );
    println!(
        "  pooled runtime allocation: {:?}; keep_resident_kib {}",
        pooled_rt.allocation(),
        env.cfg.engine.keep_resident_kib
    );
    let (mut p, mut b, mut o) = (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..100 {
        sample(&pooled_rt, &mut p).await;
        sample_before(&before, &mut b).await;
        sample(&od_rt, &mut o).await;
    }
    let (mut p, mut b, mut o) = (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..iters(3000) {
        sample(&pooled_rt, &mut p).await;
        sample_before(&before, &mut b).await;
        sample(&od_rt, &mut o).await;
    }
    let stats = |s: Samples| (Stats::of(s.alone), Stats::of(s.cycle), Stats::of(s.call));
    let (p, b, o) = (stats(p), stats(b), stats(o));
    for (name, (alone, cycle, call)) in [
        ("pooled", &p),
        ("pooled, before (WASI guest, bindgen load)", &b),
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
                "before {}, on-demand {}",
                fmt_d(b.0.median),
                fmt_d(o.0.median)
            ),
            format!("{:.2}×", ratio(p.0.median, b.0.median)),
            "≤ 5 µs pooled",
            Some(pooled && p.0.median.as_micros() <= 5),
        ),
        row(
            "5",
            "instantiation: instance + release, pooled (median)",
            format!("{} (p95 {})", fmt_d(p.1.median), fmt_d(p.1.p95)),
            format!("before {}", fmt_d(b.1.median)),
            format!("{:.2}×", ratio(p.1.median, b.1.median)),
            "–",
            None,
        ),
        row(
            "5",
            "instantiation: a whole call on the mock, pooled (median)",
            format!("{} (p95 {})", fmt_d(p.2.median), fmt_d(p.2.p95)),
            format!("before {}", fmt_d(b.2.median)),
            format!("{:.2}×", ratio(p.2.median, b.2.median)),
            "–",
            None,
        ),
    ]
}
