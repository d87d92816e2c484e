//! Benchmark 9: what the workloads' seccomp filter costs on a syscall-heavy command:
//! `find /usr -type f | wc -l`, forked and exec'd with the filter installed (as the
//! supervisor does, after `no_new_privs`) vs the same without it. Interleaved.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stockade_host::substrate::linux::seccomp::Filter;

use crate::common::*;

fn find(filter: Option<&Filter>) -> Duration {
    let mut c = Command::new("/bin/sh");
    c.args(["-c", "find /usr -type f | wc -l"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(f) = filter {
        let f = f.clone();
        // SAFETY: runs in the forked child before exec; prctl and `install` are
        // async-signal-safe (no allocation, no lock).
        unsafe {
            c.pre_exec(move || {
                rustix::thread::set_no_new_privs(true)?;
                f.install()
            });
        }
    }
    let t = Instant::now();
    let s = c.status().expect("find");
    let d = t.elapsed();
    assert!(s.success(), "find failed: {s}");
    d
}

pub async fn run(_env: &Env) -> Vec<Row> {
    let filter = Filter::workload().expect("the workload filter");
    let n = iters(30);
    let (mut with, mut without) = (vec![], vec![]);
    tokio::task::block_in_place(|| {
        for i in 0..n + 2 {
            let a = find(Some(&filter));
            let b = find(None);
            if i >= 2 {
                with.push(a);
                without.push(b);
            }
        }
    });
    let (with, without) = (Stats::of(with), Stats::of(without));
    detail("find /usr under the workload filter", &with);
    detail("find /usr unfiltered", &without);
    println!("  filter: {} BPF instructions", filter.instruction_count());
    let r = ratio(with.median, without.median);
    vec![row(
        "9",
        "seccomp: `find /usr -type f | wc -l` under the workload filter (median)",
        format!("{} (p95 {})", fmt_d(with.median), fmt_d(with.p95)),
        format!("unfiltered {}", fmt_d(without.median)),
        format!("{r:.3}×"),
        "≤ 1.05×",
        Some(r <= 1.05),
    )]
}
