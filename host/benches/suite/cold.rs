//! Benchmark 2: Cold ensure: a container ready to run (user, pid, mount, net, UTS, IPC
//! namespaces, cgroups and limits, its storage, its root filesystem, supervisor up and
//! answering) running `/bin/true`, vs a bare `clone3` into the same namespaces running
//! `/bin/true` (the substrate's own clone code, `namespaces::spawn`) and vs bubblewrap
//! with the same isolation (`--unshare-all --unshare-user --uid 1000`, a read-only
//! `/usr`, `/dev`, `/proc`, `/tmp`, `--new-session --die-with-parent`). Interleaved, so
//! kernel state (network namespace teardown runs asynchronously) weighs on every row
//! alike.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use stockade_host::substrate::Substrate;
use stockade_host::substrate::linux::{idmap, namespaces};

use crate::common::*;

const BWRAP: &[&str] = &[
    "--unshare-all",
    "--unshare-user",
    "--uid",
    "1000",
    "--gid",
    "1000",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--new-session",
    "--die-with-parent",
    "/bin/true",
];

fn bwrap_available() -> bool {
    std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// clone3 into new user/pid/mnt/net/uts/ipc namespaces (ids mapped onto a leased
/// range), execve /bin/true, wait for it.
fn bare_clone() -> Duration {
    let lease = idmap::lease(&Default::default())
        .unwrap()
        .expect("a free id range");
    let exe = OwnedFd::from(std::fs::File::open("/bin/true").unwrap());
    let t = Instant::now();
    let spawned = namespaces::spawn(namespaces::SpawnRequest {
        exe,
        argv: vec![CString::new("true").unwrap()],
        envp: vec![],
        fds: vec![],
        open_in_child: vec![],
        cgroup: None,
        namespaces: true,
        id_map: Some(lease.map_line()),
        join: vec![],
    })
    .expect("clone3");
    let status = Some(namespaces::reap_blocking(&spawned.pidfd).unwrap());
    let d = t.elapsed();
    assert_eq!(status, Some(0), "bare clone: /bin/true failed");
    d
}

fn bwrap() -> Duration {
    let t = Instant::now();
    let s = std::process::Command::new("bwrap")
        .args(BWRAP)
        .status()
        .unwrap();
    let d = t.elapsed();
    assert!(s.success(), "bwrap failed: {s}");
    d
}

pub async fn run(env: &Env) -> Vec<Row> {
    let has_bwrap = bwrap_available();
    if !has_bwrap {
        println!("  bwrap not installed (apt-get install bubblewrap): that baseline is skipped");
    }
    let n = iters(40);
    let t_cmd = cmd(&["/bin/true"], &[]);
    let (mut sub, mut fac, mut stop, mut bare, mut bw) = (vec![], vec![], vec![], vec![], vec![]);
    // One warm-up of each (page cache, the spawner thread).
    for i in 0..n + 2 {
        let key = format!("bench-cold-{i}");
        let t = Instant::now();
        let c = env.linux.ensure(&key).await.expect("ensure");
        let r = env
            .linux
            .run(&c, t_cmd.clone(), Duration::from_secs(30))
            .await
            .expect("run");
        let d_sub = t.elapsed();
        assert_eq!(r.exit_code, 0);
        let t = Instant::now();
        env.linux.stop(&c).await.unwrap();
        let d_stop = t.elapsed();

        let key = format!("bench-cold-facade-{i}");
        let t = Instant::now();
        let o = env.rt.exec(&key, &true_input()).await.expect("exec");
        let d_fac = t.elapsed();
        assert_eq!(o.exit_code, 0);
        env.rt.abort(&key).await.unwrap();

        let d_bare = tokio::task::spawn_blocking(bare_clone).await.unwrap();
        let d_bw = if has_bwrap {
            Some(tokio::task::spawn_blocking(bwrap).await.unwrap())
        } else {
            None
        };
        if i >= 2 {
            sub.push(d_sub);
            stop.push(d_stop);
            fac.push(d_fac);
            bare.push(d_bare);
            bw.extend(d_bw);
        }
    }
    let (sub, fac, stop, bare) = (
        Stats::of(sub),
        Stats::of(fac),
        Stats::of(stop),
        Stats::of(bare),
    );
    detail("stockade: ensure + run /bin/true (substrate)", &sub);
    detail("stockade: first exec on a new key (facade)", &fac);
    detail("stockade: stop (not in the figure)", &stop);
    detail("bare clone3 into the same namespaces", &bare);
    let bw = (!bw.is_empty()).then(|| Stats::of(bw));
    if let Some(bw) = &bw {
        detail(
            "bwrap --unshare-all --unshare-user --uid 1000 … /bin/true",
            bw,
        );
    }
    let mut rows = vec![];
    match &bw {
        Some(bw) => {
            rows.push(row(
                "2",
                "cold: ensure + run /bin/true, substrate (median)",
                format!("{} (p95 {})", fmt_d(sub.median), fmt_d(sub.p95)),
                format!("bwrap {}", fmt_d(bw.median)),
                format!("{:.2}×", ratio(sub.median, bw.median)),
                "≤ 1.0× bwrap",
                Some(sub.median <= bw.median),
            ));
            rows.push(row(
                "2",
                "cold: first exec on a new key, facade (median)",
                format!("{} (p95 {})", fmt_d(fac.median), fmt_d(fac.p95)),
                format!("bwrap {}", fmt_d(bw.median)),
                format!("{:.2}×", ratio(fac.median, bw.median)),
                "≤ 1.0× bwrap",
                Some(fac.median <= bw.median),
            ));
        }
        None => rows.push(row(
            "2",
            "cold: ensure + run /bin/true, substrate (median)",
            fmt_d(sub.median),
            "bwrap not installed",
            "–",
            "≤ 1.0× bwrap",
            None,
        )),
    }
    rows.push(row(
        "2",
        "cold: bare clone3 into the same namespaces (median)",
        fmt_d(bare.median),
        format!("stockade {}", fmt_d(sub.median)),
        format!("stockade = {:.1}× bare", ratio(sub.median, bare.median)),
        "–",
        None,
    ));
    rows
}
