//! `stockade serve`: the store, the substrate, the runtime and the HTTP API, with
//! graceful shutdown on SIGTERM/SIGINT (stop accepting, let open calls finish up to a
//! deadline, revoke every grant, stop every container, write the audit queue, close
//! the store, exit 0).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::api::{self, ApiState};
use stockade_linux::Linux;
use stockade_remote::{Callbacks, Remote};
use stockade_runtime::config::Config;
use stockade_runtime::runtime::Runtime;
use stockade_runtime::signals::Signals;
use stockade_runtime::substrate::Substrate;
use stockade_runtime::substrate::mock::Mock;
use stockade_store::Store;

/// The pieces `serve`, `demo` and the tests assemble.
pub struct Service {
    /// The runtime over the configured substrate.
    pub runtime: Arc<Runtime>,
    /// The configuration it was built from.
    pub config: Config,
    /// A remote substrate's call-back verifier (`POST /v1/nodes/events`).
    pub callbacks: Option<Arc<Callbacks>>,
    /// The mock substrate, when it is the one (its routes: `crate::api::mock`).
    pub mock: Option<Arc<Mock>>,
    /// The data directory's lock, held while the service lives.
    _lock: std::fs::File,
}

/// Build the store, the configured substrate and the runtime.
pub async fn build(config: Config) -> anyhow::Result<Service> {
    config.validate()?;
    // A security list emptied on purpose is honoured, and said (one line each).
    config.warn_emptied();
    let data_dir = &config.substrate.data_dir;
    // Private before anything is read or written in it.
    stockade_runtime::datadir::secure(data_dir)?;
    let lock = stockade_runtime::datadir::lock(data_dir)?;
    let store = Arc::new(Store::open_in(data_dir)?);
    let mut callbacks = None;
    let mut mock = None;
    let substrate: Arc<dyn Substrate> = match config.substrate.kind.as_str() {
        "mock" => {
            // A test double must never pass for a sandbox: said loudly, at every start.
            tracing::warn!(target: "stockade::serve", "substrate \"mock\": a TEST DOUBLE. No container, no fence, no command runs: outcomes are scripted (docs/MOCK.md). Never serve it to anything but tests");
            let m = Arc::new(Mock::new(config.substrate.ceiling as usize));
            mock = Some(m.clone());
            m
        }
        "remote" => {
            let remote = Arc::new(Remote::new(&config, store.clone())?);
            callbacks = Some(remote.callbacks());
            // Every stored secret to every node (one that restarted or missed one).
            let (r, st) = (remote.clone(), store.clone());
            tokio::spawn(async move { r.sync_secrets(&st).await });
            remote
        }
        _ => {
            let exe = stockade_linux::supervisor_exe(&config.substrate)?;
            let linux = Linux::new(&config, store.clone(), exe).await?;
            // The preview doors' listener (DESIGN §8). A listener that cannot bind is
            // logged and leaves expose answering a typed error; the API still serves.
            if config.preview.enabled
                && let Err(e) = linux.serve_previews().await
            {
                tracing::warn!(target: "stockade::preview", listen = config.preview.listen, error = %e, "the preview listener could not bind: expose answers unreachable");
            }
            Arc::new(linux)
        }
    };
    let runtime = Arc::new(Runtime::new(&config, substrate, store)?);
    Ok(Service {
        runtime,
        config,
        callbacks,
        mock,
        _lock: lock,
    })
}

/// A mock script read from a file (`stockade serve --mock --mock-script FILE`): read
/// and checked before anything is built, so a bad one refuses to start.
pub fn read_mock_script(
    path: &std::path::Path,
) -> anyhow::Result<(
    stockade_runtime::substrate::mock::script::Script,
    serde_json::Value,
)> {
    let text = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let script = stockade_runtime::substrate::mock::script::Script::from_value(&doc)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((script, doc))
}

/// Run the server until SIGTERM or SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    serve_with(config, None).await
}

/// [`serve`], the mock (when it is the substrate) answering from `mock_script` from
/// its start.
pub async fn serve_with(
    config: Config,
    mock_script: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let mock_script = match &mock_script {
        Some(_) if config.substrate.kind != "mock" => {
            anyhow::bail!("a mock script is for the mock substrate only (stockade serve --mock)")
        }
        Some(p) => Some(read_mock_script(p)?),
        None => None,
    };
    // The signal handling before anything is built: a SIGTERM in the
    // first moments (the warm pool's first containers being built) would otherwise end
    // the process by the default action and leave their mounts and cgroups to the next
    // start's sweep. Caught here, it waits until the service is built, then shuts it
    // down as any other SIGTERM does.
    let mut signals = Signals::install().context("install the SIGTERM and SIGINT handlers")?;
    let listen: SocketAddr = config.api.listen.parse().context("api.listen")?;
    // E2B's domain form (docs/E2B.md): all four keys or none, checked (the PEMs read)
    // before anything is bound or touched.
    let e2b_domain = crate::e2b::domain::configure(
        config.e2b.domain.as_deref(),
        config.e2b.tls_listen.as_deref(),
        config.e2b.tls_cert.as_deref(),
        config.e2b.tls_key.as_deref(),
        [
            "[e2b] domain",
            "[e2b] tls_listen",
            "[e2b] tls_cert",
            "[e2b] tls_key",
        ],
    )
    .map_err(|m| anyhow::anyhow!("wasmtime.toml: {m}"))?;
    raise_descriptor_limit();
    // The port first: an instance that cannot serve must not touch (sweep) anything.
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let domain_listener = match &e2b_domain {
        Some(d) => Some(
            tokio::net::TcpListener::bind(d.listen)
                .await
                .with_context(|| format!("[e2b] tls_listen: listen on {}", d.listen))?,
        ),
        None => None,
    };
    let svc = build(config).await?;
    if let (Some(m), Some((script, doc))) = (&svc.mock, mock_script) {
        tracing::info!(target: "stockade::mock", rules = script.rules.len(), default = script.default.is_some(), "mock script set");
        m.set_script(script, doc);
    }
    let cfg = &svc.config;
    let (token, token_path) =
        api::load_or_create_token(&cfg.substrate.data_dir).context("API token")?;
    let (approver_token, approver_path) =
        api::load_or_create_approver_token(&cfg.substrate.data_dir).context("approver token")?;
    let local = listener.local_addr()?;
    tracing::info!(
        target: "stockade::serve",
        listen = %local,
        token_file = %token_path.display(),
        substrate = svc.runtime.substrate().kind(),
        allocation = ?svc.runtime.allocation(),
        "stockade serving"
    );
    eprintln!(
        "stockade: serving on http://{local} (substrate {}); API token in {}",
        svc.runtime.substrate().kind(),
        token_path.display()
    );
    let events = svc.runtime.spawn_event_loop();
    let idle = (cfg.substrate.idle_timeout_ms > 0).then(|| {
        let idle_for = Duration::from_millis(cfg.substrate.idle_timeout_ms);
        let every = (idle_for / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        svc.runtime.spawn_idle_loop(idle_for, every)
    });
    // Lifetimes (`set-lifetime`): asked every second, each ended under its key's lock.
    let expire = svc.runtime.spawn_expire_loop(Duration::from_secs(1));
    let state = Arc::new(ApiState {
        runtime: svc.runtime.clone(),
        token,
        approver_token,
        approval_ttl_ms: cfg.floor.approval_ttl_ms,
        secrets: stockade_egress::secrets::Secrets::from_config(
            svc.runtime.store().clone(),
            &cfg.egress,
        ),
        tenants: crate::tenants::Tenants::load(svc.runtime.store().clone(), cfg.substrate.ceiling)
            .context("scoped consumer tokens")?,
    });
    tracing::info!(target: "stockade::serve", approver_token_file = %approver_path.display(), "approvals take the approver token");
    let server_token = state.token.clone();
    let mock_state = state.clone();
    let mcp = crate::mcp::http::McpHttp::new(local, state.token.clone(), &cfg.api.mcp_origins)
        .with_tenants(state.tenants.clone());
    let mut app = api::router(state, cfg.api.max_body_bytes)
        // `/mcp` checks the consumer's token itself (crate::mcp::http).
        .merge(crate::mcp::http::router(mcp, cfg.api.max_body_bytes));
    // E2B's API (docs/E2B.md): a client of this API with the caller's token, its
    // requests handed to this router with no connection (api::in_process).
    let e2b = crate::e2b::E2b::serve(
        local,
        svc.runtime.store().clone(),
        &cfg.e2b.internet,
        &server_token,
        e2b_domain.as_ref().map(|d| d.domain.as_str()),
        Arc::new(api::in_process::InProcess::new(app.clone())),
    )
    .map_err(|m| anyhow::anyhow!("the E2B layer: {m}"))?;
    let e2b_router = crate::e2b::router(e2b.clone(), cfg.api.max_body_bytes);
    app = app.merge(e2b_router.clone());
    // The domain form: one HTTPS listener routed by Host onto the same E2B router.
    // Cancelled when shutdown is requested: the domain listener stops accepting with
    // the API's (its open connections finish as the API's do).
    let domain_stop = tokio_util::sync::CancellationToken::new();
    let domain_task = match (e2b_domain, domain_listener) {
        (Some(d), Some(l)) => {
            tracing::info!(target: "stockade::e2b", listen = %d.listen, domain = %d.domain, "e2b domain form serving");
            let app = crate::e2b::domain::router(e2b, &d.domain, e2b_router);
            let stop = domain_stop.clone();
            Some(tokio::spawn(async move {
                tokio::select! {
                    () = crate::e2b::domain::serve(l, d.tls, app) => {}
                    () = stop.cancelled() => {}
                }
            }))
        }
        _ => None,
    };
    if let Some(m) = &svc.mock {
        // The mock-only routes exist over the mock alone (docs/MOCK.md).
        app = app.merge(api::mock::router(
            mock_state.clone(),
            m.clone(),
            cfg.api.max_body_bytes,
        ));
    }
    if let Some(cb) = &svc.callbacks {
        // Signed by a node, not a bearer token: beside the API's auth layer.
        app = app.merge(api::nodes::router(cb.clone()));
    }
    let stopping = Arc::new(tokio::sync::Notify::new());
    let signal = {
        let stopping = stopping.clone();
        async move {
            signals.recv().await;
            tracing::info!(target: "stockade::serve", "shutdown requested: no new connections");
            domain_stop.cancel();
            stopping.notify_waiters();
            stopping.notify_one();
        }
    };
    // No Nagle: a streamed chunk leaves at once (with it, a small chunk waited ~40 ms
    // for the client's delayed ACK).
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(signal);
    let deadline = Duration::from_millis(cfg.api.shutdown_deadline_ms);
    tokio::select! {
        r = server => r.context("HTTP server")?,
        _ = async { stopping.notified().await; tokio::time::sleep(deadline).await } => {
            tracing::warn!(target: "stockade::serve", ?deadline, "open calls did not finish by the shutdown deadline");
        }
    }
    events.abort();
    expire.abort();
    if let Some(t) = domain_task {
        t.abort();
    }
    if let Some(i) = idle {
        i.abort();
    }
    svc.runtime.shutdown().await;
    // The egress audit's queue into SQLite before the process exits: every
    // proxy has stopped, so nothing is recorded after this.
    if let Err(e) = svc.runtime.store().flush() {
        tracing::warn!(target: "stockade::serve", error = %e, "the egress audit queue could not be written");
    }
    tracing::info!(target: "stockade::serve", "every grant revoked, every container stopped; bye");
    Ok(())
}

/// Raise the soft descriptor limit to the hard one: each container may hold up to
/// `egress::MAX_CONNECTIONS` client connections (and their upstreams), and a
/// default soft limit of 1024 would cap the whole service well below its ceiling.
fn raise_descriptor_limit() {
    let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if let Some(max) = l.maximum
        && l.current.is_none_or(|c| c < max)
    {
        let raised = rustix::process::Rlimit {
            current: Some(max),
            maximum: Some(max),
        };
        if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::Nofile, raised) {
            tracing::warn!(target: "stockade::serve", error = %e, "cannot raise the descriptor limit");
        }
    }
}
