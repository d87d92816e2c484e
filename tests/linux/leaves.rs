//! A fenced run's leaf kept for the next run (`supervisor::pid1::leaves`; DESIGN §4): the
//! next run of the key starts in the leaf the last one left empty, and a kept leaf never
//! carries a process into the next run's tree, whose connections the proxy gives the
//! run's grant.

use std::path::{Path, PathBuf};

use stockade_runtime::bindings::ExecInput;
use stockade_runtime::substrate::Substrate;

use crate::facade::{Fx, fx, grant, out, wait_for};
use crate::support::DEADLINE;

/// The leaf cgroups of container `c`.
fn leaves(f: &Fx, c: &str) -> Vec<String> {
    leaves_under(&f.cgroup_root.join(c))
}

fn leaves_under(container: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(container)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Container `c`'s `/workspace`, as the host sees it.
fn workspace(f: &Fx, c: &str) -> PathBuf {
    f.data.join("containers").join(c).join("fs/workspace")
}

fn fenced(f: &Fx, script: &str) -> ExecInput {
    let mut input = f.sh(script);
    input.grant = Some(grant("example.test", &["GET"], None));
    input
}

fn procs(leaf: &Path) -> Vec<i32> {
    std::fs::read_to_string(leaf.join("cgroup.procs"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A host process the test places in a leaf, killed and reaped however the test ends.
struct Intruder(std::process::Child);

impl Drop for Intruder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two runs of a key share one leaf; a process placed in the kept leaf between runs (as
/// an unkillable leftover would be, or a write to its `cgroup.procs`) is killed before
/// the next run starts there: while that run runs, its leaf holds its processes alone.
/// A run that leaves a process behind gives no leaf back: its tree is killed and its leaf
/// removed by the fence's teardown, and the next run gets a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_process_placed_in_a_kept_leaf_never_shares_the_next_runs_tree() {
    let f = fx(|_| {}).await;
    let o = f.rt.exec("k", &fenced(&f, "true")).await.unwrap();
    assert_eq!(o.exit_code, 0, "{o:?}");
    let c = f.linux.current("k").await.unwrap().unwrap();
    let kept = leaves(&f, &c);
    assert_eq!(kept.len(), 1, "the run's leaf is kept: {kept:?}");
    let o = f.rt.exec("k", &fenced(&f, "true")).await.unwrap();
    assert_eq!(o.exit_code, 0, "{o:?}");
    assert_eq!(leaves(&f, &c), kept, "the next run starts in the kept leaf");

    // The attack: a process in the kept leaf, waiting for the next run's grant.
    let leaf: PathBuf = f.cgroup_root.join(&c).join(&kept[0]);
    let mut intruder = Intruder(
        std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap(),
    );
    let pid = intruder.0.id() as i32;
    std::fs::write(leaf.join("cgroup.procs"), pid.to_string()).unwrap();
    assert_eq!(procs(&leaf), vec![pid]);
    let ws = workspace(&f, &c);
    let run = {
        let (rt, input) = (
            f.rt.clone(),
            fenced(
                &f,
                "touch /workspace/ready; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo ran",
            ),
        );
        tokio::spawn(async move { rt.exec("k", &input).await })
    };
    wait_for("the run is running", || ws.join("ready").exists()).await;
    assert_eq!(leaves(&f, &c), kept, "the run is in the kept leaf's place");
    let members = procs(&leaf);
    assert!(
        !members.contains(&pid),
        "the process placed in the kept leaf is in the run's tree: {members:?}"
    );
    assert!(!members.is_empty(), "the run's own processes are there");
    let status = intruder.0.try_wait().unwrap();
    assert!(
        status.is_some(),
        "the process placed in the kept leaf still lives"
    );
    std::fs::write(ws.join("go"), "").unwrap();
    let o = run.await.unwrap().unwrap();
    assert_eq!(
        (o.exit_code, out(&o.stdout).as_str()),
        (0, "ran\n"),
        "{o:?}"
    );
    assert_eq!(leaves(&f, &c), kept, "emptied, and kept again");

    // A run that leaves a process behind: its leaf is not given back.
    let o =
        f.rt.exec("k", &fenced(&f, "sleep 1000 & echo left"))
            .await
            .unwrap();
    assert_eq!(out(&o.stdout), "left\n", "{o:?}");
    f.assert_no_marked("the fence's teardown kills what the run left")
        .await;
    assert_eq!(leaves(&f, &c), Vec::<String>::new(), "its leaf is removed");
    let o = f.rt.exec("k", &fenced(&f, "true")).await.unwrap();
    assert_eq!(o.exit_code, 0, "{o:?}");
    let next = leaves(&f, &c);
    assert!(
        next.len() == 1 && next != kept,
        "a new leaf: {next:?} after {kept:?}"
    );
    f.finish().await;
}

/// What the fenced run and the detached process below say on a proxy connection: the
/// status of one request's answer and its denial reason.
const ASK: &str = r#"
import socket
def ask(c, target, path):
    c.sendall(("GET http://%s%s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, path, target)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        b = c.recv(4096)
        if not b:
            return "closed -"
        data += b
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    n, reason = 0, "-"
    for l in lines[1:]:
        name, _, value = l.partition(":")
        if name.lower() == "content-length":
            n = int(value)
        if name.lower() == "x-stockade-denial":
            reason = value.strip()
    while len(body) < n:
        b = c.recv(4096)
        if not b:
            break
        body += b
    return "%s %s" % (lines[0].split(" ")[1], reason)
"#;

/// Red team, 2026-12-04: a connection to the proxy that a fenced run held and passed to
/// a detached process (`SCM_RIGHTS`) before it ended is not the next run's when that run
/// starts in the kept leaf, under the same tree id. The proxy attributed it from the
/// earlier run's reading of the tree (which named the connection), and the detached
/// process's request was admitted under the next fence, which never handed it anything.
/// Now a reading made before a run began answers nothing for that run: the detached
/// request is denied `detached`, and the upstream sees the first run's request alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_connection_passed_on_by_an_earlier_run_gets_no_later_runs_grant() {
    let f = fx(|_| {}).await;
    let (port, seen) = crate::facade_egress::http_server("127.0.0.2");
    let target = format!("127.0.0.2:{port}");
    let detached = format!(
        r#"{ASK}
import os, sys, time
sys.stderr = open("/workspace/detached.err", "w", buffering=1)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("/workspace/pass.sock")
srv.listen(1)
conn, _ = srv.accept()
_, fds, _, _ = socket.recv_fds(conn, 16, 1)
passed = socket.socket(fileno=fds[0])
passed.settimeout(10)
conn.sendall(b"k")
for _ in range(1200):
    if os.path.exists("/workspace/go"):
        break
    time.sleep(0.05)
open("/workspace/stolen.tmp", "w").write(ask(passed, "{target}", "/stolen") + "\n")
os.rename("/workspace/stolen.tmp", "/workspace/stolen")
while True:
    time.sleep(3600)
"#
    );
    f.rt.start_detached("pass", &f.argv(&["python3", "-c", &detached]))
        .await
        .unwrap();
    let c = f.linux.current("pass").await.unwrap().unwrap();
    let ws = workspace(&f, &c);
    wait_for("the detached process listens", || {
        ws.join("pass.sock").exists()
    })
    .await;
    let before = leaves(&f, &c);
    // The first run: one admitted request on a kept-alive connection, which it hands
    // to the detached process before it ends with nothing left (its leaf is kept).
    let first = format!(
        r#"{ASK}
c = socket.create_connection(("127.0.0.1", 3128), timeout=10)
print(ask(c, "{target}", "/first"))
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
u.connect("/workspace/pass.sock")
socket.send_fds(u, [b"c"], [c.fileno()])
u.recv(1)
"#
    );
    let mut input = f.argv(&["python3", "-c", &first]);
    input.grant = Some(grant("127.0.0.2", &[], None));
    let o = f.rt.exec("pass", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "200 -\n",
        "the first run's own request: {}",
        out(&o.stderr)
    );
    let kept = leaves(&f, &c);
    assert_eq!(
        kept.len(),
        before.len() + 1,
        "the run's leaf is kept: {kept:?}"
    );
    // The next run makes no request of its own: it only lets the detached process
    // try the connection while it runs in the kept leaf.
    let mut input = f.sh(
        "touch /workspace/go; for i in $(seq 400); do [ -e /workspace/stolen ] && break; sleep 0.05; done; cat /workspace/stolen",
    );
    input.grant = Some(grant("127.0.0.2", &[], None));
    let o = f.rt.exec("pass", &input).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "403 detached\n",
        "the detached process's request on the passed connection: {} {}",
        out(&o.stderr),
        std::fs::read_to_string(ws.join("detached.err")).unwrap_or_default()
    );
    assert_eq!(
        leaves(&f, &c),
        kept,
        "the next run started in the kept leaf"
    );
    let requests: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| !r.trim().is_empty())
        .cloned()
        .collect();
    assert_eq!(requests, ["GET /first".to_string()]);
    f.finish().await;
}

/// The substrate's `run` with no grant open (a run the host did not name): its next run
/// starts in the leaf it left empty, under the same id; a detached process gets a leaf
/// of its own, and a run that leaves a process behind keeps its tree (its leaf is not
/// given to the next run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_runs_leaf_is_kept_for_the_next_unnamed_run() {
    let h = crate::support::harness(|_| {}).await;
    let c = h.linux.ensure("k").await.unwrap();
    let dir = h.cgroup_root.join(&c);
    let r = h.linux.run(&c, h.cmd("true"), DEADLINE).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let kept = leaves_under(&dir);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let r = h.linux.run(&c, h.cmd("true"), DEADLINE).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert_eq!(
        leaves_under(&dir),
        kept,
        "the next run starts in the kept leaf"
    );
    let id = h
        .linux
        .start_process(&c, h.cmd("exec sleep 1000"))
        .await
        .unwrap();
    assert!(!kept.contains(&id), "a detached process gets a new leaf");
    let r = h
        .linux
        .run(&c, h.cmd("sleep 1000 & echo left"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let mut after = kept.clone();
    after.push(id);
    after.sort();
    assert_eq!(
        leaves_under(&dir),
        after,
        "the run's tree lives on in its leaf"
    );
    h.linux.kill_all(&c).await.unwrap();
    assert_eq!(
        leaves_under(&dir),
        Vec::<String>::new(),
        "killed trees' leaves go"
    );
    h.assert_no_marked("killed").await;
    h.finish().await;
}

/// The abandoned-run race (docs/LINUX.md, "A teardown that overtakes its run"): a
/// caller that goes away mid-call has its fence torn down while the run it asked for
/// may still be on its way to the container (another connection, a node's batch). A
/// run that comes after its fence's kill must not start: it would outlive its fence
/// (on a node, holding the container's next grant off until its timeout). Attacked
/// here as the race leaves it: the grant applied, the teardown's kill made, then the
/// run. On the old code the run started (the marker file was written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_comes_after_its_fences_kill_does_not_start() {
    let h = crate::support::harness(|_| {}).await;
    let c = h.linux.ensure("k").await.unwrap();
    let deny = stockade_egress::rules::Grant::parse(&[]).unwrap();
    h.linux.apply_grant(&c, "f1", deny.clone()).await.unwrap();
    h.linux.kill_all(&c).await.unwrap();
    let late = h
        .linux
        .run(&c, h.cmd("touch /workspace/ran; exec sleep 1000"), DEADLINE)
        .await;
    let err = late
        .expect_err("a run after its fence's kill started")
        .to_string();
    assert!(err.contains("teardown began"), "{err}");
    h.linux.revoke_grant(&c).await.unwrap();
    h.assert_no_marked("nothing of the late run").await;
    // The next fence runs as ever, and the late run left nothing behind.
    h.linux.apply_grant(&c, "f2", deny).await.unwrap();
    let r = h
        .linux
        .run(&c, h.cmd("test ! -e /workspace/ran"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "the late run wrote its marker: it ran");
    h.linux.kill_all(&c).await.unwrap();
    h.linux.revoke_grant(&c).await.unwrap();
    h.finish().await;
}
