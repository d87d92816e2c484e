//! The warm pool (`substrate.warm`): containers built ahead of demand and handed to a
//! new key. A warm container is handed out once, gets the key's snapshot, fence and
//! records, is never handed out dead, and nothing of the pool outlives a shutdown or
//! a restart.

use std::path::Path;
use std::time::Duration;

use stockade_egress::rules::{Grant, RuleSpec};
use stockade_linux::Linux;
use stockade_runtime::substrate::Substrate;

use crate::support::{DEADLINE, harness, host_server, setup, stockade_exe};

const FILL: Duration = Duration::from_secs(60);

/// Every pid in a cgroup and its descendants.
fn pids_under(cg: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_to_string(cg.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for e in std::fs::read_dir(cg).into_iter().flatten().flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(pids_under(&e.path()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_gets_the_warm_container_and_the_pool_refills() {
    let h = harness(|c| c.substrate.warm = 1).await;
    assert!(h.linux.warm_filled(FILL).await, "the pool never filled");
    let warm = h.linux.warm_ids();
    assert_eq!(warm.len(), 1, "{warm:?}");
    let a = h.linux.ensure("a").await.unwrap();
    assert_eq!(a, warm[0], "the new key got the warm container");
    assert!(
        h.linux.warm_filled(FILL).await,
        "the pool refilled after the take"
    );
    let next = h.linux.warm_ids();
    assert_eq!(next.len(), 1);
    assert_ne!(next[0], a, "a container is handed out once");
    // An existing key keeps its container: the pool is not touched.
    assert_eq!(h.linux.ensure("a").await.unwrap(), a);
    assert_eq!(h.linux.warm_ids(), next);
    let b = h.linux.ensure("b").await.unwrap();
    assert_eq!(b, next[0]);
    assert_ne!(a, b);
    // Each is a working container with its own hostname.
    for c in [&a, &b] {
        let r = h
            .linux
            .run(c, h.cmd("cat /etc/hostname; id -u"), DEADLINE)
            .await
            .unwrap();
        let out = String::from_utf8_lossy(&r.stdout).to_string();
        assert!(out.starts_with(&format!("stockade-{}", &c[..12])), "{out}");
        assert!(out.ends_with("1000\n"), "{out}");
    }
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_container_gets_the_keys_snapshot_owned_by_its_workload_user() {
    let h = harness(|c| c.substrate.warm = 1).await;
    let first = h.linux.ensure("snap").await.unwrap();
    let r = h
        .linux
        .run(
            &first,
            h.cmd("mkdir -p d && echo kept > d/f && ln -s d/f link"),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    h.linux.snapshot(&first).await.unwrap();
    h.linux.stop(&first).await.unwrap();
    assert!(h.linux.warm_filled(FILL).await, "the pool never filled");
    let warm = h.linux.warm_ids();
    let second = h.linux.ensure("snap").await.unwrap();
    assert_eq!(second, warm[0], "the restart came from the pool");
    let r = h
        .linux
        .run(
            &second,
            h.cmd("cat d/f; readlink link; stat -c %u d/f; echo more >> d/f && echo writable"),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        "kept\nd/f\n1000\nwritable\n",
        "{r:?}"
    );
    // Another key's warm container holds nothing of this key's.
    let other = h.linux.ensure("other").await.unwrap();
    let r = h
        .linux
        .run(&other, h.cmd("ls -A /workspace | wc -l"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "0", "{r:?}");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_container_serves_its_keys_fence_and_records_its_denials() {
    let h = harness(|c| c.substrate.warm = 1).await;
    let port = host_server();
    assert!(h.linux.warm_filled(FILL).await, "the pool never filled");
    let warm = h.linux.warm_ids();
    let c = h.linux.ensure("fenced").await.unwrap();
    assert_eq!(c, warm[0]);
    let curl =
        format!("curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://127.0.0.2:{port}/");
    let grant = Grant::parse(&[RuleSpec::new("127.0.0.2", &[], None)]).unwrap();
    h.linux.apply_grant(&c, "fence-1", grant).await.unwrap();
    let r = h.linux.run(&c, h.cmd(&curl), DEADLINE).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "200", "{r:?}");
    h.linux.revoke_grant(&c).await.unwrap();
    let r = h.linux.run(&c, h.cmd(&curl), DEADLINE).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "403", "{r:?}");
    let denials = h.linux.denials("fenced").await.unwrap();
    assert_eq!(denials.len(), 1, "the denial is the key's: {denials:?}");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_warm_container_is_discarded_never_handed_out() {
    let h = harness(|c| c.substrate.warm = 1).await;
    assert!(h.linux.warm_filled(FILL).await, "the pool never filled");
    let dead = h.linux.warm_ids().remove(0);
    let cg = h.cgroup_root.join(&dead);
    let pids = pids_under(&cg);
    assert_eq!(
        pids.len(),
        1,
        "a warm container runs its supervisor only: {pids:?}"
    );
    // Wait on the event the substrate itself sees: the supervisor's pidfd turning
    // readable (the kernel notifies it after the process left its cgroup, so an empty
    // cgroup.procs alone would race it).
    let pid = rustix::process::Pid::from_raw(pids[0]).expect("a supervisor's pid");
    let pidfd =
        rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).expect("pidfd_open");
    rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL)
        .expect("kill the supervisor");
    assert!(
        stockade_tests::poll_readable(&pidfd, DEADLINE),
        "the killed supervisor lingers"
    );
    let c = h.linux.ensure("k").await.unwrap();
    assert_ne!(c, dead, "a dead warm container was handed out");
    let r = h
        .linux
        .run(&c, h.cmd("echo alive"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "alive\n");
    assert!(!cg.exists(), "the dead warm container's cgroup was removed");
    assert!(
        !h.container_dir(&dead).exists(),
        "the dead warm container's directory was removed"
    );
    h.finish().await;
}

/// A shutdown while the pool is still building (the refiller starts with the
/// substrate) and one with a full pool both leave nothing: `finish` checks cgroups,
/// mounts, directories and v1 limit directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_mid_build_or_with_a_full_pool_leaves_nothing() {
    let h = harness(|c| c.substrate.warm = 2).await;
    assert!(
        h.linux.warm_status().building,
        "the refiller starts at once"
    );
    h.finish().await;
    let h = harness(|c| c.substrate.warm = 2).await;
    assert!(h.linux.warm_filled(FILL).await, "the pool never filled");
    assert_eq!(h.linux.warm_ids().len(), 2);
    h.finish().await;
}

/// A host killed with a full pool (dropped without a shutdown): the next start sweeps
/// the warm containers like any other it owns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_sweeps_the_previous_hosts_warm_containers() {
    let mut h = harness(|c| c.substrate.warm = 1).await;
    assert!(h.linux.warm_filled(FILL).await, "the pool never filled");
    let old = h.linux.warm_ids().remove(0);
    h.restart().await;
    assert!(!h.cgroup_root.join(&old).exists(), "swept at start");
    assert!(!h.container_dir(&old).exists(), "swept at start");
    assert!(h.linux.warm_filled(FILL).await, "the new pool filled");
    assert_ne!(h.linux.warm_ids(), vec![old]);
    h.finish().await;
}

/// The id pool must cover every container that may exist: the ceiling's and the
/// warm ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_id_pool_must_cover_the_ceiling_and_the_warm_pool() {
    let s = setup("warm-ids", |c| {
        c.substrate.ceiling = 4;
        c.substrate.warm = 1;
        c.substrate.ids.containers = 4;
    });
    let err = match Linux::new(&s.cfg, s.store.clone(), stockade_exe()).await {
        Ok(_) => panic!("started with too few id ranges"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("ceiling + substrate.warm"), "{err}");
    let _ = std::fs::remove_dir_all(&s.data);
}

/// Adaptive refill (stockade-linux `warm.rs`): a burst of new keys teaches the pool its
/// size (the most arrivals within a second), and the pool refills to it within the ticket
/// gate: with keys live, it holds at most the floor plus the tickets nobody holds, so live
/// and warm containers stay within `ceiling + warm`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_teaches_the_pool_its_size_within_the_free_tickets() {
    // Ceiling 4, floor 1.
    let h = harness(|c| c.substrate.warm = 1).await;
    assert!(h.linux.warm_filled(FILL).await, "the pool never filled");
    assert_eq!(h.linux.warm_status().target, 1, "nothing learned yet");
    let burst = |tag: &'static str| {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..3 {
            let linux = h.linux.clone();
            set.spawn(async move { linux.ensure(&format!("{tag}-{i}")).await.unwrap() });
        }
        async move { set.join_all().await }
    };
    let first = burst("first").await;
    for c in &first {
        h.linux.stop(c).await.unwrap();
    }
    assert!(h.linux.warm_filled(FILL).await, "the pool never refilled");
    assert_eq!(
        h.linux.warm_status().target,
        3,
        "the burst's size was learned"
    );
    let warm = h.linux.warm_ids();
    assert_eq!(warm.len(), 3, "the next burst finds a container each");
    let second = burst("second").await;
    for c in &second {
        assert!(warm.contains(c), "{c} was built on demand, not taken warm");
    }
    // 3 live of a ceiling of 4: the pool holds its floor + 1 free ticket.
    assert!(h.linux.warm_filled(FILL).await, "the pool never refilled");
    assert_eq!(h.linux.warm_status().target, 2);
    assert_eq!(
        h.linux.warm_ids().len(),
        2,
        "live + warm within ceiling + warm"
    );
    for c in &second {
        h.linux.stop(c).await.unwrap();
    }
    h.finish().await;
}
