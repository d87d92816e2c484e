//! SIGTERM during a fence: the server stops accepting, the open fence gets its
//! deadline, every grant is revoked and no process is left.

use std::process::{Command, Stdio};
use std::time::Duration;

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
