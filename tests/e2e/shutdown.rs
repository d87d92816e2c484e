//! SIGTERM during a fence: the server stops accepting, the open fence gets its
//! deadline, every grant is revoked and no process is left. A second server never
//! sweeps the first one.

use std::process::{Command, Stdio};
use std::time::Duration;

use stockade_host::config::Config;

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
