//! Benchmark 2: Cold ensure of a new key, with a warm pool (`substrate.warm`, full when
//! the key arrives: the default case) and with the pool empty (built on demand): a container ready to run (user, pid, mount, net, UTS, IPC
//! namespaces, cgroups and limits, its storage, its root filesystem, supervisor up and
//! answering) running `/bin/true`, vs a bare `clone3` into the same namespaces running
//! `/bin/true` (the substrate's own clone code, `namespaces::spawn`) and vs bubblewrap
//! with the same isolation (`--unshare-all --unshare-user --uid 1000`, a read-only
//! `/usr`, `/dev`, `/proc`, `/tmp`, `--new-session --die-with-parent`). Interleaved, so
//! kernel state (network namespace teardown runs asynchronously) weighs on every row
//! alike.
//!
//! The burst rows (the warm pool's adaptive size, stockade-linux `warm.rs`): 16 new keys
//! arrive at once (16 concurrent first execs through the facade, each timed from its own
//! start). The first burst meets a pool of its floor (2): what every burst met before the
//! pool learned its arrivals; the later ones meet the pool the first taught (adaptive
//! refill, `warm.rs`). Beside them, in the same rounds, the same 16 concurrent execs on 16
//! keys whose containers are already running: what two CPUs give 16 calls at once with no
//! container to start.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use stockade_linux::{idmap, namespaces};
use stockade_runtime::substrate::Substrate;

use crate::common::*;

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
        attach_in_child: vec![],
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

/// One cold start of a new key through the substrate (ensure + run /bin/true; the
/// stop is not in the figure) and one through the facade (the first exec).
async fn cold_pair(env: &Env, tag: &str, i: usize) -> (Duration, Duration) {
    let key = format!("bench-cold-{tag}-{i}");
    let t = Instant::now();
    let c = env.linux.ensure(&key).await.expect("ensure");
    let r = env
        .linux
        .run(&c, cmd(&["/bin/true"], &[]), Duration::from_secs(30))
        .await
        .expect("run");
    let d_sub = t.elapsed();
    assert_eq!(r.exit_code, 0);
    env.linux.stop(&c).await.unwrap();
    let key = format!("bench-cold-facade-{tag}-{i}");
    let t = Instant::now();
    let o = env.rt.exec(&key, &true_input()).await.expect("exec");
    let d_fac = t.elapsed();
    assert_eq!(o.exit_code, 0);
    env.rt.abort(&key).await.unwrap();
    (d_sub, d_fac)
}

/// Wait (untimed) until a warm pool is full and quiet: each warm row measures a new
/// key arriving at a full pool, not the refill's CPU.
async fn filled(env: &Env) {
    assert!(
        env.linux.warm_filled(Duration::from_secs(60)).await,
        "the warm pool did not fill: {:?}",
        env.linux.warm_status()
    );
}

/// New keys per burst.
const BURST: usize = 16;

/// `BURST` concurrent first execs (facade) on new keys, each timed from its start;
/// then their containers are stopped.
async fn burst(env: &Env, tag: &str, round: usize) -> Vec<Duration> {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..BURST {
        let rt = env.rt.clone();
        let key = format!("bench-burst-{tag}-{round}-{i}");
        set.spawn(async move {
            let t = Instant::now();
            let o = rt.exec(&key, &true_input()).await.expect("exec");
            let d = t.elapsed();
            assert_eq!(o.exit_code, 0);
            (key, d)
        });
    }
    let done = set.join_all().await;
    for (key, _) in &done {
        env.rt.abort(key).await.unwrap();
    }
    done.into_iter().map(|(_, d)| d).collect()
}

/// `BURST` concurrent execs on the keys `hot` (containers running).
async fn hot_burst(env: &Env, hot: &[String]) -> Vec<Duration> {
    let mut set = tokio::task::JoinSet::new();
    for key in hot {
        let rt = env.rt.clone();
        let key = key.clone();
        set.spawn(async move {
            let t = Instant::now();
            let o = rt.exec(&key, &true_input()).await.expect("exec");
            let d = t.elapsed();
            assert_eq!(o.exit_code, 0);
            d
        });
    }
    set.join_all().await
}

/// The burst rows: an untaught pool's burst, taught bursts and hot-key bursts
/// interleaved; the warm figure `warm` (one first exec on a full pool) is the goal's
/// unit.
async fn bursts(env: &Env, warm: &Stats) -> Vec<Row> {
    let pool = Env::with(|c| c.substrate.warm = 2).await;
    filled(&pool).await;
    let untaught = burst(&pool, "untaught", 0).await;
    // Hot keys on the pool-less env: their starts teach no pool.
    let hot: Vec<String> = (0..BURST).map(|i| format!("bench-burst-hot-{i}")).collect();
    for key in &hot {
        env.rt.exec(key, &true_input()).await.expect("exec");
    }
    let rounds = iters(6).max(2);
    let (mut taught, mut hots) = (vec![], vec![]);
    for r in 0..rounds {
        filled(&pool).await;
        taught.extend(burst(&pool, "taught", r).await);
        hots.extend(hot_burst(env, &hot).await);
    }
    let learned = pool.linux.warm_status().target;
    for key in &hot {
        env.rt.abort(key).await.unwrap();
    }
    pool.shutdown().await;
    let (untaught, taught, hots) = (Stats::of(untaught), Stats::of(taught), Stats::of(hots));
    detail(
        "burst of 16 new keys, pool at its floor of 2 (untaught)",
        &untaught,
    );
    detail(
        &format!("burst of 16 new keys, pool taught (target {learned})"),
        &taught,
    );
    detail("16 concurrent execs on 16 running containers", &hots);
    let goal = 2.0;
    let mut rows = vec![];
    for (name, s, is_goal) in [
        (
            "cold: burst of 16 new keys, first exec p95, pool at its floor (untaught)",
            &untaught,
            false,
        ),
        (
            "cold: burst of 16 new keys, first exec p95, adaptive pool (taught)",
            &taught,
            true,
        ),
        (
            "cold: 16 concurrent execs on running containers, p95 (no start)",
            &hots,
            false,
        ),
    ] {
        let r = ratio(s.p95, warm.median);
        rows.push(row(
            "2",
            name,
            format!("{} (median {})", fmt_d(s.p95), fmt_d(s.median)),
            format!("warm first exec {}", fmt_d(warm.median)),
            format!("{r:.2}×"),
            if is_goal { "≤ 2.0× warm" } else { "–" },
            is_goal.then_some(r <= goal),
        ));
    }
    rows
}

pub async fn run(env: &Env) -> Vec<Row> {
    let has_bwrap = bwrap_available();
    if !has_bwrap {
        println!("  bwrap not installed (apt-get install bubblewrap): that baseline is skipped");
    }
    // The embedded default pool is 2; each iteration takes one container per path,
    // so a pool of 2 is full again before each.
    let warm = Env::with(|c| c.substrate.warm = 2).await;
    let n = iters(40);
    let (mut sub, mut fac, mut wsub, mut wfac, mut bare, mut bw) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    // One warm-up of each (page cache, the spawner thread).
    for i in 0..n + 2 {
        let (d_sub, d_fac) = cold_pair(env, "built", i).await;
        filled(&warm).await;
        let (d_wsub, _) = cold_pair(&warm, "warm", i).await;
        filled(&warm).await;
        let (_, d_wfac) = cold_pair(&warm, "warmf", i).await;
        filled(&warm).await;
        let d_bare = tokio::task::spawn_blocking(bare_clone).await.unwrap();
        let d_bw = if has_bwrap {
            Some(tokio::task::spawn_blocking(bwrap).await.unwrap())
        } else {
            None
        };
        if i >= 2 {
            sub.push(d_sub);
            fac.push(d_fac);
            wsub.push(d_wsub);
            wfac.push(d_wfac);
            bare.push(d_bare);
            bw.extend(d_bw);
        }
    }
    warm.shutdown().await;
    let (sub, fac, wsub, wfac, bare) = (
        Stats::of(sub),
        Stats::of(fac),
        Stats::of(wsub),
        Stats::of(wfac),
        Stats::of(bare),
    );
    detail(
        "stockade, warm pool: ensure + run /bin/true (substrate)",
        &wsub,
    );
    detail(
        "stockade, warm pool: first exec on a new key (facade)",
        &wfac,
    );
    detail(
        "stockade, built on demand: ensure + run /bin/true (substrate)",
        &sub,
    );
    detail(
        "stockade, built on demand: first exec on a new key (facade)",
        &fac,
    );
    detail("bare clone3 into the same namespaces", &bare);
    let bw = (!bw.is_empty()).then(|| Stats::of(bw));
    if let Some(bw) = &bw {
        detail(
            "bwrap --unshare-all --unshare-user --uid 1000 … /bin/true",
            bw,
        );
    }
    let mut rows = vec![];
    let rows_of: [(&str, &Stats, bool); 4] = [
        (
            "cold: ensure + run /bin/true, substrate, warm pool (median)",
            &wsub,
            true,
        ),
        (
            "cold: first exec on a new key, facade, warm pool (median)",
            &wfac,
            true,
        ),
        (
            "cold: ensure + run /bin/true, substrate, pool empty (median)",
            &sub,
            false,
        ),
        (
            "cold: first exec on a new key, facade, pool empty (median)",
            &fac,
            false,
        ),
    ];
    for (name, s, goal) in rows_of {
        rows.push(match &bw {
            Some(bw) => row(
                "2",
                name,
                format!("{} (p95 {})", fmt_d(s.median), fmt_d(s.p95)),
                format!("bwrap {}", fmt_d(bw.median)),
                format!("{:.2}×", ratio(s.median, bw.median)),
                if goal { "≤ 1.0× bwrap" } else { "–" },
                goal.then_some(s.median <= bw.median),
            ),
            None => row(
                "2",
                name,
                fmt_d(s.median),
                "bwrap not installed",
                "–",
                if goal { "≤ 1.0× bwrap" } else { "–" },
                None,
            ),
        });
    }
    rows.push(row(
        "2",
        "cold: bare clone3 into the same namespaces (median)",
        fmt_d(bare.median),
        format!("stockade, pool empty {}", fmt_d(sub.median)),
        format!("stockade = {:.1}× bare", ratio(sub.median, bare.median)),
        "–",
        None,
    ));
    rows.extend(bursts(env, &wfac).await);
    rows
}
