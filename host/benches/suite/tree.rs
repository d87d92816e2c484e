//! Benchmark 3: Tree kill: a tree of 1000 processes (100 `setsid` escapers, 100 double forks
//! reparented away from their shell, 799 plain children and the leader), every one
//! holding the write end of a pipe. Killed via the substrate (`kill_process`: the
//! tree's cgroup) vs a plain `killpg` of the leader's process group on the host.
//! Counted: time until the kill returns (all reaped) and the pipe reaches EOF, and the
//! survivors. A second baseline kills the same tree with `killpg` when it has no
//! escapers (the 100 `setsid`s stay in the group), and waits for every process to
//! exit (the pipe's EOF): the kernel's own time to kill 1000 processes, which the
//! first baseline's "leader reaped" stops short of. Rounds alternate (substrate,
//! killpg, whole-group killpg, …).

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use stockade_linux::cgroup::CgroupDir;
use stockade_runtime::substrate::Substrate;

use crate::common::*;

pub const TREE: usize = 1000;

const SCRIPT: &str = r#"exec >"$FIFO" 2>&1
i=0; while [ $i -lt 100 ]; do $SETSID sleep 1000 & i=$((i+1)); done
i=0; while [ $i -lt 100 ]; do (sleep 1000 &); i=$((i+1)); done
i=0; while [ $i -lt 799 ]; do sleep 1000 & i=$((i+1)); done
echo ready
exec sleep 1000"#;

fn fifo_reader(path: &Path) -> std::fs::File {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let _ = std::fs::remove_file(path);
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo");
    // The workload is the container's unprivileged user: writable by others.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    // SAFETY: valid path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0);
    // SAFETY: fresh fd.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

/// Read until `ready` (the writer is connected and the tree is forked).
fn read_ready(f: &std::fs::File) {
    let end = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.windows(5).any(|w| w == b"ready") {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "the tree never got ready: {got:?}");
        let mut p = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 100) };
        // SAFETY: valid buffer.
        let n = unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            got.extend_from_slice(&buf[..n as usize]);
        }
    }
}

/// Wait up to `limit` for EOF; `true` if it came.
fn eof_within(f: &std::fs::File, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: valid buffer.
        let n = unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            return true;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as i32) };
    }
}

/// Wait until exactly `n` marked processes live (transient subshells gone).
fn wait_count(marker: &str, n: usize) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let have = marked_processes(marker).len();
        if have == n {
            return;
        }
        assert!(
            Instant::now() < end,
            "the tree has {have} processes, not {n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Round {
    kill: Duration,
    eof: Option<Duration>,
    survivors: usize,
    killed: u32,
}

async fn substrate_round(env: &Env, c: &str, round: usize) -> Round {
    let marker = format!("{}-tree-{round}", env.marker);
    let fifo = env
        .cleanup
        .data
        .join("containers")
        .join(c)
        .join("fs/workspace/fifo");
    let reader = fifo_reader(&fifo);
    let id = env
        .linux
        .start_process(
            c,
            cmd(
                &["sh", "-c", SCRIPT],
                &[
                    ("FIFO", "/workspace/fifo"),
                    ("SETSID", "setsid"),
                    ("STOCKADE_BENCH_MARKER", &marker),
                ],
            ),
        )
        .await
        .expect("start the tree");
    let m = marker.clone();
    let reader = tokio::task::spawn_blocking(move || {
        read_ready(&reader);
        wait_count(&m, TREE);
        reader
    })
    .await
    .unwrap();
    let t = Instant::now();
    let killed = env.linux.kill_process(c, &id).await.expect("kill");
    let kill = t.elapsed();
    let eof = eof_within(&reader, Duration::from_secs(5)).then(|| t.elapsed());
    let survivors = marked_processes(&marker).len();
    Round {
        kill,
        eof,
        survivors,
        killed,
    }
}

/// `killpg` of the tree's group, timed to its leader's reap. With `escapers`, 100 of
/// the tree's processes left the group (`setsid`) and survive; without, every one is
/// in it and the round waits (up to 5 s) for the pipe's EOF: every process exited.
fn killpg_round(env: &Env, cg: &CgroupDir, round: usize, escapers: bool) -> Round {
    let kind = if escapers { "killpg" } else { "killpg-all" };
    let marker = format!("{}-{kind}-{round}", env.marker);
    let fifo = env.cleanup.data.join(format!("{kind}-fifo-{round}"));
    let reader = fifo_reader(&fifo);
    let procs = cg.open_file("cgroup.procs", true).unwrap();
    let procs_fd = procs.as_raw_fd();
    let mut command = std::process::Command::new("sh");
    command
        .args(["-c", SCRIPT])
        .env("FIFO", &fifo)
        .env("SETSID", if escapers { "setsid" } else { "" })
        .env("STOCKADE_BENCH_MARKER", &marker)
        .stdin(std::process::Stdio::null())
        .process_group(0);
    // SAFETY: only async-signal-safe calls (write) in the child.
    unsafe {
        command.pre_exec(move || {
            // Into the bench's own cgroup, so the cleanup can find the survivors.
            if libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("spawn the tree");
    drop(procs);
    read_ready(&reader);
    wait_count(&marker, TREE);
    let pgid = child.id() as i32;
    let t = Instant::now();
    // SAFETY: plain syscall.
    unsafe { libc::killpg(pgid, libc::SIGKILL) };
    let _ = child.wait();
    let kill = t.elapsed();
    let eof_limit = if escapers {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(5)
    };
    let eof = eof_within(&reader, eof_limit).then(|| t.elapsed());
    if escapers {
        // What killpg left stays (nothing more comes): counted below.
        std::thread::sleep(Duration::from_millis(100));
    }
    let survivors = marked_processes(&marker).len();
    // Clean up what killpg left.
    cg.kill().unwrap();
    cg.wait_empty(Instant::now() + Duration::from_secs(10))
        .unwrap();
    let _ = std::fs::remove_file(&fifo);
    Round {
        kill,
        eof,
        survivors,
        killed: (TREE - survivors) as u32,
    }
}

pub async fn run(env: &Env) -> Vec<Row> {
    let c = env.linux.ensure("bench-tree").await.expect("ensure");
    let n = iters(5).min(5);
    let root = CgroupDir::open(&env.cleanup.cgroup_root, false).unwrap();
    let cg = root.child("bench-killpg").unwrap();
    let say = |what: &str, i: usize, r: &Round| {
        println!(
            "  {what} round {i}: kill {}, EOF {}, killed {}, survivors {}",
            fmt_d(r.kill),
            r.eof.map(fmt_d).unwrap_or("never".into()),
            r.killed,
            r.survivors
        )
    };
    let (mut sub, mut base, mut whole) = (vec![], vec![], vec![]);
    for i in 0..n {
        let r = substrate_round(env, &c, i).await;
        say("substrate", i, &r);
        sub.push(r);
        let r = tokio::task::block_in_place(|| killpg_round(env, &cg, i, true));
        say("killpg", i, &r);
        base.push(r);
        let r = tokio::task::block_in_place(|| killpg_round(env, &cg, i, false));
        say("killpg, no escapers", i, &r);
        whole.push(r);
    }
    drop(cg);
    let _ = root.remove_child("bench-killpg");
    let _ = std::io::stdout().flush();
    env.linux.stop(&c).await.unwrap();

    let kill = Stats::of(sub.iter().map(|r| r.kill).collect());
    let eof_all = sub.iter().all(|r| r.eof.is_some());
    let eof = Stats::of(
        sub.iter()
            .map(|r| r.eof.unwrap_or(Duration::from_secs(5)))
            .collect(),
    );
    let surv: usize = sub.iter().map(|r| r.survivors).max().unwrap();
    let bkill = Stats::of(base.iter().map(|r| r.kill).collect());
    let bsurv: usize = base.iter().map(|r| r.survivors).max().unwrap();
    let weof_all = whole.iter().all(|r| r.eof.is_some());
    let weof = Stats::of(
        whole
            .iter()
            .map(|r| r.eof.unwrap_or(Duration::from_secs(5)))
            .collect(),
    );
    let wsurv: usize = whole.iter().map(|r| r.survivors).max().unwrap();
    detail("substrate kill_process (1000-process tree)", &kill);
    detail("substrate kill → pipe EOF", &eof);
    detail("killpg + reap leader", &bkill);
    detail("killpg, no escapers → pipe EOF", &weof);
    let whole_row = row(
        "3",
        format!(
            "tree kill: {TREE} processes via the substrate against killpg of the same tree with no escapers, both until every process exited (pipe EOF)"
        ),
        format!("{} (0 survivors)", fmt_d(eof.median)),
        format!(
            "killpg {}, {wsurv} survivors, EOF {}",
            fmt_d(weof.median),
            if weof_all { "always" } else { "NOT always" }
        ),
        format!("{:.2}×", ratio(eof.median, weof.median)),
        "–",
        None,
    );
    vec![
        row(
            "3",
            format!(
                "tree kill: {TREE} processes via the substrate, kill → all reaped + pipe EOF (median of {n})"
            ),
            format!(
                "{} (max {}), {surv} survivors, EOF {}",
                fmt_d(eof.median),
                fmt_d(
                    *sub.iter()
                        .map(|r| r.eof.as_ref().unwrap_or(&Duration::MAX))
                        .max()
                        .unwrap()
                ),
                if eof_all { "always" } else { "NOT always" }
            ),
            format!(
                "killpg {}, {bsurv} survivors, EOF never",
                fmt_d(bkill.median)
            ),
            format!("{:.1}×", ratio(eof.median, bkill.median)),
            "≤ 50 ms, 0 survivors",
            Some(eof.median <= Duration::from_millis(50) && surv == 0 && eof_all),
        ),
        whole_row,
    ]
}
