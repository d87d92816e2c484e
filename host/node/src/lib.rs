//! `stockade node`: one machine's linux substrate served to fronts over the network
//! (DESIGN §7, docs/NODE.md). [`protocol`] is the contract, [`auth`] the request
//! signing, [`server`] the routes (verify, own, parse, call), [`owners`] which key
//! owns which container, [`lease`] grant leases, [`idempotency`] retried calls,
//! [`tls`] the node's certificate, key and secret, [`callback`] telling the front a
//! container stopped. [`run`] puts them together, as `serve::serve` does for a front.

pub mod callback;
pub mod idempotency;
pub mod lease;
pub mod owners;
pub mod pty;
pub mod request;
pub mod routes;
pub mod server;
pub mod state;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use axum::Router;
use axum::routing::post;

use stockade_linux::Linux;
use stockade_runtime::config::Config;
use stockade_runtime::substrate::Substrate;
use stockade_runtime::substrate::mock::Mock;
use stockade_store::Store;

/// The node's routes: every call is a `POST`; `run-pty`, a WebSocket upgrade, the one
/// `GET` ([`pty::upgrade`] answers any other call's `GET` 404).
pub fn router(node: Arc<state::Node>) -> Router {
    Router::new()
        .route("/node/v1/{call}", post(server::handle).get(pty::upgrade))
        .with_state(node)
}

/// Run the node until SIGTERM or SIGINT; then revoke every open grant and stop every
/// container.
pub async fn run(config: Config) -> anyhow::Result<()> {
    // Signals first, as `serve` (a SIGTERM while the substrate is built is kept).
    let mut signals = stockade_runtime::signals::Signals::install()
        .context("install the SIGTERM and SIGINT handlers")?;
    config.validate()?;
    config.warn_emptied();
    if !matches!(config.substrate.kind.as_str(), "linux" | "mock") {
        anyhow::bail!(
            "a node serves substrate.kind \"linux\" (or \"mock\" for tests), not {:?}",
            config.substrate.kind
        );
    }
    let listen: SocketAddr = config.node.listen.parse().context("node.listen")?;
    // The port first: a node that cannot serve must not touch (sweep) anything.
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let data_dir = &config.substrate.data_dir;
    stockade_runtime::datadir::secure(data_dir)?;
    let _lock = stockade_runtime::datadir::lock(data_dir)?;
    let store = Arc::new(Store::open_in(data_dir)?);
    let substrate: Arc<dyn Substrate> = match config.substrate.kind.as_str() {
        "mock" => Arc::new(Mock::new(config.substrate.ceiling as usize)),
        _ => {
            let exe = stockade_linux::supervisor_exe(&config.substrate)?;
            let linux = Linux::new(&config, store.clone(), exe).await?;
            // The node's own preview listener (`[preview]`, docs/PREVIEW.md): a door's
            // URL names it, the front hands that URL out. As `serve`: a listener that
            // cannot bind is logged and `open-preview` answers unreachable.
            if config.preview.enabled {
                match linux.serve_previews().await {
                    // A door's path-form URL names this address: 0.0.0.0 leads nowhere.
                    Ok(bound)
                        if bound.ip().is_unspecified() && config.preview.domain.is_empty() =>
                    {
                        tracing::warn!(target: "stockade::preview", listen = %bound, "preview.listen is an unspecified address and no preview.domain is set: doors' URLs name {bound}, which no browser reaches (docs/NODE.md \"Preview doors\")");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(target: "stockade::preview", listen = config.preview.listen, error = %e, "the preview listener could not bind: open-preview answers unreachable");
                    }
                }
            }
            Arc::new(linux)
        }
    };
    let identity =
        tls::Identity::load_or_create(data_dir, &config.node.hostnames).context("node identity")?;
    let front = if config.node.front_url.is_empty() {
        None
    } else {
        let tls = if config.node.front_url.starts_with("https://") {
            Some(stockade_egress::tls::upstream_config(
                &config.egress.extra_ca_files,
            )?)
        } else {
            None
        };
        Some(callback::Front::parse(&config.node.front_url, tls)?)
    };
    let node = state::Node::new(
        &config.node.name,
        substrate.clone(),
        store.clone(),
        stockade_egress::secrets::Secrets::from_config(store.clone(), &config.egress),
        identity.secret().to_vec(),
        state::Settings {
            ceiling: config.substrate.ceiling,
            lease_grace: Duration::from_millis(config.node.lease_grace_ms),
            heartbeat: Duration::from_millis(config.node.heartbeat_ms),
            max_body: config.api.max_body_bytes,
        },
    );
    let leases = lease::spawn(node.leases.clone(), substrate.clone());
    let events = callback::spawn(node.clone(), front);
    let tls_listener = tls::TlsListener::new(listener, identity.server_config()?)?;
    let local = axum::serve::Listener::local_addr(&tls_listener)?;
    let fingerprint = identity.fingerprint();
    tracing::info!(
        target: "stockade::node",
        node = %config.node.name,
        listen = %local,
        substrate = substrate.kind(),
        cert = %identity.cert_path.display(),
        sha256 = %fingerprint,
        secret_file = %identity.secret_path.display(),
        front_url = %config.node.front_url,
        "stockade node serving"
    );
    eprintln!(
        "stockade: node {} serving on https://{local} (substrate {}); certificate {} sha256 {fingerprint}; secret {}",
        config.node.name,
        substrate.kind(),
        identity.cert_path.display(),
        identity.secret_path.display()
    );
    let app = router(node.clone());
    let stopping = Arc::new(tokio::sync::Notify::new());
    let signal = {
        let stopping = stopping.clone();
        async move {
            signals.recv().await;
            tracing::info!(target: "stockade::node", "shutdown requested: no new connections");
            stopping.notify_waiters();
            stopping.notify_one();
        }
    };
    let server = axum::serve(tls_listener, app).with_graceful_shutdown(signal);
    let deadline = Duration::from_millis(config.api.shutdown_deadline_ms);
    tokio::select! {
        r = server => r.context("node server")?,
        _ = async { stopping.notified().await; tokio::time::sleep(deadline).await } => {
            tracing::warn!(target: "stockade::node", ?deadline, "open calls did not finish by the shutdown deadline");
        }
    }
    events.abort();
    leases.abort();
    for container in substrate.open_grants() {
        let _ = substrate.kill_all(&container).await;
        let _ = substrate.revoke_grant(&container).await;
    }
    substrate.shutdown().await;
    tracing::info!(target: "stockade::node", "every grant revoked, every container stopped; bye");
    Ok(())
}
