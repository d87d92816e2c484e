//! The remote substrate's faults (docs/NODE.md), each a test, with real nodes on their own
//! hosts (a network namespace and a veth each, `stockade_tests::nodes`) and a real remote
//! front (`stockade serve`, `substrate.kind = "remote"`), all driven through the front's
//! public HTTP API as a user would:
//!
//! * a node SIGKILLed mid-fence: the call gets a typed error, and nothing stays
//!   admitted (the node's proxy died with it; its next start has no grant open);
//! * the front SIGKILLed mid-fence: the node's lease closes the grant on its own, and
//!   the front's records and the key's placement survive its restart;
//! * the link cut mid-run: a typed `unreachable`, and the node's lease closes the
//!   grant while the link is still down.
//!
//! "Mid-fence" is an exec with a grant, streamed, whose command asks the upstream the
//! grant admits every 0.2 s, after its first output and its first request arrived.
//! "Nothing open after the lease" is asked three ways: the node's `open-grants` (a
//! signed call); the upstream stops hearing the fenced command; and a request from
//! inside the key's container to that upstream, in a later exec with no grant, is
//! refused (403) and never arrives (a grant left open would have let it through). A
//! probe of our own from the container's network namespace would not do: the proxy
//! admits only the fenced run's own tree (anything else is denied as `detached`, open
//! grant or not). Every wait is on an event with a deadline.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stockade_runtime::config::Config;
use stockade_tests::nodes::{Cluster, ExecStream, Options, http_upstream, wait_for};

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
            ..Options::default()
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

/// Place `key` on a node: an exec that writes `/workspace/mark`.
fn place(c: &Cluster, key: &str) {
    let (st, out) = exec(
        c,
        key,
        &json!({"argv": ["sh", "-c", "echo kept > /workspace/mark"]}),
    );
    assert_eq!(st, 200, "{out}");
}

/// A detached process declared for `key`: its fences then tear down selectively, after
/// the run's end, by a call of the front's own (a key with nothing declared has its
/// teardown in the fence's one batch, which the node makes without the front). The
/// lease tests use it so that only the lease can close what the front left open.
fn declare(c: &Cluster, key: &str) {
    let (st, text) = stockade_tests::http(
        &c.front.addr,
        "POST",
        &format!("/v1/sandboxes/{key}/detached"),
        Some(&c.front.token()),
        json!({"argv": ["sleep", "300"]}).to_string().as_bytes(),
    );
    assert_eq!(st, 201, "{text}");
}

/// An upstream every node reaches: on the first link's root side (the other nodes'
/// namespaces route to it through their own links; the root namespace answers for
/// every address it has).
fn upstream(c: &Cluster) -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    http_upstream(c.nodes[0].link.host_ip)
}

/// Mid-fence: the node holding the key's open grant and its container (the only grant
/// open across the nodes).
fn fenced(c: &Cluster) -> (usize, String) {
    c.the_open_grant()
        .expect("exactly one grant is open, on the key's node")
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
        "curl -s -o /dev/null --max-time 5 http://{upstream}/fenced; echo started; \
         while true; do curl -s -o /dev/null --max-time 2 http://{upstream}/tick; sleep 0.2; done"
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
            Ok(p) if p == "/tick" => break,
            Ok(_) => {}
            Err(_) => panic!("the fenced command never reached its upstream"),
        }
    }
    s
}

/// How long the upstream must hear nothing for the fenced command's requests to have
/// stopped (it asks every 0.2 s).
const QUIET: Duration = Duration::from_millis(1_500);

/// Wait, up to `limit`, for the upstream to hear nothing for [`QUIET`]: the fenced
/// command's requests no longer reach it (its tree is gone or its grant closed).
fn wait_quiet(seen: &std::sync::mpsc::Receiver<String>, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        match seen.recv_timeout(QUIET) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return,
            Err(e) => panic!("the upstream stopped: {e}"),
            Ok(path) => assert!(
                Instant::now() < end,
                "the upstream still hears {path} after {limit:?}"
            ),
        }
    }
}

/// From inside the key's container, after the lease: a request to the upstream the
/// fenced grant admitted, in an exec with no grant of its own, is refused (403 from
/// the proxy; a grant left open on the node would have let it through), and the
/// upstream never hears it.
fn assert_refused_from_inside(
    c: &Cluster,
    key: &str,
    upstream: SocketAddr,
    seen: &std::sync::mpsc::Receiver<String>,
) {
    let script =
        format!("curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://{upstream}/after");
    let (st, out) = exec(c, key, &json!({"argv": ["sh", "-c", script]}));
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["stdout"], "403", "admitted after the lease: {out}");
    let heard: Vec<String> = seen.try_iter().collect();
    assert!(
        !heard.iter().any(|p| p == "/after"),
        "the upstream heard {heard:?}"
    );
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
    place(&c, key);
    let (upstream, seen) = upstream(&c);
    let mut s = open_fence(&c, key, upstream, &seen);
    let (i, _) = fenced(&c);

    c.kill_node(i);
    let killed = Instant::now();
    let mut out = String::new();
    let last = s.outcome(&mut out).expect("the stream ends with an event");
    assert_typed_error(&last, "unreachable");
    // The node's proxy died with it: the fenced command's requests stop reaching the
    // upstream, within the lease at the latest.
    wait_quiet(&seen, Duration::from_millis(GRACE_MS) + MARGIN);
    assert!(killed.elapsed() < Duration::from_millis(RUN_TIMEOUT_MS + GRACE_MS) + MARGIN);
    // Its next start sweeps what it left: no grant open, nothing reaches the upstream,
    // and the key works again, with nothing admitted.
    c.restart_node(i);
    assert_eq!(
        c.nodes[i].client().open_grants().unwrap(),
        Vec::<String>::new()
    );
    wait_quiet(&seen, MARGIN);
    assert_refused_from_inside(&c, key, upstream, &seen);
    c.stop();
}

#[test]
fn a_front_killed_mid_fence_leaves_its_grant_to_the_lease_and_records_survive_a_restart() {
    let mut c = cluster();
    let key = "front-killed";
    place(&c, key);
    let (upstream, seen) = upstream(&c);
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

    declare(&c, key);
    let opened = Instant::now();
    let s = open_fence(&c, key, upstream, &seen);
    let (i, _) = fenced(&c);

    c.kill_front();
    drop(s);
    // Nobody will revoke it but the node: its lease (the run's timeout plus the
    // grace) kills the fenced tree and closes the grant; the upstream hears no more.
    let lease = Duration::from_millis(RUN_TIMEOUT_MS + GRACE_MS) + MARGIN;
    wait_for(
        "the node's lease closes the grant",
        lease.saturating_sub(opened.elapsed()),
        || c.nodes[i].client().open_grants().ok().filter(Vec::is_empty),
    );
    wait_quiet(&seen, MARGIN);
    assert!(
        c.nodes[i]
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("lease expired")),
        "the node logs the lease that ran out"
    );

    // The front comes back with its records (the egress audit it answered before the
    // kill is still there, first: later requests may follow it) and the key's placement
    // (the mark is in the key's container, on its node only).
    c.restart_front();
    let (st, after) = egress(&c);
    assert_eq!(st, 200, "{after}");
    let events = |text: &str| -> Vec<Value> {
        let v: Value = serde_json::from_str(text).unwrap();
        v["egress"].as_array().cloned().unwrap_or_default()
    };
    let (before, after) = (events(&before), events(&after));
    assert!(
        !before.is_empty(),
        "the finished exec's request was audited"
    );
    assert_eq!(
        after.get(..before.len()),
        Some(&before[..]),
        "the records survive the restart"
    );
    let (st, out) = exec(&c, key, &json!({"argv": ["cat", "/workspace/mark"]}));
    assert_eq!(st, 200, "{out}");
    assert_eq!(
        out["stdout"], "kept\n",
        "the key is still on its node: {out}"
    );
    assert_refused_from_inside(&c, key, upstream, &seen);
    c.stop();
}

#[test]
fn a_front_killed_mid_fence_of_a_key_with_nothing_declared_leaves_the_teardown_to_the_nodes_batch()
{
    let mut c = cluster();
    let key = "front-killed-one-batch";
    place(&c, key);
    let (upstream, seen) = upstream(&c);
    let opened = Instant::now();
    let s = open_fence(&c, key, upstream, &seen);
    let (i, _) = fenced(&c);

    c.kill_front();
    drop(s);
    // The whole fence went as one batch: when the run's timeout ends it, the node
    // kills the tree and revokes the grant itself, before the lease would.
    let ended = Duration::from_millis(RUN_TIMEOUT_MS) + MARGIN;
    wait_for(
        "the node's batch closes the grant at the run's end",
        ended.saturating_sub(opened.elapsed()),
        || c.nodes[i].client().open_grants().ok().filter(Vec::is_empty),
    );
    wait_quiet(&seen, MARGIN);
    let log = c.nodes[i].log.lock().unwrap().clone();
    assert!(
        log.iter().any(|l| l.contains(&format!("key={key}"))
            && l.contains(
                r#"made=["ensure:ok", "apply-grant:ok", "run:ok", "kill-all:ok", "revoke-grant:ok"]"#
            )),
        "the fence's one batch made the teardown on the node"
    );
    c.restart_front();
    assert_refused_from_inside(&c, key, upstream, &seen);
    c.stop();
}

#[test]
fn a_cut_link_mid_run_is_unreachable_and_nothing_is_open_after_the_lease() {
    let c = cluster();
    let key = "link-cut";
    place(&c, key);
    declare(&c, key);
    let (upstream, seen) = upstream(&c);
    let opened = Instant::now();
    let mut s = open_fence(&c, key, upstream, &seen);
    let (i, _) = fenced(&c);

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
    // With the link mended, the fenced command's requests do not come back: its tree
    // was killed and its grant closed.
    c.link_up(i);
    wait_quiet(&seen, MARGIN);
    assert_eq!(
        c.nodes[i].client().open_grants().unwrap(),
        Vec::<String>::new()
    );
    assert_refused_from_inside(&c, key, upstream, &seen);
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
        std::fs::write(&other, stockade_node_protocol::auth::new_secret()).unwrap();
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
