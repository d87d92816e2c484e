//! An E2B-compatible API in front of Stockade's own (docs/E2B.md): the unmodified
//! `e2b` SDK, pointed at `E2B_API_URL=<server>/e2b` and `E2B_SANDBOX_URL=<server>/e2b/envd`
//! with a Stockade consumer token as `E2B_API_KEY`, creates, uses and kills sandboxes.
//!
//! The layer is a **client of Stockade's public API** (in `stockade serve`, through
//! the server's own router with no connection: `crate::api::in_process`), with the
//! caller's own token (`stockade-client`, as `/mcp` is): every check (the token, its
//! scope, its share, the fence, the floor) is the API's and the guest's; nothing here
//! decides what a command may reach. The same layer could run in front of the edge.
//!
//! * [`control`]: the control plane (`/e2b/sandboxes`, `/e2b/v2/sandboxes`): create,
//!   list, get, kill. A sandbox is a Stockade key derived from a server-made id and the
//!   token's scope ([`ids`]).
//! * [`process`]: envd's `process.Process` service over Connect ([`connect`]).
//! * [`files`]: envd's `/files` (read, write) under `/workspace`.
//! * [`filesystem`]: envd's `filesystem.Filesystem` service (stat, list, make, move,
//!   remove, watch) over Connect, each a fenced exec of one fixed script.
//! * [`snapshots`]: E2B's snapshots on Stockade's named snapshots and forks.
//! * [`domain`]: E2B's domain form (`E2B_DOMAIN`): one HTTPS listener routed by Host
//!   onto these routes, and `get_host(port)` onto a sandbox's preview door.
//!
//! The sandboxes made here are a table ([`Table`]): which id is whose (the SHA-256 of
//! the token that made it), for list, get, kill and envd's routing, written through to
//! the server's store (`e2b_sandboxes`) and loaded at start, so a restart keeps them.
//! Another token's id is the same 404 as an unknown one.

pub mod access;
pub mod connect;
pub mod control;
pub mod domain;
pub mod files;
pub mod filesystem;
pub mod ids;
pub mod listing;
pub mod network;
pub mod process;
pub mod snapshots;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use stockade_client::Client;

/// The control plane's path prefix (`E2B_API_URL` is the server's URL and this).
pub const API_PREFIX: &str = "/e2b";
/// envd's path prefix (`E2B_SANDBOX_URL`).
pub const ENVD_PREFIX: &str = "/e2b/envd";

/// The envd version this layer says it is: the oldest the SDK treats as having what
/// the slice answers (stdin flag, default user, multipart and octet-stream uploads).
pub const ENVD_VERSION: &str = "0.5.7";

/// At most this many sandboxes are remembered at once (a create past it: 429).
pub const MAX_SANDBOXES: usize = 4096;
/// At most this many per token, so one tenant cannot fill the table (a create past
/// it: 429 until it kills some).
pub const MAX_PER_TOKEN: usize = 256;

/// One sandbox made here.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// Its Stockade key.
    pub key: String,
    /// SHA-256 of the token that made it: only that token reaches it.
    pub owner: [u8; 32],
    /// The template asked for.
    pub template: String,
    /// When it was made (ms since the epoch).
    pub started_ms: u64,
    /// Its E2B timeout as created, seconds.
    pub timeout_s: u64,
    /// When it ends (ms since the epoch): the create's timeout, as `set_timeout` and
    /// `connect` extend it; 0 while paused (a paused sandbox has no end, as on E2B).
    pub end_ms: u64,
    /// At its end it pauses (a checkpoint) instead of being killed
    /// (`lifecycle.on_timeout = "pause"`, the create's `autoPause`).
    pub auto_pause: bool,
    /// Paused: checkpointed (its container stopped, `/workspace` kept); `connect`
    /// resumes it.
    pub paused: bool,
    /// Its metadata, as given.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Its network policy: the grant every fenced command of it is given.
    pub policy: network::Policy,
    /// The environment every command of it gets (the create's `envVars`), under the
    /// command's own.
    pub envs: std::collections::BTreeMap<String, String>,
}

/// A killed sandbox whose named snapshots outlive it: their source, so its owner still
/// lists them (and can delete them) after the kill; forgotten with its last snapshot
/// (docs/E2B.md, "Snapshots").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Its Stockade key, which holds the snapshots.
    pub key: String,
    /// SHA-256 of the token that made it.
    pub owner: [u8; 32],
}

/// The sandboxes made here, by id, and the killed ones whose snapshots outlive them.
#[derive(Default)]
pub struct Table {
    by_id: HashMap<String, Sandbox>,
    sources: HashMap<String, Source>,
}

/// What the E2B layer shares.
pub struct E2b {
    /// The API this layer is a client of: this server's (`http://127.0.0.1:PORT`,
    /// reached through [`Self::transport`] when it has one), or, in a gateway
    /// (`stockade e2b serve`), any Stockade API (another server, the edge Worker).
    api: String,
    /// `stockade serve`'s own router, which carries the layer's requests with no
    /// connection (`crate::api::in_process`); none: a connection per request.
    transport: Option<Arc<dyn stockade_client::Transport>>,
    table: Mutex<Table>,
    /// Where the table is kept across restarts (none: memory only, in tests).
    store: Option<Arc<stockade_store::Store>>,
    /// The commands running now, by (sandbox id, pid): how to stop each.
    running: Mutex<HashMap<(String, u32), process::Running>>,
    /// The sync SDK's directory watchers, by (sandbox id, watcher id).
    watchers: Mutex<HashMap<(String, String), filesystem::Watcher>>,
    next_pid: AtomicU32,
    /// `[e2b] internet`: the hosts of `allow_internet_access` (checked at start).
    internet: Vec<String>,
    /// The server's own consumer token: what ends a sandbox at its timeout (the
    /// server ending what it runs; no caller is there), and what envd's routes call
    /// the API with once a sandbox's access token opened it ([`access`]).
    server_token: Option<String>,
    /// What envd's access tokens are derived from ([`access`]): the server's token
    /// (persistent: a restart accepts the tokens it answered), or, in a layer with
    /// none (tests), random bits of this process.
    secret: String,
    /// The domain form's domain (`[e2b] domain`, `--domain`; docs/E2B.md "The domain
    /// form"), answered in a create as `domain`. None: the explicit-URL form only.
    domain: Option<String>,
}

impl E2b {
    /// The layer of the server listening on `local`, its table in memory only.
    pub fn new(local: SocketAddr) -> Arc<Self> {
        Arc::new(Self::build(local, Table::default(), None))
    }

    fn build(local: SocketAddr, table: Table, store: Option<Arc<stockade_store::Store>>) -> Self {
        let ip = match local.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
            ip if ip.is_unspecified() => "[::1]".to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            ip => ip.to_string(),
        };
        Self::of_api(format!("http://{ip}:{}", local.port()), table, store)
    }

    fn of_api(api: String, table: Table, store: Option<Arc<stockade_store::Store>>) -> Self {
        Self {
            api,
            transport: None,
            table: Mutex::new(table),
            store,
            running: Mutex::new(HashMap::new()),
            watchers: Mutex::new(HashMap::new()),
            next_pid: AtomicU32::new(1000),
            internet: Vec::new(),
            server_token: None,
            secret: ids::new_id() + &ids::new_id(),
            domain: None,
        }
    }

    /// The layer of the server listening on `local`, its table kept in `store` (the
    /// rows there loaded now).
    pub fn with_store(
        local: SocketAddr,
        store: Arc<stockade_store::Store>,
    ) -> Result<Arc<Self>, stockade_store::StoreError> {
        let mut by_id = HashMap::new();
        for r in store.e2b_sandboxes()? {
            let Ok(owner) = <[u8; 32]>::try_from(r.owner.as_slice()) else {
                continue;
            };
            let metadata = serde_json::from_str(&r.metadata).unwrap_or_default();
            by_id.insert(
                r.id,
                Sandbox {
                    key: r.key,
                    owner,
                    template: r.template,
                    started_ms: r.started_ms,
                    timeout_s: r.timeout_s,
                    end_ms: r.end_ms,
                    auto_pause: r.auto_pause,
                    paused: r.paused,
                    metadata,
                    policy: network::Policy::from_json(&r.network),
                    envs: serde_json::from_str(&r.envs).unwrap_or_default(),
                },
            );
        }
        let mut sources = HashMap::new();
        for r in store.e2b_sources()? {
            let Ok(owner) = <[u8; 32]>::try_from(r.owner.as_slice()) else {
                continue;
            };
            sources.insert(r.id, Source { key: r.key, owner });
        }
        Ok(Arc::new(Self::build(
            local,
            Table { by_id, sources },
            Some(store),
        )))
    }

    /// The server's layer: its table in `store`, "the internet" from `[e2b] internet`
    /// (a bad entry: an error naming it), sandboxes ended at their timeout with the
    /// server's own `token` (a task on the current runtime, every second), its requests
    /// to the API carried by `transport` (the server's own router: no connection).
    pub fn serve(
        local: SocketAddr,
        store: Arc<stockade_store::Store>,
        internet: &[String],
        token: &str,
        domain: Option<&str>,
        transport: Arc<dyn stockade_client::Transport>,
    ) -> Result<Arc<Self>, String> {
        network::check_internet(internet)?;
        let mut e = Arc::into_inner(Self::with_store(local, store).map_err(|x| x.to_string())?)
            .expect("just made");
        e.transport = Some(transport);
        e.domain = domain.map(str::to_string);
        e.internet = internet.to_vec();
        e.server_token = Some(token.to_string());
        e.secret = token.to_string();
        let e = Arc::new(e);
        tokio::spawn(control::reap(Arc::downgrade(&e)));
        Ok(e)
    }

    /// A gateway's layer (`stockade e2b serve`, docs/E2B.md "In front of any
    /// front"): a client of the Stockade API at `api` (another server, the edge
    /// Worker), its table in memory, "the internet" `internet`, sandboxes ended at
    /// their timeout with `token` (the operator's). `api` must be an `http(s)://` URL.
    pub fn gateway(
        api: &str,
        internet: &[String],
        token: &str,
        domain: Option<&str>,
    ) -> Result<Arc<Self>, String> {
        network::check_internet(internet)?;
        Client::new(api, token).map_err(|x| format!("--server {api:?}: {x}"))?;
        let mut e = Self::of_api(
            api.trim_end_matches('/').to_string(),
            Table::default(),
            None,
        );
        e.internet = internet.to_vec();
        e.domain = domain.map(str::to_string);
        e.server_token = Some(token.to_string());
        e.secret = token.to_string();
        let e = Arc::new(e);
        tokio::spawn(control::reap(Arc::downgrade(&e)));
        Ok(e)
    }

    /// `write` to the store, when the layer has one (a gateway's table is in memory
    /// only): a failed write is a 500, and the caller leaves its table as it was.
    fn write_through<T>(
        &self,
        write: impl FnOnce(&stockade_store::Store) -> stockade_store::Result<T>,
    ) -> Result<(), E2bError> {
        match &self.store {
            Some(store) => write(store)
                .map(drop)
                .map_err(|x| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, x.to_string())),
            None => Ok(()),
        }
    }

    /// Write sandbox `id`'s changing state (its end, paused) through to the store,
    /// then the table; `false` if it is gone.
    fn set_state(&self, id: &str, end_ms: u64, paused: bool) -> Result<bool, E2bError> {
        self.write_through(|store| store.set_e2b_state(id, end_ms, paused))?;
        Ok(match self.table().by_id.get_mut(id) {
            Some(s) => {
                s.end_ms = end_ms;
                s.paused = paused;
                true
            }
            None => false,
        })
    }

    /// Sandbox `id`'s network policy replaced (the store first); `false` when the
    /// table has no such sandbox.
    fn set_policy(&self, id: &str, policy: &network::Policy) -> Result<bool, E2bError> {
        self.write_through(|store| store.set_e2b_network(id, &policy.to_json()))?;
        Ok(match self.table().by_id.get_mut(id) {
            Some(s) => {
                s.policy = policy.clone();
                true
            }
            None => false,
        })
    }

    /// Remember sandbox `id` (written through to the store first: a failed write
    /// remembers nothing).
    fn remember(&self, id: &str, s: &Sandbox) -> Result<(), E2bError> {
        self.write_through(|store| {
            store.put_e2b_sandbox(&stockade_store::E2bSandboxRow {
                id: id.to_string(),
                key: s.key.clone(),
                owner: s.owner.to_vec(),
                template: s.template.clone(),
                started_ms: s.started_ms,
                timeout_s: s.timeout_s,
                metadata: serde_json::Value::Object(s.metadata.clone()).to_string(),
                network: s.policy.to_json(),
                end_ms: s.end_ms,
                auto_pause: s.auto_pause,
                paused: s.paused,
                envs: serde_json::to_string(&s.envs).unwrap_or_else(|_| "{}".into()),
            })
        })?;
        self.table().by_id.insert(id.to_string(), s.clone());
        Ok(())
    }

    /// Forget sandbox `id`.
    fn forget(&self, id: &str) -> Result<(), E2bError> {
        self.write_through(|store| store.remove_e2b_sandbox(id))?;
        self.table().by_id.remove(id);
        Ok(())
    }

    /// Sandbox `id` (`s`) was killed, or ended at its timeout: when its key still
    /// holds any of its snapshots, it is kept as their source, so its owner still lists
    /// them and can delete them (E2B's snapshots outlive their sandbox). A look that
    /// fails keeps it too (a list that then finds none forgets it); a write that fails
    /// is logged, and the snapshots stay usable by id.
    async fn outlive(&self, client: &Client, id: &str, s: &Sandbox) {
        let holds = match client.snapshots(&s.key).await {
            Ok(held) => held.iter().any(|n| ids::source_of(&n.name) == Some(id)),
            Err(_) => true,
        };
        if !holds {
            return;
        }
        let source = Source {
            key: s.key.clone(),
            owner: s.owner,
        };
        match self.keep_source(id, source) {
            Ok(()) => {
                tracing::info!(target: "stockade::e2b", sandbox = %id, key = %s.key, "its snapshots outlive it")
            }
            Err(x) => {
                tracing::warn!(target: "stockade::e2b", sandbox = %id, key = %s.key, error = %x.message, "its snapshots' source could not be kept: they are not listed")
            }
        }
    }

    /// Remember killed sandbox `id` as the source of snapshots that outlive it
    /// (written through to the store first).
    fn keep_source(&self, id: &str, source: Source) -> Result<(), E2bError> {
        self.write_through(|store| {
            store.put_e2b_source(&stockade_store::E2bSourceRow {
                id: id.to_string(),
                key: source.key.clone(),
                owner: source.owner.to_vec(),
            })
        })?;
        self.table().sources.insert(id.to_string(), source);
        Ok(())
    }

    /// Forget killed sandbox `id` as a snapshots' source (its last one is gone).
    fn drop_source(&self, id: &str) -> Result<(), E2bError> {
        self.write_through(|store| store.remove_e2b_source(id))?;
        self.table().sources.remove(id);
        Ok(())
    }

    /// A client of the API with the caller's `token`.
    fn client(&self, token: &str) -> Client {
        // The address was built above as `http://…`: it parses.
        let c = Client::new(&self.api, token).expect("loopback address");
        match &self.transport {
            Some(t) => c.with_transport(t.clone()),
            None => c,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding it leaves a table that is still consistent.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), process::Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn watchers(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), filesystem::Watcher>> {
        self.watchers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pid(&self) -> u32 {
        self.next_pid.fetch_add(1, Ordering::Relaxed)
    }

    /// The sandbox `id` if `token` made it; another token's is `None`, as an unknown
    /// id's is.
    /// Sandbox `id` if `access` is its envd access token ([`access`]).
    fn by_access(&self, access: &str, id: &str) -> Option<Sandbox> {
        if !ids::valid_id(id) || !access::verify(&self.secret, id, access) {
            return None;
        }
        self.table().by_id.get(id).cloned()
    }

    /// Sandbox `id`'s envd access token.
    fn access_token(&self, id: &str) -> String {
        access::token(&self.secret, id)
    }

    /// Sandbox `id`'s traffic access token ([`access::traffic_token`]).
    fn traffic_token(&self, id: &str) -> String {
        access::traffic_token(&self.secret, id)
    }

    fn owned(&self, token: &str, id: &str) -> Option<Sandbox> {
        if !ids::valid_id(id) {
            return None;
        }
        let d = digest(token);
        self.table()
            .by_id
            .get(id)
            .filter(|s| crate::compare::same(&s.owner, &d))
            .cloned()
    }
}

/// SHA-256 of a token.
fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// An error as E2B's API and envd's HTTP routes answer it: `{"code", "message"}`,
/// whose status the SDK turns into its exceptions (401 AuthenticationException, 404
/// NotFoundException, 429 RateLimitException, 400 InvalidArgumentException).
#[derive(Debug)]
pub struct E2bError {
    /// The status.
    pub status: StatusCode,
    /// For people.
    pub message: String,
}

impl E2bError {
    /// An error of `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// The 404 of an id nobody, or another token, made.
    pub fn no_sandbox(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
    }

    /// A missing or wrong key.
    pub fn unauthenticated() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "missing or wrong API key")
    }

    /// The error of a Stockade API call made for the caller.
    pub fn of_client(e: stockade_client::Error) -> Self {
        match e {
            stockade_client::Error::Api {
                status, message, ..
            } => Self::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                message,
            ),
            other => Self::new(StatusCode::BAD_GATEWAY, other.to_string()),
        }
    }
}

/// A body that could not be read (too large, cut off): its status and text.
impl From<axum::extract::rejection::BytesRejection> for E2bError {
    fn from(r: axum::extract::rejection::BytesRejection) -> Self {
        Self::new(r.status(), r.body_text())
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response()
    }
}

/// A header's value as text.
fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The E2B routes, with their own checks (merged beside the API's router, whose auth
/// layer they do not need: each call they make is the API's, with the caller's token).
pub fn router(e: Arc<E2b>, max_body_bytes: usize) -> Router {
    let a = API_PREFIX;
    let v = ENVD_PREFIX;
    Router::new()
        .route(
            &format!("{a}/sandboxes"),
            post(control::create).get(control::list),
        )
        .route(
            &format!("{a}/v2/sandboxes"),
            post(control::create).get(control::list),
        )
        .route(
            &format!("{a}/sandboxes/{{id}}"),
            get(control::info).delete(control::kill),
        )
        .route(
            &format!("{a}/sandboxes/{{id}}/connect"),
            post(control::connect),
        )
        .route(
            &format!("{a}/v2/sandboxes/{{id}}/connect"),
            post(control::connect),
        )
        .route(
            &format!("{a}/sandboxes/{{id}}/timeout"),
            post(control::set_timeout),
        )
        .route(&format!("{a}/sandboxes/{{id}}/pause"), post(control::pause))
        .route(
            &format!("{a}/sandboxes/{{id}}/network"),
            axum::routing::put(control::update_network),
        )
        .route(
            &format!("{a}/sandboxes/{{id}}/snapshots"),
            post(snapshots::create),
        )
        .route(&format!("{a}/sandboxes/{{id}}/fork"), post(snapshots::fork))
        .route(&format!("{a}/snapshots"), get(snapshots::list))
        .route(
            &format!("{a}/templates/{{id}}"),
            axum::routing::delete(snapshots::delete),
        )
        .route(&format!("{v}/health"), get(files::health))
        .route(&format!("{v}/files"), get(files::read).post(files::write))
        .route(&format!("{v}/process.Process/Start"), post(process::start))
        .route(&format!("{v}/process.Process/List"), post(process::list))
        .route(
            &format!("{v}/process.Process/SendSignal"),
            post(process::send_signal),
        )
        .route(
            &format!("{v}/process.Process/Connect"),
            post(process::connect),
        )
        .route(
            &format!("{v}/process.Process/SendInput"),
            post(process::send_input),
        )
        .route(
            &format!("{v}/process.Process/StreamInput"),
            post(process::stream_input),
        )
        .route(
            &format!("{v}/process.Process/Update"),
            post(process::update),
        )
        .route(
            &format!("{v}/process.Process/CloseStdin"),
            post(process::close_stdin),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/Stat"),
            post(filesystem::stat),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/ListDir"),
            post(filesystem::list_dir),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/MakeDir"),
            post(filesystem::make_dir),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/Move"),
            post(filesystem::move_),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/Remove"),
            post(filesystem::remove),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/WatchDir"),
            post(filesystem::watch_dir),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/CreateWatcher"),
            post(filesystem::create_watcher),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/GetWatcherEvents"),
            post(filesystem::get_watcher_events),
        )
        .route(
            &format!("{v}/filesystem.Filesystem/RemoveWatcher"),
            post(filesystem::remove_watcher),
        )
        // Another procedure of a Connect service (`pkg.Service/Method`) is Connect's
        // `unimplemented`, as envd answers one it does not have.
        .route(
            &format!("{v}/{{service}}/{{method}}"),
            axum::routing::any(unknown_rpc),
        )
        // Everything else under /e2b is E2B's 404, in E2B's shape, whatever the token:
        // never the API's fallback (whose auth layer would answer 401).
        .route(&format!("{a}/{{*rest}}"), axum::routing::any(not_served))
        .route(a, axum::routing::any(not_served))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(e)
}

/// An envd route `/{service}/{method}` not served: a Connect procedure (the service
/// named `package.Service`) is Connect's `unimplemented`, HTTP 404 (the status
/// Connect's clients read as it), whatever the token; anything else E2B's 404.
async fn unknown_rpc(
    axum::extract::Path((service, method)): axum::extract::Path<(String, String)>,
    uri: axum::http::Uri,
) -> Response {
    if !is_connect_service(&service) {
        return not_served(uri).await.into_response();
    }
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({
            "code": connect::Code::Unimplemented.name(),
            "message": format!("{service}/{method} is not served by Stockade's E2B layer"),
        })),
    )
        .into_response()
}

/// Is `s` a Connect service's name, `package.Service` (pure)?
pub fn is_connect_service(s: &str) -> bool {
    let Some((pkg, svc)) = s.rsplit_once('.') else {
        return false;
    };
    let ident = |x: &str| {
        !x.is_empty()
            && x.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    };
    ident(pkg) && ident(svc)
}

/// A route of E2B's this slice does not serve (docs/E2B.md, "What is built").
async fn not_served(uri: axum::http::Uri) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!("{}: not served by Stockade's E2B layer yet", uri.path()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_services_are_package_dot_service() {
        for (s, want) in [
            ("filesystem.Filesystem", true),
            ("process.Process", true),
            ("a.b.C", true),
            ("files", false),
            ("health", false),
            (".Filesystem", false),
            ("filesystem.", false),
            ("a..b", false),
            ("a.b-c", false),
        ] {
            assert_eq!(is_connect_service(s), want, "{s}");
        }
    }
}
