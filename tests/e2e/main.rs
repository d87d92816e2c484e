//! End to end through the real `stockade` binary: CLI → server → linux substrate.
//! Needs root and cgroup v2 (CI has both); without them every test fails with a clear
//! message. Each test checks it left no container cgroup behind.
//!
//! Two fronts, the same tests (DESIGN §7): by default [`Server`] is (a)
//! `stockade serve` over the in-process linux substrate; with
//! `STOCKADE_E2E_FRONT=remote` it is (b) `stockade serve` with `substrate.kind =
//! "remote"` over two `stockade node`s, each in its own network namespace on a veth
//! (`stockade_tests::nodes`), and the tests see only its URL and its data directory
//! (tokens). Tests that look inside the in-process substrate (its containers' files,
//! its store, its cgroup root) or need an upstream on the test host's loopback are
//! listed, each with its reason, in `remote-skips.txt` (`skip`), and so are the tests
//! front (b) fails today for something it lacks (`gap`): `scripts/test` passes every
//! listed test to `--skip`, and [`Server`] refuses to start a `skip` one in that mode.
//!
//! With `STOCKADE_E2E_FRONT=edge` it is (c): the same two nodes and workerd serving
//! `edge/`'s deployment over them (`stockade_tests::edge`: the generated deploy
//! config, the real guest through JSPI, the Durable Objects' SQLite in the test's temp
//! directory); the tests see its URL and the tokens in its data directory. Its list is
//! `edge-skips.txt`, the same format and the same rules.
#![forbid(unsafe_code)]

mod api;
mod cli;
mod clients;
mod e2b;
mod egress;
mod egress_ask;
mod lifetime;
mod mcp;
mod mcp_http;
mod mock;
mod network;
mod preview;
mod schema;
mod shell;
mod shutdown;
mod stream;
mod tenants;
mod tokens;
mod upload;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rustix::process::Signal;
use stockade_runtime::config::Config;
use stockade_tests::nodes::{Cluster, Options};
use stockade_tests::{TempDir, require_root_and_cgroup_v2, stockade_exe};

/// Which deployment the suite drives (`STOCKADE_E2E_FRONT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// (a) `stockade serve` over the in-process linux substrate (unset, `inprocess`).
    InProcess,
    /// (b) `stockade serve` over two nodes (`remote`).
    Remote,
    /// (c) workerd serving the edge deployment over two nodes (`edge`).
    Edge,
}

/// The front `STOCKADE_E2E_FRONT` names; anything unknown is a mistake, said loudly.
pub fn front() -> Front {
    match std::env::var("STOCKADE_E2E_FRONT").as_deref() {
        Err(_) | Ok("") | Ok("inprocess") => Front::InProcess,
        Ok("remote") => Front::Remote,
        Ok("edge") => Front::Edge,
        Ok(other) => {
            panic!("STOCKADE_E2E_FRONT={other:?}: expected \"inprocess\", \"remote\" or \"edge\"")
        }
    }
}

/// Front (b) or (c): the suite drives nodes, not an in-process substrate.
pub fn remote_front() -> bool {
    front() != Front::InProcess
}

/// The tests that do not run against the remote front, one per line: `skip` (it looks
/// inside front (a) by construction) or `gap` (front (b) lacks something it needs),
/// the test's path, then why (`#` lines are comments).
pub const REMOTE_SKIPS: &str = include_str!("remote-skips.txt");

/// The same for front (c), the edge deployment.
pub const EDGE_SKIPS: &str = include_str!("edge-skips.txt");

/// Whether and why `test` (`module::name`) does not run against the remote front:
/// (kind, why).
pub fn remote_skip(test: &str) -> Option<(&'static str, &'static str)> {
    listed(REMOTE_SKIPS, test)
}

/// Whether and why `test` does not run against the edge deployment: (kind, why).
pub fn edge_skip(test: &str) -> Option<(&'static str, &'static str)> {
    listed(EDGE_SKIPS, test)
}

/// `test`'s entry in a skips file: (kind, why).
fn listed(list: &'static str, test: &str) -> Option<(&'static str, &'static str)> {
    list.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|l| {
            let (kind, rest) = l.trim().split_once(char::is_whitespace)?;
            let (name, why) = rest.trim().split_once(char::is_whitespace)?;
            (name == test).then_some((kind, why.trim()))
        })
}

/// A running `stockade serve` on a free loopback port with its own data dir and cgroup root.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub dir: TempDir,
    pub cgroup_root: PathBuf,
    /// Every line the server has logged so far (front (b): the front's and its nodes').
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Front (b): the nodes the front drives (each in its own network namespace). Its
    /// `cgroup_root` above is then the first node's.
    pub nodes: Option<Cluster>,
}

impl Server {
    pub fn start() -> Self {
        Self::start_with(|_| {})
    }

    /// Wait until the server has logged a line holding every one of `needles` (colour
    /// escapes aside): a log line is written after the answer it describes is sent.
    pub fn wait_log(&self, needles: &[&str], within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            if self.log.lock().unwrap().iter().any(|l| {
                let l = plain_log(l);
                needles.iter().all(|n| l.contains(n))
            }) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the server never logged {needles:?} within {within:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let v2 = require_root_and_cgroup_v2();
        let dir = TempDir::new("e2e");
        let cgroup_root = v2.join(format!("stockade-e2e-{}", uuid::Uuid::new_v4().simple()));
        let mut cfg = Config::embedded();
        cfg.substrate.data_dir = dir.path().join("data");
        cfg.substrate.cgroup_root = cgroup_root.display().to_string();
        cfg.substrate.idle_timeout_ms = 0;
        cfg.egress.allow_private_targets = true;
        cfg.api.listen = "127.0.0.1:0".into();
        // The preview listener on a free port too (servers run side by side).
        cfg.preview.listen = "127.0.0.1:0".into();
        cfg.api.shutdown_deadline_ms = 2_000;
        tweak(&mut cfg);
        let cfg_path = dir.path().join("wasmtime.toml");
        match front() {
            Front::Remote => return Self::start_remote(cfg, dir, &cfg_path),
            Front::Edge => return Self::start_edge(cfg, dir),
            Front::InProcess => {}
        }
        std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
        let (child, addr, log) = stockade_tests::spawn_server_logged(&cfg_path);
        Self {
            child,
            addr,
            dir,
            cgroup_root,
            log,
            nodes: None,
        }
    }

    /// Front (a) from a configuration file as an operator writes it: `cfg` (as
    /// [`Server::start_with`] makes it) as TOML, then `edit`ed (a section or key taken
    /// out: what a file that never names it gets is the point).
    pub fn start_from_file(edit: impl FnOnce(&mut toml::Table)) -> Self {
        assert_eq!(
            front(),
            Front::InProcess,
            "a test of front (a)'s own configuration file (listed in the skip files)"
        );
        let v2 = require_root_and_cgroup_v2();
        let dir = TempDir::new("e2e");
        let cgroup_root = v2.join(format!("stockade-e2e-{}", uuid::Uuid::new_v4().simple()));
        let mut cfg = Config::embedded();
        cfg.substrate.data_dir = dir.path().join("data");
        cfg.substrate.cgroup_root = cgroup_root.display().to_string();
        cfg.substrate.idle_timeout_ms = 0;
        cfg.egress.allow_private_targets = true;
        cfg.api.listen = "127.0.0.1:0".into();
        cfg.preview.listen = "127.0.0.1:0".into();
        cfg.api.shutdown_deadline_ms = 2_000;
        let mut table: toml::Table = toml::from_str(&toml::to_string(&cfg).unwrap()).unwrap();
        edit(&mut table);
        let cfg_path = dir.path().join("wasmtime.toml");
        std::fs::write(&cfg_path, toml::to_string(&table).unwrap()).unwrap();
        let (child, addr, log) = stockade_tests::spawn_server_logged(&cfg_path);
        Self {
            child,
            addr,
            dir,
            cgroup_root,
            log,
            nodes: None,
        }
    }

    /// Front (b): two nodes from `cfg` (its substrate, egress and limits sections),
    /// then the remote front from `cfg` (its engine, guest, floor and API sections) with
    /// its data directory where front (a) keeps its own.
    fn start_remote(cfg: Config, dir: TempDir, cfg_path: &std::path::Path) -> Self {
        let test = std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string();
        if let Some(("skip", why)) = remote_skip(&test) {
            panic!(
                "{test} does not run against the remote front ({why}); scripts/test skips \
                 every test listed in tests/e2e/remote-skips.txt"
            );
        }
        // "What the server logged" is the deployment's: the front's and its nodes'.
        let log = stockade_tests::nodes::Log::default();
        let nodes = Cluster::start_nodes(
            &cfg,
            &Options {
                also_log: Some(log.clone()),
                nodes: 2,
                lease_grace_ms: 30_000,
                heartbeat_ms: 1_000,
                // The suites' upstreams listen on the test host's 127.0.0.2 and .3.
                mirror_loopback: vec![Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)],
            },
        );
        let front = nodes.front_config(&cfg, &dir.path().join("data"));
        std::fs::write(cfg_path, toml::to_string(&front).unwrap()).unwrap();
        let child = stockade_tests::nodes::spawn_front(cfg_path, vec![log.clone()]);
        Self {
            child,
            addr: format!("127.0.0.1:{}", nodes.front_port()),
            dir,
            cgroup_root: nodes.nodes[0].cgroup_root.clone(),
            log,
            nodes: Some(nodes),
        }
    }

    /// Front (c): two nodes as in (b), then workerd serving the edge deployment over
    /// them (its tokens in this server's data directory, its configuration and Durable
    /// Objects' storage beside it), listening where the nodes call back.
    fn start_edge(cfg: Config, dir: TempDir) -> Self {
        let test = std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string();
        if let Some(("skip", why)) = edge_skip(&test) {
            panic!(
                "{test} does not run against the edge deployment ({why}); scripts/test \
                 skips every test listed in tests/e2e/edge-skips.txt"
            );
        }
        let log = stockade_tests::nodes::Log::default();
        let heartbeat_ms = 1_000;
        let nodes = Cluster::start_nodes(
            &cfg,
            &Options {
                also_log: Some(log.clone()),
                nodes: 2,
                lease_grace_ms: 30_000,
                heartbeat_ms,
                mirror_loopback: vec![Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)],
            },
        );
        let edge_dir = dir.path().join("edge");
        std::fs::create_dir_all(&edge_dir).expect("the deployment's directory");
        let child = stockade_tests::edge::spawn_workerd(
            &nodes,
            &cfg,
            &dir.path().join("data"),
            &edge_dir,
            heartbeat_ms,
            vec![log.clone()],
        );
        Self {
            child,
            addr: format!("127.0.0.1:{}", nodes.front_port()),
            dir,
            cgroup_root: nodes.nodes[0].cgroup_root.clone(),
            log,
            nodes: Some(nodes),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Where the server's containers live: its own data directory (front (a)), or each
    /// node's (front (b)); each holds `containers/<id>/…` and the substrate's store.
    pub fn substrate_data_dirs(&self) -> Vec<PathBuf> {
        match &self.nodes {
            None => vec![self.data_dir()],
            Some(c) => c.nodes.iter().map(|n| n.data_dir.clone()).collect(),
        }
    }

    pub fn approver_token(&self) -> String {
        std::fs::read_to_string(self.data_dir().join("approver-token"))
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir().join("api-token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// `stockade ARGS…` against this server.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(stockade_exe())
            .args(args)
            .env("STOCKADE_SERVER", format!("http://{}", self.addr))
            .env("STOCKADE_DATA_DIR", self.data_dir())
            .stdin(Stdio::null())
            .output()
            .expect("run the CLI")
    }

    /// The CLI with `input` on its stdin (a pipe, closed after it).
    pub fn cli_with_stdin(&self, args: &[&str], input: &[u8]) -> std::process::Output {
        use std::io::Write;
        let mut child = Command::new(stockade_exe())
            .args(args)
            .env("STOCKADE_SERVER", format!("http://{}", self.addr))
            .env("STOCKADE_DATA_DIR", self.data_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the CLI");
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().expect("the CLI's output")
    }

    /// SIGTERM, wait for exit (with a deadline), and check nothing is left behind.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let _ = stockade_tests::kill(self.child.id() as i32, Signal::TERM);
        let status = wait_exit(&mut self.child, Duration::from_secs(30));
        if let Some(nodes) = self.nodes.take() {
            // A front that shut down left no grant open on any node, then every node
            // stops (tearing its containers down) and leaves nothing.
            for (name, open) in nodes.open_grants() {
                assert_eq!(
                    open.as_deref().map_err(|e| e.to_string()),
                    Ok(&[][..]),
                    "node {name}: grants open after the front stopped"
                );
            }
            nodes.stop();
            return status;
        }
        self.assert_clean();
        let _ = std::fs::remove_dir(&self.cgroup_root);
        stockade_tests::assert_no_limits_left(&self.cgroup_root);
        let mounts = stockade_tests::mounts_under(&self.data_dir());
        assert!(
            mounts.is_empty(),
            "container mounts left behind: {mounts:?}"
        );
        status
    }

    /// No container cgroup is left under this server's cgroup root (front (b): under
    /// any node's).
    pub fn assert_clean(&self) {
        if let Some(nodes) = &self.nodes {
            let left: Vec<_> = nodes
                .nodes
                .iter()
                .flat_map(|n| n.container_cgroups())
                .collect();
            assert!(left.is_empty(), "container cgroups left behind: {left:?}");
            return;
        }
        if let Ok(rd) = std::fs::read_dir(&self.cgroup_root) {
            let left: Vec<_> = rd
                .filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name())
                .collect();
            assert!(left.is_empty(), "container cgroups left behind: {left:?}");
        }
    }
}

impl Drop for Server {
    /// A test that failed before `stop()`: the server gets SIGTERM and its shutdown
    /// deadline to tear its containers down (SIGKILL after 10 s), then whatever is left
    /// of this server's own (its cgroup root, its v1 limit directories, its containers'
    /// mounts) is killed, removed or unmounted: a failed test leaves nothing behind
    /// either.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = stockade_tests::kill(self.child.id() as i32, Signal::TERM);
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() {
                if std::time::Instant::now() > end {
                    let _ = stockade_tests::kill(self.child.id() as i32, Signal::KILL);
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if self.nodes.is_some() {
            // Front (b): the nodes' Drop kills, removes and unmounts what is theirs.
            return;
        }
        // Its cgroup root and v1 limit directories, its containers' storage mounts.
        stockade_tests::sweep(&self.cgroup_root, &self.data_dir());
    }
}

/// Wait for a child to exit (waitpid in a thread, the event), failing after `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let pid = rustix::process::Pid::from_child(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(rustix::process::waitpid(
            Some(pid),
            rustix::process::WaitOptions::empty(),
        ));
    });
    let waited = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("process {pid} did not exit within {limit:?}"));
    let Ok(Some((r, status))) = waited else {
        panic!("waitpid {pid}: {waited:?}");
    };
    assert_eq!(r, pid, "waitpid");
    use std::os::unix::process::ExitStatusExt;
    let s = std::process::ExitStatus::from_raw(status.as_raw());
    // The Child must not wait again: mark it reaped by replacing it with the status.
    std::mem::forget(std::mem::replace(
        child,
        Command::new("true").spawn().unwrap(),
    ));
    s
}

/// A log line without its colour escapes (`ESC [ … m`).
pub fn plain_log(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod remote_list {
    /// Every test a skips file names is a test of this suite (its module's file has
    /// that function, under `#[test]`), each entry says why, and the lookup finds it.
    fn check(
        file: &str,
        list: &'static str,
        lookup: fn(&str) -> Option<(&'static str, &'static str)>,
    ) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
        let mut n = 0;
        let mut seen = std::collections::BTreeSet::new();
        for l in list.lines() {
            let l = l.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (kind, rest) = l.split_once(char::is_whitespace).expect("a kind");
            assert!(matches!(kind, "skip" | "gap"), "{file}: {l}: skip or gap");
            let (name, why) = rest
                .trim()
                .split_once(char::is_whitespace)
                .expect("a name and a reason");
            assert!(why.trim().len() > 10, "{file}: {name}: give a reason");
            assert!(seen.insert(name), "{file}: {name} is listed twice");
            let (module, test) = name.split_once("::").expect("module::test");
            let src = std::fs::read_to_string(dir.join(format!("{module}.rs")))
                .unwrap_or_else(|e| panic!("{file}: {name}: tests/e2e/{module}.rs: {e}"));
            assert!(
                src.contains(&format!("#[test]\nfn {test}(")),
                "{file}: {name} is not a test of tests/e2e/{module}.rs"
            );
            assert_eq!(lookup(name), Some((kind, why.trim())), "{file}: {name}");
            n += 1;
        }
        assert!(n > 0, "{file} lists nothing");
        assert_eq!(lookup("api::not_listed"), None);
    }

    #[test]
    fn the_remote_skip_list_names_real_tests_each_with_a_reason() {
        check("remote-skips.txt", super::REMOTE_SKIPS, super::remote_skip);
    }

    #[test]
    fn the_edge_skip_list_names_real_tests_each_with_a_reason() {
        check("edge-skips.txt", super::EDGE_SKIPS, super::edge_skip);
    }
}
