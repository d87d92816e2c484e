//! On real containers: the failure paths that used to break an invariant,
//! made real (a cgroup that refuses `cgroup.kill`, a supervisor whose socket is gone),
//! each red on the code before its fix.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use stockade_runtime::bindings::{DetachedState, FacadeError};
use stockade_runtime::runtime::CallError;
use stockade_runtime::substrate::Housekeeping as _;
use stockade_runtime::substrate::Substrate;

use crate::facade::{fx, grant, out, wait_for};
use crate::support::DEADLINE;

/// A kill that fails (the leaf's `cgroup.kill` refuses the supervisor) leaves the tree
/// tracked: the stop fails, a retried stop fails too instead of answering success while
/// the tree lives, the process is still running and declared; once the cgroup accepts
/// the kill again, the stop kills it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_that_fails_keeps_the_tree_tracked() {
    let f = fx(|_| {}).await;
    let id =
        f.rt.start_detached("k", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    wait_for("the detached process runs", || f.marked().len() == 1).await;
    let c = f.linux.current("k").await.unwrap().unwrap();
    let kill_file = f.cgroup_root.join(&c).join(&id).join("cgroup.kill");
    let owner = std::fs::metadata(&kill_file).unwrap();
    let (uid, gid) = {
        use std::os::unix::fs::MetadataExt;
        (owner.uid(), owner.gid())
    };
    // The supervisor (the container's root, an unprivileged host uid) may no longer
    // write it.
    std::os::unix::fs::chown(&kill_file, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&kill_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    for attempt in 0..2 {
        let r = f.rt.stop_detached("k", &id).await;
        assert!(
            matches!(r, Err(CallError::Facade(FacadeError::Failed(_)))),
            "attempt {attempt}: a stop that killed nothing answered {r:?}"
        );
        assert_eq!(f.marked().len(), 1, "the tree is alive");
        assert_eq!(
            f.rt.detached_status("k", &id).await.unwrap(),
            DetachedState::Running
        );
        assert_eq!(f.declarations().len(), 1, "the declaration is kept");
    }
    std::os::unix::fs::chown(&kill_file, Some(uid), Some(gid)).unwrap();
    f.rt.stop_detached("k", &id)
        .await
        .expect("the kill works again");
    f.assert_no_marked("stopped").await;
    assert!(f.declarations().is_empty());
    f.finish().await;
}

/// A supervisor that cannot be reached over its socket while its container lives is an
/// error the caller sees, not a gone container: the stop fails, the declaration stays,
/// the process runs on (a failed request used to read as "container gone": records
/// cleared, the stop answered success, nothing killed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_supervisor_connection_is_not_a_gone_container() {
    let f = fx(|_| {}).await;
    let id =
        f.rt.start_detached("k", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    wait_for("the detached process runs", || f.marked().len() == 1).await;
    let c = f.linux.current("k").await.unwrap().unwrap();
    // The socket's path goes away and the pooled connections with it: every new
    // request fails to connect, while the supervisor lives.
    std::fs::remove_file(f.data.join("containers").join(&c).join("sup.sock")).unwrap();
    f.linux.drop_connections(&c);
    let r = f.rt.stop_detached("k", &id).await;
    assert!(
        matches!(r, Err(CallError::Facade(FacadeError::Failed(_)))),
        "a failed request was taken for a gone container: {r:?}"
    );
    assert_eq!(f.declarations().len(), 1, "the declaration is kept");
    assert_eq!(f.marked().len(), 1, "the process runs on");
    // Abort still stops it (from the host: the pidfd and cgroup.kill).
    f.rt.abort("k").await.unwrap();
    f.assert_no_marked("aborted").await;
    assert!(f.declarations().is_empty());
    f.finish().await;
}

/// The supervisor SIGKILLed in the middle of a fence (its command and what the command
/// backgrounded running, the grant open): the call answers a typed error, the grant is
/// closed, the whole tree is dead, the container's cgroup is gone and nothing is
/// declared; the key's next exec gets a new container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_killed_mid_fence_closes_the_fence() {
    let f = std::sync::Arc::new(fx(|_| {}).await);
    let events = f.rt.spawn_event_loop();
    let mut input = f.sh("sleep 1000 & exec sleep 1000");
    input.grant = Some(grant("127.0.0.2", &[], None));
    let call = {
        let f = f.clone();
        tokio::spawn(async move { f.rt.exec("k", &input).await })
    };
    wait_for("the command and its background run", || {
        f.marked().len() == 2
    })
    .await;
    let c = f.linux.current("k").await.unwrap().unwrap();
    assert_eq!(f.linux.open_grants(), vec![c.clone()], "the fence is open");
    let pid = f.linux.supervisor_pid(&c).unwrap();
    stockade_tests::kill(pid, rustix::process::Signal::KILL).expect("kill the supervisor");
    let r = tokio::time::timeout(DEADLINE, call)
        .await
        .expect("the call answers once its supervisor is dead")
        .unwrap();
    assert!(
        matches!(r, Err(CallError::Facade(_))),
        "a typed error, got {r:?}"
    );
    assert!(f.linux.open_grants().is_empty(), "a grant is left open");
    f.assert_no_marked("the tree died with its supervisor")
        .await;
    wait_for("the container's cgroup is gone", || {
        f.container_cgroups() == 0
    })
    .await;
    assert!(f.declarations().is_empty());
    let o = f.rt.exec("k", &f.sh("echo back")).await.unwrap();
    assert_eq!(out(&o.stdout), "back\n");
    events.abort();
    let _ = events.await;
    std::sync::Arc::into_inner(f)
        .expect("the call's clone is gone")
        .finish()
        .await;
}

/// The data directory's disk full (a small tmpfs, filled to ENOSPC): a checkpoint
/// fails with a typed error and changes nothing (the container runs on, the detached
/// process is running and declared, no partial snapshot is left); a fenced exec still
/// works and closes its fence; a start-detached either declares its process or leaves
/// none. Once space is back, the checkpoint works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_disk_fails_cleanly() {
    let _ns = crate::support::SPAWNER_NAMESPACE.lock().await;
    let mut data = PathBuf::new();
    let f = fx(|c| {
        data = c.substrate.data_dir.clone();
        std::fs::create_dir_all(&data).unwrap();
        mount_tmpfs(&data, "size=16m,mode=0700");
    })
    .await;
    let o =
        f.rt.exec("k", &f.sh("head -c 4000000 /dev/urandom > blob && echo ok"))
            .await
            .unwrap();
    assert_eq!(out(&o.stdout), "ok\n", "{}", out(&o.stderr));
    let id =
        f.rt.start_detached("k", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    wait_for("the detached process runs", || f.marked().len() == 1).await;
    let filler = data.join("filler");
    fill(&filler);

    let r = f.rt.checkpoint("k").await;
    assert!(
        matches!(&r, Err(CallError::Facade(FacadeError::Failed(m))) if m.contains("snapshot")),
        "a checkpoint on a full disk: {r:?}"
    );
    assert!(
        f.linux.current("k").await.unwrap().is_some(),
        "the container runs on"
    );
    assert_eq!(
        f.rt.detached_status("k", &id).await.unwrap(),
        DetachedState::Running
    );
    assert_eq!(f.declarations().len(), 1);
    let snapshots: Vec<_> = std::fs::read_dir(data.join("snapshots"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        snapshots.is_empty(),
        "a partial snapshot is left: {snapshots:?}"
    );

    let mut fenced = f.sh("echo fenced");
    fenced.grant = Some(grant("127.0.0.2", &[], None));
    let o = f.rt.exec("k", &fenced).await.unwrap();
    assert_eq!(out(&o.stdout), "fenced\n");
    assert!(f.linux.open_grants().is_empty());
    assert_eq!(f.marked().len(), 1, "the declared process is spared");

    match f.rt.start_detached("k", &f.sh("exec sleep 1000")).await {
        Ok(_) => {
            eprintln!("start-detached on a full disk: the record fit in the store's free pages");
            assert_eq!(f.declarations().len(), 2);
            assert_eq!(f.marked().len(), 2);
        }
        Err(e) => {
            eprintln!("start-detached on a full disk: {e:?}");
            assert!(
                matches!(e, CallError::Facade(FacadeError::Failed(_))),
                "{e:?}"
            );
            assert_eq!(f.declarations().len(), 1);
            assert_eq!(f.marked().len(), 1, "an undeclared process was left");
        }
    }

    std::fs::remove_file(&filler).unwrap();
    f.rt.checkpoint("k")
        .await
        .expect("the checkpoint works with space");
    f.assert_no_marked("checkpointed").await;
    assert!(f.declarations().is_empty());
    f.rt.shutdown().await;
    // The store keeps its database open: detach the mount, the memory goes with it.
    rustix::mount::unmount(&data, rustix::mount::UnmountFlags::DETACH).expect("umount");
    f.finish().await;
}

fn mount_tmpfs(at: &std::path::Path, opts: &str) {
    use rustix::mount::{MountFlags, mount};
    let opts = std::ffi::CString::new(opts).unwrap();
    // A fresh tmpfs over the test's own directory.
    mount(
        "tmpfs",
        at,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        opts.as_c_str(),
    )
    .expect("mount tmpfs");
}

/// Write to `path` until the filesystem is full.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5a_u8; 64 * 1024];
    for size in [chunk.len(), 4096, 1] {
        loop {
            match file.write(&chunk[..size]) {
                Ok(0) => break,
                Ok(_) => {}
                // ENOSPC.
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
    }
}
