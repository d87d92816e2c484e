//! End to end through the real `stockade` binary: CLI → server → linux substrate.
//! Needs root and cgroup v2 (CI has both); without them every test fails with a clear
//! message. Each test checks it left no container cgroup behind.
#![forbid(unsafe_code)]

mod api;
mod cli;
mod clients;
mod egress;
mod mcp;
mod schema;
mod shutdown;
mod stream;
mod tokens;
mod upload;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rustix::process::Signal;
use stockade_host::config::Config;
use stockade_tests::{TempDir, require_root_and_cgroup_v2, stockade_exe};

/// A running `stockade serve` on a free loopback port with its own data dir and cgroup root.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub dir: TempDir,
    pub cgroup_root: PathBuf,
    /// Every line the server has logged so far.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    pub fn start() -> Self {
        Self::start_with(|_| {})
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
        cfg.api.shutdown_deadline_ms = 2_000;
        tweak(&mut cfg);
        let cfg_path = dir.path().join("wasmtime.toml");
        std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
        let (child, addr, log) = stockade_tests::spawn_server_logged(&cfg_path);
        Self {
            child,
            addr,
            dir,
            cgroup_root,
            log,
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
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

    /// No container cgroup is left under this server's cgroup root.
    pub fn assert_clean(&self) {
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
        remove_cgroup_tree(&self.cgroup_root);
        // Its v1 limit directories and its containers' storage mounts too.
        use stockade_host::substrate::linux::{cgroup, limits};
        let plan = limits::Plan::detect(cgroup::detect_v2().as_deref());
        if let Some(name) = self.cgroup_root.file_name() {
            for parent in limits::v1_roots(&plan, &name.to_string_lossy()) {
                remove_cgroup_tree(&parent);
            }
        }
        for m in stockade_tests::mounts_under(&self.data_dir()).iter().rev() {
            let _ = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// Kill and remove a cgroup tree this test owns, deepest first (nothing if it is gone).
fn remove_cgroup_tree(dir: &std::path::Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let _ = std::fs::remove_dir(dir);
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
