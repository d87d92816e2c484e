//! The Stockade benchmark suite: every figure measured side by side with its baseline,
//! in the same process, on the same machine. A plain `main` (harness = false) printing
//! one table; see docs/BENCHMARKS.md.
//!
//! `cargo bench -p stockade-host --bench suite [-- SECTION…]` where SECTION is one of
//! memory, instance, status, fence, cold, tree, throughput, seccomp, limits, stream (default:
//! all). Needs root, cgroup v2 and `target/release/stockade` (`bash scripts/bench` does
//! everything).

mod audit;
mod cold;
mod common;
mod fence;
mod instance;
mod limits;
mod memory;
mod peers;
mod remote;
mod scale;
mod seccomp;
mod status;
mod stream;
mod throughput;
mod tree;
mod upload;

const SECTIONS: &[&str] = &[
    "memory",
    "instance",
    "status",
    "fence",
    "cold",
    "tree",
    "throughput",
    "seccomp",
    "limits",
    "stream",
    "remote",
    "peers",
    "audit",
    "scale",
    "upload",
];

fn main() {
    // `cargo bench` passes `--bench`; anything else not a flag selects sections.
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    for w in &wanted {
        assert!(
            SECTIONS.contains(&w.as_str()),
            "unknown section {w}; one of {SECTIONS:?}"
        );
    }
    let run = |s: &str| wanted.is_empty() || wanted.iter().any(|w| w == s);
    // `STOCKADE_BENCH_LOG=<filter>` (e.g. `stockade::substrate=info`): the server's log
    // lines on stderr, for where a section's time goes (each `container started` line
    // carries its build's phases).
    if let Ok(filter) = std::env::var("STOCKADE_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    // A panic's cleanup waits for the runtime to be gone (common::Cleanup).
    let rows = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(async {
            let env = common::Env::new().await;
            println!(
                "stockade bench suite: {} cores, kernel {}, allocation {:?}, kill mode {:?}",
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(0),
                std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .unwrap_or_default()
                    .trim(),
                env.rt.allocation(),
                env.linux.capabilities().kill_mode,
            );
            let mut rows = Vec::new();
            macro_rules! section {
                ($name:literal, $m:ident) => {
                    if run($name) {
                        let t = std::time::Instant::now();
                        println!("\n== {} ==", $name);
                        rows.extend($m::run(&env).await);
                        println!("  ({} took {:.1} s)", $name, t.elapsed().as_secs_f64());
                    }
                };
            }
            section!("memory", memory);
            section!("instance", instance);
            section!("status", status);
            section!("fence", fence);
            section!("cold", cold);
            section!("tree", tree);
            section!("throughput", throughput);
            section!("seccomp", seccomp);
            section!("limits", limits);
            section!("stream", stream);
            section!("remote", remote);
            section!("scale", scale);
            section!("peers", peers);
            section!("audit", audit);
            section!("upload", upload);
            env.shutdown().await;
            rows
        })
    }));
    let rows = match rows {
        Ok(rows) => rows,
        Err(panic) => {
            rt.shutdown_timeout(std::time::Duration::from_secs(10));
            common::run_deferred_cleanups();
            std::panic::resume_unwind(panic);
        }
    };
    common::print_table(&rows);
    println!("\nsuite took {:.1} s", started.elapsed().as_secs_f64());
}
