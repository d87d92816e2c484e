//! Nodes on their own hosts (DESIGN §7, docs/NODE.md): a harness that starts `stockade
//! node` processes, each in a network namespace of its own reached over a veth pair (its
//! own "host" on a private /30), and a front (`stockade serve` with `substrate.kind =
//! "remote"`) in the root namespace that drives them over HTTPS.
//!
//! Why a namespace per node: a node's listener, its egress proxy and the front's call
//! backs then cross a real link that a test can cut (`ip link set … down`), and the
//! node's address is not the front's, as on separate machines.
//!
//! The namespace is held by a process of the harness ([`Link`]), not named with `ip
//! netns add` (a bind mount under `/run/netns` would change the host's mount table,
//! which other tests running at the same time check). A node is started with `nsenter
//! --net=/proc/<holder>/ns/net`, not `ip netns exec`: that also unshares the mount
//! namespace and mounts a fresh sysfs on `/sys`, which hides `/sys/fs/cgroup` from the
//! node (it could not make a container); `nsenter --net` changes the network namespace
//! only.
//!
//! Everything a [`Cluster`] makes is its own and named after its short id (`sk<id>h1`
//! veths, `stockade-node-<id>-n1` cgroup roots, its temp directory; `stk-<id>-n1` names
//! a namespace in logs): dropping it kills only its own processes (by pid), removes its
//! cgroups (under every `/sys/fs/cgroup/*` mount), unmounts what its nodes left mounted
//! under its directories, ends its namespaces and deletes its veths, and then checks
//! that nothing of that is left. A test waits on events with deadlines (a file appearing, a listener accepting),
//! never on a sleep.
//!
//! Each node serves its own preview listener on its own address
//! ([`Node::preview_addr`], port [`PREVIEW_PORT`]), so a door's URL leads from the test
//! host (curl, a browser) over the link to the node that holds it; with a `[preview]
//! domain` in the base configuration, node `nI`'s is `nI.{domain}`.
//!
//! [`NodeClient`] signs node calls (`stockade_node_protocol::auth`) and pins the node's
//! certificate, so a test can ask a node directly, e.g. for its `open-grants`.
//!
//! One job per module: `link` (a namespace and its veth), `mirror` (the test host's
//! loopback addresses inside a node's namespace), `client` (signed, pinned node
//! calls), `api` (an upstream and a streamed exec, as tests drive a front); this one
//! starts, kills and cleans up the nodes and the front.

mod api;
mod client;
mod link;
mod mirror;

pub use api::{ExecStream, http_upstream};
pub use client::{NodeClient, parse_response};
pub use link::{Link, in_netns, pick_subnet};
pub use mirror::Mirror;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use stockade_runtime::config::{Config, RemoteNode};

use crate::{TempDir, kill, stockade_exe};

/// The port every node listens on (its own address, so they never collide).
pub const NODE_PORT: u16 = 8788;

/// The port of every node's preview listener (`[preview] listen`, on its own address).
pub const PREVIEW_PORT: u16 = 8790;

/// How long a node or a front may take to come up.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// A log a child's stderr is copied into (and echoed to the test's stderr).
pub type Log = Arc<Mutex<Vec<String>>>;

/// Connect with a deadline per attempt.
fn connect(addr: SocketAddr, limit: Duration) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, limit)
}

/// A child's stderr copied, line by line, into a [`Log`] and the test's stderr with
/// `prefix`; the returned channel gets each line too (a test may wait on one).
fn keep_log(
    child: &mut Child,
    prefix: String,
    logs: Vec<Log>,
) -> std::sync::mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[{prefix}] {line}");
            for log in &logs {
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(line.clone());
            }
            let _ = tx.send(line);
        }
    });
    rx
}

/// SIGTERM, then SIGKILL if it has not exited within `grace`; reaped either way. The
/// process is the harness's own child (a pid, never a name).
fn terminate(child: &mut Child, grace: Duration) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = kill(child.id() as i32, Signal::TERM);
    let end = Instant::now() + grace;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > end {
            let _ = kill(child.id() as i32, Signal::KILL);
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `stockade node` on its own link.
pub struct Node {
    /// Its name (`n1`, `n2`, …), as the front knows it.
    pub name: String,
    /// Its host: namespace and veth.
    pub link: Link,
    /// Its configuration file.
    pub config: PathBuf,
    /// Its data directory (`node/cert.pem`, `node/secret`, `containers/…`).
    pub data_dir: PathBuf,
    /// Its cgroup root (under the v2 mount).
    pub cgroup_root: PathBuf,
    /// Every line it has logged (across restarts).
    pub log: Log,
    child: Option<Child>,
    mirror: Option<Mirror>,
    also_log: Option<Log>,
}

impl Node {
    /// Its API's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.link.ns_ip, NODE_PORT))
    }

    /// Its preview listener's address (doors' URLs name it, or its domain).
    pub fn preview_addr(&self) -> SocketAddr {
        SocketAddr::from((self.link.ns_ip, PREVIEW_PORT))
    }

    /// Its API's URL (as the front's `[[remote.nodes]] url`).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr())
    }

    /// Its pinned certificate.
    pub fn cert_file(&self) -> PathBuf {
        self.data_dir.join("node/cert.pem")
    }

    /// Its request secret.
    pub fn secret_file(&self) -> PathBuf {
        self.data_dir.join("node/secret")
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Start it (`nsenter --net=… stockade node --config …`) and wait, with a
    /// deadline, for its certificate, its secret and its listener.
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} already runs", self.name);
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", self.link.ns_path().display()))
            .arg("--")
            .arg(stockade_exe())
            .args(["node", "--config"])
            .arg(&self.config)
            .env_remove("STOCKADE_DATA_DIR")
            // The node's `batch` line (debug) names the calls each batch made.
            .env("RUST_LOG", "info,stockade::node=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nsenter … stockade node");
        let mut logs = vec![self.log.clone()];
        logs.extend(self.also_log.clone());
        let _lines = keep_log(&mut child, self.name.clone(), logs);
        self.child = Some(child);
        let end = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                panic!("node {} exited while starting: {status}", self.name);
            }
            let files = self.cert_file().is_file() && self.secret_file().is_file();
            if files && connect(self.addr(), Duration::from_millis(500)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < end,
                "node {} did not listen on {} within {START_DEADLINE:?} (cert and secret: {files})",
                self.name,
                self.addr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A client for its API, signing with its secret and pinning its certificate.
    pub fn client(&self) -> NodeClient {
        NodeClient::from_files(self.addr(), &self.cert_file(), &self.secret_file())
            .expect("the node's certificate and secret")
    }

    /// The containers (directories) under its cgroup root.
    pub fn container_cgroups(&self) -> Vec<String> {
        std::fs::read_dir(&self.cgroup_root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

/// The front: `stockade serve` over the nodes.
pub struct Front {
    /// Its address for the test (`127.0.0.1:<port>`; it listens on every address so
    /// the nodes reach it on their links' root side).
    pub addr: String,
    /// Its data directory (tokens, store).
    pub data_dir: PathBuf,
    /// Its configuration file.
    pub config: PathBuf,
    /// Every line it has logged (across restarts).
    pub log: Log,
    child: Option<Child>,
}

impl Front {
    /// The consumer's token.
    pub fn token(&self) -> String {
        read_trimmed(&self.data_dir.join("api-token"))
    }

    /// The approver's token.
    pub fn approver_token(&self) -> String {
        read_trimmed(&self.data_dir.join("approver-token"))
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "the front already runs");
        let child = spawn_front(&self.config, vec![self.log.clone()]);
        self.child = Some(child);
    }

    /// `stockade ARGS…` against this front (the CLI, as a user runs it).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(stockade_exe())
            .args(args)
            .env("STOCKADE_SERVER", format!("http://{}", self.addr))
            .env("STOCKADE_DATA_DIR", &self.data_dir)
            .stdin(Stdio::null())
            .output()
            .expect("run the CLI")
    }
}

/// `stockade serve --config <config>` (a front), its log kept in each of `logs`
/// (and echoed with a `[front]` prefix); returns once it logged that it serves.
pub fn spawn_front(config: &Path, logs: Vec<Log>) -> Child {
    let mut child = Command::new(stockade_exe())
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("STOCKADE_DATA_DIR")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stockade serve");
    let lines = keep_log(&mut child, "front".into(), logs);
    let end = Instant::now() + START_DEADLINE;
    loop {
        match lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(l) if l.contains("serving on http://") => return child,
            Ok(_) => {}
            Err(e) => {
                let _ = kill(child.id() as i32, Signal::KILL);
                let status = child.wait();
                // Disconnected: it closed its stderr (exited) before serving.
                panic!("the front did not serve within {START_DEADLINE:?} ({e}; exit: {status:?})");
            }
        }
    }
}

fn read_trimmed(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

/// How a [`Cluster`] is made.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many nodes.
    pub nodes: usize,
    /// Each node's `lease_grace_ms`.
    pub lease_grace_ms: u64,
    /// Each node's `heartbeat_ms`.
    pub heartbeat_ms: u64,
    /// Addresses of the test host's loopback (e.g. 127.0.0.2) that each node reaches
    /// as if they were its own: see [`Mirror`]. Empty: none.
    pub mirror_loopback: Vec<Ipv4Addr>,
    /// A log every node's lines also go to (e.g. the e2e suite's server log, so a test
    /// that searches "what the server logged" searches the whole deployment's).
    pub also_log: Option<Log>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 2,
            lease_grace_ms: 2_000,
            heartbeat_ms: 500,
            mirror_loopback: Vec::new(),
            also_log: None,
        }
    }
}

/// N nodes, each on its own link, and a front over them.
pub struct Cluster {
    /// The short id every name of this cluster carries.
    pub id: String,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The front.
    pub front: Front,
    dir: Option<TempDir>,
    cgroup_names: Vec<String>,
    front_port: u16,
    heartbeat_ms: u64,
}

impl Cluster {
    /// Start `opts.nodes` nodes from `base` (its substrate, egress and limits
    /// sections; `base` as the e2e suite tweaks it), each on its own link, and wait for
    /// them; no front yet ([`Cluster::start`] starts one, [`Cluster::front_config`]
    /// configures one the caller starts). Needs root and cgroup v2.
    pub fn start_nodes(base: &Config, opts: &Options) -> Cluster {
        let v2 = crate::require_root_and_cgroup_v2();
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let dir = TempDir::new(&format!("nodes-{id}"));
        // The front's port is chosen first: the nodes call it back (front_url).
        let port = {
            let l = TcpListener::bind("0.0.0.0:0").expect("a free port");
            l.local_addr().expect("its address").port()
        };
        let mut cluster = Cluster {
            id: id.clone(),
            nodes: Vec::new(),
            front: Front {
                addr: format!("127.0.0.1:{port}"),
                data_dir: dir.path().join("front/data"),
                config: dir.path().join("front/wasmtime.toml"),
                log: Log::default(),
                child: None,
            },
            dir: Some(dir),
            cgroup_names: Vec::new(),
            front_port: port,
            heartbeat_ms: opts.heartbeat_ms,
        };
        let root = cluster.dir().to_path_buf();
        for i in 1..=opts.nodes {
            let link = Link::create(&id, i).expect("a node's namespace and veth");
            let name = format!("n{i}");
            let ndir = root.join(&name);
            std::fs::create_dir_all(&ndir).expect("the node's directory");
            let cg_name = format!("stockade-node-{id}-{name}");
            cluster.cgroup_names.push(cg_name.clone());
            let mut cfg = base.clone();
            cfg.substrate.kind = "linux".into();
            cfg.substrate.data_dir = ndir.join("data");
            cfg.substrate.cgroup_root = v2.join(&cg_name).display().to_string();
            cfg.substrate.idle_timeout_ms = 0;
            cfg.egress.allow_private_targets = true;
            cfg.node.listen = SocketAddr::from((link.ns_ip, NODE_PORT)).to_string();
            cfg.node.name = name.clone();
            cfg.node.hostnames = vec![link.ns_ip.to_string()];
            cfg.node.front_url = format!("http://{}:{port}", link.host_ip);
            cfg.node.lease_grace_ms = opts.lease_grace_ms;
            cfg.node.heartbeat_ms = opts.heartbeat_ms;
            // Its own preview listener on its own address, reached from the test host
            // over the link; with a domain, one of its own under `base`'s (a Host-form
            // name must lead to the node that holds the door).
            cfg.preview.enabled = true;
            cfg.preview.listen = SocketAddr::from((link.ns_ip, PREVIEW_PORT)).to_string();
            if !base.preview.domain.is_empty() {
                cfg.preview.domain = format!("{name}.{}", base.preview.domain);
            }
            cfg.remote = Default::default();
            let config = ndir.join("wasmtime.toml");
            std::fs::write(&config, toml::to_string(&cfg).expect("a node config")).unwrap();
            cluster.nodes.push(Node {
                name,
                link,
                config,
                data_dir: cfg.substrate.data_dir.clone(),
                cgroup_root: v2.join(&cg_name),
                log: Log::default(),
                child: None,
                mirror: None,
                also_log: opts.also_log.clone(),
            });
        }
        for n in &mut cluster.nodes {
            if !opts.mirror_loopback.is_empty() {
                n.mirror = Some(
                    Mirror::start(&n.link, &opts.mirror_loopback)
                        .expect("mirror the test host's loopback addresses into the node"),
                );
            }
            n.spawn();
        }
        cluster
    }

    /// [`Cluster::start_nodes`], then its own front (`<dir>/front/data`), started and
    /// waited for.
    pub fn start(base: &Config, opts: &Options) -> Cluster {
        let mut cluster = Cluster::start_nodes(base, opts);
        let cfg = cluster.front_config(base, &cluster.front.data_dir);
        std::fs::create_dir_all(cluster.dir().join("front")).unwrap();
        std::fs::write(
            &cluster.front.config,
            toml::to_string(&cfg).expect("a front config"),
        )
        .unwrap();
        cluster.front.spawn();
        cluster
    }

    /// The configuration of a front over these nodes, from `base` (its engine,
    /// guest, floor and API sections), with `data_dir`, listening on every address at
    /// the port the nodes call back (so they reach it on their links' root side).
    pub fn front_config(&self, base: &Config, data_dir: &Path) -> Config {
        let mut cfg = base.clone();
        cfg.substrate.kind = "remote".into();
        cfg.substrate.data_dir = data_dir.to_path_buf();
        cfg.api.listen = format!("0.0.0.0:{}", self.front_port);
        cfg.remote.nodes = self
            .nodes
            .iter()
            .map(|n| RemoteNode {
                name: n.name.clone(),
                url: n.url(),
                cert_file: n.cert_file(),
                secret_file: n.secret_file(),
            })
            .collect();
        // Faster than the default three seconds: a cut link is told sooner.
        cfg.remote.heartbeat_timeout_ms = (self.heartbeat_ms * 3).max(1_000);
        cfg
    }

    /// The port the front listens on (every address) and the nodes call back.
    pub fn front_port(&self) -> u16 {
        self.front_port
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the cluster's directory").path()
    }

    /// Cut node `i`'s link (0-based).
    pub fn link_down(&self, i: usize) {
        self.nodes[i].link.down().expect("ip link set down");
    }

    /// Mend node `i`'s link.
    pub fn link_up(&self, i: usize) {
        self.nodes[i].link.up().expect("ip link set up");
    }

    /// SIGKILL node `i`'s process (only it) and reap it.
    pub fn kill_node(&mut self, i: usize) {
        let mut c = self.nodes[i].child.take().expect("the node runs");
        kill(c.id() as i32, Signal::KILL).expect("kill the node");
        let _ = c.wait();
    }

    /// Start node `i` again (same data dir, so the same certificate and secret).
    pub fn restart_node(&mut self, i: usize) {
        self.nodes[i].spawn();
    }

    /// SIGKILL the front (only it) and reap it.
    pub fn kill_front(&mut self) {
        let mut c = self.front.child.take().expect("the front runs");
        kill(c.id() as i32, Signal::KILL).expect("kill the front");
        let _ = c.wait();
    }

    /// Start the front again on the same port and data directory.
    pub fn restart_front(&mut self) {
        self.front.spawn();
    }

    /// The one node with a grant open and that grant's container (the node's own id),
    /// if exactly one grant is open across the nodes.
    pub fn the_open_grant(&self) -> Option<(usize, String)> {
        let mut open = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for id in n.client().open_grants().ok()? {
                open.push((i, id));
            }
        }
        (open.len() == 1).then(|| open.remove(0))
    }

    /// Each node's `open-grants` (asked from the root side of its link).
    pub fn open_grants(&self) -> Vec<(String, std::io::Result<Vec<String>>)> {
        self.nodes
            .iter()
            .map(|n| (n.name.clone(), n.client().open_grants()))
            .collect()
    }

    /// The front stops (SIGTERM, its shutdown deadline), then every node (SIGTERM: a
    /// node tears its containers down), each within `grace` or SIGKILL.
    pub fn terminate_all(&mut self, grace: Duration) {
        if let Some(mut c) = self.front.child.take() {
            terminate(&mut c, grace);
        }
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                terminate(&mut c, grace);
            }
        }
    }

    /// What this cluster left behind on the machine: its nodes' container cgroups,
    /// mounts under its directory, its namespaces and veths. Empty: clean.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for n in &self.nodes {
            for c in n.container_cgroups() {
                left.push(format!("{}: container cgroup {c}", n.name));
            }
        }
        if let Some(d) = &self.dir {
            for m in crate::mounts_under(d.path()) {
                left.push(format!("mount {m}"));
            }
        }
        left
    }

    /// Stop everything gracefully and check the nodes tore their containers down and
    /// left no mount; then clean the rest (Drop). Panics naming what was left.
    pub fn stop(mut self) {
        self.terminate_all(Duration::from_secs(30));
        let left = self.leftovers();
        assert!(
            left.is_empty(),
            "left behind after a graceful stop: {left:?}"
        );
    }

    fn cleanup(&mut self) -> Vec<String> {
        self.terminate_all(Duration::from_secs(10));
        // Its sockets hold the namespaces: closed before they are deleted.
        for n in &mut self.nodes {
            n.mirror = None;
        }
        let mut problems = Vec::new();
        // Cgroups: every hierarchy this machine mounts (v2 and the v1 limit ones).
        for name in &self.cgroup_names {
            for dir in cgroup_dirs_named(name) {
                remove_cgroup_tree(&dir);
                if dir.exists() {
                    problems.push(format!("cgroup {}", dir.display()));
                }
            }
        }
        if let Some(d) = &self.dir {
            for m in crate::mounts_under(d.path()).iter().rev() {
                let _ = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH);
            }
            for m in crate::mounts_under(d.path()) {
                problems.push(format!("mount {m}"));
            }
        }
        for n in &mut self.nodes {
            if let Err(e) = n.link.remove() {
                problems.push(e.to_string());
            }
        }
        if let Some(d) = self.dir.take() {
            let p = d.path().to_path_buf();
            drop(d);
            if p.exists() {
                problems.push(format!("directory {}", p.display()));
            }
        }
        problems
    }
}

impl Drop for Cluster {
    /// Kill only its own processes, then remove its cgroups, mounts, namespaces, veths
    /// and directory, and check they are gone.
    fn drop(&mut self) {
        let problems = self.cleanup();
        if !problems.is_empty() && !std::thread::panicking() {
            panic!("the cluster left behind: {problems:?}");
        }
    }
}

/// `/sys/fs/cgroup/<h>/<name>` for every hierarchy `h`, and `/sys/fs/cgroup/<name>`
/// (a pure v2 machine), that exist.
fn cgroup_dirs_named(name: &str) -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut out = vec![base.join(name)];
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        out.push(e.path().join(name));
    }
    out.retain(|p| p.is_dir());
    out
}

/// Kill and remove a cgroup tree this harness owns, deepest first (`cgroup.kill` where
/// the hierarchy has it, else SIGKILL to each listed pid; nothing if it is gone).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() || Instant::now() > end {
            break;
        }
        for p in pids {
            let _ = kill(p, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let end = Instant::now() + Duration::from_secs(5);
    while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Poll `f` until it returns `Some`, failing after `limit` with `what`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
