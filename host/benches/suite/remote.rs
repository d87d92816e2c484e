//! Remote exec (docs/BENCHMARKS.md): the substrate over the network. A real `stockade node`
//! (the release binary, its own data directory and cgroup root) on loopback, and a runtime
//! over the `remote` substrate driving it with the same compiled guest, side by side with
//! the in-process runtime over the in-process linux substrate, interleaved:
//! * fence overhead of `exec /bin/true`: remote over loopback vs in-process (goal ≤ 1.3×);
//! * the same five substrate calls a fenced exec makes (ensure, apply-grant, run,
//!   kill-all, revoke-grant: the trace the conformance scenarios pin), made directly
//!   on the remote substrate: the guest's and runtime's share of the remote figure;
//! * live output latency: a command prints the wall clock and sleeps; its first
//!   chunk's arrival through the runtime's output sink, in-process and remote;
//! * context switches per exec and per `health` call, front and node
//!   (`/proc/<pid>/task/*/schedstat`, counted over loops of their own, untimed).
//!
//! `STOCKADE_BENCH_REMOTE_PROFILE=health|exec` (seconds in
//! `STOCKADE_BENCH_REMOTE_PROFILE_SECS`, default 10) runs only that call in a loop on a
//! runtime worker after the warm-up, printing both pids, for `perf record -p` / `strace -p`
//! / callgrind from outside (docs/bench-log/2026-12-03.md, "Remote exec's round trip taken
//! apart").

use std::io::{BufRead, BufReader};
use std::process::{Child, Command as Proc, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use stockade_remote::Remote;
use stockade_remote::client::NodeClient;
use stockade_runtime::config::{Config, RemoteNode};
use stockade_runtime::runtime::{ExecIo, Runtime};
use stockade_runtime::substrate::{Answer, Call, Output, Substrate, Target};
use stockade_store::Store;

use crate::common::*;

/// The node process; killed (SIGTERM, then waited) on drop, its directories removed.
struct Node {
    child: Child,
    _cleanup: Cleanup,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: no preconditions; the pid is our own child's.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_node(env: &Env) -> (Node, Config) {
    let v2 = stockade_linux::cgroup::detect_v2().expect("cgroup v2");
    let tag = &env.marker[..12];
    let data = std::env::temp_dir().join(format!("stockade-bench-node-{tag}"));
    let cgroup_root = v2.join(format!("stockade-bench-node-{}", env.marker));
    let cleanup = Cleanup {
        data: data.clone(),
        cgroup_root: cgroup_root.clone(),
    };
    std::fs::create_dir_all(&data).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = env.cfg.clone();
    cfg.substrate.data_dir = data.join("data");
    cfg.substrate.cgroup_root = cgroup_root.display().to_string();
    cfg.node.listen = format!("127.0.0.1:{port}");
    cfg.node.name = "bench-node".into();
    let path = data.join("node.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let mut child = Proc::new(stockade_exe())
        .args(["node", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stockade node");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("serving on https://") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the node did not start within 60 s");
    let node_dir = cfg.substrate.data_dir.join("node");
    let mut front = env.cfg.clone();
    front.substrate.kind = "remote".into();
    front.substrate.data_dir = data.join("front");
    front.remote.nodes = vec![RemoteNode {
        name: "bench-node".into(),
        url: format!("https://127.0.0.1:{port}"),
        cert_file: node_dir.join("cert.pem"),
        secret_file: node_dir.join("secret"),
    }];
    (
        Node {
            child,
            _cleanup: cleanup,
        },
        front,
    )
}

/// Time from the printed wall clock to the first stdout chunk through the runtime.
async fn first_chunk(rt: &Arc<Runtime>, key: &str) -> Duration {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let input = {
        let mut i = true_input();
        i.argv = vec!["sh".into(), "-c".into(), "date +%s%N; sleep 0.2".into()];
        i
    };
    let rt2 = rt.clone();
    let key2 = key.to_owned();
    let call = tokio::spawn(async move {
        let io = ExecIo {
            output: Some(tx),
            ..ExecIo::default()
        };
        rt2.exec_with(&key2, &input, io).await
    });
    let mut lat = None;
    while let Some(o) = rx.recv().await {
        if let Output::Stdout(b) = o
            && lat.is_none()
        {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            let written: u64 = String::from_utf8_lossy(&b).trim().parse().unwrap();
            lat = Some(now.saturating_sub(Duration::from_nanos(written)));
        }
    }
    call.await.unwrap().expect("exec");
    lat.expect("a stdout chunk")
}

/// Times the threads of `pid` were switched in (`/proc/<pid>/task/*/schedstat`'s
/// third field: time slices run), summed.
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum()
}

/// Context switches per iteration of `body` (`n` of them), of the front (this
/// process) and of the node.
async fn switches_per<F: AsyncFnMut()>(node: u32, n: usize, mut body: F) -> (f64, f64) {
    let me = std::process::id();
    let (f0, n0) = (switches(me), switches(node));
    for _ in 0..n {
        body().await;
    }
    let (f1, n1) = (switches(me), switches(node));
    (
        f1.saturating_sub(f0) as f64 / n as f64,
        n1.saturating_sub(n0) as f64 / n as f64,
    )
}

/// `STOCKADE_BENCH_REMOTE_PROFILE`: one call in a loop on a runtime worker for a while.
async fn profile(what: &str, node: u32, rrt: Arc<Runtime>, probe: Arc<NodeClient>, key: &str) {
    let secs: u64 = std::env::var("STOCKADE_BENCH_REMOTE_PROFILE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    println!(
        "  profile: {what} for {secs} s; front pid {}, node pid {node}",
        std::process::id()
    );
    let (what, key) = (what.to_owned(), key.to_owned());
    let calls = tokio::spawn(async move {
        let input = true_input();
        let end = Instant::now() + Duration::from_secs(secs);
        let mut times = vec![];
        while Instant::now() < end {
            let t = Instant::now();
            if what == "exec" {
                assert_eq!(rrt.exec(&key, &input).await.unwrap().exit_code, 0);
            } else {
                let _: stockade_node_protocol::Health = probe
                    .call("health", "", &serde_json::json!({}))
                    .await
                    .expect("health");
            }
            times.push(t.elapsed());
        }
        times
    })
    .await
    .unwrap();
    detail("profiled calls", &Stats::of(calls));
}

pub async fn run(env: &Env) -> Vec<Row> {
    let (node, front_cfg) = start_node(env);
    std::fs::create_dir_all(&front_cfg.substrate.data_dir).unwrap();
    let store = Arc::new(Store::open_in(&front_cfg.substrate.data_dir).expect("front store"));
    let remote = Arc::new(Remote::new(&front_cfg, store.clone()).expect("remote substrate"));
    let rrt = Arc::new(
        Runtime::from_compiled(&env.compiled, &front_cfg, remote.clone(), store).expect("runtime"),
    );
    // The same front with a batch's calls sent one request each (5 round trips per
    // exec, as before the `batch` call): the baseline of the batch, interleaved.
    let store5 = Arc::new(Store::open_in(&front_cfg.substrate.data_dir).expect("front store"));
    let remote5 = Arc::new(
        Remote::new(&front_cfg, store5.clone())
            .expect("remote substrate")
            .one_request_per_call(),
    );
    let rrt5 = Arc::new(
        Runtime::from_compiled(&env.compiled, &front_cfg, remote5, store5).expect("runtime"),
    );
    // And with the ensure always alone and the teardown in a request of its own (3
    // round trips per exec, as before the ensure went in the first batch), and with
    // the teardown alone only (2, as before it went in the fence's batch): those
    // cuts' baselines, interleaved.
    let store3 = Arc::new(Store::open_in(&front_cfg.substrate.data_dir).expect("front store"));
    let remote3 = Arc::new(
        Remote::new(&front_cfg, store3.clone())
            .expect("remote substrate")
            .ensure_alone()
            .teardown_alone(),
    );
    let rrt3 = Arc::new(
        Runtime::from_compiled(&env.compiled, &front_cfg, remote3, store3).expect("runtime"),
    );
    let store2 = Arc::new(Store::open_in(&front_cfg.substrate.data_dir).expect("front store"));
    let remote2 = Arc::new(
        Remote::new(&front_cfg, store2.clone())
            .expect("remote substrate")
            .teardown_alone(),
    );
    let rrt2 = Arc::new(
        Runtime::from_compiled(&env.compiled, &front_cfg, remote2, store2).expect("runtime"),
    );
    let (lk, rk, rk5, rk3, rk2) = (
        "bench-remote-local",
        "bench-remote",
        "bench-remote-5",
        "bench-remote-3",
        "bench-remote-2",
    );
    let input = true_input();
    for _ in 0..20 {
        assert_eq!(env.rt.exec(lk, &input).await.expect("exec").exit_code, 0);
        assert_eq!(
            rrt.exec(rk, &input).await.expect("remote exec").exit_code,
            0
        );
        assert_eq!(
            rrt5.exec(rk5, &input).await.expect("remote exec").exit_code,
            0
        );
        assert_eq!(
            rrt3.exec(rk3, &input).await.expect("remote exec").exit_code,
            0
        );
        assert_eq!(
            rrt2.exec(rk2, &input).await.expect("remote exec").exit_code,
            0
        );
    }
    let probe = Arc::new(
        NodeClient::new(
            &front_cfg.remote.nodes[0],
            Duration::from_secs(30),
            Duration::from_secs(5),
        )
        .expect("a node client"),
    );
    let node_pid = node.child.id();
    if let Ok(what) = std::env::var("STOCKADE_BENCH_REMOTE_PROFILE") {
        profile(&what, node_pid, rrt.clone(), probe, rk).await;
        rrt.shutdown().await;
        rrt5.shutdown().await;
        rrt3.shutdown().await;
        rrt2.shutdown().await;
        return vec![];
    }
    let grant = stockade_egress::rules::Grant::deny_all();
    let raw = cmd(&["/bin/true"], &[]);
    let n = iters(300);
    let (mut local, mut rem, mut rem5, mut rem3, mut rem2) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut direct, mut direct3, mut direct2, mut direct1) = (vec![], vec![], vec![], vec![]);
    // The fence's calls as a batch carries them.
    let apply_run = |t: Target| {
        [
            Call::ApplyGrant {
                container: t.clone(),
                fence: "bench-fence".into(),
                grant: grant.clone(),
            },
            Call::Run {
                container: t,
                cmd: raw.clone(),
                timeout: Duration::from_secs(30),
            },
        ]
    };
    let teardown = |t: Target| {
        [
            Call::KillAll {
                container: t.clone(),
            },
            Call::RevokeGrant { container: t },
        ]
    };
    for _ in 0..n {
        let t = Instant::now();
        assert_eq!(env.rt.exec(lk, &input).await.unwrap().exit_code, 0);
        local.push(t.elapsed());

        let t = Instant::now();
        assert_eq!(rrt.exec(rk, &input).await.unwrap().exit_code, 0);
        rem.push(t.elapsed());

        let t = Instant::now();
        assert_eq!(rrt5.exec(rk5, &input).await.unwrap().exit_code, 0);
        rem5.push(t.elapsed());

        let t = Instant::now();
        assert_eq!(rrt3.exec(rk3, &input).await.unwrap().exit_code, 0);
        rem3.push(t.elapsed());

        let t = Instant::now();
        assert_eq!(rrt2.exec(rk2, &input).await.unwrap().exit_code, 0);
        rem2.push(t.elapsed());

        // The five calls of the fence, made directly on the remote substrate.
        let t = Instant::now();
        let c = remote.ensure(rk).await.unwrap();
        remote
            .apply_grant(&c, "bench-fence", grant.clone())
            .await
            .unwrap();
        let r = remote
            .run(&c, raw.clone(), Duration::from_secs(30))
            .await
            .unwrap();
        remote.kill_all(&c).await.unwrap();
        remote.revoke_grant(&c).await.unwrap();
        direct.push(t.elapsed());
        assert_eq!(r.exit_code, 0);

        // The same as the guest has made them: ensure, then two batches.
        let t = Instant::now();
        let c = remote.ensure(rk).await.unwrap();
        let on = || Target::Container(c.clone());
        let opened = remote.batch(apply_run(on()).to_vec(), None).await.unwrap();
        let closed = remote.batch(teardown(on()).to_vec(), None).await.unwrap();
        direct3.push(t.elapsed());
        assert!(opened.iter().chain(&closed).all(Result::is_ok));
        assert_eq!(opened.len() + closed.len(), 4);

        // And as the guest makes them for a key with declared processes: two batches,
        // the ensure in the first.
        let t = Instant::now();
        let mut calls = vec![Call::Ensure { key: rk.into() }];
        calls.extend(apply_run(Target::Ensured));
        let opened = remote.batch(calls, None).await.unwrap();
        let Some(Ok(Answer::Ensure(c))) = opened.first() else {
            panic!("the batch's ensure: {opened:?}");
        };
        let closed = remote
            .batch(teardown(Target::Container(c.clone())).to_vec(), None)
            .await
            .unwrap();
        direct2.push(t.elapsed());
        assert!(opened.iter().chain(&closed).all(Result::is_ok));
        assert_eq!(opened.len() + closed.len(), 5);

        // And as the guest makes them for a key with no declared process: one batch.
        let t = Instant::now();
        let mut calls = vec![Call::Ensure { key: rk.into() }];
        calls.extend(apply_run(Target::Ensured));
        calls.extend(teardown(Target::Ensured));
        let all = remote.batch(calls, None).await.unwrap();
        direct1.push(t.elapsed());
        assert!(all.iter().all(Result::is_ok), "{all:?}");
        assert_eq!(all.len(), 5);
    }
    // Per call (the profile in docs/bench-log/2026-12-03.md): each of the five calls timed
    // alone, remote vs the in-process linux substrate, and `health` (a signed call that
    // does no substrate work: TLS, HTTP, signature, nonce and the node's task, nothing
    // else), interleaved.
    let names = ["ensure", "apply-grant", "run", "kill-all", "revoke-grant"];
    let (mut per_local, mut per_remote): (Vec<Vec<Duration>>, Vec<Vec<Duration>>) =
        (vec![vec![]; 5], vec![vec![]; 5]);
    let (mut health, mut health_worker) = (vec![], vec![]);
    for _ in 0..n {
        for (sub, key, out) in [
            (&*env.linux as &dyn Substrate, lk, &mut per_local),
            (&*remote as &dyn Substrate, rk, &mut per_remote),
        ] {
            let t = Instant::now();
            let c = sub.ensure(key).await.unwrap();
            out[0].push(t.elapsed());
            let t = Instant::now();
            sub.apply_grant(&c, "bench-fence", grant.clone())
                .await
                .unwrap();
            out[1].push(t.elapsed());
            let t = Instant::now();
            let r = sub
                .run(&c, raw.clone(), Duration::from_secs(30))
                .await
                .unwrap();
            out[2].push(t.elapsed());
            assert_eq!(r.exit_code, 0);
            let t = Instant::now();
            sub.kill_all(&c).await.unwrap();
            out[3].push(t.elapsed());
            let t = Instant::now();
            sub.revoke_grant(&c).await.unwrap();
            out[4].push(t.elapsed());
        }
        let t = Instant::now();
        let _: stockade_node_protocol::Health = probe
            .call("health", "", &serde_json::json!({}))
            .await
            .expect("health");
        health.push(t.elapsed());
        // The same on a runtime worker, where the guest's calls are made (the loop
        // above runs on `block_on`'s thread, which a worker wakes when an answer comes).
        let p = probe.clone();
        health_worker.push(
            tokio::spawn(async move {
                let t = Instant::now();
                let _: stockade_node_protocol::Health = p
                    .call("health", "", &serde_json::json!({}))
                    .await
                    .expect("health");
                t.elapsed()
            })
            .await
            .unwrap(),
        );
    }
    let mut per_call = vec![];
    for (i, name) in names.iter().enumerate() {
        let (l, r) = (
            Stats::of(per_local[i].clone()),
            Stats::of(per_remote[i].clone()),
        );
        detail(&format!("{name}, in-process"), &l);
        detail(&format!("{name}, remote"), &r);
        per_call.push(format!(
            "{name} {} → {} (+{})",
            fmt_d(l.median),
            fmt_d(r.median),
            fmt_d(r.median.saturating_sub(l.median))
        ));
    }
    let health = Stats::of(health);
    let health_worker = Stats::of(health_worker);
    detail("health (a signed call, no substrate work)", &health);
    detail("health, called on a runtime worker", &health_worker);
    // Context switches (front, node) per exec and per health call, untimed loops.
    let m = iters(100);
    let sw_local = switches_per(node_pid, m, async || {
        assert_eq!(env.rt.exec(lk, &input).await.unwrap().exit_code, 0);
    })
    .await;
    let sw_remote = switches_per(node_pid, m, async || {
        assert_eq!(rrt.exec(rk, &input).await.unwrap().exit_code, 0);
    })
    .await;
    let sw_health = switches_per(node_pid, m, async || {
        let p = probe.clone();
        tokio::spawn(async move {
            let _: stockade_node_protocol::Health = p
                .call("health", "", &serde_json::json!({}))
                .await
                .expect("health");
        })
        .await
        .unwrap();
    })
    .await;
    let switches_row = format!(
        "exec in-process {:.1} (front); exec remote {:.1} + {:.1} (front + node); health on a worker {:.1} + {:.1}",
        sw_local.0, sw_remote.0, sw_remote.1, sw_health.0, sw_health.1
    );
    println!("  context switches per call: {switches_row}");
    let (mut lat_local, mut lat_remote) = (vec![], vec![]);
    for _ in 0..iters(20) {
        lat_local.push(first_chunk(&env.rt, lk).await);
        lat_remote.push(first_chunk(&rrt, rk).await);
    }
    rrt.shutdown().await;
    rrt5.shutdown().await;
    rrt3.shutdown().await;
    rrt2.shutdown().await;
    drop(node);
    let (local, rem, rem5, rem3, rem2) = (
        Stats::of(local),
        Stats::of(rem),
        Stats::of(rem5),
        Stats::of(rem3),
        Stats::of(rem2),
    );
    let (direct, direct3, direct2, direct1) = (
        Stats::of(direct),
        Stats::of(direct3),
        Stats::of(direct2),
        Stats::of(direct1),
    );
    let (lat_local, lat_remote) = (Stats::of(lat_local), Stats::of(lat_remote));
    detail("exec /bin/true, in-process runtime", &local);
    detail("exec /bin/true, remote runtime (loopback)", &rem);
    detail(
        "exec /bin/true, remote runtime, one request per call",
        &rem5,
    );
    detail(
        "exec /bin/true, remote runtime, the ensure and the teardown alone (3 round trips)",
        &rem3,
    );
    detail(
        "exec /bin/true, remote runtime, the teardown alone (2 round trips)",
        &rem2,
    );
    detail("the 5 substrate calls, direct on remote", &direct);
    detail("ensure + 2 batches, direct on remote", &direct3);
    detail(
        "2 batches (the ensure in the first), direct on remote",
        &direct2,
    );
    detail("1 batch (the whole fence), direct on remote", &direct1);
    detail("live output, first chunk, in-process", &lat_local);
    detail("live output, first chunk, remote", &lat_remote);
    let r = ratio(rem.median, local.median);
    // A front that makes more round trips per exec: its exec against the in-process
    // one, and the one-round-trip front's against it.
    let baseline = |what: &str, s: &Stats| {
        row(
            "23",
            format!("remote: exec /bin/true, {what}, median)"),
            format!("{} (p95 {})", fmt_d(s.median), fmt_d(s.p95)),
            format!("in-process {}", fmt_d(local.median)),
            format!(
                "{:.2}× (1 round trip {:.2}×)",
                ratio(s.median, local.median),
                ratio(rem.median, s.median)
            ),
            "–",
            None,
        )
    };
    // The fence's calls made directly in fewer requests: against the five calls, and
    // against the one more request before it.
    let direct_row = |what: &str, s: &Stats, fewer_than: Option<(&str, &Stats)>| {
        let of = fewer_than.map_or(String::new(), |(n, b)| {
            format!(" (of {n} requests {:.2}×)", ratio(s.median, b.median))
        });
        row(
            "23",
            format!("remote: {what} direct (median)"),
            format!("{} (p95 {})", fmt_d(s.median), fmt_d(s.p95)),
            format!("5 calls direct {}", fmt_d(direct.median)),
            format!("{:.2}×{of}", ratio(s.median, direct.median)),
            "–",
            None,
        )
    };
    vec![
        row(
            "23",
            "remote: exec /bin/true over a node on loopback (median)",
            format!("{} (p95 {})", fmt_d(rem.median), fmt_d(rem.p95)),
            format!("in-process {}", fmt_d(local.median)),
            format!("{r:.2}×"),
            "≤ 1.3×",
            Some(r <= 1.3),
        ),
        baseline("a batch's calls one request each (5 round trips", &rem5),
        baseline("the ensure and the teardown alone (3 round trips", &rem3),
        baseline("the teardown alone (2 round trips", &rem2),
        row(
            "23",
            "remote: the fence's 5 substrate calls made directly (median)",
            format!("{} (p95 {})", fmt_d(direct.median), fmt_d(direct.p95)),
            format!("remote exec {}", fmt_d(rem.median)),
            format!("{:.2}×", ratio(rem.median, direct.median)),
            "–",
            None,
        ),
        direct_row(
            "ensure + [apply-grant, run] + [kill-all, revoke-grant]",
            &direct3,
            None,
        ),
        direct_row(
            "[ensure, apply-grant, run] + [kill-all, revoke-grant]",
            &direct2,
            Some(("3", &direct3)),
        ),
        direct_row(
            "[ensure, apply-grant, run, kill-all, revoke-grant]",
            &direct1,
            Some(("2", &direct2)),
        ),
        row(
            "23",
            "remote: one signed call doing no substrate work (health, median)",
            format!("{} (p95 {})", fmt_d(health.median), fmt_d(health.p95)),
            per_call.join("; "),
            "–",
            "–",
            None,
        ),
        row(
            "23",
            "remote: health on a runtime worker (median); context switches per call",
            format!(
                "{} (p95 {})",
                fmt_d(health_worker.median),
                fmt_d(health_worker.p95)
            ),
            switches_row,
            "–",
            "–",
            None,
        ),
        row(
            "23",
            "live output, first chunk: remote vs in-process (median)",
            format!(
                "{} (p95 {})",
                fmt_d(lat_remote.median),
                fmt_d(lat_remote.p95)
            ),
            format!("in-process {}", fmt_d(lat_local.median)),
            format!("{:.2}×", ratio(lat_remote.median, lat_local.median)),
            "–",
            None,
        ),
    ]
}
