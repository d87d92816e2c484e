//! The supervisor's (PID 1's) footprint, for docs/BENCHMARKS.md ("Footprint"; the
//! supervisor is its own small executable, DESIGN §4): its executable's size, its resident
//! memory in a running container, and the cold start (ensure + run `/bin/true`, the stop
//! not counted) of new keys with no warm pool.
//!
//! `cargo run -p stockade-host --example supervisor_measure -- [SUPERVISOR] [N]`
//! (root, cgroup v2). `SUPERVISOR` defaults to `stockade-supervisor` beside this
//! example's target directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stockade_linux::{Linux, cgroup};
use stockade_runtime::config::Config;
use stockade_runtime::substrate::{Command, Housekeeping, Substrate};
use stockade_store::Store;

fn vm_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn true_cmd() -> Command {
    Command {
        argv: vec!["/bin/true".into()],
        cwd: "/workspace".into(),
        env: Vec::new(),
        stdin: Vec::new(),
        stdin_stream: None,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let exe = args.next().map(PathBuf::from).unwrap_or_else(|| {
        let me = std::env::current_exe().expect("current_exe");
        me.parent()
            .and_then(|p| p.parent())
            .expect("target dir")
            .join("stockade-supervisor")
    });
    let n: usize = args.next().map_or(20, |n| n.parse().expect("N"));
    let v2 = cgroup::detect_v2().expect("cgroup v2");
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let data = std::env::temp_dir().join(format!("stockade-measure-{}", &marker[..12]));
    let cgroup_root = v2.join(format!("stockade-measure-{marker}"));
    let mut cfg = Config::embedded();
    cfg.substrate.data_dir = data.clone();
    cfg.substrate.cgroup_root = cgroup_root.display().to_string();
    cfg.substrate.warm = 0;
    cfg.substrate.idle_timeout_ms = 0;
    std::fs::create_dir_all(&data).unwrap();
    let store = Arc::new(Store::open_in(&data).expect("store"));
    let linux = Linux::new(&cfg, store, exe.clone())
        .await
        .expect("linux substrate");
    println!(
        "supervisor {}: {} bytes",
        exe.display(),
        std::fs::metadata(&exe).expect("the supervisor").len()
    );

    // Resident memory of PID 1 in a running container, after one run.
    let c = linux.ensure("measure-rss").await.expect("ensure");
    let r = linux
        .run(&c, true_cmd(), Duration::from_secs(30))
        .await
        .expect("run");
    assert_eq!(r.exit_code, 0);
    let pid = linux.supervisor_pid(&c).expect("supervisor pid");
    println!("supervisor VmRSS: {} KiB", vm_rss_kib(pid));
    linux.stop(&c).await.expect("stop");

    // Cold starts.
    let mut times = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let c = linux
            .ensure(&format!("measure-cold-{i}"))
            .await
            .expect("ensure");
        let r = linux
            .run(&c, true_cmd(), Duration::from_secs(30))
            .await
            .expect("run");
        times.push(t.elapsed());
        assert_eq!(r.exit_code, 0);
        linux.stop(&c).await.expect("stop");
    }
    times.sort();
    let mean = times.iter().sum::<Duration>() / n as u32;
    println!(
        "cold ensure + run /bin/true, n={n}: median {:?}, min {:?}, mean {:?}",
        times[n / 2],
        times[0],
        mean
    );
    // What it made: the data directory, the cgroup root, the v1 limit parents.
    let v1_roots = linux.v1_roots();
    linux.shutdown().await;
    drop(linux);
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir(&cgroup_root);
    for root in v1_roots {
        let _ = std::fs::remove_dir(&root);
    }
}
