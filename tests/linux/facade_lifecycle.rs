//! The lifecycle through the facade on real containers: checkpoint and abort, artifacts, a
//! supervisor killed from outside, idle eviction, the ticket gate under load, and the
//! real binary SIGKILLed mid-fence and restarted. docs/LIFECYCLE.md maps each
//! transition to the test that proves it.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use stockade_runtime::bindings::{DetachedState, FacadeError, GoneReason};
use stockade_runtime::config::Config;
use stockade_runtime::runtime::CallError;
use stockade_runtime::substrate::Substrate;
use stockade_store::Store;

use crate::facade::{count_cgroups, declarations, facade_err, fx, out, wait_for};
use crate::support::{DEADLINE, marked_processes, require_root_and_cgroup_v2};

/// Checkpoint: the workspace comes back on the next exec (a new container), the
/// detached process is killed and its id reads gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_restores_files_and_ends_detached_processes() {
    let f = fx(|_| {}).await;
    let o =
        f.rt.exec(
            "cp",
            &f.sh("mkdir -p d && printf kept > d/file && echo gone > /tmp/t"),
        )
        .await
        .unwrap();
    assert_eq!(o.exit_code, 0, "{o:?}");
    let id =
        f.rt.start_detached("cp", &f.sh("sleep 1000 & exec sleep 1000"))
            .await
            .unwrap();
    wait_for("the detached tree runs", || f.marked().len() == 2).await;
    let c1 = f.linux.current("cp").await.unwrap().unwrap();
    f.rt.checkpoint("cp").await.unwrap();
    assert!(
        f.marked().is_empty(),
        "checkpoint returns after the container died"
    );
    assert_eq!(f.linux.current("cp").await.unwrap(), None);
    assert!(f.declarations().is_empty(), "checkpoint clears the records");
    assert_eq!(
        f.rt.detached_status("cp", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::Unknown)
    );
    assert_eq!(f.container_cgroups(), 0);
    let o =
        f.rt.exec("cp", &f.sh("cat d/file; ls /tmp | wc -l"))
            .await
            .unwrap();
    assert_eq!(out(&o.stdout), "kept0\n", "{o:?}");
    assert_ne!(
        f.linux.current("cp").await.unwrap().unwrap(),
        c1,
        "a new container"
    );
    f.finish().await;
}

/// Abort keeps nothing of the aborted run: the next container restores the PREVIOUS
/// checkpoint (the restore cache is only written by checkpoint), or an empty
/// workspace when the key never checkpointed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_restores_nothing_of_the_aborted_run() {
    let f = fx(|_| {}).await;
    f.rt.exec("ab", &f.sh("echo one > a")).await.unwrap();
    f.rt.checkpoint("ab").await.unwrap();
    let o =
        f.rt.exec("ab", &f.sh("cat a && echo two > b && echo changed > a"))
            .await
            .unwrap();
    assert_eq!(out(&o.stdout), "one\n");
    let id =
        f.rt.start_detached("ab", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    f.rt.abort("ab").await.unwrap();
    assert!(
        f.marked().is_empty(),
        "abort returns after the container died"
    );
    assert!(f.declarations().is_empty(), "abort clears the records");
    assert_eq!(
        f.rt.detached_status("ab", &id).await.unwrap(),
        DetachedState::Gone(GoneReason::Unknown)
    );
    let o = f.rt.exec("ab", &f.sh("cat a; ls")).await.unwrap();
    assert_eq!(
        out(&o.stdout),
        "one\na\n",
        "the previous checkpoint, not the aborted run"
    );

    // A key that never checkpointed starts empty after an abort.
    f.rt.exec("fresh", &f.sh("echo x > a")).await.unwrap();
    f.rt.abort("fresh").await.unwrap();
    let o = f.rt.exec("fresh", &f.sh("ls | wc -l")).await.unwrap();
    assert_eq!(out(&o.stdout), "0\n");
    // Abort with no live container only clears stale records, and succeeds.
    f.rt.abort("fresh").await.unwrap();
    f.rt.abort("fresh").await.unwrap();
    f.finish().await;
}

/// Artifacts a run wrote are listed and read back byte-exact in chunks; traversal
/// names and symlinks out are invalid input; another key sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_are_listed_read_back_exactly_and_names_cannot_escape() {
    let f = fx(|_| {}).await;
    const N: usize = 300_000;
    let expect: Vec<u8> = (0..N).map(|i| ((i * 7 + 3) % 256) as u8).collect();
    let o = f
        .rt
        .exec(
            "art",
            &f.sh(&format!(
                "mkdir -p /artifacts/bin && python3 -c 'import sys; sys.stdout.buffer.write(bytes((i*7+3)%256 for i in range({N})))' > /artifacts/bin/data.bin && printf small > /artifacts/s.txt && ln -s /etc/passwd /artifacts/link && ln -s /etc /artifacts/etc"
            )),
        )
        .await
        .unwrap();
    assert_eq!(o.exit_code, 0, "{}", out(&o.stderr));
    let list = f.rt.artifacts("art").await.unwrap();
    let got: Vec<_> = list.iter().map(|a| (a.name.as_str(), a.size)).collect();
    assert_eq!(got, vec![("bin/data.bin", N as u64), ("s.txt", 5)]);
    let mut read = Vec::new();
    let chunk = 64 * 1024;
    loop {
        let part =
            f.rt.read_artifact("art", "bin/data.bin", read.len() as u64, chunk)
                .await
                .unwrap();
        if part.is_empty() {
            break;
        }
        assert!(part.len() <= chunk as usize);
        read.extend_from_slice(&part);
    }
    assert!(read == expect, "byte-exact ({} of {N} bytes)", read.len());
    assert_eq!(
        f.rt.read_artifact("art", "s.txt", 2, 100).await.unwrap(),
        b"all"
    );
    for bad in [
        "../s.txt",
        "/etc/passwd",
        "bin/../../x",
        "link",
        "etc/passwd",
        "bin/./data.bin",
        "",
    ] {
        assert!(
            matches!(
                facade_err(f.rt.read_artifact("art", bad, 0, 100).await),
                FacadeError::InvalidInput(_)
            ),
            "{bad:?} must be invalid input"
        );
    }
    assert!(f.rt.artifacts("other").await.unwrap().is_empty());
    assert!(matches!(
        facade_err(f.rt.read_artifact("other", "s.txt", 0, 100).await),
        FacadeError::InvalidInput(_)
    ));
    // Still readable after the container stopped.
    f.rt.abort("art").await.unwrap();
    assert_eq!(
        f.rt.read_artifact("art", "s.txt", 0, 100).await.unwrap(),
        b"small"
    );
    f.finish().await;
}

/// The supervisor SIGKILLed from outside: the event loop runs the guest's on-stop,
/// every declaration is cleared and the detached id reads gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_killed_from_outside_runs_on_stop() {
    let f = fx(|_| {}).await;
    let events = f.rt.spawn_event_loop();
    let id =
        f.rt.start_detached("sk", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    let id2 =
        f.rt.start_detached("sk", &f.sh("exec sleep 1000"))
            .await
            .unwrap();
    assert_eq!(f.declarations().len(), 2);
    let c = f.linux.current("sk").await.unwrap().unwrap();
    let pid = f.linux.supervisor_pid(&c).unwrap();
    stockade_tests::kill(pid, Signal::KILL).expect("kill the supervisor");
    wait_for("on-stop cleared the records", || {
        f.declarations().is_empty()
    })
    .await;
    f.assert_no_marked("the container died with its PID 1")
        .await;
    for i in [&id, &id2] {
        assert!(matches!(
            f.rt.detached_status("sk", i).await.unwrap(),
            DetachedState::Gone(_)
        ));
    }
    assert_eq!(f.linux.current("sk").await.unwrap(), None);
    assert_eq!(f.container_cgroups(), 0);
    // The key gets a new container on its next exec.
    let o = f.rt.exec("sk", &f.sh("echo back")).await.unwrap();
    assert_eq!(out(&o.stdout), "back\n");
    events.abort();
    f.finish().await;
}

/// Idle eviction frees a ticket: with ceiling 1, key B gets in once key A idled out
/// (A was checkpointed: its workspace comes back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_eviction_frees_a_ticket() {
    let f = fx(|c| {
        c.substrate.ceiling = 1;
        c.substrate.idle_timeout_ms = 200;
    })
    .await;
    f.rt.exec("A", &f.sh("echo a > mark")).await.unwrap();
    assert!(matches!(
        facade_err(f.rt.exec("B", &f.sh("true")).await),
        FacadeError::OverCapacity
    ));
    let idle =
        f.rt.spawn_idle_loop(Duration::from_millis(200), Duration::from_millis(50));
    // B was refused above; now retry (bounded) until A idled out and freed its ticket.
    let end = Instant::now() + DEADLINE;
    let o = loop {
        match f.rt.exec("B", &f.sh("echo b")).await {
            Ok(o) => break o,
            Err(CallError::Facade(FacadeError::OverCapacity)) => {
                assert!(Instant::now() < end, "A never idled out");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert_eq!(out(&o.stdout), "b\n");
    assert_eq!(f.linux.current("A").await.unwrap(), None);
    idle.abort();
    let _ = idle.await;
    f.rt.abort("B").await.unwrap();
    let o = f.rt.exec("A", &f.sh("cat mark")).await.unwrap();
    assert_eq!(out(&o.stdout), "a\n", "idle eviction is a checkpoint");
    f.finish().await;
}

/// 32 keys exec at once against ceiling 4: a watcher never sees more than 4 container
/// cgroups. With no admission timeout the refused get `over-capacity`; with one long
/// enough, every exec eventually succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ceiling_holds_under_32_concurrent_keys() {
    for wait_ms in [0u64, 60_000] {
        let f = fx(|c| {
            c.substrate.ceiling = 4;
            c.substrate.admission_timeout_ms = wait_ms;
        })
        .await;
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicUsize::new(0));
        let watcher = {
            let (stop, max, root) = (stop.clone(), max.clone(), f.cgroup_root.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    max.fetch_max(count_cgroups(&root), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(500));
                }
            })
        };
        let mut tasks = Vec::new();
        for i in 0..32 {
            let rt = f.rt.clone();
            let input = f.sh("sleep 0.2");
            tasks.push(tokio::spawn(async move {
                let key = format!("k{i}");
                let r = rt.exec(&key, &input).await;
                if r.is_ok() {
                    rt.abort(&key).await.unwrap();
                }
                r
            }));
        }
        let (mut ok, mut over) = (0, 0);
        for t in tasks {
            match t.await.unwrap() {
                Ok(o) => {
                    assert_eq!(o.exit_code, 0);
                    ok += 1;
                }
                Err(CallError::Facade(FacadeError::OverCapacity)) => over += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        watcher.join().unwrap();
        let max = max.load(Ordering::Relaxed);
        assert!(max <= 4, "{max} container cgroups at once");
        assert!(max >= 1, "the watcher saw containers");
        if wait_ms == 0 {
            assert!(
                ok >= 1 && over >= 1 && ok + over == 32,
                "ok {ok}, over {over}"
            );
        } else {
            assert_eq!(
                (ok, over),
                (32, 0),
                "with admission time every exec gets in"
            );
            assert_eq!(
                max, 4,
                "the gate admitted up to the ceiling while others waited"
            );
        }
        f.finish().await;
    }
}

// ---------------------------------------------------------------------------------
// The real binary, SIGKILLed mid-fence and restarted.
// ---------------------------------------------------------------------------------

/// One HTTP/1.1 request with the token; returns (status, body).
fn http(addr: &str, method: &str, path: &str, token: &str, body: &str) -> (u16, String) {
    stockade_tests::http(addr, method, path, Some(token), body.as_bytes())
}

/// Live (non-zombie) process `pid`.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| !s[i + 2..].starts_with('Z')))
        .unwrap_or(false)
}

/// The container cgroups under a root.
fn cgroup_names(root: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Pids of the supervisors `server` started (its children running `stockade-supervisor`).
fn supervisors_of(server: i32) -> Vec<i32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(server) && cmd.starts_with(b"stockade-supervisor\0") {
            v.push(pid);
        }
    }
    v
}

fn wait_until(why: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting: {why}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn reap(child: &mut Child) {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut c = std::mem::replace(child, Command::new("true").spawn().unwrap());
    std::thread::spawn(move || {
        let _ = tx.send(c.wait());
    });
    rx.recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("{pid} did not exit"))
        .unwrap();
    let _ = child.wait();
}

/// Host SIGKILLed mid-fence with a detached process, then restarted on the same data
/// directory: PR_SET_PDEATHSIG killed every container, the start-up sweep removed the
/// leftover cgroups, the detached id reads `gone(container-unreachable)` and its record
/// is cleared, no grant is open, and a new exec works.
#[test]
fn the_host_killed_mid_fence_and_restarted_leaves_nothing_and_stays_consistent() {
    let v2 = require_root_and_cgroup_v2();
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("stockade-facade-kill-{}", &marker[..12]));
    let cgroup_root: PathBuf = v2.join(format!("stockade-test-{marker}"));
    let data = dir.join("data");
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = Config::embedded();
    cfg.substrate.data_dir = data.clone();
    cfg.substrate.cgroup_root = cgroup_root.display().to_string();
    cfg.substrate.idle_timeout_ms = 0;
    // A warm container too: the host's death must take it, the sweep must remove it.
    cfg.substrate.warm = 1;
    cfg.egress.allow_private_targets = true;
    cfg.api.listen = "127.0.0.1:0".into();
    cfg.api.shutdown_deadline_ms = 2_000;
    let cfg_path = dir.join("wasmtime.toml");
    std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();

    let (mut server, addr) = stockade_tests::spawn_server(&cfg_path);
    let token = std::fs::read_to_string(data.join("api-token"))
        .unwrap()
        .trim()
        .to_string();
    let env = format!(r#""env": {{"STOCKADE_TEST_MARKER": "{marker}"}}"#);
    let (st, body) = http(
        &addr,
        "POST",
        "/v1/sandboxes/hk/detached",
        &token,
        &format!(r#"{{"argv": ["sh", "-c", "sleep 1000 & exec sleep 1000"], {env}}}"#),
    );
    assert_eq!(st, 201, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A long fence with a grant open.
    let fence = {
        let (addr, token) = (addr.clone(), token.clone());
        let body = format!(
            r#"{{"argv": ["sh", "-c", "sleep 1000; echo done"], {env}, "grant": {{"rules": [{{"host": "127.0.0.2"}}]}}}}"#
        );
        std::thread::spawn(move || http(&addr, "POST", "/v1/sandboxes/hk/exec", &token, &body))
    };
    wait_until("the detached tree and the fence run", || {
        marked_processes(&marker).len() >= 4
    });
    // The key's container and the warm one (built in the background).
    wait_until("the key's and the warm container run", || {
        supervisors_of(server.id() as i32).len() == 2 && count_cgroups(&cgroup_root) == 2
    });
    let sups = supervisors_of(server.id() as i32);
    let before = cgroup_names(&cgroup_root);
    stockade_tests::kill(server.id() as i32, Signal::KILL).expect("kill the server");
    reap(&mut server);
    let (st, _) = fence.join().unwrap();
    assert_ne!(st, 200, "the fence never answered");
    wait_until("PR_SET_PDEATHSIG killed the supervisors", || {
        sups.iter().all(|p| !alive(*p))
    });
    wait_until("no process of the containers is alive", || {
        marked_processes(&marker).is_empty()
    });
    {
        let store = Store::open_in(&data).unwrap();
        assert_eq!(
            declarations(&store).len(),
            1,
            "records persist across a host death"
        );
    }

    let (mut server, addr) = stockade_tests::spawn_server(&cfg_path);
    let after = cgroup_names(&cgroup_root);
    assert!(
        before.iter().all(|n| !after.contains(n)),
        "the start-up sweep removed the leftovers (the key's and the warm container): {before:?} {after:?}"
    );
    let (st, body) = http(
        &addr,
        "GET",
        &format!("/v1/sandboxes/hk/detached/{id}"),
        &token,
        "",
    );
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("gone"), Some("container-unreachable")),
        "{body}"
    );
    {
        let store = Store::open_in(&data).unwrap();
        assert!(declarations(&store).is_empty(), "the records are cleared");
    }
    let (st, body) = http(
        &addr,
        "GET",
        &format!("/v1/sandboxes/hk/detached/{id}"),
        &token,
        "",
    );
    // The same reason on the next poll (DESIGN §2.3: a tombstone, not `unknown`).
    assert_eq!(
        (st, body.contains("container-unreachable")),
        (200, true),
        "{body}"
    );
    // A new exec works, in a new container, and no grant is open for it beyond its own.
    let (st, body) = http(
        &addr,
        "POST",
        "/v1/sandboxes/hk/exec",
        &token,
        &format!(
            r#"{{"argv": ["sh", "-c", "echo again; curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://127.0.0.2:9/"], {env}}}"#
        ),
    );
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["exit_code"], 0, "{body}");
    assert_eq!(v["stdout"], "again\n403", "{body}");

    let _ = stockade_tests::kill(server.id() as i32, Signal::TERM);
    reap(&mut server);
    assert!(marked_processes(&marker).is_empty());
    assert_eq!(
        count_cgroups(&cgroup_root),
        0,
        "container cgroups left behind"
    );
    let _ = std::fs::remove_dir(&cgroup_root);
    stockade_tests::assert_no_limits_left(&cgroup_root);
    let mounts = stockade_tests::mounts_under(&dir);
    assert!(
        mounts.is_empty(),
        "container mounts left behind: {mounts:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
