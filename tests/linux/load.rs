//! Load with a leak census: many keys running execs (plain, fenced, ones
//! that background a process), detached processes, and random stop / status / abort /
//! checkpoint, with idle eviction running, all at once against a ceiling on real
//! containers. Throughout, the ceiling holds (no more container cgroups than tickets);
//! afterwards (every key aborted) nothing is left: no process, container cgroup, mount,
//! open grant or declaration, and this process's descriptor count is back at its
//! baseline.
//!
//! The test is the scaled run. `STOCKADE_LOAD=full` is the full run (16 keys ×
//! 200 execs, 100 detached processes, ceiling 16), whose figures are a section of
//! docs/BENCHMARKS.md; `STOCKADE_LOAD_SEED` replays a run; `STOCKADE_LOAD_MIX=plain` is
//! its baseline (the same keys and number of calls, plain execs only).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stockade_runtime::bindings::FacadeError;
use stockade_runtime::runtime::CallError;
use stockade_runtime::substrate::Housekeeping as _;

use crate::facade::{Fx, count_cgroups, fx, grant, wait_for};
use crate::support::mounts_under;

/// The shape of a run.
#[derive(Debug, Clone, Copy)]
struct Shape {
    keys: usize,
    ops_per_key: usize,
    detached: usize,
    ceiling: u32,
}

const SCALED: Shape = Shape {
    keys: 6,
    ops_per_key: 25,
    detached: 12,
    ceiling: 4,
};

const FULL: Shape = Shape {
    keys: 16,
    ops_per_key: 200,
    detached: 100,
    ceiling: 16,
};

/// A tiny deterministic generator (xorshift64*): the run replays from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Descriptors this process holds.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// What each descriptor is (for the message of a failed census).
fn fd_table() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .map(|e| {
            let to = std::fs::read_link(e.path()).map(|p| p.display().to_string());
            format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                to.unwrap_or_default()
            )
        })
        .collect();
    v.sort();
    v
}

/// What a run did.
#[derive(Debug, Default)]
struct Tally {
    /// Outcome counts by call and kind (`exec ok`, `abort over-capacity`, …).
    outcomes: BTreeMap<String, u32>,
    /// Latency of every successful exec.
    exec_ms: Vec<f64>,
}

fn kind<T>(r: &Result<T, CallError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(CallError::Facade(FacadeError::OverCapacity)) => "over-capacity",
        Err(CallError::Facade(FacadeError::NeedsApproval(_))) => "needs-approval",
        Err(CallError::Facade(FacadeError::InvalidInput(_))) => "invalid-input",
        Err(CallError::Facade(FacadeError::Unreachable(_))) => "unreachable",
        Err(CallError::Facade(FacadeError::Failed(_))) => "failed",
        Err(CallError::Trap(_)) => "trap",
    }
}

/// One key's worker: `ops` random calls.
async fn worker(
    f: Arc<Fx>,
    key: String,
    ops: usize,
    seed: u64,
    detached_left: Arc<AtomicUsize>,
    tally: Arc<Mutex<Tally>>,
) -> Vec<String> {
    let mut rng = Rng(seed | 1);
    // The benchmark's baseline: the same keys and calls, plain execs only.
    let plain_only = std::env::var("STOCKADE_LOAD_MIX").as_deref() == Ok("plain");
    let mut ids: Vec<String> = vec![];
    let mut errors = vec![];
    for _ in 0..ops {
        let r = rng.below(if plain_only { 20 } else { 40 });
        let (call, outcome, detail) = match r {
            0..=29 => {
                let mut input = match r {
                    0..=19 => f.sh("echo plain"),
                    20..=25 => f.sh("echo fenced"),
                    _ => f.sh("sleep 1000 & echo backgrounded"),
                };
                if (20..=25).contains(&r) {
                    input.grant = Some(grant("127.0.0.2", &[], None));
                }
                let t = Instant::now();
                let o = f.rt.exec(&key, &input).await;
                if o.is_ok() {
                    tally
                        .lock()
                        .unwrap()
                        .exec_ms
                        .push(t.elapsed().as_secs_f64() * 1e3);
                }
                ("exec", kind(&o), format!("{:?}", o.as_ref().err()))
            }
            30..=33 => {
                if detached_left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_err()
                {
                    continue;
                }
                let o = f.rt.start_detached(&key, &f.sh("exec sleep 1000")).await;
                if let Ok(id) = &o {
                    ids.push(id.clone());
                } else {
                    detached_left.fetch_add(1, Ordering::SeqCst);
                }
                (
                    "start-detached",
                    kind(&o),
                    format!("{:?}", o.as_ref().err()),
                )
            }
            34..=35 if !ids.is_empty() => {
                let id = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                let o = f.rt.stop_detached(&key, &id).await;
                ("stop-detached", kind(&o), format!("{:?}", o.as_ref().err()))
            }
            36..=37 if !ids.is_empty() => {
                let id = &ids[rng.below(ids.len() as u64) as usize];
                let o = f.rt.detached_status(&key, id).await;
                (
                    "detached-status",
                    kind(&o),
                    format!("{:?}", o.as_ref().err()),
                )
            }
            38 => {
                let o = f.rt.abort(&key).await;
                ("abort", kind(&o), format!("{:?}", o.as_ref().err()))
            }
            39 => {
                let o = f.rt.checkpoint(&key).await;
                ("checkpoint", kind(&o), format!("{:?}", o.as_ref().err()))
            }
            _ => continue,
        };
        *tally
            .lock()
            .unwrap()
            .outcomes
            .entry(format!("{call} {outcome}"))
            .or_default() += 1;
        // Over capacity is the ticket gate answering; every other error is a defect.
        if !matches!(outcome, "ok" | "over-capacity") {
            errors.push(format!("{key} {call}: {detail}"));
        }
    }
    errors
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn census(shape: Shape) {
    let seed: u64 = std::env::var("STOCKADE_LOAD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("load census {shape:?}, STOCKADE_LOAD_SEED={seed}");
    let f = Arc::new(
        fx(|c| {
            c.substrate.ceiling = shape.ceiling;
        })
        .await,
    );
    // Warm up (the engine's first instance, the store's statements), then the baseline,
    // once what the warm-up container held (its sockets, pidfd, directories) is closed:
    // the last of it is dropped by tasks that end after the abort answered.
    let sockets_before: Vec<String> = fd_table()
        .into_iter()
        .filter(|l| l.contains("socket:"))
        .collect();
    f.rt.exec("warm", &f.sh("true")).await.unwrap();
    f.rt.abort("warm").await.unwrap();
    let containers = f.data.join("containers").display().to_string();
    let cgroups = format!("{}/", f.cgroup_root.display());
    let a_containers = |l: &String| {
        (l.contains("socket:") && !sockets_before.contains(l))
            || l.contains("[pidfd]")
            || l.contains(&containers)
            || l.contains(&cgroups)
    };
    wait_for("the warm-up container's descriptors are closed", || {
        !fd_table().iter().any(a_containers)
    })
    .await;
    let baseline = fds();
    let baseline_table = fd_table();
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let monitor = {
        let (stop, most, root) = (stop.clone(), most.clone(), f.cgroup_root.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                most.fetch_max(count_cgroups(&root), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let idle =
        f.rt.spawn_idle_loop(Duration::from_millis(300), Duration::from_millis(50));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let detached_left = Arc::new(AtomicUsize::new(shape.detached));
    let started = Instant::now();
    let workers: Vec<_> = (0..shape.keys)
        .map(|i| {
            tokio::spawn(worker(
                f.clone(),
                format!("load-{i}"),
                shape.ops_per_key,
                seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                detached_left.clone(),
                tally.clone(),
            ))
        })
        .collect();
    let mut errors = vec![];
    for w in workers {
        errors.extend(w.await.unwrap());
    }
    let wall = started.elapsed();
    idle.abort();
    let _ = idle.await;
    for i in 0..shape.keys {
        f.rt.abort(&format!("load-{i}")).await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    monitor.join().unwrap();

    let tally = std::mem::take(&mut *tally.lock().unwrap());
    let mut ms = tally.exec_ms.clone();
    ms.sort_by(f64::total_cmp);
    eprintln!(
        "load census: {} calls in {:.1} s; {} execs ok ({:.1}/s), exec p50 {:.1} ms, p99 {:.1} ms; most containers at once {} (ceiling {}); descriptors baseline {baseline}; {:?}",
        tally.outcomes.values().sum::<u32>(),
        wall.as_secs_f64(),
        ms.len(),
        ms.len() as f64 / wall.as_secs_f64(),
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        most.load(Ordering::SeqCst),
        shape.ceiling,
        tally.outcomes
    );
    assert!(
        errors.is_empty(),
        "calls failed under load:\n{}",
        errors.join("\n")
    );
    assert!(
        most.load(Ordering::SeqCst) <= shape.ceiling as usize,
        "{} containers at once over a ceiling of {}",
        most.load(Ordering::SeqCst),
        shape.ceiling
    );
    assert!(
        tally.outcomes.get("exec ok").copied().unwrap_or(0) > 0,
        "no exec succeeded"
    );

    // The census.
    f.assert_no_marked("every key aborted").await;
    wait_for("no container cgroup", || f.container_cgroups() == 0).await;
    assert!(f.linux.open_grants().is_empty(), "a grant is open");
    assert_eq!(f.declarations(), vec![], "stale declarations");
    let mounts = mounts_under(&f.data.join("containers"));
    assert!(mounts.is_empty(), "container mounts left: {mounts:?}");
    let end = Instant::now() + crate::support::DEADLINE;
    while fds() > baseline && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        fds() <= baseline,
        "descriptors leaked: baseline {baseline_table:#?}\nnow {:#?}",
        fd_table()
    );
    eprintln!("descriptors at the end: {} (baseline {baseline})", fds());
    Arc::into_inner(f)
        .expect("every worker is done")
        .finish()
        .await;
}

/// The census counts this process's descriptors, and the suite's other tests open
/// theirs in the same process: the run gets a process of its own. This test re-runs
/// itself, alone, in a child of this test binary (`STOCKADE_LOAD_CHILD` marks the
/// child, which does the census); the parent passes only if the child did.
#[test]
fn load_leaves_nothing_behind_and_holds_the_ceiling() {
    crate::support::require_root_and_cgroup_v2();
    if std::env::var_os(CHILD).is_some() {
        let shape = if std::env::var("STOCKADE_LOAD").as_deref() == Ok("full") {
            FULL
        } else {
            SCALED
        };
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(census(shape));
        return;
    }
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "load::load_leaves_nothing_behind_and_holds_the_ceiling",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run the census");
    let out = String::from_utf8_lossy(&child.stdout);
    print!("{out}");
    assert!(
        child.status.success(),
        "the load census failed: {}",
        child.status
    );
    // A child that matched no test would pass too: it must have run exactly this one.
    assert!(
        out.contains("test result: ok. 1 passed"),
        "the census did not run in the child:\n{out}"
    );
}

/// Set in the child that runs the census.
const CHILD: &str = "STOCKADE_LOAD_CHILD";
