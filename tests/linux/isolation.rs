//! What a container is (DESIGN §4): read-only root, writable /workspace, own PID
//! namespace, loopback only, a detached server reachable from a later run.

use stockade_runtime::substrate::Substrate;

use crate::support::{DEADLINE, harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_isolation_facts() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("iso").await.unwrap();
    let host_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host_port.local_addr().unwrap().port();
    let script = format!(
        "touch /etc/stockade-probe 2>/dev/null && echo root-writable; \
         touch /usr/stockade-probe 2>/dev/null && echo usr-writable; \
         echo data > /workspace/w && echo workspace-ok; \
         echo data > /tmp/t && echo tmp-ok; \
         echo data > /artifacts/report.txt && echo artifacts-ok; \
         tr '\\0' ' ' < /proc/1/cmdline | grep -q '^stockade-supervisor --id ' && echo pid1-supervisor; \
         echo pid=$$; \
         python3 -c 'import socket; print(\"ifaces\", sorted(n for _, n in socket.if_nameindex()))'; \
         python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=3)' 2>/dev/null && echo host-reachable; \
         grep -c . /proc/self/status >/dev/null && grep -E '^(Cap|Sig(Ign|Blk))' /proc/self/status; \
         hostname; \
         ls /sys 2>/dev/null | head -1; \
         echo HTTPS_PROXY=$HTTPS_PROXY"
    );
    let r = h.linux.run(&c, h.cmd(&script), DEADLINE).await.unwrap();
    let out = String::from_utf8_lossy(&r.stdout).to_string();
    let err = String::from_utf8_lossy(&r.stderr).to_string();
    for absent in ["root-writable", "usr-writable", "host-reachable"] {
        assert!(!out.contains(absent), "{absent}:\n{out}\n{err}");
    }
    for present in [
        "workspace-ok",
        "tmp-ok",
        "artifacts-ok",
        "pid1-supervisor",
        "ifaces ['lo']",
        // No capability in any set: the bounding set emptied to its last one.
        "CapInh:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        // No signal ignored or blocked, whatever the supervisor and the host above it
        // ignore (SIGPIPE at least: Rust's runtime) or block. (What is caught is the
        // program's own: GNU grep handles SIGSEGV.)
        "SigIgn:\t0000000000000000",
        "SigBlk:\t0000000000000000",
        "HTTPS_PROXY=http://127.0.0.1:3128",
    ] {
        assert!(out.contains(present), "{present}:\n{out}\n{err}");
    }
    let pid: i32 = out
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        pid < 100,
        "the command's pid {pid} is in the container's own PID namespace"
    );
    assert!(h.container_dir(&c).join("fs/workspace/w").is_file());
    assert!(!std::path::Path::new("/etc/stockade-probe").exists());
    // /artifacts is read from the host, by key.
    let arts = h.linux.list_artifacts("iso").await.unwrap();
    assert_eq!(arts.len(), 1);
    assert_eq!(arts[0].name, "report.txt");
    assert_eq!(
        h.linux
            .read_artifact("iso", "report.txt", 0, 100)
            .await
            .unwrap(),
        b"data\n"
    );
    assert!(h.linux.read_artifact("iso", "../x", 0, 10).await.is_err());
    // A symlink planted in /artifacts is never followed.
    h.linux
        .run(&c, h.cmd("ln -s /etc/passwd /artifacts/leak"), DEADLINE)
        .await
        .unwrap();
    assert!(matches!(
        h.linux.read_artifact("iso", "leak", 0, 100).await,
        Err(stockade_runtime::substrate::SubstrateError::Invalid(_))
    ));
    drop(host_port);
    h.finish().await;
}

/// A detached `python3 -m http.server` started with start-process is reachable on the
/// container's loopback by a later run, reports running, and is gone after its kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_server_is_reachable_and_dies_with_its_kill() {
    let h = harness(|_| {}).await;
    let c = h.linux.ensure("server").await.unwrap();
    let mut server = h.cmd("");
    server.argv = vec![
        "python3".into(),
        "-m".into(),
        "http.server".into(),
        "8000".into(),
        "--bind".into(),
        "127.0.0.1".into(),
    ];
    let id = h.linux.start_process(&c, server).await.unwrap();
    // The client waits for the server itself (connect until it answers, with a deadline).
    let client = "import time, urllib.request\n\
                  end = time.time() + 15\n\
                  while True:\n\
                  \x20   try:\n\
                  \x20       print(urllib.request.urlopen('http://127.0.0.1:8000/', timeout=2).status); break\n\
                  \x20   except OSError:\n\
                  \x20       if time.time() > end: raise\n\
                  \x20       time.sleep(0.05)\n";
    let mut run = h.cmd("");
    run.argv = vec!["python3".into(), "-c".into(), client.into()];
    let r = h.linux.run(&c, run, DEADLINE).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "200", "{r:?}");
    let st = h.linux.process_status(&c, &id).await.unwrap().unwrap();
    assert!(st.running && st.exit_code.is_none(), "{st:?}");
    assert!(h.linux.kill_process(&c, &id).await.unwrap() >= 1);
    h.assert_no_marked("after killing the server").await;
    let r = h.linux.run(&c, h.cmd("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), timeout=2)' || echo refused"), DEADLINE).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "refused");
    h.finish().await;
}
