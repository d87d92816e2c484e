//! Fault tests (invariant 1), on real containers through the
//! facade: an epoch deadline while a fence is open, and start-detached past the
//! ceiling.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use stockade_egress::rules::Grant as ParsedGrant;
use stockade_linux::Linux;
use stockade_runtime::bindings::FacadeError;
use stockade_runtime::config::Config;
use stockade_runtime::runtime::{CallError, Runtime};
use stockade_runtime::substrate::{
    Artifact, Command, ContainerId, Denial, Event, FenceCounts, Housekeeping, OutputSink,
    ProcessInfo, Result, RunResult, Substrate, SubstrateError,
};
use stockade_tests::compiled;

use crate::facade::{facade_err, fx, grant, out, wait_for};
use crate::support::{DEADLINE, assert_left_nothing, host_server, marked_processes};

/// Entries added to the fence's teardown listing: lowering them into the guest (a
/// `cabi_realloc` call for each id, guest code) and deciding over them is guest
/// compute, well past [`CALL_DEADLINE_MS`] (it still traps at 400 ms on this machine),
/// spent after the command ran and before the guest's kills and revoke. The deadline
/// leaves the guest's own work before the fence (instantiation, validation) room on a
/// loaded machine: a trap there would never reach the listing (`padded` stays 0).
const PADDING: usize = 1_000_000;
const CALL_DEADLINE_MS: u64 = 200;

/// The linux substrate, with the first listing of a container's processes made
/// expensive for the guest to take in (as if the container tracked a million trees):
/// the way to make the guest itself run past its deadline while the fence is open
/// (time inside imports does not count against the deadline, by design).
struct HeavyListing {
    linux: Arc<Linux>,
    padded: AtomicUsize,
}

#[async_trait]
impl Substrate for HeavyListing {
    async fn ensure(&self, key: &str) -> Result<ContainerId> {
        self.linux.ensure(key).await
    }
    async fn current(&self, key: &str) -> Result<Option<ContainerId>> {
        self.linux.current(key).await
    }
    async fn apply_grant(&self, container: &str, fence: &str, grant: ParsedGrant) -> Result<()> {
        self.linux.apply_grant(container, fence, grant).await
    }
    async fn revoke_grant(&self, container: &str) -> Result<FenceCounts> {
        self.linux.revoke_grant(container).await
    }
    async fn run(&self, container: &str, cmd: Command, timeout: Duration) -> Result<RunResult> {
        self.linux.run(container, cmd, timeout).await
    }
    async fn run_streaming(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        sink: OutputSink,
    ) -> Result<RunResult> {
        self.linux
            .run_streaming(container, cmd, timeout, sink)
            .await
    }
    async fn start_process(&self, container: &str, cmd: Command) -> Result<String> {
        self.linux.start_process(container, cmd).await
    }
    async fn list_processes(&self, container: &str) -> Result<Vec<ProcessInfo>> {
        let mut listed = self.linux.list_processes(container).await?;
        if self.padded.fetch_add(1, Ordering::SeqCst) == 0 {
            listed.extend((0..PADDING).map(|i| ProcessInfo {
                id: format!("00000000-0000-4000-8000-{i:012}"),
                running: true,
                exit_code: None,
            }));
        }
        Ok(listed)
    }
    async fn process_status(&self, container: &str, id: &str) -> Result<Option<ProcessInfo>> {
        self.linux.process_status(container, id).await
    }
    async fn kill_process(&self, container: &str, id: &str) -> Result<u32> {
        self.linux.kill_process(container, id).await
    }
    async fn kill_all(&self, container: &str) -> Result<u32> {
        self.linux.kill_all(container).await
    }
    async fn snapshot(&self, container: &str) -> Result<()> {
        self.linux.snapshot(container).await
    }
    async fn stop(&self, container: &str) -> Result<()> {
        self.linux.stop(container).await
    }
    async fn denials(&self, key: &str) -> Result<Vec<Denial>> {
        self.linux.denials(key).await
    }
    async fn list_artifacts(&self, key: &str) -> Result<Vec<Artifact>> {
        self.linux.list_artifacts(key).await
    }
    async fn read_artifact(
        &self,
        key: &str,
        name: &str,
        offset: u64,
        length: u32,
    ) -> Result<Vec<u8>> {
        self.linux.read_artifact(key, name, offset, length).await
    }
}

#[async_trait]
impl Housekeeping for HeavyListing {
    fn kind(&self) -> &'static str {
        self.linux.kind()
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.linux.subscribe()
    }
    async fn idle(&self, idle_for: Duration) -> Vec<String> {
        self.linux.idle(idle_for).await
    }
    fn open_grants(&self) -> Vec<ContainerId> {
        self.linux.open_grants()
    }
    async fn shutdown(&self) {
        self.linux.shutdown().await
    }
    fn injected(&self, op: &str) -> Option<SubstrateError> {
        self.linux.injected(op)
    }
}

/// An epoch deadline mid-fence: the guest runs past its per-call deadline after its
/// command ran and before its teardown and revoke. The call ends in a trap that says
/// so; the host revokes the grant (the proxy then answers `no-grant`) and kills the
/// tree (what the fenced command backgrounded is dead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_deadline_mid_fence_revokes_the_grant_and_kills_the_tree() {
    let s = crate::support::setup("deadline", |c: &mut Config| {
        c.engine.call_deadline_ms = CALL_DEADLINE_MS;
        c.engine.memory_mib = 512;
    });
    let linux = Arc::new(crate::support::start_linux(&s).await);
    let heavy = Arc::new(HeavyListing {
        linux: linux.clone(),
        padded: AtomicUsize::new(0),
    });
    let rt = Arc::new(
        Runtime::from_compiled(compiled(), &s.cfg, heavy.clone(), s.store.clone())
            .expect("runtime"),
    );
    // A declared detached process: the teardown is then selective, and lists.
    rt.start_detached("k", &exec_input(&s.marker, "exec sleep 1000"))
        .await
        .unwrap();
    let port = host_server();
    let mut input = exec_input(
        &s.marker,
        &format!(
            "curl -s -o /dev/null -w '%{{http_code}}\\n' --max-time 5 http://127.0.0.2:{port}/ > fenced; sleep 1000 & echo started"
        ),
    );
    input.grant = Some(grant("127.0.0.2", &[], None));
    let r = rt.exec("k", &input).await;
    match &r {
        Err(CallError::Trap(why)) => assert!(why.contains("deadline"), "{why}"),
        other => panic!("expected the deadline's trap, got {other:?}"),
    }
    assert_eq!(
        heavy.padded.load(Ordering::SeqCst),
        1,
        "the command ran and the teardown listed, in the fence"
    );
    assert!(linux.open_grants().is_empty(), "the grant was revoked");
    wait_for("the fenced command's background process is killed", || {
        marked_processes(&s.marker).is_empty()
    })
    .await;
    // The fenced command did reach the upstream under the grant; afterwards the proxy
    // denies it: no fence is open.
    let c = linux
        .current("k")
        .await
        .unwrap()
        .expect("the container lives");
    let fenced = s
        .data
        .join("containers")
        .join(&c)
        .join("fs/workspace/fenced");
    assert_eq!(std::fs::read_to_string(fenced).unwrap(), "200\n");
    let after = linux
        .run(
            &c,
            Command {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    format!(
                        "curl -s -o /dev/null -D - --max-time 5 http://127.0.0.2:{port}/ | tr -d '\\r' | grep -i '^x-stockade-denial'"
                    ),
                ],
                cwd: "/workspace".into(),
                env: vec![("STOCKADE_TEST_MARKER".into(), s.marker.clone())],
                stdin: vec![],
                stdin_stream: None,
            },
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(
        out(&after.stdout).to_ascii_lowercase(),
        "x-stockade-denial: no-grant\n",
        "{after:?}"
    );
    rt.shutdown().await;
    assert!(marked_processes(&s.marker).is_empty());
    assert_left_nothing(&s.cgroup_root, &s.data, &s.mountinfo);
}

/// `sh -c script` as an exec input, tagged with `marker`.
fn exec_input(marker: &str, script: &str) -> stockade_runtime::bindings::ExecInput {
    stockade_runtime::bindings::ExecInput {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        cwd: None,
        env: vec![("STOCKADE_TEST_MARKER".into(), marker.to_string())],
        timeout_ms: Some(DEADLINE.as_millis() as u64),
        grant: None,
        approval: None,
        stdin: None,
    }
}

/// Start-detached past the ceiling: with `ceiling = 1` and one key live, another key's
/// start-detached answers over-capacity and leaves nothing: no container, no cgroup, no
/// declaration, no process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_detached_past_the_ceiling_answers_over_capacity_and_leaves_nothing() {
    let f = fx(|c| c.substrate.ceiling = 1).await;
    let a =
        f.rt.start_detached("a", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    wait_for("a's process runs", || f.marked().len() == 1).await;
    let before: Vec<PathBuf> = containers(&f.data);
    assert_eq!(before.len(), 1);
    assert!(matches!(
        facade_err(f.rt.start_detached("b", &f.sh("exec sleep 1000")).await),
        FacadeError::OverCapacity
    ));
    assert_eq!(
        f.linux.current("b").await.unwrap(),
        None,
        "no container for b"
    );
    assert_eq!(containers(&f.data), before, "no container directory for b");
    assert_eq!(f.container_cgroups(), 1, "no cgroup for b");
    let declared = f.declarations();
    assert_eq!(declared.len(), 1, "only a's declaration: {declared:?}");
    assert_eq!(f.marked().len(), 1, "b started nothing");
    // a is untouched.
    f.rt.stop_detached("a", &a).await.unwrap();
    f.assert_no_marked("a stopped").await;
    f.finish().await;
}

/// Container directories under a test's data directory.
fn containers(data: &std::path::Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data.join("containers"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}
