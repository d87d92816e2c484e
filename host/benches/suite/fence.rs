//! Benchmark 1: Fence overhead: `exec /bin/true` through the facade (library call and HTTP) vs
//! the substrate's `run` of `/bin/true` in the same container (a supervisor-level
//! spawn + wait: the raw cost inside the container), interleaved.

use std::time::{Duration, Instant};

use stockade_runtime::substrate::{Call, Substrate, Target};

use crate::common::*;

pub async fn run(env: &Env) -> Vec<Row> {
    let key = "bench-fence";
    let input = true_input();
    // Warm: the container exists, the pool and the caches are hot.
    for _ in 0..20 {
        let o = env.rt.exec(key, &input).await.expect("exec");
        assert_eq!(o.exit_code, 0);
    }
    let c = env.linux.current(key).await.unwrap().expect("container");
    let raw_cmd = cmd(&["/bin/true"], &[]);
    let mut http = env.http();
    let body = r#"{"argv":["/bin/true"],"timeout_ms":30000}"#;
    let path = format!("/v1/sandboxes/{key}/exec");
    let n = iters(400);
    let (mut lib, mut raw, mut api, mut host) = (vec![], vec![], vec![], vec![]);
    for _ in 0..n {
        let t = Instant::now();
        let o = env.rt.exec(key, &input).await.expect("exec");
        lib.push(t.elapsed());
        assert_eq!(o.exit_code, 0);

        let t = Instant::now();
        let r = env
            .linux
            .run(&c, raw_cmd.clone(), Duration::from_secs(30))
            .await
            .expect("run");
        raw.push(t.elapsed());
        assert_eq!(r.exit_code, 0);

        let (status, d) = tokio::task::block_in_place(|| {
            let t = Instant::now();
            let (status, _) = http.request("POST", &path, Some(body));
            (status, t.elapsed())
        });
        assert_eq!(status, 200);
        api.push(d);

        let t = Instant::now();
        let s = std::process::Command::new("/bin/true").status().unwrap();
        host.push(t.elapsed());
        assert!(s.success());
    }
    // The kill-all round trip the fence's teardown adds (no detached processes).
    let mut killall = vec![];
    for _ in 0..iters(200) {
        let t = Instant::now();
        env.linux.kill_all(&c).await.unwrap();
        killall.push(t.elapsed());
    }
    // The runtime's own part of an exec (the guest, the host's imports, the store):
    // the same exec over the mock substrate, whose calls take no time.
    let mock = std::sync::Arc::new(
        stockade_runtime::runtime::Runtime::from_compiled(
            &env.compiled,
            &env.cfg,
            std::sync::Arc::new(stockade_runtime::substrate::mock::Mock::new(16)),
            env.store.clone(),
        )
        .unwrap(),
    );
    let mut on_mock = vec![];
    for i in 0..iters(200) + 20 {
        let t = Instant::now();
        let o = mock.exec("bench-fence-mock", &input).await.expect("exec");
        if i >= 20 {
            on_mock.push(t.elapsed());
        }
        assert_eq!(o.exit_code, 0);
    }
    // The same, each after a host `/bin/true` (as the exec in the loop above follows
    // one): the runtime's part with the caches another process left.
    let mut on_mock_cold = vec![];
    for _ in 0..iters(200) {
        let s = std::process::Command::new("/bin/true").status().unwrap();
        assert!(s.success());
        let t = Instant::now();
        let o = mock.exec("bench-fence-mock", &input).await.expect("exec");
        on_mock_cold.push(t.elapsed());
        assert_eq!(o.exit_code, 0);
    }
    // The HTTP API's part: the same exec over the mock through the API, and the
    // API's cheapest request, each after a host `/bin/true`.
    let mock_api = serve_api(&env.cfg, mock.clone(), env.store.clone(), &env.token).await;
    let mut on_mock_http = Http::connect(mock_api, &env.token);
    let mock_path = "/v1/sandboxes/bench-fence-mock/exec";
    let (mut mock_http, mut health) = (vec![], vec![]);
    for _ in 0..iters(200) {
        let s = std::process::Command::new("/bin/true").status().unwrap();
        assert!(s.success());
        let d = tokio::task::block_in_place(|| {
            let t = Instant::now();
            let (status, _) = on_mock_http.request("POST", mock_path, Some(body));
            assert_eq!(status, 200);
            t.elapsed()
        });
        mock_http.push(d);
        let s = std::process::Command::new("/bin/true").status().unwrap();
        assert!(s.success());
        let d = tokio::task::block_in_place(|| {
            let t = Instant::now();
            let (status, _) = on_mock_http.request("GET", "/v1/health", None);
            assert_eq!(status, 200);
            t.elapsed()
        });
        health.push(d);
    }
    // The fence's other substrate calls, each alone: where its overhead goes.
    let grant = stockade_egress::rules::Grant::deny_all();
    let (mut ensure, mut grants, mut batch) = (vec![], vec![], vec![]);
    for _ in 0..iters(200) {
        // The fence's one batch, made straight on the substrate (no guest).
        let calls = vec![
            Call::Ensure { key: key.into() },
            Call::ApplyGrant {
                container: Target::Ensured,
                fence: "bench-fence".into(),
                grant: grant.clone(),
            },
            Call::Run {
                container: Target::Ensured,
                cmd: raw_cmd.clone(),
                timeout: Duration::from_secs(30),
            },
            Call::KillAll {
                container: Target::Ensured,
            },
            Call::RevokeGrant {
                container: Target::Ensured,
            },
        ];
        let t = Instant::now();
        let answers = env.linux.batch(calls, None).await.unwrap();
        batch.push(t.elapsed());
        assert!(answers.iter().all(Result::is_ok));
        let t = Instant::now();
        env.linux.ensure(key).await.unwrap();
        ensure.push(t.elapsed());
        let t = Instant::now();
        env.linux
            .apply_grant(&c, "bench-fence", grant.clone())
            .await
            .unwrap();
        env.linux.revoke_grant(&c).await.unwrap();
        grants.push(t.elapsed());
    }
    // Paired: each round's exec less the same round's substrate run (and the API's
    // less the library's), so a drift of the machine between rounds cancels out. The
    // medians of these move less from run to run than the rows' medians do.
    let paired = |a: &[Duration], b: &[Duration]| -> (f64, f64) {
        let mut d: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x.as_secs_f64() - y.as_secs_f64()) * 1e6)
            .collect();
        d.sort_by(f64::total_cmp);
        (d[d.len() / 2], d[d.len() * 95 / 100])
    };
    let (lib_over, lib_over95) = paired(&lib, &raw);
    let (api_over, api_over95) = paired(&api, &raw);
    let (api_part, api_part95) = paired(&api, &lib);
    let on_mock = Stats::of(on_mock);
    let on_mock_cold = Stats::of(on_mock_cold);
    let batch = Stats::of(batch);
    let (mock_http, health) = (Stats::of(mock_http), Stats::of(health));
    let (lib, raw, api, host, killall, ensure, grants) = (
        Stats::of(lib),
        Stats::of(raw),
        Stats::of(api),
        Stats::of(host),
        Stats::of(killall),
        Stats::of(ensure),
        Stats::of(grants),
    );
    detail("exec /bin/true, library (Runtime::exec)", &lib);
    detail("exec /bin/true, HTTP API (keep-alive)", &api);
    detail("raw: substrate run /bin/true (same container)", &raw);
    detail("host: std::process::Command /bin/true", &host);
    detail("substrate kill_all (the teardown's round trip)", &killall);
    detail(
        "exec over the mock substrate (the runtime's part)",
        &on_mock,
    );
    detail("… the same, each after a host /bin/true", &on_mock_cold);
    detail("… the same through the HTTP API", &mock_http);
    detail("GET /v1/health, after a host /bin/true", &health);
    println!(
        "  paired, per round (µs): exec − run median {lib_over:.0} (p95 {lib_over95:.0}); HTTP exec − run {api_over:.0} (p95 {api_over95:.0}); HTTP exec − library exec {api_part:.0} (p95 {api_part95:.0})"
    );
    detail("the fence's batch straight on the substrate", &batch);
    detail("substrate ensure (a live container)", &ensure);
    detail("substrate apply_grant + revoke_grant", &grants);
    let r_lib = ratio(lib.median, raw.median);
    let over = lib.median.as_secs_f64() * 1e6 - raw.median.as_secs_f64() * 1e6;
    vec![
        row(
            "1",
            "fence: exec /bin/true, library call (median)",
            format!("{} (p95 {})", fmt_d(lib.median), fmt_d(lib.p95)),
            format!("substrate run {}", fmt_d(raw.median)),
            format!("{r_lib:.2}× (+{over:.0} µs)"),
            "≤ 1.25×",
            Some(r_lib <= 1.25),
        ),
        row(
            "1",
            "fence: exec /bin/true, HTTP API (median)",
            format!("{} (p95 {})", fmt_d(api.median), fmt_d(api.p95)),
            format!("substrate run {}", fmt_d(raw.median)),
            format!(
                "{:.2}× (+{:.0} µs)",
                ratio(api.median, raw.median),
                (api.median.as_secs_f64() - raw.median.as_secs_f64()) * 1e6
            ),
            "–",
            None,
        ),
        row(
            "1",
            "raw spawn on the host, outside any container (median)",
            fmt_d(host.median),
            format!("substrate run {}", fmt_d(raw.median)),
            format!("{:.2}×", ratio(host.median, raw.median)),
            "–",
            None,
        ),
    ]
}
