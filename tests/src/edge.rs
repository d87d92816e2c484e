//! The edge deployment for tests (front (c) of `tests/e2e/main.rs`; DESIGN §7): workerd
//! serving `edge/`'s Worker (the public API, a Durable Object per key, the real guest .wasm
//! through JSPI) over the nodes of a [`Cluster`] (each `stockade node` in its own network
//! namespace on a veth), so a suite can drive it through its URL and tokens alone.
//!
//! The configuration is the deployment's own: a description (listen address, tokens
//! in files, the nodes' addresses, pinned certificates and secrets, the floor) handed
//! to `edge/scripts/deploy-config.mjs`, whose output workerd serves. The Durable
//! Objects' SQLite (`localDisk`) lives in the caller's temp directory. workerd listens
//! on every address at the cluster's front port, the port the nodes call back
//! (`POST /v1/nodes/events`), so a stopped container's `on-stop` reaches the guest.
//!
//! workerd is the caller's child (a pid, never a name); the cluster's Drop removes
//! what the nodes made. Readiness is a health answer waited on with a deadline.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use stockade_runtime::config::Config;

use crate::kill;
use crate::nodes::{Cluster, Log};

/// How long workerd may take to serve (it compiles the guest's core modules).
const START_DEADLINE: Duration = Duration::from_secs(90);

/// The consumer's and the approver's token files under a deployment's data directory
/// (the names `stockade serve` uses, so a client reads them the same way).
pub const TOKEN_FILES: [&str; 2] = ["api-token", "approver-token"];

/// `edge/` in this checkout, or `$STOCKADE_EDGE_DIR` (a copy of its `src/`,
/// `scripts/`, `gen-jspi/` and `node_modules/.bin/workerd`, e.g. to keep running
/// while something rebuilds `edge/`).
pub fn edge_dir() -> PathBuf {
    match std::env::var_os("STOCKADE_EDGE_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../edge"),
    }
}

/// What the deployment needs from `edge/` (the pinned workerd, the JSPI build), or
/// a loud failure saying how to make it.
fn require_edge_build() -> PathBuf {
    let edge = edge_dir();
    let workerd = edge.join("node_modules/.bin/workerd");
    assert!(
        workerd.exists(),
        "{} is missing: run `npm ci` in edge/ (scripts/test does)",
        workerd.display()
    );
    assert!(
        edge.join("gen-jspi/stockade.js").is_file(),
        "edge/gen-jspi is missing: run `bash edge/build.sh` (scripts/test does)"
    );
    workerd
}

/// The deployment's description for `edge/scripts/deploy-config.mjs` (its README's
/// format): the nodes of `cluster`, tokens in `data_dir`, SQLite under `storage`, the
/// floor, `/mcp`'s allowed origins and the heartbeat from `base`.
pub fn description(
    cluster: &Cluster,
    base: &Config,
    data_dir: &Path,
    storage: &Path,
    heartbeat_ms: u64,
) -> serde_json::Value {
    let nodes: Vec<_> = cluster
        .nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "name": n.name,
                "address": n.addr().to_string(),
                "cert_file": n.cert_file(),
                "secret_file": n.secret_file(),
            })
        })
        .collect();
    // `idle_timeout_ms = 0` is "never" to the Rust host; the Worker has no "never":
    // an hour is past any test.
    let idle_ms = match base.substrate.idle_timeout_ms {
        0 => 3_600_000,
        ms => ms,
    };
    serde_json::json!({
        "listen": format!("0.0.0.0:{}", cluster.front_port()),
        "storage": storage,
        "api_token_file": data_dir.join(TOKEN_FILES[0]),
        "approver_token_file": data_dir.join(TOKEN_FILES[1]),
        "idle_ms": idle_ms,
        "heartbeat_ms": heartbeat_ms,
        "approval_ttl_ms": base.floor.approval_ttl_ms,
        "floor": base.floor.rules,
        "mcp_origins": base.api.mcp_origins,
        "nodes": nodes,
    })
}

/// Write fresh tokens into `data_dir` (0600), as `stockade serve` does on first start.
fn write_tokens(data_dir: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(data_dir).expect("the deployment's data directory");
    for name in TOKEN_FILES {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(data_dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        f.write_all(token.as_bytes()).expect("write a token");
    }
}

/// Copy `r`'s lines into each log and the test's stderr with `prefix`.
fn keep_lines(r: impl Read + Send + 'static, prefix: &'static str, logs: Vec<Log>) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            eprintln!("[{prefix}] {line}");
            for log in &logs {
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(line.clone());
            }
        }
    });
}

/// Whether `GET /v1/health` on `addr` answers 200.
fn healthy(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /v1/health HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// Serve the edge deployment over `cluster`'s nodes: tokens written into `data_dir`,
/// the configuration generated into `dir` (and the Durable Objects' storage there),
/// workerd started with its output in each of `logs`. Returns once it answers its
/// health route on `127.0.0.1:<front port>`, or fails loudly (workerd killed).
pub fn spawn_workerd(
    cluster: &Cluster,
    base: &Config,
    data_dir: &Path,
    dir: &Path,
    heartbeat_ms: u64,
    logs: Vec<Log>,
) -> Child {
    let workerd = require_edge_build();
    write_tokens(data_dir);
    let storage = dir.join("do-storage");
    std::fs::create_dir_all(&storage).expect("the Durable Objects' storage");
    let desc_path = dir.join("deploy.json");
    let capnp = dir.join("deploy.capnp");
    let desc = description(cluster, base, data_dir, &storage, heartbeat_ms);
    std::fs::write(&desc_path, desc.to_string()).expect("write the description");
    // Its real path: the script writes only when run as itself (argv[1] is its URL).
    let script = edge_dir().join("scripts/deploy-config.mjs");
    let script = std::fs::canonicalize(&script).unwrap_or(script);
    let out = Command::new("node")
        .arg(&script)
        .arg(&desc_path)
        .arg(&capnp)
        .output()
        .expect("run node edge/scripts/deploy-config.mjs");
    assert!(
        out.status.success(),
        "deploy-config.mjs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        capnp.is_file(),
        "{} wrote no {}",
        script.display(),
        capnp.display()
    );
    let mut child = Command::new(&workerd)
        .args(["serve", "--experimental"])
        .arg(&capnp)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn workerd");
    keep_lines(
        child.stdout.take().expect("piped stdout"),
        "workerd",
        logs.clone(),
    );
    keep_lines(child.stderr.take().expect("piped stderr"), "workerd", logs);
    let addr = SocketAddr::from(([127, 0, 0, 1], cluster.front_port()));
    let end = Instant::now() + START_DEADLINE;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("workerd exited while starting: {status}");
        }
        if healthy(addr) {
            return child;
        }
        if Instant::now() > end {
            let _ = kill(child.id() as i32, Signal::KILL);
            let _ = child.wait();
            panic!("workerd did not serve on {addr} within {START_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
