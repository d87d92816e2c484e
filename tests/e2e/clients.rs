//! The client libraries against the real binary: `clients/python` (standard library
//! only, its unittest suite) and `clients/typescript` (its node test suite), each
//! driving every facade call, live output included, on a server this test starts; and
//! the Python framework providers (`clients/python/tests_providers`: the OpenAI Agents
//! SDK's and deepagents' sandboxes on Stockade, and their own E2B providers on Stockade's
//! E2B API) in the venv scripts/setup makes from tests/agents-requirements.txt.

use std::process::Command;

use crate::Server;

/// Run a client's test suite against `s`; it must succeed and say `passed` (so a
/// suite that ran nothing fails). Its output.
fn run(what: &str, mut cmd: Command, s: &Server, passed: &str) -> String {
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
    text
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

/// target/pyenv-agents' python (tests/agents-requirements.txt, and `clients/python`
/// installed into it for its entry point); a missing venv fails loudly, never passes.
pub fn agents_python() -> String {
    let py =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv-agents/bin/python");
    let probe = Command::new(&py)
        .args([
            "-c",
            "import agents, deepagents, deepagents_code, langchain_e2b, e2b; \
             import importlib.metadata as m; \
             assert 'stockade' in m.entry_points(group='deepagents_code.sandbox_providers').names",
        ])
        .output();
    match probe {
        Ok(out) if out.status.success() => py.display().to_string(),
        Ok(out) => panic!(
            "{} lacks the provider suite's packages: run `bash scripts/setup` \
             (tests/agents-requirements.txt and clients/python)\n{}",
            py.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "{} is missing ({e}): run `bash scripts/setup` (it makes target/pyenv-agents \
             from tests/agents-requirements.txt)",
            py.display()
        ),
    }
}

#[test]
fn the_python_framework_providers_drive_stockade() {
    let py = agents_python();
    let s = Server::start();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let (vars, _gateway) = crate::e2b::e2b_env(&s);
    let mut cmd = Command::new(py);
    // PYTHONPATH: the tree's `stockade`, not the copy installed for its entry point.
    cmd.args(["-m", "unittest", "discover", "-v", "-s", "tests_providers"])
        .current_dir(&root)
        .env("PYTHONPATH", &root)
        .envs(vars)
        // No model service: the models are scripted, and nothing may reach OpenAI.
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL");
    let text = run("the framework providers' tests", cmd, &s, "Ran 12 tests");
    // Nothing skipped: a skip (an E2B call not served, a deployment without preview
    // doors) is a failure here.
    assert!(
        text.lines().any(|l| l.trim() == "OK") && !text.contains("skipped"),
        "{text}"
    );
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

/// `stockade.testing` (docs/MOCK.md): its pytest suite, each test on its own
/// `stockade serve --mock` the fixture starts from STOCKADE_BIN (no root, no
/// containers), in target/pyenv (pytest pinned in tests/python-requirements.txt),
/// including a dispatcher's poll loop that sees `gone(container-unreachable)` after an
/// injected fault. Every server it starts is stopped by the fixture.
#[test]
fn the_python_mock_fixture_drives_serve_mock() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let py = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv/bin/python");
    let out = Command::new(&py)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider", "tests_mock"])
        .current_dir(&root)
        .env("PYTHONPATH", &root)
        .env("STOCKADE_BIN", stockade_tests::stockade_exe())
        .env_remove("STOCKADE_TOKEN")
        .env_remove("STOCKADE_SERVER")
        .env_remove("STOCKADE_DATA_DIR")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: cannot run ({e}): run `bash scripts/setup`",
                py.display()
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the mock fixture's tests failed:\n{text}"
    );
    assert!(text.contains("8 passed"), "no \"8 passed\" in:\n{text}");
}

/// The same helper for Node's test runner (`@stockade/client/testing`,
/// `clients/typescript/test-mock`): its hooks start and stop a `stockade serve --mock`
/// from STOCKADE_BIN; a dispatcher's poll loop sees `gone(container-unreachable)` after
/// an injected fault.
#[test]
fn the_typescript_mock_helper_drives_serve_mock() {
    ts_mock_suite("test:mock", "# pass 5");
}

/// The same helper under vitest (`clients/typescript/test-vitest`, vitest pinned by the
/// lockfile): vitest's `beforeAll`/`afterAll` given as its hooks; a scripted command's
/// output and the fence's trace, and the poll loop that sees the injected fault.
#[test]
fn the_typescript_mock_helper_runs_under_vitest() {
    ts_mock_suite("test:vitest", "Tests  2 passed (2)");
}

/// Run `npm run SCRIPT` in clients/typescript against STOCKADE_BIN's `serve --mock`; it
/// must succeed and say `passed`.
fn ts_mock_suite(script: &str, passed: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript");
    assert!(
        root.join("node_modules").exists(),
        "clients/typescript/node_modules is missing: run `bash scripts/setup` (npm ci)"
    );
    let out = Command::new("npm")
        .args(["run", "--silent", script])
        .current_dir(&root)
        .env("STOCKADE_BIN", stockade_tests::stockade_exe())
        .env_remove("STOCKADE_TOKEN")
        .env_remove("STOCKADE_SERVER")
        .env_remove("STOCKADE_DATA_DIR")
        // CI's environment (CI=1) makes vitest colour its summary even into a pipe;
        // the check reads plain text, so colour is off and any escape left is stripped.
        .env("NO_COLOR", "1")
        .env_remove("FORCE_COLOR")
        .output()
        .expect("run npm");
    let text = strip_ansi(&format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ));
    assert!(
        out.status.success(),
        "the mock helper's tests ({script}) failed:\n{text}"
    );
    assert!(text.contains(passed), "no {passed:?} in:\n{text}");
}

/// `text` without its ANSI CSI escapes (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
