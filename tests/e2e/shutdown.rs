//! SIGTERM during a fence: the server stops accepting, the open fence gets its
//! deadline, every grant is revoked and no process is left. A second server never
//! sweeps the first one.

use std::process::{Command, Stdio};
use std::time::Duration;

use stockade_runtime::config::Config;

use crate::Server;

#[test]
fn sigterm_during_a_fence_revokes_the_grant_and_leaves_no_process() {
    let srv = Server::start_with(|c| c.api.shutdown_deadline_ms = 500);
    // A fence that would run for a long time, with a grant open.
    let marker = format!("e2e-shutdown-{}", uuid::Uuid::new_v4().simple());
    let mut fence = Command::new(crate::stockade_exe())
        .args(["exec", "shut", "--grant", "example.com", "--", "sh", "-c"])
        .arg(format!("sleep 1000; echo {marker}"))
        .env("STOCKADE_SERVER", format!("http://{}", srv.addr))
        .env("STOCKADE_DATA_DIR", srv.data_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the fenced command to exist (its shell is visible from the host).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !fenced_alive(&marker) {
        assert!(
            std::time::Instant::now() < deadline,
            "the fenced command never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = srv.stop();
    assert!(
        status.success(),
        "the server exits 0 after SIGTERM: {status:?}"
    );
    // The fenced command and everything of its container is gone.
    assert!(
        !fenced_alive(&marker),
        "a process of the fence survived the shutdown"
    );
    let _ = crate::wait_exit(&mut fence, Duration::from_secs(30));
}

/// A process (not the CLI itself) whose command line carries the marker.
fn fenced_alive(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            let Ok(c) = std::fs::read(e.path().join("cmdline")) else {
                return false;
            };
            let argv0 = c.split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(&c).contains(marker) && !argv0.ends_with(b"stockade")
        })
}

/// Invariant 12 through the real binary: a second `stockade serve` on the same data
/// directory is refused, and one that cannot bind its port sweeps nothing, so the first
/// server's detached process lives on.
#[test]
fn a_second_server_never_sweeps_the_first() {
    let s = Server::start();
    let out = s.cli(&["start", "keep", "--", "sleep", "1000"]);
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let run_second = |tweak: &dyn Fn(&mut Config)| {
        let mut cfg: Config =
            toml::from_str(&std::fs::read_to_string(s.dir.path().join("wasmtime.toml")).unwrap())
                .unwrap();
        tweak(&mut cfg);
        let path = s
            .dir
            .path()
            .join(format!("second-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
        let out = std::process::Command::new(stockade_tests::stockade_exe())
            .args(["serve", "--config"])
            .arg(&path)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The same data directory (another port): refused, naming it.
    let (status, err) = run_second(&|c| c.api.listen = "127.0.0.1:0".into());
    assert!(!status.success(), "{err}");
    assert!(err.contains("in use by another stockade instance"), "{err}");
    // Another data directory, the same cgroup root, the first one's port: it cannot
    // bind, so it never starts, never sweeps.
    let other = s.dir.path().join("other-data");
    let addr = s.addr.clone();
    let (status, err) = run_second(&|c| {
        c.substrate.data_dir = other.clone();
        c.api.listen = addr.clone();
    });
    assert!(!status.success(), "{err}");
    assert!(err.contains("listen on"), "{err}");
    let st = s.cli(&["--json", "status", "keep", &id]);
    assert!(
        String::from_utf8_lossy(&st.stdout).contains("running"),
        "the first server's detached process died: {st:?}"
    );
    assert!(s.stop().success());
}

/// The harness itself: a test that fails before `stop()` (its `Server` dropped while
/// serving, a container up) leaves no cgroup behind. Failed runs used to leave empty
/// container cgroups under the test's root.
#[test]
fn a_server_dropped_while_serving_leaves_no_cgroup() {
    let srv = Server::start();
    let out = srv.cli(&["exec", "dropped", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = srv.cgroup_root.clone();
    assert!(root.exists());
    let data = srv.data_dir();
    drop(srv);
    assert!(!root.exists(), "{} is left", root.display());
    stockade_tests::assert_no_limits_left(&root);
    let mounts = stockade_tests::mounts_under(&data);
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
}

/// A SIGTERM at any point of start-up (before the data directory,
/// once it exists, while the warm pool's first container is being built, once
/// serving) ends the server cleanly: exit 0 once its handling is installed, and in
/// every case no container cgroup, limit directory or mount is left. On the code that
/// installed the handling after building, a SIGTERM during the warm build killed the
/// server by the default action and left the warm container's mount and cgroups.
#[test]
fn a_sigterm_at_any_point_of_start_up_leaves_nothing() {
    use std::io::BufRead;
    let v2 = stockade_tests::require_root_and_cgroup_v2();
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Point {
        Spawned,
        DataDir,
        WarmBuilding,
        Serving,
    }
    for point in [
        Point::Spawned,
        Point::DataDir,
        Point::WarmBuilding,
        Point::Serving,
    ] {
        let dir = stockade_tests::TempDir::new("e2e-start-term");
        let data = dir.path().join("data");
        let root = v2.join(format!("stockade-e2e-{}", uuid::Uuid::new_v4().simple()));
        let mut cfg = Config::embedded();
        cfg.substrate.data_dir = data.clone();
        cfg.substrate.cgroup_root = root.display().to_string();
        cfg.substrate.warm = 2;
        cfg.substrate.idle_timeout_ms = 0;
        cfg.api.listen = "127.0.0.1:0".into();
        let path = dir.path().join("wasmtime.toml");
        std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
        let mut child = Command::new(crate::stockade_exe())
            .args(["serve", "--config"])
            .arg(&path)
            .env_remove("STOCKADE_DATA_DIR")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, serving) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if line.contains("serving on http://") {
                    let _ = tx.send(());
                }
                eprintln!("[server] {line}");
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let reached = |p: Point| match p {
            Point::Spawned => true,
            Point::DataDir => data.exists(),
            Point::WarmBuilding => std::fs::read_dir(&root)
                .map(|rd| rd.filter_map(Result::ok).any(|e| e.path().is_dir()))
                .unwrap_or(false),
            Point::Serving => serving.try_recv().is_ok(),
        };
        while !reached(point) {
            assert!(
                std::time::Instant::now() < deadline,
                "start-up never reached {point:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = stockade_tests::kill(child.id() as i32, rustix::process::Signal::TERM);
        let status = crate::wait_exit(&mut child, Duration::from_secs(30));
        if point != Point::Spawned {
            assert!(
                status.success(),
                "SIGTERM at {point:?}: the server did not exit cleanly: {status:?}"
            );
        }
        let left: Vec<_> = std::fs::read_dir(&root)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name())
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            left.is_empty(),
            "SIGTERM at {point:?}: container cgroups left: {left:?}"
        );
        let _ = std::fs::remove_dir(&root);
        stockade_tests::assert_no_limits_left(&root);
        let mounts = stockade_tests::mounts_under(&data);
        assert!(
            mounts.is_empty(),
            "SIGTERM at {point:?}: mounts left: {mounts:?}"
        );
    }
}

/// The egress audit is written off the request path (a batching writer):
/// what a burst of proxied requests recorded right before SIGTERM is in the store
/// after the server exited (its shutdown writes the queue). 80 requests refused by the
/// fence (no grant: one denial row each, under the denials' burst of 100), then SIGTERM
/// at once, then the store reopened and counted.
#[test]
fn sigterm_right_after_a_burst_of_proxied_requests_loses_no_audit_row() {
    let mut srv = Server::start();
    let n = 80;
    let script = format!(
        "for i in $(seq {n}); do curl -s -o /dev/null --max-time 5 http://burst.invalid/$i; done; echo sent"
    );
    let body = serde_json::json!({ "argv": ["sh", "-c", script] }).to_string();
    let (status, text) = stockade_tests::http(
        &srv.addr,
        "POST",
        "/v1/sandboxes/audit-burst/exec",
        Some(&srv.token()),
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("sent"), "{text}");
    let _ = stockade_tests::kill(srv.child.id() as i32, rustix::process::Signal::TERM);
    let exit = crate::wait_exit(&mut srv.child, Duration::from_secs(30));
    assert!(exit.success(), "the server exits 0 after SIGTERM: {exit:?}");
    let store = stockade_store::Store::open_in(&srv.data_dir()).unwrap();
    let denials = store.denials("audit-burst").unwrap();
    drop(store);
    assert_eq!(
        denials.len(),
        n,
        "every refused request of the burst has its row after the shutdown"
    );
    assert!(denials.iter().all(|d| d.host == "burst.invalid"));
    // Already exited: stop() only checks that nothing is left.
    srv.stop();
}

/// A clean shutdown removes the parent cgroups this instance made for its containers:
/// with an `auto` root (named after the data directory: no one else's), the v2 root
/// and its v1 namesakes are gone once the server exits (red team, 2026-12-04: a server
/// stopped by SIGTERM left them, empty). A configured root stays: it may be shared, or
/// the operator's (every other test's root is one, removed by the harness).
#[test]
fn a_clean_shutdown_removes_the_cgroups_its_auto_root_made() {
    use stockade_linux::{cgroup, limits};
    let mut srv = Server::start_with(|c| c.substrate.cgroup_root = "auto".into());
    let v2 = cgroup::detect_v2().expect("cgroup v2");
    let name = cgroup::auto_root_name(&srv.data_dir());
    // The harness's own cleanup, should this fail, looks there.
    srv.cgroup_root = v2.join(&name);
    let out = srv.cli(&["exec", "roots", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = limits::Plan::detect(Some(&v2));
    let roots: Vec<_> = std::iter::once(srv.cgroup_root.clone())
        .chain(limits::v1_roots(&plan, &name))
        .collect();
    for r in &roots {
        assert!(r.exists(), "{} was made", r.display());
    }
    let _ = stockade_tests::kill(srv.child.id() as i32, rustix::process::Signal::TERM);
    let status = crate::wait_exit(&mut srv.child, Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    let left: Vec<_> = roots.iter().filter(|r| r.exists()).collect();
    assert!(left.is_empty(), "left at shutdown: {left:?}");
}
