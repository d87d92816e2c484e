//! Issue 12 on real containers: the failure paths that used to break an invariant,
//! made real (a cgroup that refuses `cgroup.kill`, a supervisor whose socket is gone),
//! each red on the code before its fix.

use std::os::unix::fs::PermissionsExt;

use stockade_host::bindings::{DetachedState, FacadeError};
use stockade_host::runtime::CallError;
use stockade_host::substrate::Substrate;

use crate::facade::{fx, wait_for};

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
