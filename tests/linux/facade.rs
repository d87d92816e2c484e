//! The facade on real containers: the guest `.wasm` through the wasmtime runtime over
//! the linux substrate. This module holds the harness (a `Runtime` over an
//! `Arc<Linux>`, with the same leftovers check as `support::Harness`) and the
//! conformance scenarios that apply on linux, written against real processes.
//! `facade_egress` and `facade_lifecycle` use the harness.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stockade_linux::Linux;
use stockade_runtime::bindings::{DetachedState, ExecInput, FacadeError, GoneReason, Grant, Rule};
use stockade_runtime::config::Config;
use stockade_runtime::runtime::{CallError, Runtime};
use stockade_runtime::substrate::Housekeeping as _;
use stockade_runtime::substrate::Substrate;
use stockade_store::Store;
use stockade_tests::compiled;

use crate::support::{DEADLINE, marked_processes};

/// One test's runtime over a real linux substrate, and what it must clean up.
pub struct Fx {
    pub rt: Arc<Runtime>,
    pub linux: Arc<Linux>,
    pub store: Arc<Store>,
    pub data: PathBuf,
    pub cgroup_root: PathBuf,
    /// Every command a test runs carries `STOCKADE_TEST_MARKER=<marker>`.
    pub marker: String,
    mountinfo: String,
    /// Sweeps what the test made if it panics before `finish` (last: dropped last).
    _sweep: stockade_tests::SweepOnPanic,
}

/// A runtime over a fresh linux substrate with `tweak` applied to the configuration
/// (the embedded defaults, then a private data dir and cgroup root, ceiling 4, private
/// targets allowed).
pub async fn fx(tweak: impl FnOnce(&mut Config)) -> Fx {
    let s = crate::support::setup("facade", tweak);
    let sweep = stockade_tests::SweepOnPanic::new(&s.cgroup_root, &s.data);
    let linux = Arc::new(crate::support::start_linux(&s).await);
    let sub: Arc<dyn Substrate> = linux.clone();
    let rt = Arc::new(
        Runtime::from_compiled(compiled(), &s.cfg, sub, s.store.clone()).expect("runtime"),
    );
    Fx {
        rt,
        linux,
        store: s.store,
        data: s.data,
        cgroup_root: s.cgroup_root,
        marker: s.marker,
        mountinfo: s.mountinfo,
        _sweep: sweep,
    }
}

impl Fx {
    /// `sh -c script`, tagged with the marker.
    pub fn sh(&self, script: &str) -> ExecInput {
        ExecInput {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            cwd: None,
            env: vec![("STOCKADE_TEST_MARKER".into(), self.marker.clone())],
            timeout_ms: Some(DEADLINE.as_millis() as u64),
            grant: None,
            approval: None,
            stdin: None,
        }
    }

    /// `argv`, tagged with the marker.
    pub fn argv(&self, argv: &[&str]) -> ExecInput {
        let mut i = self.sh("");
        i.argv = argv.iter().map(|s| s.to_string()).collect();
        i
    }

    /// Live marked processes.
    pub fn marked(&self) -> Vec<i32> {
        marked_processes(&self.marker)
    }

    /// Wait until no marked process is left, or fail.
    pub async fn assert_no_marked(&self, why: &str) {
        wait_for(why, || self.marked().is_empty()).await;
    }

    /// Container cgroups under this test's cgroup root.
    pub fn container_cgroups(&self) -> usize {
        count_cgroups(&self.cgroup_root)
    }

    /// Records of detached declarations (the guest's `detached/` records), any scope.
    pub fn declarations(&self) -> Vec<(String, String, String)> {
        declarations(&self.store)
    }

    /// Stop everything and check nothing is left behind (as `support::Harness::finish`).
    pub async fn finish(self) {
        self.rt.shutdown().await;
        assert!(
            self.linux.open_grants().is_empty(),
            "a grant is open after shutdown"
        );
        self.assert_no_marked("after shutdown").await;
        crate::support::assert_left_nothing(&self.cgroup_root, &self.data, &self.mountinfo);
    }
}

/// Directories (container cgroups) directly under `root`.
pub fn count_cgroups(root: &std::path::Path) -> usize {
    std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .count()
        })
        .unwrap_or(0)
}

/// The guest's detached declarations in `store`.
pub fn declarations(store: &Store) -> Vec<(String, String, String)> {
    store
        .all_records()
        .unwrap()
        .into_iter()
        .filter(|(_, name, _)| name.starts_with("detached/"))
        .collect()
}

/// Poll `cond` until it holds, failing after `DEADLINE` with `why`.
pub async fn wait_for(why: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting: {why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A grant of one rule.
pub fn grant(host: &str, methods: &[&str], path_prefix: Option<&str>) -> Grant {
    Grant {
        rules: vec![Rule {
            host: host.into(),
            methods: methods.iter().map(|s| s.to_string()).collect(),
            path_prefix: path_prefix.map(str::to_string),
            headers: vec![],
            intercept: true,
        }],
        ask: false,
    }
}

/// The guest's typed error, or fail.
pub fn facade_err<T: std::fmt::Debug>(r: Result<T, CallError>) -> FacadeError {
    match r {
        Err(CallError::Facade(e)) => e,
        other => panic!("expected a facade error, got {other:?}"),
    }
}

pub fn out(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

// ---------------------------------------------------------------------------------
// Conformance scenarios that apply on linux, against real processes.
// ---------------------------------------------------------------------------------

/// Invariants 2 and 7: no declared process → the fence kills what the command
/// backgrounded (kill-all), and reports it in `killed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_declared_process_the_fence_kills_a_backgrounded_child() {
    let f = fx(|_| {}).await;
    let o =
        f.rt.exec("bg", &f.sh("sleep 1000 & setsid sleep 1000 & echo started"))
            .await
            .unwrap();
    assert_eq!(
        (o.exit_code, out(&o.stdout)),
        (0, "started\n".into()),
        "{o:?}"
    );
    assert!(
        o.killed >= 2,
        "the teardown killed the backgrounded tree: {o:?}"
    );
    f.assert_no_marked("a backgrounded child survived its fence")
        .await;
    f.finish().await;
}

/// Invariants 2 and 7: declared processes are spared, everything else the fence
/// started is listed and killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_is_spared_and_undeclared_is_killed() {
    let f = fx(|_| {}).await;
    let id =
        f.rt.start_detached("sel", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    wait_for("the detached process runs", || f.marked().len() == 1).await;
    let o =
        f.rt.exec("sel", &f.sh("sleep 1000 & echo bg"))
            .await
            .unwrap();
    assert_eq!(out(&o.stdout), "bg\n");
    assert_eq!(o.killed, 1, "only the undeclared background child: {o:?}");
    assert_eq!(
        f.rt.detached_status("sel", &id).await.unwrap(),
        DetachedState::Running
    );
    wait_for("exactly the declared process is left", || {
        f.marked().len() == 1
    })
    .await;
    assert_eq!(f.declarations().len(), 1);
    f.finish().await;
}

/// Invariant 4: the floor is the same for both doors, and a refused call ensures
/// nothing; an approval recorded for the key admits the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_guards_both_doors() {
    let f = fx(|c| c.floor.rules = vec![vec!["git".into(), "push".into(), "**".into()]]).await;
    let push = f.argv(&["git", "push", "origin", "main"]);
    assert!(matches!(
        facade_err(f.rt.exec("floor", &push).await),
        FacadeError::NeedsApproval(_)
    ));
    assert!(matches!(
        facade_err(f.rt.start_detached("floor", &push).await),
        FacadeError::NeedsApproval(_)
    ));
    assert_eq!(
        f.linux.current("floor").await.unwrap(),
        None,
        "nothing was ensured"
    );
    assert_eq!(f.container_cgroups(), 0);
    // An approval for another key does not count; one for this key does.
    let other = f
        .store
        .record_approval("other", &push.argv, 0, u64::MAX >> 1)
        .unwrap();
    let mut with = push.clone();
    with.approval = Some(other);
    assert!(matches!(
        facade_err(f.rt.exec("floor", &with).await),
        FacadeError::NeedsApproval(_)
    ));
    with.approval = Some(
        f.store
            .record_approval("floor", &push.argv, 0, u64::MAX >> 1)
            .unwrap(),
    );
    let o = f.rt.exec("floor", &with).await.expect("approved: admitted");
    assert_ne!(
        o.exit_code, 0,
        "git push has nowhere to push, but it ran: {o:?}"
    );
    f.finish().await;
}

/// Invariant 5: another key's id is `gone(unknown)`, and stopping it touches nothing;
/// `stop-detached` kills the whole tree and forgets the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_keys_id_is_unknown_and_stop_kills_and_forgets() {
    let f = fx(|_| {}).await;
    let id =
        f.rt.start_detached("owner", &f.sh("sleep 1000 & setsid sleep 1000 & wait"))
            .await
            .unwrap();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "ids are UUIDs: {id}");
    wait_for("the detached tree is up", || f.marked().len() >= 3).await;
    assert_eq!(
        f.rt.detached_status("thief", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::Unknown)
    );
    f.rt.stop_detached("thief", &id).await.unwrap();
    assert_eq!(
        f.rt.detached_status("owner", &id).await.unwrap(),
        DetachedState::Running,
        "another key's stop killed nothing"
    );
    assert!(f.marked().len() >= 3);
    assert_eq!(f.linux.current("thief").await.unwrap(), None);
    f.rt.stop_detached("owner", &id).await.unwrap();
    assert!(
        f.marked().is_empty(),
        "stop returns after the whole tree is dead"
    );
    assert_eq!(
        f.rt.detached_status("owner", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::Unknown)
    );
    assert!(f.declarations().is_empty(), "the record is forgotten");
    f.finish().await;
}

/// Standard input: bytes reach the command exactly and then end of
/// file; 4 MiB, more than a pipe holds, go through without blocking anyone; a command
/// that never reads its stdin ends as usual (the writer sees EPIPE, not the supervisor
/// dying); a detached process gets its stdin too; no stdin is `/dev/null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_reaches_the_command_and_then_ends() {
    let f = fx(|_| {}).await;
    let text = "line one\nline two \u{2713}\n\0binary\u{ff}"
        .as_bytes()
        .to_vec();
    let mut cat = f.sh("cat");
    cat.stdin = Some(text.clone());
    let o = f.rt.exec("k", &cat).await.unwrap();
    assert_eq!(o.stdout, text);
    assert_eq!(o.exit_code, 0);

    let big: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut count = f.sh("wc -c");
    count.stdin = Some(big.clone());
    let o = f.rt.exec("k", &count).await.unwrap();
    assert_eq!(out(&o.stdout).trim(), (4u32 << 20).to_string());

    let mut ignore = f.sh("exit 7");
    ignore.stdin = Some(big);
    assert_eq!(f.rt.exec("k", &ignore).await.unwrap().exit_code, 7);

    let mut detached = f.sh("cat > got; exec sleep 1000");
    detached.stdin = Some(b"for the detached one\n".to_vec());
    f.rt.start_detached("k", &detached).await.unwrap();
    // The detached process writes `got` once its stdin ended: read until it is there.
    let read_back = async {
        loop {
            let o = f.rt.exec("k", &f.sh("cat got")).await.unwrap();
            if !o.stdout.is_empty() {
                return o.stdout;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let got = tokio::time::timeout(DEADLINE, read_back)
        .await
        .expect("the detached process wrote its stdin");
    assert_eq!(got, b"for the detached one\n");

    let o = f.rt.exec("k", &f.sh("cat; echo end")).await.unwrap();
    assert_eq!(out(&o.stdout), "end\n", "no stdin is /dev/null");
    f.finish().await;
}
