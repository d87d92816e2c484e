//! The harness: a `Linux` substrate per test with its own data directory and cgroup
//! root, commands tagged with a per-test marker, and a check that nothing is left behind.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stockade_linux::Linux;
use stockade_runtime::config::{Config, KillMode};
use stockade_runtime::substrate::Housekeeping as _;
use stockade_runtime::substrate::{Command, ProcessInfo, Substrate};
use stockade_store::Store;

/// Deadline for anything a test waits on.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub use stockade_tests::{mounts_under, require_root_and_cgroup_v2, stockade_exe, supervisor_exe};

/// One test's substrate and what it must clean up.
pub struct Harness {
    pub linux: Linux,
    pub data: PathBuf,
    pub cgroup_root: PathBuf,
    /// Every process a test command starts carries `STOCKADE_TEST_MARKER=<marker>`.
    pub marker: String,
    mountinfo: String,
    cfg: Config,
    store: Arc<Store>,
    /// Sweeps what the test made if it panics before `finish` (last: dropped last).
    _sweep: stockade_tests::SweepOnPanic,
}

/// One test's private resources: configuration (the embedded defaults, then its own
/// data directory and cgroup root, ceiling 4, no warm pool, 64 KiB of output, private targets
/// allowed, then `tweak`), marker, store, and the host's mount table before it started.
pub struct Setup {
    pub cfg: Config,
    pub data: PathBuf,
    pub cgroup_root: PathBuf,
    pub marker: String,
    pub mountinfo: String,
    pub store: Arc<Store>,
}

/// Fail (never skip) without root and cgroup v2, then prepare a test's resources.
pub fn setup(tag: &str, tweak: impl FnOnce(&mut Config)) -> Setup {
    let v2 = require_root_and_cgroup_v2();
    capture_logs();
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let data = std::env::temp_dir().join(format!("stockade-{tag}-{}", &marker[..12]));
    let cgroup_root = v2.join(format!("stockade-test-{marker}"));
    let mut cfg = Config::embedded();
    cfg.substrate.data_dir = data.clone();
    cfg.substrate.cgroup_root = cgroup_root.display().to_string();
    cfg.substrate.ceiling = 4;
    // Tests count the containers they make: no warm pool builds beside them, except
    // in the pool's own tests (`warm.rs`), which set it. The e2e suite runs the
    // embedded default.
    cfg.substrate.warm = 0;
    cfg.substrate.output_limit = 64 * 1024;
    cfg.egress.allow_private_targets = true;
    tweak(&mut cfg);
    std::fs::create_dir_all(&data).unwrap();
    let store = Arc::new(Store::open_in(&data).expect("store"));
    Setup {
        cfg,
        data,
        cgroup_root,
        marker,
        mountinfo: mounts(),
        store,
    }
}

/// The linux substrate of a setup; with the kill mode left to `auto` it must be the
/// full cgroup mechanism (a machine that degrades fails the suite, it does not pass it).
pub async fn start_linux(s: &Setup) -> Linux {
    let linux = Linux::new(&s.cfg, s.store.clone(), supervisor_exe())
        .await
        .expect("linux substrate");
    if s.cfg.substrate.kill_mode == KillMode::Auto {
        assert_eq!(
            linux.capabilities().kill_mode,
            KillMode::Cgroup,
            "{:?}",
            linux.capabilities()
        );
    }
    linux
}

/// A substrate with `tweak` applied to a test configuration.
pub async fn harness(tweak: impl FnOnce(&mut Config)) -> Harness {
    let s = setup("linux", tweak);
    let sweep = stockade_tests::SweepOnPanic::new(&s.cgroup_root, &s.data);
    let linux = start_linux(&s).await;
    Harness {
        linux,
        data: s.data,
        cgroup_root: s.cgroup_root,
        marker: s.marker,
        mountinfo: s.mountinfo,
        cfg: s.cfg,
        store: s.store,
        _sweep: sweep,
    }
}

/// Held by a test that mounts beside the spawner's mount namespace and asserts what
/// it holds, and by a test whose data directory is a mount made after that namespace
/// (its spawns make the namespace again, copying every storage mount live then).
pub static SPAWNER_NAMESPACE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The host's mount table, without the container storage mounts of tests running
/// beside this one (each test's data directory is `<tmp>/stockade-*`) and of any
/// Stockade server running beside the suite (`<data>/containers/<id>/fs`, wherever its
/// data directory is). The test's own mounts are checked separately: none may be left
/// under its data directory.
pub fn mounts() -> String {
    let tests = std::env::temp_dir().join("stockade-");
    let tests = tests.to_string_lossy();
    // Mount ids and the order are stable; only our own changes would show.
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            !l.split_whitespace().nth(4).is_some_and(|m| {
                m.starts_with(&*tests) || stockade_tests::is_container_storage_mount(m)
            })
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

impl Harness {
    /// A command tagged with this test's marker.
    pub fn cmd(&self, script: &str) -> Command {
        Command {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            cwd: "/workspace".into(),
            env: vec![("STOCKADE_TEST_MARKER".into(), self.marker.clone())],
            stdin: vec![],
            stdin_stream: None,
        }
    }

    /// Host pids of every live (non-zombie) process carrying this test's marker.
    pub fn marked(&self) -> Vec<i32> {
        marked_processes(&self.marker)
    }

    /// Wait until no marked process is left, or fail.
    pub async fn assert_no_marked(&self, why: &str) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = self.marked();
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{why}: {} marked processes survive: {:?}",
                left.len(),
                &left[..left.len().min(10)]
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A new substrate over the same data directory and cgroup root, as after a host
    /// restart (the old one is dropped without any shutdown, as if the host was killed).
    pub async fn restart(&mut self) {
        let fresh = Linux::new(&self.cfg, self.store.clone(), supervisor_exe())
            .await
            .expect("linux substrate");
        self.linux = fresh;
    }

    /// The container's host directory.
    pub fn container_dir(&self, id: &str) -> PathBuf {
        self.data.join("containers").join(id)
    }

    /// Stop everything and check nothing is left behind: no marked process, no
    /// container cgroup, no mount change; then remove the test's root cgroup and data.
    pub async fn finish(self) {
        self.linux.shutdown().await;
        self.assert_no_marked("after shutdown").await;
        assert_left_nothing(&self.cgroup_root, &self.data, &self.mountinfo);
    }
}

/// After a test's shutdown: no container cgroup under its cgroup root, the host's mount
/// table as it was, no container's workspace, root or socket left; then remove the
/// test's cgroup root and data directory.
pub fn assert_left_nothing(cgroup_root: &std::path::Path, data: &std::path::Path, mountinfo: &str) {
    if cgroup_root.exists() {
        let left: Vec<_> = std::fs::read_dir(cgroup_root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "container cgroups left behind: {left:?}");
        std::fs::remove_dir(cgroup_root).expect("remove the test's cgroup root");
    }
    assert_eq!(mounts(), mountinfo, "the host's mount table changed");
    let left = mounts_under(data);
    assert!(left.is_empty(), "container mounts left behind: {left:?}");
    stockade_tests::assert_no_limits_left(cgroup_root);
    let containers: Vec<_> = std::fs::read_dir(data.join("containers"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    for c in containers {
        for sub in ["fs", "root", "sup.sock"] {
            assert!(
                !c.join(sub).exists(),
                "{} left behind",
                c.join(sub).display()
            );
        }
    }
    // A substrate a test dropped without a shutdown (a "dead" host, `restart`) still
    // has its watchers in this process: one may tear its old container down while the
    // directory goes, and `remove_dir_all` then stops at a directory it just refilled.
    // Retry until the directory is gone (it was seen left behind once in CI).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::remove_dir_all(data).is_err() && data.exists() {
        assert!(
            Instant::now() < deadline,
            "the test's data directory {} cannot be removed",
            data.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Host pids of live processes whose environment holds `STOCKADE_TEST_MARKER=<marker>`.
///
/// A process in the middle of an `execve` may not show its environment: the read
/// fails (`ESRCH`), or reads empty (the memory it opened is the old one, torn down; or
/// the new one, whose stack is not written yet). A marked `sh` that execs `sleep` was
/// read as gone in that window: a "vanished" detached process, 3 runs in 210 of
/// `failure::` + `facade::` with two tests at a time (and, read in a loop beside a
/// process that execs itself 300 times: 667 reads in 727,000 missed). So a live user
/// process that shows no environment is read again ([`environ`]).
pub fn marked_processes(marker: &str) -> Vec<i32> {
    let needle = format!("STOCKADE_TEST_MARKER={marker}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Some(env) = environ(pid) else {
            continue;
        };
        let live = Stat::read(pid).is_some_and(|s| !s.zombie());
        if live && env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// The longest a process is read again through its `execve` (see [`marked_processes`]).
const EXEC_WINDOW: Duration = Duration::from_millis(500);

/// `pid`'s environment; read again while the process is a live user process that
/// shows none, empty or `ESRCH` (an `execve` under way), within [`EXEC_WINDOW`].
/// `None` once it is gone, or if it cannot be read.
fn environ(pid: i32) -> Option<Vec<u8>> {
    let path = format!("/proc/{pid}/environ");
    let deadline = Instant::now() + EXEC_WINDOW;
    loop {
        let env = match std::fs::read(&path) {
            Ok(e) if !e.is_empty() => return Some(e),
            Ok(e) => Some(e),
            // Under way through an `execve`; any other error is for good (this
            // machine's own PID 1 refuses root: EACCES).
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => None,
            Err(_) => return None,
        };
        let stat = Stat::read(pid)?;
        if stat.zombie() || stat.kernel_thread || Instant::now() >= deadline {
            return env;
        }
        // Read empty from a process whose environment is set up by now: read once
        // more (an environment may be empty).
        if env.is_some()
            && stat.env_end != 0
            && let Ok(again) = std::fs::read(&path)
        {
            return Some(again);
        }
        std::thread::yield_now();
    }
}

/// What `/proc/<pid>/stat` says of a process: its state, group and memory.
struct Stat {
    /// The state letter (`Z`: a zombie).
    state: char,
    pgrp: i32,
    /// `PF_KTHREAD`: a kernel thread has no user memory.
    kernel_thread: bool,
    /// Where its environment ends (0: no user memory, or not set up yet).
    env_end: u64,
}

impl Stat {
    fn read(pid: i32) -> Option<Stat> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields from the third (the state) on: proc(5) numbers them from 1.
        let fields: Vec<&str> = s[s.rfind(')')? + 2..].split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        const PF_KTHREAD: u64 = 0x0020_0000;
        Some(Stat {
            state: fields.first()?.chars().next()?,
            pgrp: fields.get(5 - 3)?.parse().ok()?,
            kernel_thread: field(9).is_some_and(|flags| flags & PF_KTHREAD != 0),
            env_end: field(51).unwrap_or(0),
        })
    }

    fn zombie(&self) -> bool {
        self.state == 'Z'
    }
}

/// Wait until `status` reports the process not running; its final info.
pub async fn wait_exited(linux: &Linux, container: &str, id: &str) -> ProcessInfo {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let info = linux
            .process_status(container, id)
            .await
            .unwrap()
            .expect("tracked");
        if !info.running {
            return info;
        }
        assert!(Instant::now() < deadline, "{id} still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait for `n` marked processes to exist (a started tree finished forking).
pub async fn wait_marked_at_least(h: &Harness, n: usize) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let have = h.marked().len();
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {have} of {n} marked processes appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until `fd` reaches EOF (every writer gone), or fail after the deadline.
pub fn assert_eof_within(fd: &std::fs::File, deadline: Duration) {
    let end = Instant::now() + deadline;
    let mut buf = [0u8; 4096];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the pipe never reached EOF: a writer survived"
        );
        stockade_tests::poll_readable(fd, left);
        if let Ok(0) = rustix::io::read(fd, &mut buf) {
            return;
        }
    }
}

/// A host HTTP server on 127.0.0.2 answering `ok` to every request.
pub fn host_server() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut s, &mut buf);
            let _ = std::io::Write::write_all(
                &mut s,
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
            );
        }
    });
    port
}

/// What the process-wide log capture holds: the host's warnings (every
/// `stockade::degradation` line among them) and the substrate's container starts and
/// stops (the story a failing test is told with).
static CAPTURED: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// The capture's filter.
const CAPTURE: &str = "stockade=warn,stockade::substrate=info";

/// How many of the last captured lines a failing test prints.
const TOLD_ON_PANIC: usize = 60;

struct CaptureSink;

impl std::io::Write for CaptureSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        CAPTURED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Capture the host's log lines (`CAPTURE`) this test binary writes, whatever thread
/// writes them (the host logs a supervisor's degradation on a runtime worker): one
/// process-wide subscriber, installed by the first test's [`setup`]. Tests tell their
/// lines apart by container id ([`degradation_lines`]). A panic prints the last
/// `TOLD_ON_PANIC` lines after its message: a container that stopped on its own, or a
/// cgroup that was not removed, shows beside the assertion it broke.
pub fn capture_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(CAPTURE))
            .with_writer(|| CaptureSink)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("the log capture is this binary's only subscriber");
        tracing::callsite::rebuild_interest_cache();
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            let all = CAPTURED.lock().unwrap_or_else(|p| p.into_inner());
            let text = String::from_utf8_lossy(&all);
            let lines: Vec<&str> = text.lines().collect();
            let told = &lines[lines.len().saturating_sub(TOLD_ON_PANIC)..];
            eprintln!(
                "--- the last {} host log lines of this binary (all tests) ---\n{}",
                told.len(),
                told.join("\n")
            );
        }));
    });
}

/// Captured degradation lines that name `container`.
pub fn degradation_lines(container: &str) -> Vec<String> {
    let all = CAPTURED.lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(&all)
        .lines()
        .filter(|l| l.contains(" stockade::degradation:"))
        .filter(|l| {
            l.contains(&format!("container=\"{container}\""))
                || l.contains(&format!("container={container}"))
        })
        .map(str::to_string)
        .collect()
}

/// The state letter and process group of host pid `pid` (`/proc/<pid>/stat`), if it
/// exists.
pub fn proc_state_and_pgrp(pid: i32) -> Option<(char, i32)> {
    Stat::read(pid).map(|s| (s.state, s.pgrp))
}
