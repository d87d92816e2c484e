//! The operator's path by the docs alone: docs/NODE.md "Two nodes on one host" run as
//! written. The commands are read from that section's first `sh` block, and the
//! configurations are `docs/examples/`'s own files, so a doc or an example that drifts
//! from the code turns this red (a key the parser refuses, a default that moved, a
//! token file the CLI does not find).
//!
//! The block runs in a private mount and network namespace (`unshare`): `/var/lib` is a
//! tmpfs there and `127.0.0.1` is the namespace's own loopback, so the documented data
//! directories and ports meet nothing of the machine's (a `stockade serve` beside the
//! suite keeps its `127.0.0.1:8787`). A line that starts a server in the background
//! (`… &`) is followed by what the block's own comment says to wait for: the server's
//! "serving on" line. Every server is stopped by SIGTERM in the reverse order, as an
//! operator would, and the nodes' cgroup roots must be gone afterwards.

use std::path::{Path, PathBuf};
use std::process::Command;

use stockade_linux::cgroup::auto_root_name;

/// The section whose commands are walked, and the line it must end with.
const SECTION: &str = "## Two nodes on one host";
const WANT: &str = "hi";

/// The first ```sh block under `section` in `markdown`: its command lines (comments
/// and blank lines dropped, a trailing comment cut).
fn commands(markdown: &str, section: &str) -> Vec<String> {
    let after = markdown
        .split_once(section)
        .unwrap_or_else(|| panic!("docs/NODE.md has no {section:?}"))
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, b)| b.split_once("```"))
        .unwrap_or_else(|| panic!("{section:?} has no sh block"))
        .0;
    block
        .lines()
        .map(|l| match l.find(" #") {
            Some(i) => l[..i].trim(),
            None => l.trim(),
        })
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// The walk as one bash script: background lines wait for "serving on", the rest run
/// in order; an EXIT trap stops the servers (last started first) and waits for each.
fn script(lines: &[String], repo: &Path, bin: &Path) -> String {
    let mut s = format!(
        r#"set -eu
ip link set lo up
mount -t tmpfs -o mode=0755 stockade-docs-walk /var/lib
export PATH={bin}:$PATH
unset STOCKADE_DATA_DIR STOCKADE_TOKEN STOCKADE_SERVER || true
cd {repo}
logs=$(mktemp -d)
pids=()
stop() {{
  for ((i=${{#pids[@]}}-1; i>=0; i--)); do
    kill -TERM "${{pids[i]}}" 2>/dev/null || true
    wait "${{pids[i]}}" 2>/dev/null || true
  done
}}
trap stop EXIT
serving() {{
  for _ in $(seq 1 600); do
    grep -q 'serving on' "$1" && return 0
    kill -0 "$2" 2>/dev/null || {{ echo "docs walk: the server died:" >&2; cat "$1" >&2; return 1; }}
    sleep 0.1
  done
  echo "docs walk: no 'serving on' within 60 s:" >&2; cat "$1" >&2; return 1
}}
"#,
        bin = bin.display(),
        repo = repo.display()
    );
    for (i, line) in lines.iter().enumerate() {
        match line.strip_suffix('&') {
            Some(cmd) => s.push_str(&format!(
                "{cmd} >\"$logs/{i}\" 2>&1 &\npids+=($!)\nserving \"$logs/{i}\" $!\n",
                cmd = cmd.trim()
            )),
            None => s.push_str(&format!("{line}\n")),
        }
    }
    s
}

/// The v2 root and its v1 namesakes a node with `data_dir` would make.
fn cgroup_roots(data_dir: &str) -> Vec<PathBuf> {
    let name = auto_root_name(Path::new(data_dir));
    let v2 = stockade_tests::require_root_and_cgroup_v2();
    let mut roots = vec![v2.join(&name)];
    for c in ["pids", "memory", "cpu"] {
        roots.push(Path::new("/sys/fs/cgroup").join(c).join(&name));
    }
    roots
}

#[test]
fn commands_are_read_from_the_docs_block() {
    let md = "x\n## Two nodes on one host\ntext\n```sh\n# a comment\na --x &   # start\n\nb y\n```\n```sh\nc\n```\n";
    assert_eq!(commands(md, SECTION), vec!["a --x &", "b y"]);
}

#[test]
fn two_nodes_and_a_front_from_the_docs_run_a_command() {
    stockade_tests::require_root_and_cgroup_v2();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let repo = repo.canonicalize().expect("repository");
    let md = std::fs::read_to_string(repo.join("docs/NODE.md")).expect("docs/NODE.md");
    let lines = commands(&md, SECTION);
    assert!(
        lines.iter().filter(|l| l.ends_with('&')).count() >= 3,
        "the block starts two nodes and a front: {lines:?}"
    );
    // A node started from the example on this machine would share these cgroup roots:
    // refuse to run beside it rather than sweep its containers (invariant 12).
    let roots: Vec<PathBuf> = ["/var/lib/stockade-node-a", "/var/lib/stockade-node-b"]
        .iter()
        .flat_map(|d| cgroup_roots(d))
        .collect();
    for r in &roots {
        assert!(
            !r.exists(),
            "{} exists: a node from docs/examples runs on this machine; stop it first",
            r.display()
        );
    }
    let exe = stockade_tests::stockade_exe();
    let bin = exe.parent().expect("bin dir");
    let out = Command::new("unshare")
        .args(["--mount", "--net", "--fork", "--kill-child", "bash", "-c"])
        .arg(script(&lines, &repo, bin))
        .output()
        .expect("run unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the documented walk failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert_eq!(
        stdout.lines().last(),
        Some(WANT),
        "the last command's output\nstderr:\n{stderr}"
    );
    // A clean shutdown removes an auto root's cgroups (v2 and v1 namesakes).
    let left: Vec<&PathBuf> = roots.iter().filter(|r| r.exists()).collect();
    assert!(left.is_empty(), "cgroups left by the walk: {left:?}");
}
