//! Shared helpers for the integration suites: a compiled guest shared per test
//! binary, temporary directories that clean up, input builders, and the scenario
//! runner used by the conformance suite.
//!
//! No `unsafe`: the suites' system calls (signals, mounts, polls) go through rustix.
#![forbid(unsafe_code)]

pub mod edge;
pub mod faults;
pub mod https;
pub mod nodes;
pub mod scenarios;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use stockade_runtime::bindings::ExecInput;
use stockade_runtime::config::Config;
use stockade_runtime::runtime::{Compiled, Runtime};
use stockade_runtime::substrate::mock::Mock;
use stockade_store::Store;

/// The `stockade` binary built next to the running test binary
/// (`target/debug/deps/<suite>-<hash>` → `target/debug/stockade`): the real binary, used
/// by the e2e suite.
pub fn stockade_exe() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("stockade");
    assert!(
        path.is_file(),
        "{} is missing: build it first: cargo build -p stockade-host",
        path.display()
    );
    path
}

/// The `stockade-supervisor` binary (a container's PID 1), built beside `stockade` by
/// `cargo build -p stockade-host --bins`, found the same way as [`stockade_exe`].
pub fn supervisor_exe() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("stockade-supervisor");
    assert!(
        path.is_file(),
        "{} is missing: build it first: cargo build -p stockade-host --bins",
        path.display()
    );
    path
}

/// Fail (never skip) when the machine cannot run real containers; returns the cgroup v2
/// mount.
pub fn require_root_and_cgroup_v2() -> PathBuf {
    assert!(
        rustix::process::geteuid().is_root(),
        "this suite needs root (CI runs it as root)"
    );
    stockade_linux::cgroup::detect_v2()
        .expect("this suite needs cgroup v2 at /sys/fs/cgroup or /sys/fs/cgroup/unified")
}

/// After a test's containers are gone: no container's directory is left in the v1
/// limit hierarchies (pids, memory, cpu) under the test's cgroup root name; then
/// remove those roots. Fails naming what is left.
pub fn assert_no_limits_left(cgroup_root: &Path) {
    use stockade_linux::{cgroup, limits};
    let v2 = cgroup::detect_v2();
    let plan = limits::Plan::detect(v2.as_deref());
    let name = cgroup_root
        .file_name()
        .expect("a named cgroup root")
        .to_string_lossy()
        .into_owned();
    for parent in limits::v1_roots(&plan, &name) {
        if parent.exists() {
            let left: Vec<_> = std::fs::read_dir(&parent)
                .unwrap()
                .flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| e.file_name())
                .collect();
            assert!(
                left.is_empty(),
                "limit cgroups left in {}: {left:?}",
                parent.display()
            );
            std::fs::remove_dir(&parent).expect("remove the test's v1 limits root");
        }
    }
}

/// What one test made on the host (its cgroup root, its data directory), swept when
/// the test panics before its `finish` checked that nothing is left: a red test left
/// its containers running (their supervisors outlive a dropped substrate while the
/// test binary runs), their tmpfs mounts, cgroups and directories. On a normal drop it
/// does nothing: `finish` removes all of it and asserts so. It touches only this
/// test's own cgroup root (every process below it is the test's) and data directory.
pub struct SweepOnPanic {
    cgroup_root: PathBuf,
    data: PathBuf,
}

impl SweepOnPanic {
    /// Sweep these if the thread panics while the guard lives.
    pub fn new(cgroup_root: &Path, data: &Path) -> SweepOnPanic {
        SweepOnPanic {
            cgroup_root: cgroup_root.to_path_buf(),
            data: data.to_path_buf(),
        }
    }
}

impl Drop for SweepOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            sweep(&self.cgroup_root, &self.data);
        }
    }
}

/// Kill every process under `cgroup_root` (`cgroup.kill`), unmount what is mounted
/// under `data` (deepest first, detached), remove the cgroups (the v1 limit roots of
/// the same name too) and `data`. Best effort, bounded: a cleanup, not a check.
pub fn sweep(cgroup_root: &Path, data: &Path) {
    use stockade_linux::{cgroup, limits};
    let _ = std::fs::write(cgroup_root.join("cgroup.kill"), "1");
    wait_unpopulated(cgroup_root, Duration::from_secs(5));
    let mut mounts = mounts_under(data);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH);
    }
    let name = cgroup_root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let v2 = cgroup::detect_v2();
    let plan = limits::Plan::detect(v2.as_deref());
    for root in std::iter::once(cgroup_root.to_path_buf()).chain(limits::v1_roots(&plan, &name)) {
        remove_cgroup_tree(&root);
    }
    let _ = std::fs::remove_dir_all(data);
}

/// Wait until `cgroup.events` says `populated 0`, or `within`: the file raises POLLPRI
/// on every change.
fn wait_unpopulated(cgroup: &Path, within: Duration) {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let Ok(mut events) = std::fs::File::open(cgroup.join("cgroup.events")) else {
        return;
    };
    let deadline = std::time::Instant::now() + within;
    loop {
        let mut text = String::new();
        let _ = std::io::Seek::rewind(&mut events);
        if events.read_to_string(&mut text).is_err() || !text.contains("populated 1") {
            return;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        let timeout = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(&events, PollFlags::PRI)];
        let _ = rustix::event::poll(&mut fds, Some(&timeout));
    }
}

/// `rmdir` every directory of a cgroup tree, deepest first (emptied first: `sweep`).
/// A v1 hierarchy may still refuse (`EBUSY`) for a moment after the v2 root says
/// `populated 0` (seen after a panicking test: its container's v1 directories were
/// left, empty); v1 has no event to wait on, so the refusal is retried for up to 2 s.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while let Err(e) = std::fs::remove_dir(dir) {
        if e.raw_os_error() != Some(rustix::io::Errno::BUSY.raw_os_error())
            || std::time::Instant::now() >= deadline
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a mount point is a Stockade container's storage (`<data>/containers/<id>/fs`,
/// the one mount a container has in the host's table): another server's, when it is not
/// under the test's own data directory (a server may run beside the suite).
pub fn is_container_storage_mount(mount_point: &str) -> bool {
    let parts: Vec<&str> = mount_point.rsplitn(4, '/').collect();
    matches!(parts.as_slice(), ["fs", id, "containers", _]
        if !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
}

/// Mount points at or under `dir` in this process's mount table.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(&*dir))
        .map(str::to_string)
        .collect()
}

/// `stockade serve --config <cfg>` (the real binary); returns the child and its bound
/// address, read from the log line that names it (the event, not a sleep). The
/// server's log is echoed to the test's stderr with a `[server]` prefix.
pub fn spawn_server(cfg: &Path) -> (Child, String) {
    let (child, addr, _) = spawn_server_logged(cfg);
    (child, addr)
}

/// [`spawn_server`], also keeping every line the server logs (a test searches them).
pub fn spawn_server_logged(cfg: &Path) -> (Child, String, Arc<std::sync::Mutex<Vec<String>>>) {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = log.clone();
    let mut child = Command::new(stockade_exe())
        .args(["serve", "--config"])
        .arg(cfg)
        .env_remove("STOCKADE_DATA_DIR")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stockade serve");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && let Some(rest) = line.split("serving on http://").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                sent = true;
            }
            eprintln!("[server] {line}");
            kept.lock().unwrap().push(line);
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server did not start within 60 s");
    (child, addr, log)
}

/// One raw HTTP/1.1 request (no client library between the test and the server);
/// returns (status, body).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\ncontent-type: application/json\r\n",
        body.len()
    );
    if let Some(t) = token {
        req.push_str(&format!("authorization: Bearer {t}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    // A server may answer (413, 400) and close before the whole body is written: the
    // write then fails, and the answer is what the test checks.
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// A directory removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory under the system temp dir.
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("stockade-{tag}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&p).expect("create a temp dir");
        Self(p)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The configuration tests start from: the embedded defaults.
pub fn test_config() -> Config {
    Config::embedded()
}

/// The guest, compiled once per test binary (the expensive part).
pub fn compiled() -> &'static Compiled {
    static C: OnceLock<Compiled> = OnceLock::new();
    C.get_or_init(|| Compiled::new(&test_config()).expect("compile the embedded guest"))
}

/// The real guest over the mock substrate and a real SQLite store.
pub struct MockHarness {
    /// The runtime.
    pub rt: Arc<Runtime>,
    /// The substrate, for traces and faults.
    pub mock: Arc<Mock>,
    /// The store.
    pub store: Arc<Store>,
    /// The data directory.
    pub dir: TempDir,
}

impl MockHarness {
    /// Ceiling 16, the embedded floor rules.
    pub fn new() -> Self {
        Self::with(16, None)
    }

    /// A given ceiling and (optionally) floor rules.
    pub fn with(ceiling: usize, floor: Option<Vec<Vec<String>>>) -> Self {
        Self::with_config(ceiling, floor, test_config())
    }

    /// A given ceiling, floor rules and base configuration.
    pub fn with_config(ceiling: usize, floor: Option<Vec<Vec<String>>>, mut cfg: Config) -> Self {
        let dir = TempDir::new("conformance");
        if let Some(f) = floor {
            cfg.floor.rules = f;
        }
        let mock = Arc::new(Mock::new(ceiling));
        let store = Arc::new(Store::open_in(dir.path()).expect("open the store"));
        let rt = Arc::new(
            Runtime::from_compiled(compiled(), &cfg, mock.clone(), store.clone()).expect("runtime"),
        );
        Self {
            rt,
            mock,
            store,
            dir,
        }
    }

    /// Reopen the store from disk and build a new runtime over it (a host restart).
    pub fn restart(&mut self) {
        let store = Arc::new(Store::open_in(self.dir.path()).expect("reopen the store"));
        self.rt = Arc::new(
            Runtime::from_compiled(compiled(), &test_config(), self.mock.clone(), store.clone())
                .expect("runtime"),
        );
        self.store = store;
    }
}

impl Default for MockHarness {
    fn default() -> Self {
        Self::new()
    }
}

/// An input running `argv` with nothing else set.
pub fn input(argv: &[&str]) -> ExecInput {
    ExecInput {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: vec![],
        timeout_ms: None,
        grant: None,
        approval: None,
        stdin: None,
    }
}

/// Raise the calling thread's niceness to `nice` (on Linux a thread has its own): a
/// test's stand-in for another machine (an upstream) then takes only spare CPU, as it
/// would elsewhere. 0 or less: nothing changes.
pub fn nice_this_thread(nice: i32) {
    if nice <= 0 {
        return;
    }
    // `None` is who = 0: on Linux the calling thread alone.
    rustix::process::setpriority_process(None, nice).expect("setpriority");
}

/// Send `sig` to the process `pid` (the test's own child or a process it started).
/// Never a group or every process: a pid that is not positive is an error, not `kill(-1)`.
pub fn kill(pid: i32, sig: rustix::process::Signal) -> std::io::Result<()> {
    let pid = (pid > 0)
        .then(|| rustix::process::Pid::from_raw(pid))
        .flatten()
        .ok_or_else(|| std::io::Error::other(format!("not a process id: {pid}")))?;
    Ok(rustix::process::kill_process(pid, sig)?)
}

/// Wait up to `timeout` for `fd` to be readable (data, EOF or a pidfd's exit); true
/// when it is. An interrupted or failed poll reads as not yet readable.
pub fn poll_readable(fd: impl std::os::fd::AsFd, timeout: Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let timeout = Timespec::try_from(timeout).expect("a timeout in range");
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    poll(&mut fds, Some(&timeout)).is_ok_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use rustix::process::Signal;

    /// A test's kill names one process: 0 (its own group) and -1 (every process it may
    /// signal, as root the whole machine) are refused before any system call.
    #[test]
    fn kill_refuses_a_pid_that_is_not_one_process() {
        for pid in [i32::MIN, 0, -1] {
            let e = super::kill(pid, Signal::CONT).expect_err("refused");
            assert_eq!(e.to_string(), format!("not a process id: {pid}"));
        }
    }

    /// Only a container's storage mount is left out of the host's mount table
    /// comparison; every other mount still counts.
    #[test]
    fn a_container_storage_mount_is_told_from_others() {
        let rows = [
            (
                "/var/lib/stockade/containers/9f1d1f78-647e-42ba-beca-b84afde316df/fs",
                true,
            ),
            ("/tmp/x/containers/0ee7473f/fs", true),
            ("/tmp/x/containers/0ee7473f/root", false),
            ("/tmp/x/containers/../fs", false),
            ("/tmp/x/containers//fs", false),
            ("/tmp/x/other/0ee7473f/fs", false),
            ("/run/netns/x", false),
            ("/", false),
            ("containers/0ee7473f/fs", false),
        ];
        for (m, want) in rows {
            assert_eq!(super::is_container_storage_mount(m), want, "{m}");
        }
    }
}
