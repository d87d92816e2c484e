//! Issue 23's faults, each a test, with real nodes on their own hosts (a network
//! namespace and a veth each, `stockade_tests::nodes`) and a real remote front
//! (`stockade serve`, `substrate.kind = "remote"`), all driven through the front's
//! public HTTP API as a user would:
//!
//! * a node SIGKILLed mid-fence: the call gets a typed error, and nothing stays
//!   admitted (the node's proxy died with it; its next start has no grant open);
//! * the front SIGKILLed mid-fence: the node's lease closes the grant on its own, and
//!   the front's records and the key's placement survive its restart;
//! * the link cut mid-run: a typed `unreachable`, and the node's lease closes the
//!   grant while the link is still down.
//!
//! "Mid-fence" is an exec with a grant, streamed, after its command reached the
//! upstream the grant admits and its first output arrived. "Nothing open" is asked two
//! ways: the node's `open-grants` (a signed call) and, from inside the container's own
//! network namespace, a request through its egress proxy to that same upstream, which
//! must no longer be admitted. Every wait is on an event with a deadline.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stockade_host::config::Config;
use stockade_tests::nodes::{
    Cluster, ExecStream, Options, container_netns, http_upstream, request_through_proxy, wait_for,
};

/// The nodes' lease grace: small, so a test waits seconds, not the default 30.
const GRACE_MS: u64 = 2_000;
/// Slack on top of a lease for a loaded machine (two cores, other suites building).
const MARGIN: Duration = Duration::from_secs(8);
/// The fenced run's own timeout: its lease while it runs is this plus the grace.
const RUN_TIMEOUT_MS: u64 = 4_000;

fn base() -> Config {
    let mut cfg = Config::embedded();
    cfg.egress.allow_private_targets = true;
    cfg.api.shutdown_deadline_ms = 2_000;
    cfg
}

fn cluster() -> Cluster {
    Cluster::start(
        &base(),
        &Options {
            nodes: 2,
            lease_grace_ms: GRACE_MS,
            heartbeat_ms: 500,
        },
    )
}

/// A buffered exec through the front: (status, answer).
fn exec(c: &Cluster, key: &str, body: &Value) -> (u16, Value) {
    let (st, text) = stockade_tests::http(
        &c.front.addr,
        "POST",
        &format!("/v1/sandboxes/{key}/exec"),
        Some(&c.front.token()),
        body.to_string().as_bytes(),
    );
    (
        st,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Place `key` on a node (an exec that writes `/workspace/mark`) and return the
/// node's index: the only node with a container.
fn place(c: &Cluster, key: &str) -> usize {
    let (st, out) = exec(
        c,
        key,
        &json!({"argv": ["sh", "-c", "echo kept > /workspace/mark"]}),
    );
    assert_eq!(st, 200, "{out}");
    c.node_with_a_container()
        .expect("the key's container is on a node")
}

/// The fenced exec, streamed: the command asks `upstream` (its grant admits the
/// upstream's host), prints `started`, and sleeps well past every deadline here.
/// Returns once the upstream saw the command and its first output arrived.
fn open_fence(
    c: &Cluster,
    key: &str,
    upstream: SocketAddr,
    seen: &std::sync::mpsc::Receiver<String>,
) -> ExecStream {
    let script = format!(
        "curl -s -o /dev/null --max-time 5 http://{upstream}/fenced; echo started; sleep 60"
    );
    let mut s = ExecStream::open(
        &c.front.addr,
        &c.front.token(),
        key,
        &json!({
            "argv": ["sh", "-c", script],
            "timeout_ms": RUN_TIMEOUT_MS,
            "grant": {"rules": [{"host": upstream.ip().to_string()}]},
        }),
    );
    assert_eq!(s.status, 200, "the streamed exec was refused");
    let first = s.next_event().expect("a first event");
    assert_eq!(first, json!({"type": "stdout", "data": "started\n"}));
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match seen.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(p) if p == "/fenced" => break,
            Ok(_) => {}
            Err(_) => panic!("the fenced command never reached its upstream"),
        }
    }
    s
}

/// The proxy of the key's container, asked from inside its network namespace:
/// `Some(status)`, or `None` when nothing answers (the proxy or the container is gone).
fn from_inside(c: &Cluster, node: usize, url: &str) -> Option<u16> {
    let ns = container_netns(&c.nodes[node])?;
    request_through_proxy(&ns, url).ok()
}

/// The node's open grants, asked from inside its own namespace (works with its link
/// cut: the client is then on the node's side of the link).
fn open_grants_from_its_host(c: &Cluster, node: usize) -> std::io::Result<Vec<String>> {
    let client = c.nodes[node].client();
    c.nodes[node].link.inside(move || client.open_grants())
}

/// The last event of a stream is the typed error `code`.
fn assert_typed_error(last: &Value, code: &str) {
    assert_eq!(last["type"], "error", "a typed error event: {last}");
    assert_eq!(last["error"]["code"], code, "{last}");
}

#[test]
fn a_node_killed_mid_fence_gives_a_typed_error_and_no_grant_outlives_the_lease() {
    let mut c = cluster();
    let key = "node-killed";
    let i = place(&c, key);
    let (upstream, seen) = http_upstream(c.nodes[i].link.host_ip);
    let probe = format!("http://{upstream}/probe");
    let mut s = open_fence(&c, key, upstream, &seen);
    // Mid-fence: the grant is open on the node, and admits the container's requests.
    assert_eq!(c.nodes[i].client().open_grants().unwrap().len(), 1);
    assert_eq!(from_inside(&c, i, &probe), Some(200), "admitted mid-fence");

    c.kill_node(i);
    let started = Instant::now();
    let mut out = String::new();
    let last = s.outcome(&mut out).expect("the stream ends with an event");
    assert_typed_error(&last, "unreachable");
    // The node's proxy died with it: nothing is admitted from the container, within
    // the lease at the latest.
    wait_for(
        "the dead node's grant stops admitting",
        Duration::from_millis(GRACE_MS) + MARGIN,
        || (from_inside(&c, i, &probe) != Some(200)).then_some(()),
    );
    assert!(started.elapsed() < Duration::from_millis(RUN_TIMEOUT_MS + GRACE_MS) + MARGIN);
    // Its next start sweeps what it left: no grant open, and the key works again.
    c.restart_node(i);
    assert_eq!(
        c.nodes[i].client().open_grants().unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(from_inside(&c, i, &probe).filter(|s| *s == 200), None);
    let (st, out) = exec(&c, key, &json!({"argv": ["echo", "again"]}));
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["stdout"], "again\n", "{out}");
    c.stop();
}

#[test]
fn a_front_killed_mid_fence_leaves_its_grant_to_the_lease_and_records_survive_a_restart() {
    let mut c = cluster();
    let key = "front-killed";
    let i = place(&c, key);
    let (upstream, seen) = http_upstream(c.nodes[i].link.host_ip);
    let probe = format!("http://{upstream}/probe");
    // A record to keep: a finished fenced exec's egress audit.
    let (st, out) = exec(
        &c,
        key,
        &json!({
            "argv": ["sh", "-c", format!("curl -s --max-time 5 http://{upstream}/recorded")],
            "grant": {"rules": [{"host": upstream.ip().to_string()}]},
        }),
    );
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["stdout"], "ok", "{out}");
    let egress = |c: &Cluster| {
        stockade_tests::http(
            &c.front.addr,
            "GET",
            &format!("/v1/sandboxes/{key}/egress"),
            Some(&c.front.token()),
            b"",
        )
    };
    let (st, before) = egress(&c);
    assert_eq!(st, 200, "{before}");

    let opened = Instant::now();
    let s = open_fence(&c, key, upstream, &seen);
    assert_eq!(c.nodes[i].client().open_grants().unwrap().len(), 1);
    assert_eq!(from_inside(&c, i, &probe), Some(200), "admitted mid-fence");

    c.kill_front();
    drop(s);
    // Nobody will revoke it but the node: its lease (the run's timeout plus the
    // grace) closes the grant, and the container's requests are refused.
    let lease = Duration::from_millis(RUN_TIMEOUT_MS + GRACE_MS) + MARGIN;
    wait_for(
        "the node's lease closes the grant",
        lease.saturating_sub(opened.elapsed()),
        || c.nodes[i].client().open_grants().ok().filter(Vec::is_empty),
    );
    assert_ne!(
        from_inside(&c, i, &probe),
        Some(200),
        "admitted after the lease"
    );
    assert!(
        c.nodes[i]
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("lease expired")),
        "the node logs the lease that ran out"
    );

    // The front comes back with its records and the key's placement.
    c.restart_front();
    let (st, after) = egress(&c);
    assert_eq!(
        (st, &after),
        (200, &before),
        "the records survive the restart"
    );
    let (st, out) = exec(&c, key, &json!({"argv": ["cat", "/workspace/mark"]}));
    assert_eq!(st, 200, "{out}");
    assert_eq!(
        out["stdout"], "kept\n",
        "the key is still on its node: {out}"
    );
    assert_eq!(c.node_with_a_container(), Some(i));
    c.stop();
}

#[test]
fn a_cut_link_mid_run_is_unreachable_and_nothing_is_open_after_the_lease() {
    let c = cluster();
    let key = "link-cut";
    let i = place(&c, key);
    let (upstream, seen) = http_upstream(c.nodes[i].link.host_ip);
    let probe = format!("http://{upstream}/probe");
    let opened = Instant::now();
    let mut s = open_fence(&c, key, upstream, &seen);
    assert_eq!(c.nodes[i].client().open_grants().unwrap().len(), 1);
    assert_eq!(from_inside(&c, i, &probe), Some(200), "admitted mid-fence");

    c.link_down(i);
    let cut = Instant::now();
    let mut out = String::new();
    let last = s.outcome(&mut out).expect("the stream ends with an event");
    assert_typed_error(&last, "unreachable");
    assert!(
        cut.elapsed() < Duration::from_secs(15),
        "unreachable is told within the heartbeat deadline, not a TCP timeout: {:?}",
        cut.elapsed()
    );
    // The node cannot hear the front: its lease closes the grant with the link still
    // down (asked on the node's side of the link).
    let lease = Duration::from_millis(RUN_TIMEOUT_MS + GRACE_MS) + MARGIN;
    wait_for(
        "the node's lease closes the grant behind a cut link",
        lease.saturating_sub(opened.elapsed()),
        || open_grants_from_its_host(&c, i).ok().filter(Vec::is_empty),
    );
    // With the link mended, the container's requests to the upstream are refused.
    c.link_up(i);
    assert_ne!(
        from_inside(&c, i, &probe),
        Some(200),
        "admitted after the lease"
    );
    c.stop();
}

/// The harness itself with real nodes and no front: each node listens on its own
/// namespace's address (not the root's), answers a signed `open-grants` (nothing open)
/// and `health` with its name, refuses a call signed with another secret (401), and
/// dropping the cluster leaves no namespace, veth, cgroup or directory.
#[test]
fn nodes_on_their_own_hosts_answer_signed_calls_and_leave_nothing() {
    let c = Cluster::start_nodes(&base(), &Options::default());
    let mut names = Vec::new();
    for n in &c.nodes {
        assert_eq!(n.client().open_grants().unwrap(), Vec::<String>::new());
        let (st, body) = n.client().call("health", "", b"{}").unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((st, &v["ok"]["node"]), (200, &json!(n.name)), "{v}");
        // Another secret: refused.
        let other = c.dir().join(format!("{}-other-secret", n.name));
        std::fs::write(&other, stockade_host::node::auth::new_secret()).unwrap();
        let forged =
            stockade_tests::nodes::NodeClient::from_files(n.addr(), &n.cert_file(), &other)
                .unwrap();
        assert_eq!(forged.call("health", "", b"{}").unwrap().0, 401);
        // Its own host: the address is the namespace's, not the root's.
        assert!(
            std::net::TcpListener::bind(n.addr()).is_err(),
            "the node's address is not the test host's"
        );
        names.push((
            n.link.ns_path(),
            n.link.host_if.clone(),
            n.cgroup_root.clone(),
        ));
    }
    let dir = c.dir().to_path_buf();
    drop(c);
    for (ns, veth, cg) in names {
        assert!(!ns.exists(), "{} left", ns.display());
        assert!(!std::path::Path::new("/sys/class/net").join(&veth).exists());
        assert!(!cg.exists(), "{} left", cg.display());
    }
    assert!(!dir.exists());
}
