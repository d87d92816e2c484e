//! The remote substrate (DESIGN §7): `stockade serve` with `substrate.kind =
//! "remote"` over two real `stockade node` processes, driven through the front's public
//! HTTP API. The nodes run on their own hosts (a network namespace and a veth each:
//! `stockade_tests::nodes`, whose cluster cleans up every process, cgroup, mount,
//! namespace and directory it made).
//!
//! * an exec through the front runs on a node, live output streams, and two keys whose
//!   rendezvous order differs land on different nodes;
//! * a full node (ceiling 1) sends a new key to the other node, and that placement
//!   survives a front restart: with the first node free again, the key stays where
//!   its workspace is;
//! * a node's container killed from outside: the node calls the front back, and the
//!   guest's `on-stop` clears the key's detached declaration;
//! * a secret set through the front reaches every node.

use std::time::Duration;

use serde_json::{Value, json};
use stockade_remote::placement;
use stockade_runtime::config::Config;
use stockade_tests::nodes::{Cluster, ExecStream, Options, wait_for};

const DEADLINE: Duration = Duration::from_secs(30);

fn base() -> Config {
    let mut cfg = Config::embedded();
    // No warm containers: a node's container cgroups are exactly its keys'.
    cfg.substrate.warm = 0;
    cfg.api.shutdown_deadline_ms = 2_000;
    cfg
}

/// A key whose rendezvous order over the cluster's nodes starts with node `first`.
fn key_first_on(c: &Cluster, first: usize, tag: &str) -> String {
    let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .find(|k| placement::order(&names, k)[0] == first)
        .expect("some key")
}

fn call(c: &Cluster, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let (st, text) = stockade_tests::http(
        &c.front.addr,
        method,
        path,
        Some(&c.front.token()),
        body.to_string().as_bytes(),
    );
    (
        st,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn exec(c: &Cluster, key: &str, argv: &[&str]) -> (u16, Value) {
    call(
        c,
        "POST",
        &format!("/v1/sandboxes/{key}/exec"),
        &json!({ "argv": argv }),
    )
}

fn containers(c: &Cluster) -> Vec<usize> {
    c.nodes
        .iter()
        .map(|n| n.container_cgroups().len())
        .collect()
}

fn logged(log: &stockade_tests::nodes::Log, needle: &str) -> bool {
    log.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|l| l.contains(needle))
}

#[test]
fn an_exec_runs_on_a_node_and_two_keys_spread_by_placement() {
    let c = Cluster::start(&base(), &Options::default());
    let (a, b) = (key_first_on(&c, 0, "spread"), key_first_on(&c, 1, "spread"));
    let (st, out) = exec(&c, &a, &["sh", "-c", "echo hello from $(hostname)"]);
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["exit_code"], 0, "{out}");
    assert!(
        out["stdout"]
            .as_str()
            .unwrap_or("")
            .starts_with("hello from"),
        "{out}"
    );
    assert_eq!(containers(&c), vec![1, 0], "key {a} is on its first node");
    // The key is placed and declares no process: its next exec is one batch, the ensure
    // first and the teardown last (one round trip).
    let (st, out) = exec(&c, &a, &["true"]);
    assert_eq!(st, 200, "{out}");
    wait_for(
        "the node's batch opened with the key's ensure",
        DEADLINE,
        || {
            c.nodes[0]
                .log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|l| {
                    l.contains(&format!("key={a}"))
                        && l.contains(
                        r#"made=["ensure:ok", "apply-grant:ok", "run:ok", "kill-all:ok", "revoke-grant:ok"]"#,
                    )
                })
                .then_some(())
        },
    );
    // Live output through the front: a chunk arrives before the command ends.
    let mut s = ExecStream::open(
        &c.front.addr,
        &c.front.token(),
        &b,
        &json!({"argv": ["sh", "-c", "echo first; sleep 1; echo second"]}),
    );
    assert_eq!(s.status, 200);
    assert_eq!(
        s.next_event().expect("a first event"),
        json!({"type": "stdout", "data": "first\n"})
    );
    let mut rest = String::new();
    let last = s.outcome(&mut rest).expect("the exit event");
    assert_eq!(last["type"], "exit", "{last}");
    assert_eq!(last["exit_code"], 0, "{last}");
    assert_eq!(rest, "second\n");
    assert_eq!(containers(&c), vec![1, 1], "key {b} is on the other node");
    // A secret set through the front is handed to every node.
    let (st, text) = stockade_tests::http(
        &c.front.addr,
        "PUT",
        "/v1/secrets/remote-token",
        Some(&c.front.approver_token()),
        json!({"value": "s3cret", "host": "api.example.com", "methods": ["GET"]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(st, 204, "{text}");
    for n in &c.nodes {
        wait_for("the node was handed the secret", DEADLINE, || {
            logged(&n.log, "secret set secret=remote-token").then_some(())
        });
    }
    c.stop();
}

#[test]
fn a_full_node_sends_a_new_key_to_the_other_and_the_placement_survives_a_front_restart() {
    let mut cfg = base();
    cfg.substrate.ceiling = 1;
    let mut c = Cluster::start(&cfg, &Options::default());
    // Both keys would go to the first node; the first fills it.
    let first = key_first_on(&c, 0, "full-a");
    let second = key_first_on(&c, 0, "full-b");
    let (st, out) = exec(&c, &first, &["true"]);
    assert_eq!(st, 200, "{out}");
    assert_eq!(containers(&c), vec![1, 0]);
    let (st, out) = exec(&c, &second, &["sh", "-c", "echo kept > /workspace/mark"]);
    assert_eq!(st, 200, "the full node's key went elsewhere: {out}");
    assert_eq!(containers(&c), vec![1, 1], "{second} is on the second node");
    assert!(logged(&c.front.log, "node passed over for a new key"));

    // The front restarts; the first node is freed (the first key aborted). The second
    // key's rendezvous choice is now free, but its placement keeps it where its
    // workspace is.
    c.kill_front();
    c.restart_front();
    let (st, out) = call(
        &c,
        "POST",
        &format!("/v1/sandboxes/{first}/abort"),
        &json!({}),
    );
    assert!(st == 200 || st == 204, "{st} {out}");
    wait_for("the first node is free", DEADLINE, || {
        (c.nodes[0].container_cgroups().is_empty()).then_some(())
    });
    let (st, out) = exec(&c, &second, &["cat", "/workspace/mark"]);
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["stdout"], "kept\n", "{out}");
    assert_eq!(
        containers(&c),
        vec![0, 1],
        "{second} stayed on the second node"
    );
    c.stop();
}

/// The supervisor (the container's PID 1) of the only container on node `i`.
fn supervisor_of_the_container(c: &Cluster, i: usize) -> Option<i32> {
    let root = &c.nodes[i].cgroup_root;
    let names = c.nodes[i].container_cgroups();
    let container = root.join(names.first()?);
    let mut dirs = vec![container];
    let mut pids = Vec::new();
    while let Some(d) = dirs.pop() {
        if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                dirs.push(e.path());
            }
        }
    }
    pids.into_iter().find(|p| {
        std::fs::read_to_string(format!("/proc/{p}/comm"))
            .map(|c| c.trim().starts_with("stockade-superv"))
            .unwrap_or(false)
    })
}

#[test]
fn on_stop_reaches_the_guest_when_a_nodes_container_is_killed_from_outside() {
    let c = Cluster::start(&base(), &Options::default());
    let key = key_first_on(&c, 1, "stopped");
    let (st, out) = call(
        &c,
        "POST",
        &format!("/v1/sandboxes/{key}/detached"),
        &json!({"argv": ["sleep", "1000"]}),
    );
    assert_eq!(st, 201, "{out}");
    let id = out["id"].as_str().expect("an id").to_string();
    let status = |c: &Cluster| {
        call(
            c,
            "GET",
            &format!("/v1/sandboxes/{key}/detached/{id}"),
            &json!({}),
        )
    };
    assert_eq!(status(&c).1, json!({"state": "running"}));
    let pid = supervisor_of_the_container(&c, 1).expect("the container's supervisor");
    stockade_tests::kill(pid, rustix::process::Signal::KILL).expect("kill the supervisor");
    // The node tells the front, the front the guest (on-stop): the declaration is
    // cleared, so the id reads gone.
    wait_for("the front heard the node", DEADLINE, || {
        logged(&c.front.log, "container stopped on its own").then_some(())
    });
    assert!(logged(&c.front.log, "node event accepted"));
    let (st, out) = status(&c);
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["state"], "gone", "{out}");
    // The key gets a new container on its next exec, on the same node.
    let (st, out) = exec(&c, &key, &["echo", "back"]);
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["stdout"], "back\n", "{out}");
    assert_eq!(containers(&c), vec![0, 1]);
    c.stop();
}
