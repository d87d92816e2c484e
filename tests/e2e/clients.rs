//! The client libraries against the real binary: `clients/python` (standard library
//! only, its unittest suite) and `clients/typescript` (its node test suite), each
//! driving every facade call, live output included, on a server this test starts.

use std::process::Command;

use crate::Server;

/// Run a client's test suite against `s`; it must succeed and say `passed` (so a
/// suite that ran nothing fails).
fn run(what: &str, mut cmd: Command, s: &Server, passed: &str) {
    let out = cmd
        .env("STOCKADE_SERVER", format!("http://{}", s.addr))
        .env("STOCKADE_DATA_DIR", s.data_dir())
        .env_remove("STOCKADE_TOKEN")
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    assert!(text.contains(passed), "{what}: no {passed:?} in:\n{text}");
}

#[test]
fn the_python_client_covers_every_call() {
    let s = Server::start();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "unittest", "discover", "-v", "-s", "tests"])
        .current_dir(&root)
        .env("PYTHONPATH", &root);
    run("the Python client's tests", cmd, &s, "Ran 6 tests");
    s.stop();
}

#[test]
fn the_typescript_client_covers_every_call() {
    let s = Server::start();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript");
    assert!(
        root.join("node_modules").exists(),
        "clients/typescript/node_modules is missing: run `bash scripts/setup` (npm ci)"
    );
    let mut cmd = Command::new("npm");
    cmd.args(["test", "--silent"]).current_dir(&root);
    run("the TypeScript client's tests", cmd, &s, "# tests 6");
    s.stop();
}
