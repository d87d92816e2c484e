//! Benchmark 8: Memory: what one live idle container costs the host (the host process's RSS
//! growth, the supervisor's RSS, the container cgroup's `memory.current`), and the
//! guest component's size.

use std::time::Duration;

use stockade_runtime::bindings::EMBEDDED_GUEST;
use stockade_runtime::substrate::Substrate;

use crate::common::*;

const N: usize = 10;

pub async fn run(env: &Env) -> Vec<Row> {
    // Warm the host's own paths first (the first container pays one-off allocations).
    env.rt.exec("bench-mem-warm", &true_input()).await.unwrap();
    env.rt.abort("bench-mem-warm").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_kib("self").unwrap();
    let mut containers = vec![];
    for i in 0..N {
        let k = format!("bench-mem-{i}");
        env.rt.exec(&k, &true_input()).await.unwrap();
        containers.push((k.clone(), env.linux.current(&k).await.unwrap().unwrap()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_kib("self").unwrap();
    let mut sup = 0u64;
    let mut cg = 0u64;
    for (_, c) in &containers {
        let pid = env.linux.supervisor_pid(c).unwrap();
        sup += rss_kib(&pid.to_string()).unwrap_or(0);
        if let Some(p) = env.linux.container_cgroup(c) {
            cg += std::fs::read_to_string(p.join("memory.current"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0)
                / 1024;
        }
    }
    for (k, _) in &containers {
        env.rt.abort(k).await.unwrap();
    }
    let host_per = after.saturating_sub(before) as f64 / N as f64;
    let sup_per = sup as f64 / N as f64;
    let cg_per = cg as f64 / N as f64;
    println!("  host RSS {before} KiB → {after} KiB with {N} idle containers");
    println!(
        "  per container: host +{host_per:.0} KiB, supervisor RSS {sup_per:.0} KiB, cgroup memory.current {cg_per:.0} KiB"
    );
    println!("  guest component: {} bytes", EMBEDDED_GUEST.len());
    vec![
        row(
            "8",
            "memory: host-process RSS per live idle container",
            format!("{host_per:.0} KiB"),
            format!("supervisor RSS {sup_per:.0} KiB, cgroup memory.current {cg_per:.0} KiB"),
            "–",
            "–",
            None,
        ),
        row(
            "8",
            "memory: guest component (.wasm, embedded)",
            format!("{:.1} KiB", EMBEDDED_GUEST.len() as f64 / 1024.0),
            "–",
            "–",
            "–",
            None,
        ),
    ]
}
