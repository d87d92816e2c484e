//! `stockade mcp` driven by a real MCP client: the official Python SDK (`mcp` on PyPI)
//! runs `tests/mcp/drive.py`, which starts `stockade mcp` over stdio against this
//! server and checks initialize, tools/list and tools/call (a granted exec, a denial,
//! a detached server, put, tool errors). `scripts/test` installs the SDK into a venv
//! and sets `STOCKADE_PYTHON`; without it this test fails and says so.

use crate::Server;

#[test]
fn a_real_mcp_client_drives_stockade_mcp() {
    let python = std::env::var("STOCKADE_PYTHON").unwrap_or_else(|_| {
        panic!(
            "STOCKADE_PYTHON is not set: run `bash scripts/test` (it installs the MCP Python SDK into a venv), or set it to a python with `pip install mcp`"
        )
    });
    let s = Server::start();
    let drive = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/drive.py");
    let out = std::process::Command::new(&python)
        .arg(&drive)
        .arg(stockade_tests::stockade_exe())
        .env("STOCKADE_SERVER", format!("http://{}", s.addr))
        .env("STOCKADE_DATA_DIR", s.data_dir())
        .output()
        .expect("run the MCP client");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the MCP client failed:\n{text}");
    assert!(text.contains("mcp: all checks passed"), "{text}");
    s.stop();
}
