//! What every section shares: the environment (a real linux substrate, a runtime, an
//! HTTP API on 127.0.0.1:0), timing statistics, the result table, and cleanup.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use stockade_host::api::{self, ApiState};
use stockade_linux::{Linux, cgroup, limits};
use stockade_runtime::bindings::ExecInput;
use stockade_runtime::config::Config;
use stockade_runtime::runtime::{Compiled, Runtime};
use stockade_runtime::substrate::Command;
use stockade_store::Store;

/// Sorted samples.
pub struct Stats {
    pub n: usize,
    pub median: Duration,
    pub p95: Duration,
    pub min: Duration,
    pub mean: Duration,
}

impl Stats {
    pub fn of(mut v: Vec<Duration>) -> Stats {
        assert!(!v.is_empty(), "no samples");
        v.sort();
        let n = v.len();
        let at = |q: f64| v[((n as f64 - 1.0) * q).round() as usize];
        Stats {
            n,
            median: at(0.5),
            p95: at(0.95),
            min: v[0],
            mean: v.iter().sum::<Duration>() / n as u32,
        }
    }
}

/// A duration for a table: µs under 10 ms, else ms.
pub fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10_000.0 {
        format!("{us:.1} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

/// One row of the final table.
pub struct Row {
    pub section: &'static str,
    pub name: String,
    pub value: String,
    pub baseline: String,
    pub ratio: String,
    pub goal: String,
    /// None: informational (no goal).
    pub met: Option<bool>,
}

pub fn row(
    section: &'static str,
    name: impl Into<String>,
    value: impl Into<String>,
    baseline: impl Into<String>,
    ratio: impl Into<String>,
    goal: impl Into<String>,
    met: Option<bool>,
) -> Row {
    Row {
        section,
        name: name.into(),
        value: value.into(),
        baseline: baseline.into(),
        ratio: ratio.into(),
        goal: goal.into(),
        met,
    }
}

pub fn print_table(rows: &[Row]) {
    println!();
    println!("| # | measure | value | baseline | ratio | goal | met |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**NO**",
            None => "–",
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.section, r.name, r.value, r.baseline, r.ratio, r.goal, met
        );
    }
}

/// Per-section detail lines: `name  n  median  p95  min  mean`.
pub fn detail(name: &str, s: &Stats) {
    println!(
        "  {name:<44} n={:<5} median {:>11}  p95 {:>11}  min {:>11}  mean {:>11}",
        s.n,
        fmt_d(s.median),
        fmt_d(s.p95),
        fmt_d(s.min),
        fmt_d(s.mean)
    );
}

pub fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// `target/release/stockade-supervisor` (a container's PID 1), next to `stockade`;
/// `STOCKADE_BENCH_SUPERVISOR` names another (a before/after comparison of it).
pub fn supervisor_exe() -> PathBuf {
    let p = std::env::var_os("STOCKADE_BENCH_SUPERVISOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| stockade_exe().with_file_name("stockade-supervisor"));
    assert!(
        p.is_file(),
        "{} is missing: build it first (cargo build --release -p stockade-host --bins)",
        p.display()
    );
    p
}

/// `target/release/stockade`, next to this bench binary (`target/release/deps/suite-…`).
pub fn stockade_exe() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("stockade");
    assert!(
        p.is_file(),
        "{} is missing: build it first (cargo build --release -p stockade-host)",
        p.display()
    );
    p
}

/// `/bin/true` as a fenced command.
pub fn true_input() -> ExecInput {
    ExecInput {
        argv: vec!["/bin/true".into()],
        cwd: None,
        env: vec![],
        timeout_ms: Some(30_000),
        grant: None,
        approval: None,
        stdin: None,
    }
}

pub fn cmd(argv: &[&str], env: &[(&str, &str)]) -> Command {
    Command {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: "/workspace".into(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        stdin: vec![],
        stdin_stream: None,
    }
}

/// Removes the bench's cgroup root and data directory even on a panic.
pub struct Cleanup {
    pub data: PathBuf,
    pub cgroup_root: PathBuf,
}

/// The cleanups a panic put off (data directory, cgroup root): `main` makes them once
/// the runtime is gone ([`run_deferred_cleanups`]).
static DEFERRED: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Unwinding out of `block_on`: the runtime's tasks still hold the substrate
            // and the store, and a container's teardown or the store's last flush would
            // write into the data directory after it was removed (a panicking section
            // left `containers/<id>/artifacts` and `stockade.db` behind).
            DEFERRED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((self.data.clone(), self.cgroup_root.clone()));
            return;
        }
        clean(&self.data, &self.cgroup_root);
    }
}

/// The cleanups a panic put off, after `main` dropped the runtime.
pub fn run_deferred_cleanups() {
    let deferred = std::mem::take(&mut *DEFERRED.lock().unwrap_or_else(PoisonError::into_inner));
    for (data, cgroup_root) in deferred {
        clean(&data, &cgroup_root);
    }
}

fn clean(data: &Path, cgroup_root: &Path) {
    if let Ok(root) = cgroup::CgroupDir::open(cgroup_root, false) {
        for name in root.children().unwrap_or_default() {
            let _ = root.destroy_child(&name, Instant::now() + Duration::from_secs(10));
        }
        drop(root);
        let _ = std::fs::remove_dir(cgroup_root);
    }
    // The containers' v1 limit directories (pids, memory, cpu).
    let plan = limits::Plan::detect(cgroup::detect_v2().as_deref());
    let name = cgroup_root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for parent in limits::v1_roots(&plan, &name) {
        for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let _ = limits::remove_v1_dir(&e.path(), Instant::now() + Duration::from_secs(10));
        }
        let _ = std::fs::remove_dir(&parent);
    }
    // A container whose teardown had not finished still has its storage mounted under
    // the data directory, and `remove_dir_all` stops at the first error (EBUSY on the
    // mount point): a full `fence` run once left the store and a container directory.
    // Detach what is still mounted there first (deepest first), then remove.
    let dir = data.to_string_lossy().into_owned();
    let mut mounted: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(&dir))
        .map(str::to_owned)
        .collect();
    mounted.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounted {
        let _ = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH);
    }
    let _ = std::fs::remove_dir_all(data);
}

/// A real linux substrate, a runtime over it, and the HTTP API.
pub struct Env {
    pub cfg: Config,
    pub linux: Arc<Linux>,
    pub rt: Arc<Runtime>,
    pub compiled: Compiled,
    pub store: Arc<Store>,
    pub api: SocketAddr,
    pub token: String,
    pub marker: String,
    pub cleanup: Cleanup,
}

impl Env {
    /// The benches' configuration: no warm pool (a background build would weigh on
    /// every other row); the cold section starts a second `Env` with one.
    pub async fn new() -> Env {
        Self::with(|_| {}).await
    }

    /// [`Env::new`] with `tweak` applied to its configuration.
    pub async fn with(tweak: impl FnOnce(&mut Config)) -> Env {
        // SAFETY: no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "the benches need root");
        let v2 = cgroup::detect_v2().expect("the benches need cgroup v2");
        let marker = uuid::Uuid::new_v4().simple().to_string();
        let data = std::env::temp_dir().join(format!("stockade-bench-{}", &marker[..12]));
        let cgroup_root = v2.join(format!("stockade-bench-{marker}"));
        let cleanup = Cleanup {
            data: data.clone(),
            cgroup_root: cgroup_root.clone(),
        };
        let mut cfg = Config::embedded();
        cfg.substrate.data_dir = data.clone();
        cfg.substrate.cgroup_root = cgroup_root.display().to_string();
        cfg.substrate.ceiling = 40;
        // The tree bench starts 1000 processes in one container.
        cfg.substrate.limits.pids = 4096;
        cfg.substrate.idle_timeout_ms = 0;
        cfg.substrate.warm = 0;
        cfg.egress.allow_private_targets = true;
        tweak(&mut cfg);
        std::fs::create_dir_all(&data).unwrap();
        let store = Arc::new(Store::open_in(&data).expect("store"));
        let linux = Arc::new(
            Linux::new(&cfg, store.clone(), supervisor_exe())
                .await
                .expect("linux substrate"),
        );
        let compiled = Compiled::new(&cfg).expect("compile the guest");
        let rt = Arc::new(
            Runtime::from_compiled(&compiled, &cfg, linux.clone(), store.clone()).expect("runtime"),
        );
        let token = "bench-token".to_string();
        let api = serve_api(&cfg, rt.clone(), store.clone(), &token).await;
        Env {
            cfg,
            linux,
            rt,
            compiled,
            store,
            api,
            token,
            marker,
            cleanup,
        }
    }

    /// A keep-alive HTTP/1.1 connection to the API.
    pub fn http(&self) -> Http {
        Http::connect(self.api, &self.token)
    }

    pub async fn shutdown(self) {
        self.rt.shutdown().await;
        drop(self.cleanup);
    }
}

/// The HTTP API over `rt` on a loopback port of its own (the bench's token; no
/// secrets): its address.
pub async fn serve_api(
    cfg: &Config,
    rt: Arc<Runtime>,
    store: Arc<Store>,
    token: &str,
) -> SocketAddr {
    let state = Arc::new(ApiState {
        runtime: rt,
        token: token.into(),
        approver_token: "bench-approver-token".into(),
        approval_ttl_ms: cfg.floor.approval_ttl_ms,
        secrets: stockade_egress::secrets::Secrets::new(
            store.clone(),
            cfg.egress.secret_files.clone(),
        ),
        tenants: stockade_host::tenants::Tenants::load(store, cfg.substrate.ceiling).unwrap(),
    });
    let app = api::router(state, cfg.api.max_body_bytes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// A minimal blocking keep-alive HTTP/1.1 client (the measured path is the server's;
/// the client is the same for every row). Run it inside `block_in_place`.
pub struct Http {
    s: std::net::TcpStream,
    token: String,
    buf: Vec<u8>,
}

impl Http {
    pub fn connect(addr: SocketAddr, token: &str) -> Http {
        let s = std::net::TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        Http {
            s,
            token: token.into(),
            buf: Vec::with_capacity(8192),
        }
    }

    /// Send one request; the status and body.
    pub fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let b = body.unwrap_or("");
        self.request_bytes(method, path, "application/json", b.as_bytes())
    }

    /// Send one request with a body of any type; the status and body.
    pub fn request_bytes(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        b: &[u8],
    ) -> (u16, String) {
        // A small body goes in one write with its head, as the project's clients send
        // it (hyper's writev, Python's http.client and Node's fetch all join them):
        // two writes wake the server twice (docs/BENCHMARKS.md, "One request, one
        // write"). A large one (an upload) follows its head, not copied.
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            self.token,
            b.len()
        )
        .into_bytes();
        if b.len() <= 64 * 1024 {
            request.extend_from_slice(b);
            self.s.write_all(&request).unwrap();
        } else {
            self.s.write_all(&request).unwrap();
            self.s.write_all(b).unwrap();
        }
        self.buf.clear();
        let mut chunk = [0u8; 8192];
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = self.s.read(&mut chunk).unwrap();
            assert!(n > 0, "the API closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_string();
        let status: u16 = head[9..12].parse().unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .expect("content-length");
        while self.buf.len() < head_end + len {
            let n = self.s.read(&mut chunk).unwrap();
            assert!(n > 0, "the API closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let body = String::from_utf8_lossy(&self.buf[head_end..head_end + len]).to_string();
        (status, body)
    }
}

impl Http {
    /// POST to an NDJSON route: each event with the instant it arrived, until the
    /// final one (`exit` or `error`), which is returned too.
    pub fn stream(
        &mut self,
        path: &str,
        body: &str,
        mut on_event: impl FnMut(&serde_json::Value, Instant),
    ) -> serde_json::Value {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.token,
            body.len()
        );
        self.s.write_all(req.as_bytes()).unwrap();
        self.buf.clear();
        let mut chunk = vec![0u8; 256 * 1024];
        let mut read = |buf: &mut Vec<u8>, s: &mut std::net::TcpStream| {
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "the API closed the connection");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            read(&mut self.buf, &mut self.s);
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_string();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut raw = self.buf.split_off(head_end);
        let mut lines: Vec<u8> = Vec::new();
        loop {
            // One chunk: its size line, its data, CRLF.
            let size_end = loop {
                if let Some(i) = raw.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                read(&mut raw, &mut self.s);
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&raw[..size_end]).unwrap(), 16).unwrap();
            while raw.len() < size_end + 2 + size + 2 {
                read(&mut raw, &mut self.s);
            }
            let at = Instant::now();
            lines.extend_from_slice(&raw[size_end + 2..size_end + 2 + size]);
            raw.drain(..size_end + 2 + size + 2);
            assert!(size > 0, "the stream ended before its outcome");
            while let Some(nl) = lines.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = lines.drain(..=nl).collect();
                let ev: serde_json::Value = serde_json::from_slice(&line).unwrap();
                if matches!(ev["type"].as_str(), Some("exit" | "error")) {
                    // The terminating chunk follows.
                    while !raw.windows(5).any(|w| w == b"0\r\n\r\n") {
                        read(&mut raw, &mut self.s);
                    }
                    return ev;
                }
                on_event(&ev, at);
            }
        }
    }
}

/// Resident set of a process, in KiB (VmRSS).
pub fn rss_kib(pid: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Host pids of live (non-zombie) processes whose environment holds `MARK=<marker>`.
pub fn marked_processes(marker: &str) -> Vec<i32> {
    let needle = format!("STOCKADE_BENCH_MARKER={marker}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            continue;
        }
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with('Z')))
            .unwrap_or(true);
        if !zombie {
            out.push(pid);
        }
    }
    out
}

/// The number of iterations, scaled by `STOCKADE_BENCH_SCALE` (default 1.0; the quick
/// CI smoke run uses 0.05).
pub fn iters(n: usize) -> usize {
    let scale: f64 = std::env::var("STOCKADE_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * scale).round() as usize).max(3)
}

/// The bwrap baseline's arguments (`cold`, `peers`): every namespace, uid 1000, the
/// host's /usr read-only, /bin/true.
pub const BWRAP: &[&str] = &[
    "--unshare-all",
    "--unshare-user",
    "--uid",
    "1000",
    "--gid",
    "1000",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--new-session",
    "--die-with-parent",
    "/bin/true",
];
