//! Benchmark 9: what the workloads' seccomp filter costs on a syscall-heavy command:
//! `find /usr -type f | wc -l` (about 230 000 syscalls, most of them `fcntl`, `close`,
//! `getdents64`, `newfstatat`), forked and exec'd with the filter installed (as the
//! supervisor does, after `no_new_privs`) vs the same without it. Interleaved.
//!
//! Both sides are spawned the same way: a `pre_exec` hook (`no_new_privs`, then the
//! filter or nothing), so both fork the bench process. Before 2026-12-03 only the
//! filtered side had a hook: std spawned the baseline with `posix_spawn` (a vfork that
//! copies no page tables) and the filtered side with a `fork` of this large process, and
//! the difference in spawn cost was counted as the filter's.
//!
//! A third side installs a one-instruction `RET_ALLOW` filter: the floor any filter
//! costs (every syscall then takes the kernel's syscall-entry work path), whatever its
//! shape. The workload filter's own cost is the distance above that floor.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stockade_linux::seccomp::Filter;

use crate::common::*;

#[derive(Clone, Copy)]
enum Side {
    Unfiltered,
    AllowAll,
    Workload,
}

/// `seccomp(SECCOMP_SET_MODE_FILTER)` with one `RET_ALLOW` instruction.
/// Async-signal-safe (no allocation).
fn install_allow_all() -> std::io::Result<()> {
    let insn = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    }];
    let fprog = libc::sock_fprog {
        len: 1,
        filter: insn.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at one valid instruction that outlives the call; the kernel
    // copies it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::c_ulong::from(libc::SECCOMP_SET_MODE_FILTER),
            0 as libc::c_ulong,
            &raw const fprog,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn find(side: Side, filter: &Filter) -> Duration {
    let mut c = Command::new("/bin/sh");
    c.args(["-c", "find /usr -type f | wc -l"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let f = filter.clone();
    // SAFETY: runs in the forked child before exec; prctl and the installs are
    // async-signal-safe (no allocation, no lock).
    unsafe {
        c.pre_exec(move || {
            rustix::thread::set_no_new_privs(true)?;
            match side {
                Side::Unfiltered => Ok(()),
                Side::AllowAll => install_allow_all(),
                Side::Workload => f.install(),
            }
        });
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
    let (mut with, mut floor, mut without) = (vec![], vec![], vec![]);
    tokio::task::block_in_place(|| {
        for i in 0..n + 2 {
            let a = find(Side::Workload, &filter);
            let b = find(Side::Unfiltered, &filter);
            let c = find(Side::AllowAll, &filter);
            if i >= 2 {
                with.push(a);
                without.push(b);
                floor.push(c);
            }
        }
    });
    let (with, floor, without) = (Stats::of(with), Stats::of(floor), Stats::of(without));
    detail("find /usr under the workload filter", &with);
    detail("find /usr under a one-instruction allow-all filter", &floor);
    detail("find /usr unfiltered", &without);
    println!(
        "  filter: {} BPF instructions; workload ÷ allow-all {:.3}×, allow-all ÷ unfiltered {:.3}×",
        filter.instruction_count(),
        ratio(with.median, floor.median),
        ratio(floor.median, without.median)
    );
    let r = ratio(with.median, without.median);
    vec![row(
        "9",
        "seccomp: `find /usr -type f | wc -l` under the workload filter (median; both sides forked alike)",
        format!("{} (p95 {})", fmt_d(with.median), fmt_d(with.p95)),
        format!(
            "unfiltered {} (allow-all filter {})",
            fmt_d(without.median),
            fmt_d(floor.median)
        ),
        format!("{r:.3}×"),
        "≤ 1.05×",
        Some(r <= 1.05),
    )]
}
