//! `stockade demo`: the design's story (DESIGN §2.1) end to end on real containers,
//! in-process, printing each step. It needs what the linux substrate needs (root,
//! namespaces; cgroup v2 for full tree kills) and python3 on the host (visible read-only
//! inside).

use std::sync::Arc;

use anyhow::{Context, bail};

use stockade_runtime::bindings::{DetachedState, ExecInput, Grant, Rule};
use stockade_runtime::config::Config;
use stockade_runtime::runtime::CallError;

const KEY: &str = "demo";

fn input(argv: &[&str]) -> ExecInput {
    ExecInput {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: vec![],
        timeout_ms: Some(60_000),
        grant: None,
        approval: None,
        stdin: None,
    }
}

/// Fetch `url` with Python's urllib, which goes through the container's proxy
/// (HTTP_PROXY) for any host NO_PROXY does not name.
fn fetch(url: &str) -> Vec<String> {
    let code = format!(
        "import urllib.request,sys\ntry:\n print(urllib.request.urlopen({url:?}, timeout=10).read().decode())\nexcept Exception as e:\n print('refused:', e); sys.exit(22)"
    );
    vec!["python3".into(), "-c".into(), code]
}

/// A tiny "package registry" on the host's loopback: `GET /simple/<pkg>` answers. It
/// listens on 127.0.0.2: inside a container NO_PROXY names 127.0.0.1 and localhost (a
/// later exec dials a detached server there directly), so a host service the fence
/// should govern must have another address.
async fn registry() -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.2:0").await?;
    let port = l.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]);
                let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
                let body = format!("package index for {path}: demo-pkg-1.0.tar.gz\n");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok((port, task))
}

fn step(n: u32, what: &str) {
    println!("\n== {n}. {what}");
}

/// Run the demo; returns the exit code.
pub async fn run(mut cfg: Config) -> anyhow::Result<i32> {
    let data =
        std::env::temp_dir().join(format!("stockade-demo-{}", uuid::Uuid::new_v4().simple()));
    cfg.substrate.data_dir = data.clone();
    cfg.substrate.kind = "linux".into();
    // The demo's registry listens on the host's loopback; production keeps this false.
    cfg.egress.allow_private_targets = true;
    let svc = crate::serve::build(cfg)
        .await
        .context("start the linux substrate (needs root)")?;
    let rt = Arc::clone(&svc.runtime);
    let (port, registry) = registry().await?;
    let result = story(&rt, port).await;
    rt.shutdown().await;
    registry.abort();
    let _ = std::fs::remove_dir_all(&data);
    result
}

async fn story(
    rt: &std::sync::Arc<stockade_runtime::runtime::Runtime>,
    port: u16,
) -> anyhow::Result<i32> {
    let show = |e: CallError| anyhow::anyhow!("{e}");
    step(
        1,
        &format!(
            "exec with a grant for GET 127.0.0.2/simple/ — the \"install\" step (registry on 127.0.0.2:{port})"
        ),
    );
    let mut install = input(&[]);
    install.argv = fetch(&format!("http://127.0.0.2:{port}/simple/demo-pkg"));
    install.grant = Some(Grant {
        rules: vec![Rule {
            host: "127.0.0.2".into(),
            methods: vec!["GET".into()],
            path_prefix: Some("/simple/".into()),
            headers: vec![],
            intercept: true,
        }],
        ask: false,
    });
    let out = rt.exec(KEY, &install).await.map_err(show)?;
    print!(
        "   exit {} · stdout: {}",
        out.exit_code,
        String::from_utf8_lossy(&out.stdout)
    );
    if out.exit_code != 0 {
        bail!(
            "the granted fetch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    step(
        2,
        "start-detached: python3 -m http.server 8000 (no grant, ever)",
    );
    let mut server = input(&[
        "python3",
        "-m",
        "http.server",
        "8000",
        "--bind",
        "127.0.0.1",
    ]);
    server.timeout_ms = None;
    let id = rt.start_detached(KEY, &server).await.map_err(show)?;
    println!("   id {id}");

    step(3, "a later exec dials the detached server on localhost");
    let dial = "import urllib.request,time\nfor i in range(200):\n try:\n  r=urllib.request.urlopen('http://127.0.0.1:8000/', timeout=2); print('HTTP', r.status, 'from the detached server'); break\n except OSError: time.sleep(0.05)\nelse: raise SystemExit(1)";
    let out = rt
        .exec(KEY, &input(&["python3", "-c", dial]))
        .await
        .map_err(show)?;
    print!(
        "   exit {} · {}",
        out.exit_code,
        String::from_utf8_lossy(&out.stdout)
    );

    step(4, "detached-status");
    let st = rt.detached_status(KEY, &id).await.map_err(show)?;
    println!(
        "   {}",
        crate::render::state_words(&crate::api::detached_state(&st))
    );
    if st != DetachedState::Running {
        bail!("the detached server is not running");
    }

    step(5, "a request outside the grant is denied and recorded");
    let mut outside = install.clone();
    outside.argv = fetch(&format!("http://127.0.0.2:{port}/private/secrets"));
    let out = rt.exec(KEY, &outside).await.map_err(show)?;
    print!(
        "   exit {} · {}",
        out.exit_code,
        String::from_utf8_lossy(&out.stdout)
    );
    println!("   denials in this fence: {}", out.denials);
    for d in rt.denials(KEY).await.map_err(show)? {
        println!(
            "   denial: {} {}{} reason={} fence={}",
            d.method, d.host, d.path, d.reason, d.rule_set
        );
    }

    step(6, "stop-detached: the whole tree dies, nothing is left");
    rt.stop_detached(KEY, &id).await.map_err(show)?;
    let st = rt.detached_status(KEY, &id).await.map_err(show)?;
    println!(
        "   status now {}",
        crate::render::state_words(&crate::api::detached_state(&st))
    );
    let out = rt
        .exec(KEY, &input(&["sh", "-c", "ls /proc | grep -c '^[0-9]'"]))
        .await
        .map_err(show)?;
    print!(
        "   processes left in the container (the counting shell and ls included): {}",
        String::from_utf8_lossy(&out.stdout)
    );
    rt.abort(KEY).await.map_err(show)?;
    println!("\n== done: container aborted, grants revoked");
    Ok(0)
}
