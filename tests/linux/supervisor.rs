//! The supervisor executable, a container's PID 1 (its own small executable, DESIGN §4):
//! the host finds it where `substrate.supervisor` says, refuses to start without it, and a
//! supervisor that never ran is an error naming the step its clone child failed.

use stockade_linux::{Linux, supervisor_exe};

use crate::support::{assert_left_nothing, setup};

/// A file that exists (start-up checks that) but may not be executed: the clone child
/// fails at its `execveat`, and `ensure` says so. It used to say only "exited during
/// set-up": the child's exit code (127) was never decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_that_cannot_be_executed_is_an_error_naming_the_step() {
    // The substrate's traits (ensure; shutdown), whichever of them holds which.
    use stockade_runtime::substrate::*;
    let s = setup("sup-exec", |_| {});
    let bogus = s.data.join("not-a-supervisor");
    std::fs::write(&bogus, b"not an executable\n").unwrap();
    let linux = Linux::new(&s.cfg, s.store.clone(), bogus)
        .await
        .expect("linux substrate");
    let err = linux
        .ensure("sup-exec")
        .await
        .expect_err("no container without its supervisor")
        .to_string();
    assert!(
        err.contains("the supervisor did not start: executing the supervisor: "),
        "{err}"
    );
    linux.shutdown().await;
    assert_left_nothing(&s.cgroup_root, &s.data, &s.mountinfo);
}

/// No supervisor executable: start-up refuses, naming the key that says where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_supervisor_refuses_start_naming_its_key() {
    let s = setup("sup-missing", |_| {});
    let missing = s.data.join("no-such-supervisor");
    let err = match Linux::new(&s.cfg, s.store.clone(), missing).await {
        Ok(_) => panic!("started without a supervisor"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("no-such-supervisor"), "{err}");
    assert!(err.contains("substrate.supervisor"), "{err}");
    let _ = std::fs::remove_dir_all(&s.data);
}

/// `substrate.supervisor`: `auto` is `stockade-supervisor` beside the running
/// executable; anything else is that path.
#[test]
fn the_supervisor_is_found_beside_the_executable_unless_configured() {
    let mut cfg = stockade_runtime::config::Config::embedded().substrate;
    assert_eq!(cfg.supervisor, "auto");
    let me = std::env::current_exe().unwrap();
    assert_eq!(
        supervisor_exe(&cfg).unwrap(),
        me.parent().unwrap().join("stockade-supervisor")
    );
    cfg.supervisor = "/opt/stockade/pid1".into();
    assert_eq!(
        supervisor_exe(&cfg).unwrap(),
        std::path::PathBuf::from("/opt/stockade/pid1")
    );
}

/// The mount namespace every container is cloned from holds no container's storage: a clone
/// copies its parent's namespace mount by mount, and the host's has one storage mount per
/// live container. Each child gets its storage as a detached copy instead, and works on the
/// host's tmpfs: what a command writes, the host reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_containers_are_cloned_from_holds_no_storage_mount() {
    use stockade_runtime::substrate::Substrate as _;
    let _ns = crate::support::SPAWNER_NAMESPACE.lock().await;
    let f = crate::facade::fx(|_| {}).await;
    let mut storage = Vec::new();
    for key in ["a", "b"] {
        let o =
            f.rt.exec(
                key,
                &f.sh("echo from-$0 > /workspace/x && cat /workspace/x"),
            )
            .await
            .unwrap();
        assert_eq!(crate::facade::out(&o.stdout), "from-sh\n");
        let c = f
            .linux
            .current(key)
            .await
            .unwrap()
            .expect("the container runs");
        let fs = f.data.join("containers").join(&c).join("fs");
        assert_eq!(
            std::fs::read_to_string(fs.join("workspace/x")).unwrap(),
            "from-sh\n",
            "the container wrote on the host's storage"
        );
        storage.push(format!(" {} ", fs.display()));
    }
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let spawner = stockade_linux::namespaces::spawner_task().expect("the spawner thread runs");
    let cloned_from = std::fs::read_to_string(spawner.join("mountinfo")).unwrap();
    for fs in &storage {
        assert!(host.contains(fs.as_str()), "the host mounts{fs}");
        assert!(
            !cloned_from.contains(fs.as_str()),
            "the namespace containers are cloned from holds the storage mount{fs}"
        );
    }
    f.finish().await;
}

/// More calls at once than a supervisor has connection workers are all answered: one
/// beyond them waits in the listen backlog until a busy connection ends, and the host
/// keeps fewer connections idle (each holds a worker) than there are workers, so a
/// worker frees up. Twice: the second time the host holds idle connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_calls_at_once_than_workers_are_all_answered() {
    use stockade_runtime::substrate::{Command, Substrate as _};
    let f = std::sync::Arc::new(crate::facade::fx(|_| {}).await);
    let o = f.rt.exec("k", &f.sh("true")).await.unwrap();
    assert_eq!(o.exit_code, 0);
    let c = f
        .linux
        .current("k")
        .await
        .unwrap()
        .expect("the container runs");
    let workspace = f.data.join("containers").join(&c).join("fs/workspace");
    let n = stockade_linux::SUPERVISOR_WORKERS + 1;
    for round in 0..2 {
        let go = workspace.join("go");
        let _ = std::fs::remove_file(&go);
        let runs: Vec<_> = (0..n)
            .map(|i| {
                let (f, c) = (f.clone(), c.clone());
                let script = format!(
                    "touch /workspace/started-{round}-{i}; while [ ! -e /workspace/go ]; do sleep 0.02; done"
                );
                let cmd = Command {
                    argv: vec!["sh".into(), "-c".into(), script],
                    cwd: "/workspace".into(),
                    env: vec![("STOCKADE_TEST_MARKER".into(), f.marker.clone())],
                    stdin: vec![],
                    stdin_stream: None,
                };
                tokio::spawn(async move { f.linux.run(&c, cmd, crate::support::DEADLINE).await })
            })
            .collect();
        let started = |w: &std::path::Path| {
            (0..n)
                .filter(|i| w.join(format!("started-{round}-{i}")).exists())
                .count()
        };
        crate::facade::wait_for("as many runs as workers run", || {
            started(&workspace) >= n - 1
        })
        .await;
        std::fs::write(&go, b"").unwrap();
        for r in runs {
            let r = tokio::time::timeout(crate::support::DEADLINE, r)
                .await
                .unwrap_or_else(|_| {
                    panic!("round {round}: a call waited for a worker past the deadline")
                });
            assert_eq!(r.unwrap().unwrap().exit_code, 0);
        }
        assert_eq!(started(&workspace), n, "round {round}: every run ran");
    }
    std::sync::Arc::into_inner(f)
        .expect("the runs' clones are gone")
        .finish()
        .await;
}
