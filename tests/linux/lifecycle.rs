//! Container lifecycle: a supervisor killed from outside, snapshot and restore.

use std::time::Duration;

use stockade_runtime::substrate::Housekeeping as _;
use stockade_runtime::substrate::{Event, Substrate, SubstrateError};

use crate::support::{DEADLINE, harness, wait_marked_at_least};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_killed_from_outside_is_reported_stopped() {
    let h = harness(|_| {}).await;
    let mut events = h.linux.subscribe();
    let c = h.linux.ensure("outside").await.unwrap();
    h.linux
        .start_process(&c, h.cmd("sleep 1000"))
        .await
        .unwrap();
    wait_marked_at_least(&h, 1).await;
    let pid = h.linux.supervisor_pid(&c).unwrap();
    // The supervisor is our child, not yet reaped.
    stockade_tests::kill(pid, rustix::process::Signal::KILL).expect("kill the supervisor");
    let ev = tokio::time::timeout(DEADLINE, events.recv())
        .await
        .expect("an event")
        .unwrap();
    assert_eq!(ev, Event::Stopped(c.clone()));
    assert!(matches!(
        h.linux.list_processes(&c).await,
        Err(SubstrateError::Unreachable(_))
    ));
    assert_eq!(h.linux.current("outside").await.unwrap(), None);
    h.assert_no_marked("the PID namespace died with its PID 1")
        .await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_and_stop_then_ensure_restores_the_workspace() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("snap").await.unwrap();
    let r = h
        .linux
        .run(&c, h.cmd("mkdir -p sub && echo kept > sub/file && ln -s sub/file link && echo art > /artifacts/a"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    h.linux.snapshot(&c).await.unwrap();
    h.linux.stop(&c).await.unwrap();
    // The stopped container's artifacts stay readable until the key's next container.
    assert_eq!(
        h.linux.read_artifact("snap", "a", 0, 10).await.unwrap(),
        b"art\n"
    );
    let c2 = h.linux.ensure("snap").await.unwrap();
    assert_ne!(c, c2);
    let r = h
        .linux
        .run(
            &c2,
            h.cmd("cat sub/file; readlink link; ls /artifacts | wc -l"),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "kept\nsub/file\n0\n");
    assert!(
        !h.container_dir(&c).exists(),
        "the previous container's directory is replaced"
    );
    assert!(h.linux.list_artifacts("snap").await.unwrap().is_empty());
    let _ = Duration::ZERO;
    h.finish().await;
}

/// After the host dies without stopping anything and starts again, the start-up sweep
/// kills every leftover container: no orphan survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_sweeps_containers_a_dead_host_left_behind() {
    let mut h = harness(|_| {}).await;
    let c = h.linux.ensure("orphan").await.unwrap();
    h.linux
        .start_process(&c, h.cmd("setsid sleep 1000 & sleep 1000"))
        .await
        .unwrap();
    wait_marked_at_least(&h, 2).await;
    h.restart().await;
    h.assert_no_marked("after the restart's sweep").await;
    assert_eq!(h.linux.current("orphan").await.unwrap(), None);
    assert!(!h.container_dir(&c).join("workspace").exists());
    h.finish().await;
}

/// `idle` names a key whose container had no call for the period and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_names_quiet_containers_only() {
    let h = harness(|_| {}).await;
    let quiet = h.linux.ensure("quiet").await.unwrap();
    let busy = h.linux.ensure("busy").await.unwrap();
    h.linux
        .start_process(&busy, h.cmd("sleep 1000"))
        .await
        .unwrap();
    assert_eq!(
        h.linux.idle(Duration::ZERO).await,
        vec!["quiet".to_string()]
    );
    assert!(h.linux.idle(Duration::from_secs(3600)).await.is_empty());
    let _ = quiet;
    h.finish().await;
}

/// Invariant 12: a second instance with another data directory, even under the same
/// cgroup root, sweeps nothing of the first one's: its containers and their processes
/// live on, and it leaves their cgroups alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_touches_only_its_own_sandboxes() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("first").await.unwrap();
    let id = h
        .linux
        .start_process(&c, h.cmd("exec sleep 1000"))
        .await
        .unwrap();
    wait_marked_at_least(&h, 1).await;
    // Another data directory, the same cgroup root: what a second server or a test
    // suite next to a server used to be.
    let root = h.cgroup_root.display().to_string();
    let other = crate::support::setup("second", move |cfg| cfg.substrate.cgroup_root = root);
    let second = crate::support::start_linux(&other).await;
    let st = h.linux.process_status(&c, &id).await.unwrap().unwrap();
    assert!(
        st.running,
        "the second instance's sweep killed the first's process: {st:?}"
    );
    assert_eq!(h.marked().len(), 1);
    assert!(h.cgroup_root.join(&c).is_dir(), "its cgroup was removed");
    // The second one works beside it.
    let c2 = second.ensure("second").await.unwrap();
    let r = second
        .run(&c2, h.cmd("echo beside"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "beside\n");
    second.shutdown().await;
    assert!(
        h.linux
            .process_status(&c, &id)
            .await
            .unwrap()
            .unwrap()
            .running
    );
    let _ = std::fs::remove_dir_all(&other.data);
    h.finish().await;
}
