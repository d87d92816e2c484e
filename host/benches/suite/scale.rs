//! Benchmark 12: Scale (docs/SCALE.md): N live idle containers (N = 100, 250, 500, 1000,
//! scaled by `STOCKADE_BENCH_SCALE`; `STOCKADE_SCALE_N=20,50` overrides), what each costs
//! the host's memory, and a new key's cold start at each N against its cold start with
//! none live (the baseline, measured in the same run before the first container).
//!
//! Counted per container at each N (deltas from the moment before the first container):
//! * **host**: the host process's RSS (this process: the substrate runs in it);
//! * **supervisor**: the proportional set size (PSS: a shared page is split among its
//!   sharers, so the supervisor binary's text counts once in all) of every process in
//!   the containers' cgroups, summed: with an idle container that is its PID 1;
//! * **kernel**: `/proc/meminfo`'s `Slab + KernelStack + PageTables + Shmem` (namespaces,
//!   cgroups, sockets, stacks, page tables, the containers' tmpfs), machine-wide: other
//!   processes move it too (the load average is printed);
//! * the container's own v1 memory cgroup (`memory.usage_in_bytes`, of which
//!   `memory.kmem.usage_in_bytes` is the kernel's), where this machine has one: what its
//!   limit sees; the kernel memory the clone makes before the supervisor joins it
//!   (its namespaces) is in the machine-wide row only.
//!
//! The figure is host + supervisor + kernel. Each N's cold start is `exec /bin/true` on
//! a new key (a container built on demand, no warm pool), the probe container aborted
//! after; its p50/p95 beside the N = 0 probe's.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stockade_runtime::substrate::Substrate;

use crate::common::*;

/// The containers started at once while filling (the node's 2 cores stay busy).
const FILL_PARALLEL: usize = 4;

/// `/proc/meminfo` fields, KiB.
fn meminfo() -> BTreeMap<String, u64> {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let kib = v.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some((k.to_string(), kib))
        })
        .collect()
}

fn kernel_kib(m: &BTreeMap<String, u64>) -> u64 {
    ["Slab", "KernelStack", "PageTables", "Shmem"]
        .iter()
        .map(|k| m.get(*k).copied().unwrap_or(0))
        .sum()
}

/// `smaps_rollup` of one process: (Rss, Pss, Private) in KiB.
fn smaps(pid: &str) -> (u64, u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let f = |name: &str| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (
        f("Rss:"),
        f("Pss:"),
        f("Private_Clean:") + f("Private_Dirty:"),
    )
}

/// Every pid in a cgroup and its descendants.
fn cgroup_pids(dir: &Path, out: &mut Vec<String>) {
    if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(s.lines().map(str::to_string));
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            cgroup_pids(&e.path(), out);
        }
    }
}

fn read_u64(p: &Path) -> u64 {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn threads(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The N levels.
fn levels() -> Vec<usize> {
    if let Ok(s) = std::env::var("STOCKADE_SCALE_N") {
        return s.split(',').filter_map(|n| n.trim().parse().ok()).collect();
    }
    let scale: f64 = std::env::var("STOCKADE_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    [100.0, 250.0, 500.0, 1000.0]
        .iter()
        .map(|n: &f64| ((n * scale).round() as usize).max(2))
        .collect()
}

/// `probes` cold starts on new keys, each aborted after: the durations.
async fn cold_probes(env: &Env, tag: &str, probes: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(probes);
    for i in 0..probes {
        let k = format!("scale-probe-{tag}-{i}");
        let t = Instant::now();
        env.rt.exec(&k, &true_input()).await.unwrap();
        out.push(t.elapsed());
        env.rt.abort(&k).await.unwrap();
    }
    out
}

pub async fn run(_env: &Env) -> Vec<Row> {
    let levels = levels();
    let top = levels.iter().copied().max().unwrap_or(0);
    let probes = iters(20).min(40);
    let env = Env::with(|c| {
        c.substrate.ceiling = (top + 8) as u32;
        // The id pool's leases are machine-wide: a range of its own, so that a
        // thousand containers here take no range another instance's tests need.
        c.substrate.ids.start = 3_000_000_000;
        c.substrate.ids.containers = (top + 16) as u32;
        c.substrate.limits.pids = 64;
    })
    .await;
    let env = Arc::new(env);
    // The host's one-off allocations first.
    cold_probes(&env, "warmup", 3).await;
    let base_cold = Stats::of(cold_probes(&env, "0", probes).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let host0 = rss_kib("self").unwrap_or(0);
    let mem0 = meminfo();
    let fds0 = open_fds();
    let threads0 = threads("self");
    println!(
        "  load average {}  baseline: host RSS {host0} KiB, kernel {} KiB, cold start p50 {} p95 {} (n={probes})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        kernel_kib(&mem0),
        fmt_d(base_cold.median),
        fmt_d(base_cold.p95)
    );
    let mut rows = Vec::new();
    let mut live: Vec<String> = Vec::new();
    let fill = Arc::new(tokio::sync::Semaphore::new(FILL_PARALLEL));
    for &n in &levels {
        let t = Instant::now();
        let started = n.saturating_sub(live.len()).max(1);
        let mut set = tokio::task::JoinSet::new();
        for i in live.len()..n {
            let k = format!("scale-{i}");
            live.push(k.clone());
            let (env, fill) = (env.clone(), fill.clone());
            set.spawn(async move {
                let _p = fill.acquire().await.unwrap();
                env.rt
                    .exec(&k, &true_input())
                    .await
                    .map_err(|e| format!("{k}: {e:?}"))
            });
        }
        let mut failed = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Err(e) = r.unwrap() {
                failed.push(e);
            }
        }
        let fill_s = t.elapsed().as_secs_f64();
        if !failed.is_empty() {
            println!(
                "  N={n}: {} of the new containers failed, first: {}",
                failed.len(),
                failed[0]
            );
            rows.push(row(
                "12",
                format!("scale: {n} live idle containers"),
                format!("{} failed", failed.len()),
                "–",
                "–",
                "all start",
                Some(false),
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Memory at N.
        let host = rss_kib("self").unwrap_or(0);
        let mem = meminfo();
        let (mut rss, mut pss, mut private, mut procs, mut sup_threads) = (0, 0, 0, 0, 0);
        let (mut cg_usage, mut cg_kmem) = (0u64, 0u64);
        let mem_v1 = env
            .linux
            .v1_roots()
            .into_iter()
            .find(|p| p.join("memory.usage_in_bytes").exists());
        for k in &live {
            let Some(id) = env.linux.current(k).await.unwrap() else {
                continue;
            };
            let mut pids = Vec::new();
            if let Some(cg) = env.linux.container_cgroup(&id) {
                cgroup_pids(&cg, &mut pids);
            }
            for p in &pids {
                let (r, ps, pr) = smaps(p);
                rss += r;
                pss += ps;
                private += pr;
                sup_threads += threads(p);
            }
            procs += pids.len() as u64;
            if let Some(root) = &mem_v1 {
                cg_usage += read_u64(&root.join(&id).join("memory.usage_in_bytes")) / 1024;
                cg_kmem += read_u64(&root.join(&id).join("memory.kmem.usage_in_bytes")) / 1024;
            }
        }
        let nf = n as f64;
        let host_per = host.saturating_sub(host0) as f64 / nf;
        let kernel_per = kernel_kib(&mem).saturating_sub(kernel_kib(&mem0)) as f64 / nf;
        let sup_per = pss as f64 / nf;
        let avail_per =
            mem0.get("MemAvailable")
                .copied()
                .unwrap_or(0)
                .saturating_sub(mem.get("MemAvailable").copied().unwrap_or(0)) as f64
                / nf;
        let total = host_per + sup_per + kernel_per;
        let cold = Stats::of(cold_probes(&env, &n.to_string(), probes).await);
        let slab_per = mem
            .get("Slab")
            .copied()
            .unwrap_or(0)
            .saturating_sub(mem0.get("Slab").copied().unwrap_or(0)) as f64
            / nf;
        let kstack_per =
            mem.get("KernelStack")
                .copied()
                .unwrap_or(0)
                .saturating_sub(mem0.get("KernelStack").copied().unwrap_or(0)) as f64
                / nf;
        println!(
            "  N={n} (filled in {fill_s:.1} s, {:.1} ms each): per container host +{host_per:.0} KiB, supervisor PSS {sup_per:.0} KiB (RSS {:.0}, private {:.0}; {:.2} processes, {:.2} threads), kernel +{kernel_per:.0} KiB (Slab {slab_per:.0}, KernelStack {kstack_per:.0}); v1 memory cgroup {:.0} KiB (kmem {:.0}); MemAvailable −{avail_per:.0} KiB; host threads +{}, descriptors +{}",
            fill_s * 1000.0 / started as f64,
            rss as f64 / nf,
            private as f64 / nf,
            procs as f64 / nf,
            sup_threads as f64 / nf,
            cg_usage as f64 / nf,
            cg_kmem as f64 / nf,
            threads("self").saturating_sub(threads0),
            open_fds().saturating_sub(fds0),
        );
        detail(&format!("cold start, {n} live"), &cold);
        rows.push(row(
            "12",
            format!("scale: host memory per live idle container, N = {n}"),
            format!("{:.0} KiB", total),
            format!(
                "host RSS {host_per:.0} + supervisor PSS {sup_per:.0} + kernel {kernel_per:.0} KiB"
            ),
            "–",
            "≤ 2048 KiB",
            Some(total <= 2048.0),
        ));
        let r = ratio(cold.median, base_cold.median);
        rows.push(row(
            "12",
            format!("scale: cold start p50 (p95), N = {n} live"),
            format!("{} ({})", fmt_d(cold.median), fmt_d(cold.p95)),
            format!(
                "{} ({}) with none live",
                fmt_d(base_cold.median),
                fmt_d(base_cold.p95)
            ),
            format!("{r:.2}×"),
            "≤ 1.5×",
            Some(r <= 1.5),
        ));
    }
    // Clean up: every key aborted, then the substrate shut down.
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for k in live {
        let (env, fill) = (env.clone(), fill.clone());
        set.spawn(async move {
            let _p = fill.acquire().await.unwrap();
            let _ = env.rt.abort(&k).await;
        });
    }
    while set.join_next().await.is_some() {}
    println!("  all aborted in {:.1} s", t.elapsed().as_secs_f64());
    match Arc::try_unwrap(env) {
        Ok(env) => env.shutdown().await,
        Err(_) => println!("  (the scale env is still shared: dropped without shutdown)"),
    }
    rows
}
