//! Every CLI verb against the real server, with `--json` where it applies.

use serde_json::Value;
use stockade_wire::{
    Aborted, Approval, Artifacts, Checkpointed, Denials, DetachedState, Ensured, ExecOutcome,
    Forked, GoneReason, Snapshot, SnapshotDeleted, Snapshots, Started, Stopped,
};

use crate::Server;

fn json(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "CLI failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "--json output does not parse ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `--json` output read as the API's answer (`stockade-wire`): the CLI prints exactly
/// what the API answered.
fn answer<T: serde::de::DeserializeOwned>(out: &std::process::Output) -> T {
    let v = json(out);
    serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("--json output is not the API's answer ({e}): {v}"))
}

#[test]
fn every_verb_works_through_the_real_binary() {
    let srv = Server::start();
    // exec: output shown, exit code passed through.
    let out = srv.cli(&[
        "exec",
        "e2e",
        "--",
        "sh",
        "-c",
        "echo hello; echo oops >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "exit code passes through");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    let v: ExecOutcome = answer(&srv.cli(&["--json", "exec", "e2e", "--", "echo", "hi"]));
    assert_eq!(v.stdout, "hi\n");
    assert_eq!(v.exit_code, 0);

    // start / status / stop.
    let v: Started = answer(&srv.cli(&["--json", "start", "e2e", "--", "sleep", "1000"]));
    let id = v.id;
    let st: DetachedState = answer(&srv.cli(&["--json", "status", "e2e", &id]));
    assert_eq!(st, DetachedState::Running);
    let text = srv.cli(&["status", "e2e", &id]);
    assert_eq!(String::from_utf8_lossy(&text.stdout).trim(), "running");
    let v: Stopped = answer(&srv.cli(&["--json", "stop", "e2e", &id]));
    assert_eq!(v.stopped, id);
    let st: DetachedState = answer(&srv.cli(&["--json", "status", "e2e", &id]));
    assert_eq!(
        st,
        DetachedState::Gone {
            reason: GoneReason::Unknown
        }
    );

    // artifacts written by a run, listed and read back byte-exact.
    let out = srv.cli(&[
        "exec",
        "e2e",
        "--",
        "sh",
        "-c",
        "printf 'a\\0b' > /artifacts/bin.dat",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Artifacts = answer(&srv.cli(&["--json", "artifacts", "e2e"]));
    assert_eq!(v.artifacts[0].name, "bin.dat");
    assert_eq!(v.artifacts[0].size, 3);
    let out = srv.cli(&["artifacts", "e2e", "bin.dat"]);
    assert_eq!(out.stdout, b"a\0b");

    // denials: a request outside the grant (127.0.0.2: host loopback that NO_PROXY,
    // which names 127.0.0.1 so a later exec can dial a detached server, does not cover).
    let out = srv.cli(&[
        "exec",
        "e2e",
        "--grant",
        "GET 127.0.0.2/allowed/",
        "--",
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://127.0.0.2:9/denied",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");
    let v: Denials = answer(&srv.cli(&["--json", "denials", "e2e"]));
    assert_eq!(v.denials[0].reason, "path");

    // approve: the floor needs it, the token admits exactly that argv.
    let out = srv.cli(&["exec", "e2e", "--", "git", "push", "--version"]);
    assert_eq!(
        out.status.code(),
        Some(77),
        "needs-approval: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Approval = answer(&srv.cli(&["--json", "approve", "e2e", "--", "sh", "-c", "exit 0"]));
    assert!(!v.token.is_empty());
    assert_eq!(v.argv, ["sh", "-c", "exit 0"]);

    // checkpoint then abort.
    srv.cli(&["exec", "e2e", "--", "sh", "-c", "echo kept > /workspace/f"]);
    let v: Checkpointed = answer(&srv.cli(&["--json", "checkpoint", "e2e"]));
    assert_eq!(v.checkpointed, "e2e");
    let out = srv.cli(&["exec", "e2e", "--", "cat", "/workspace/f"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "kept\n",
        "checkpoint restored the workspace"
    );
    // A named snapshot: the container runs on; a fork onto another key starts from it,
    // the source's later writes not the fork's; a fork onto a key with a container, a
    // bad name, and a snapshot nobody holds are refused; deleted, it forks nothing.
    let v: Snapshot = answer(&srv.cli(&["--json", "snapshot", "save", "e2e", "v1"]));
    assert_eq!(v.name, "v1");
    srv.cli(&["exec", "e2e", "--", "sh", "-c", "echo later > /workspace/f"]);
    let v: Snapshots = answer(&srv.cli(&["--json", "snapshot", "list", "e2e"]));
    assert_eq!(v.snapshots.len(), 1);
    let out = srv.cli(&["snapshot", "list", "e2e"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("v1  "));
    let v: Forked = answer(&srv.cli(&["--json", "fork", "e2e-fork", "e2e", "v1"]));
    assert_eq!(v.forked, "e2e-fork");
    let out = srv.cli(&["exec", "e2e-fork", "--", "cat", "/workspace/f"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "kept\n",
        "the fork's workspace"
    );
    for refused in [
        ["fork", "e2e-fork", "e2e", "v1"],
        ["fork", "e2e-2", "e2e", "nope"],
        ["fork", "e2e-2", "e2e", "../v1"],
    ] {
        let out = srv.cli(&refused);
        assert!(!out.status.success(), "{refused:?} was not refused");
    }
    let v: SnapshotDeleted = answer(&srv.cli(&["--json", "snapshot", "rm", "e2e", "v1"]));
    assert_eq!(v.deleted, "v1");
    assert!(!srv.cli(&["fork", "e2e-2", "e2e", "v1"]).status.success());
    let v: Aborted = answer(&srv.cli(&["--json", "abort", "e2e-fork"]));
    assert_eq!(v.aborted, "e2e-fork");
    let v: Aborted = answer(&srv.cli(&["--json", "abort", "e2e"]));
    assert_eq!(v.aborted, "e2e");

    // ensure starts the container and runs nothing: a door (which never starts one)
    // is refused before it and opens after it.
    let out = srv.cli(&["expose", "e2e", "8000"]);
    assert!(!out.status.success(), "a door onto no container");
    let v: Ensured = answer(&srv.cli(&["--json", "ensure", "e2e"]));
    assert_eq!(v.ensured, "e2e");
    let out = srv.cli(&["expose", "e2e", "8000"]);
    assert!(
        out.status.success(),
        "a door onto the ensured container: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Aborted = answer(&srv.cli(&["--json", "abort", "e2e"]));
    assert_eq!(v.aborted, "e2e");
    assert!(srv.stop().success());
}

#[test]
fn help_has_examples_and_usage_errors_exit_2() {
    let out = std::process::Command::new(crate::stockade_exe())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Examples:") && help.contains("stockade exec demo -- echo hello"),
        "{help}"
    );
    let out = std::process::Command::new(crate::stockade_exe())
        .args(["exec", "k"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Standard input through the real binary: the CLI forwards a piped
/// stdin (`-n` does not), the API takes `stdin` (text) or `stdin_base64` (bytes), and
/// both at once is a typed 400.
#[test]
fn stdin_is_forwarded_by_the_cli_and_taken_by_the_api() {
    let srv = Server::start();
    let piped = |args: &[&str], input: &[u8]| srv.cli_with_stdin(args, input);
    let out = piped(&["exec", "in", "--", "cat"], b"data from a pipe\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"data from a pipe\n");
    // More than the API's old 1 MiB body limit: the default limit carries the largest
    // stdin the guest takes.
    let big = vec![b'x'; 3 << 20];
    let out = piped(&["exec", "in", "--", "wc", "-c"], &big);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (3 << 20).to_string()
    );
    let out = piped(
        &["exec", "in", "-n", "--", "sh", "-c", "cat; echo end"],
        b"ignored",
    );
    assert_eq!(out.stdout, b"end\n", "-n forwards nothing");

    let t = srv.token();
    let a = &srv.addr;
    let (st, out) = stockade_tests::http(
        a,
        "POST",
        "/v1/sandboxes/in/exec",
        Some(&t),
        br#"{"argv":["cat"],"stdin_base64":"AAEC/w=="}"#,
    );
    assert_eq!(st, 200, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stdout_base64"], "AAEC/w==", "{v}");
    for body in [
        &br#"{"argv":["cat"],"stdin":"a","stdin_base64":"YQ=="}"#[..],
        &br#"{"argv":["cat"],"stdin_base64":"not base64!"}"#[..],
    ] {
        let (st, out) = stockade_tests::http(a, "POST", "/v1/sandboxes/in/exec", Some(&t), body);
        assert_eq!(st, 400, "{out}");
        assert!(out.contains("invalid-input"), "{out}");
    }
    srv.stop();
}

/// Files in through the real binary: a file, a directory (nested, with
/// a symlink) and a tar archive on stdin land in /workspace owned by the container's
/// user; an archive reaching out of the tree and an absolute destination are refused
/// with a typed 400 and change nothing.
#[test]
fn put_brings_files_into_the_workspace() {
    let srv = Server::start();
    // Removed when the test ends, whichever way it ends.
    let tmp = stockade_tests::TempDir::new("put");
    let dir = tmp.path().to_path_buf();
    std::fs::create_dir_all(dir.join("tree/sub")).unwrap();
    std::fs::write(dir.join("one.txt"), "one\n").unwrap();
    std::fs::write(dir.join("tree/sub/deep.txt"), "deep\n").unwrap();
    std::os::unix::fs::symlink("sub/deep.txt", dir.join("tree/link")).unwrap();
    let path = |p: &str| dir.join(p).display().to_string();

    let out = srv.cli(&["put", "files", &path("one.txt")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = srv.cli(&["put", "files", &path("tree"), "src/tree"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = stockade_host::upload::single_file("from-stdin.txt", b"stdin\n").unwrap();
    let out = srv.cli_with_stdin(&["put", "files", "-", "piped"], &archive);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = srv.cli(&[
        "exec",
        "files",
        "--",
        "sh",
        "-c",
        "cat one.txt src/tree/sub/deep.txt src/tree/link piped/from-stdin.txt; \
         readlink src/tree/link; stat -c %u:%g one.txt src/tree/sub/deep.txt; id -u",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        &lines[..5],
        ["one", "deep", "deep", "stdin", "sub/deep.txt"],
        "{text}"
    );
    let me = lines[7];
    assert_eq!(
        lines[5],
        format!("{me}:{me}"),
        "owned by the container's user: {text}"
    );
    assert_eq!(lines[6], format!("{me}:{me}"), "{text}");

    // Refused, and nothing written.
    let t = srv.token();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    h.set_link_name("../../../etc").unwrap();
    b.append_data(&mut h, "escape", std::io::empty()).unwrap();
    let bad = b.into_inner().unwrap();
    let (st, body) = stockade_tests::http(
        &srv.addr,
        "PUT",
        "/v1/sandboxes/files/files",
        Some(&t),
        &bad,
    );
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("points out of the tree"), "{body}");
    let (st, body) = stockade_tests::http(
        &srv.addr,
        "PUT",
        "/v1/sandboxes/files/files?dest=/etc",
        Some(&t),
        &archive,
    );
    assert_eq!(st, 400, "{body}");
    let out = srv.cli(&[
        "exec",
        "files",
        "--",
        "sh",
        "-c",
        "ls -a /workspace | tr '\\n' ' '",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        ". .. one.txt piped src ",
        "nothing else was written"
    );
    let _ = std::fs::remove_dir_all(&dir);
    srv.stop();
}

/// An archive past the 16 MiB a command's stdin may hold goes in whole: the host
/// hands it to the unpacking `tar` past the guest (40 MB here; the limit is 256 MiB).
#[test]
fn a_large_archive_goes_in_past_the_guests_stdin_bound() {
    let srv = Server::start();
    let body: Vec<u8> = (0..40_000_000u32).map(|i| (i % 251) as u8).collect();
    let archive = stockade_host::upload::single_file("big.bin", &body).unwrap();
    let (st, answer) = stockade_tests::http(
        &srv.addr,
        "PUT",
        "/v1/sandboxes/large/files?dest=in",
        Some(&srv.token()),
        &archive,
    );
    assert_eq!(st, 201, "{answer}");
    let out = srv.cli(&[
        "exec",
        "large",
        "--",
        "sh",
        "-c",
        "wc -c < in/big.bin; cksum < in/big.bin",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut local = std::process::Command::new("cksum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        local.stdin.take().unwrap().write_all(&body).unwrap();
    }
    let want = String::from_utf8_lossy(&local.wait_with_output().unwrap().stdout).into_owned();
    assert_eq!(text, format!("40000000\n{want}"), "the file arrived whole");
    srv.stop();
}

/// Every path segment the CLI sends is percent-encoded: an artifact whose
/// name holds a `?`, a `#`, a `%` or a space reads that artifact, byte-exact, never
/// another one (`a?b` once read `a` with a query) or a refused request.
#[test]
fn artifact_names_with_query_fragment_and_escape_characters_read_that_artifact() {
    let srv = Server::start();
    let out = srv.cli(&[
        "exec",
        "names",
        "--",
        "sh",
        "-c",
        "cd /artifacts && printf wrong > a && printf right > 'a?b' && printf hash > 'c#d' \
         && printf pct > '100%' && mkdir 'sub dir' && printf deep > 'sub dir/x?y'",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, want) in [
        ("a?b", "right"),
        ("c#d", "hash"),
        ("100%", "pct"),
        ("sub dir/x?y", "deep"),
        ("a", "wrong"),
    ] {
        let out = srv.cli(&["artifacts", "names", name]);
        assert!(
            out.status.success(),
            "{name:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{name:?}");
    }
    srv.stop();
}
