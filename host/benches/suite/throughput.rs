//! Benchmark 6: Throughput: `exec /bin/true` from 16 keys in parallel (16 containers) vs raw
//! spawn + wait of `/bin/true` from 16 threads on the host, for the same wall time;
//! plus the substrate's `run` from 16 keys (the container path without the facade).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stockade_runtime::substrate::Substrate;

use crate::common::*;

const KEYS: usize = 16;

fn window() -> Duration {
    let scale: f64 = std::env::var("STOCKADE_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64((4.0 * scale).max(0.5))
}

async fn facade(env: &Env, keys: &[String]) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = vec![];
    for k in keys {
        let (rt, k, stop, count) = (env.rt.clone(), k.clone(), stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let input = true_input();
            while !stop.load(Ordering::Relaxed) {
                let o = rt.exec(&k, &input).await.expect("exec");
                assert_eq!(o.exit_code, 0);
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let t = Instant::now();
    tokio::time::sleep(window()).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

async fn substrate(env: &Env, containers: &[String]) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = vec![];
    for c in containers {
        let (linux, c, stop, count) = (env.linux.clone(), c.clone(), stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let cmd = cmd(&["/bin/true"], &[]);
            while !stop.load(Ordering::Relaxed) {
                let r = linux
                    .run(&c, cmd.clone(), Duration::from_secs(30))
                    .await
                    .expect("run");
                assert_eq!(r.exit_code, 0);
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let t = Instant::now();
    tokio::time::sleep(window()).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

fn raw() -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let threads: Vec<_> = (0..KEYS)
        .map(|_| {
            let (stop, count) = (stop.clone(), count.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let s = std::process::Command::new("/bin/true").status().unwrap();
                    assert!(s.success());
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(window());
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

pub async fn run(env: &Env) -> Vec<Row> {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("bench-tp-{i}")).collect();
    let mut containers = vec![];
    for k in &keys {
        env.rt.exec(k, &true_input()).await.expect("warm exec");
        containers.push(env.linux.current(k).await.unwrap().unwrap());
    }
    // Twice each, alternating; the better of the two (noise is one-sided).
    let (mut f, mut s, mut r) = (0f64, 0f64, 0f64);
    for _ in 0..2 {
        f = f.max(facade(env, &keys).await);
        s = s.max(substrate(env, &containers).await);
        r = r.max(tokio::task::spawn_blocking(raw).await.unwrap());
    }
    println!("  facade exec, {KEYS} keys:     {f:>8.0} /s");
    println!("  substrate run, {KEYS} keys:   {s:>8.0} /s");
    println!("  raw host spawn, {KEYS} threads: {r:>8.0} /s");
    for k in &keys {
        env.rt.abort(k).await.unwrap();
    }
    vec![
        row(
            "6",
            format!("throughput: exec /bin/true, {KEYS} keys in parallel"),
            format!("{f:.0} execs/s"),
            format!("raw spawn {r:.0}/s"),
            format!("{:.0} %", 100.0 * f / r),
            "≥ 80 % of raw",
            Some(f / r >= 0.8),
        ),
        row(
            "6",
            format!("throughput: substrate run /bin/true, {KEYS} containers"),
            format!("{s:.0} runs/s"),
            format!("raw spawn {r:.0}/s"),
            format!("{:.0} %", 100.0 * s / r),
            "–",
            None,
        ),
    ]
}
