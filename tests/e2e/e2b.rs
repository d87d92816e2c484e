//! The E2B-compatible API (docs/E2B.md) driven by the unmodified Python `e2b` SDK,
//! pinned in tests/python-requirements.txt and installed by scripts/setup (nothing is
//! installed at test time): `tests/e2b/drive.py`, configured only by the environment
//! (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`), creates a sandbox, runs
//! commands (output, streaming, a non-zero exit), writes and reads a file, starts,
//! lists and kills a background command, lists and kills sandboxes; a wrong key is
//! AuthenticationException, an unknown id and another tenant's are NotFoundException.

use std::path::Path;

use crate::Server;

/// The venv's python with the `e2b` SDK; a missing one fails loudly, never passes.
fn python_with_e2b() -> String {
    let py = std::env::var("STOCKADE_PYTHON").unwrap_or_else(|_| {
        panic!(
            "STOCKADE_PYTHON is not set: run `bash scripts/setup` (it installs \
             tests/python-requirements.txt, the e2b SDK among them, into target/pyenv) and \
             set STOCKADE_PYTHON=$PWD/target/pyenv/bin/python"
        )
    });
    // `from e2b import Sandbox`, not `import e2b`: run from tests/, the directory
    // tests/e2b would import as an empty namespace package.
    let probe = std::process::Command::new(&py)
        .args(["-c", "from e2b import Sandbox"])
        .output()
        .expect("run STOCKADE_PYTHON");
    assert!(
        probe.status.success(),
        "{py} has no `e2b` SDK: run `bash scripts/setup` (tests/python-requirements.txt pins it)\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    py
}

#[test]
fn the_unmodified_e2b_sdk_creates_runs_writes_reads_and_kills() {
    let py = python_with_e2b();
    let s = Server::start();
    let drive = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2b/drive.py");
    let base = format!("http://{}", s.addr);
    // The environment is what `eval "$(stockade e2b env)"` sets, nothing else.
    let env = s.cli(&["e2b", "env"]);
    assert!(
        env.status.success(),
        "{}",
        String::from_utf8_lossy(&env.stderr)
    );
    let env = String::from_utf8(env.stdout).unwrap();
    let vars: Vec<(String, String)> = env
        .lines()
        .map(|l| {
            let (k, v) = l
                .strip_prefix("export ")
                .and_then(|l| l.split_once('='))
                .unwrap_or_else(|| panic!("not an export line: {l:?}"));
            (k.to_string(), v.trim_matches('\'').to_string())
        })
        .collect();
    let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"],
        "{env}"
    );
    assert_eq!(vars[0].1, format!("{base}/e2b"), "{env}");
    assert_eq!(vars[2].1, s.token(), "{env}");
    let out = std::process::Command::new(py)
        .arg(&drive)
        .arg(&base)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars)
        .output()
        .expect("run the e2b driver");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the e2b SDK driver failed:\n{text}");
    assert!(text.contains("e2b: all checks passed"), "{text}");
    s.stop();
}
