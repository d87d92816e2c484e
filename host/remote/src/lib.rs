//! The `remote` substrate: every WIT `substrate` call made on a node (`stockade
//! node`, docs/NODE.md) over HTTPS, so `stockade serve` drives containers on one or
//! more other machines with the same guest.
//!
//! * **Ids.** A container id given to the guest is `{node}/{node's container id}`: a
//!   call on a container goes to the node its prefix names. The key a container belongs
//!   to is remembered when `ensure` or `current` answers it, and every call on the
//!   container is signed with that key (the node refuses another key's container with
//!   403). A container this front never saw through `ensure`/`current` (a record from
//!   before a restart, say) is `unreachable`, as the linux substrate answers a container
//!   it does not hold; the guest always asks for the key's container first.
//! * **Placement** ([`placement`]): a key lives on one node, recorded in the store; a new
//!   key goes by rendezvous hash, falling through to the next node on `over-capacity`
//!   or `unreachable`.
//! * **Runs** stream their NDJSON lines into the output sink as they arrive; no line
//!   (heartbeats included) for `remote.heartbeat_timeout_ms` is `unreachable`. The same
//!   silence bounds opening a connection to a node, so the calls after a cut link (the
//!   guest's teardown) are told `unreachable` in seconds, not after a TCP timeout.
//! * **Stops** a node reports (its call back, `POST /v1/nodes/events`, verified by
//!   [`Callbacks`]) become [`Event::Stopped`] with the front's id, so `on-stop` reaches
//!   the guest.
//! * **Secrets** set or removed through the API are handed to every node
//!   (`put-secret`, `remove-secret`): the egress proxy that adds them runs there. A node
//!   that misses one is logged; every stored secret is handed to every node again when
//!   the front starts ([`Remote::sync_secrets`]).
//! * **The egress audit** (`GET /v1/sandboxes/{key}/egress`) is the key's node's:
//!   its proxy decided and recorded it (`admitted` and `denials`,
//!   [`Housekeeping::egress_audit`]).
//! * **Preview doors** are the node's: `open-preview` and its kin go to the container's
//!   node, whose own `[preview]` listener serves the door; its URL is handed out as the
//!   node answered it.
//! * **Pending egress decisions** (`ask = true` grants, DESIGN §5) are held by the
//!   proxy of the key's node; the API's approver routes list them over the nodes (a
//!   key's: its node's, keyed; every key's: the union of every node's, node-wide) and
//!   answer one by asking every node node-wide ([`answered`]: the ids are UUIDv4s
//!   drawn on each node, so at most one holds it; no node-prefixed id is needed).
//! * **Uploads**: a streamed stdin (an upload's checked archive) goes as `run-stream`:
//!   signed head, then tagged frames as the chunks arrive ([`stockade_node_protocol::stream`]), so
//!   the front holds a few chunks of it whatever its size.
//!
//! **Shutdown** keeps the in-process server's meaning — after it, this front leaves no
//! grant open and no container of its keys running: the runtime first revokes every
//! grant in [`Housekeeping::open_grants`] (the grants this front applied and did not
//! revoke), then [`Housekeeping::shutdown`] stops, on its node, every container this
//! front ensured or found in its life, and the containers a node's `idle` (with no idle
//! time: every container without a running process) lists for keys placed by this
//! front, so containers from before a front restart go too (one from then with a
//! process still running, never touched since, is left to the node: no node call
//! lists every container). Like the linux substrate's shutdown it takes no snapshot
//! (the guest's checkpoint does). A node that cannot be reached is logged; its leases
//! close its grants and its next idle pass or restart handles its containers.
//! Decided here, not in the runtime: the runtime's shutdown is the same for every
//! substrate.

mod batch;
mod callbacks;
pub mod client;
mod housekeeping;
pub mod placement;

pub use self::callbacks::{CallbackHeaders, CallbackRefused, Callbacks};

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use tokio::sync::broadcast;

use self::client::NodeClient;
use self::placement::Placements;
use stockade_egress::ask::{AnswerError, Pending};
use stockade_egress::rules::Grant;
use stockade_node_protocol::auth;
use stockade_node_protocol::{self as protocol, call};
use stockade_runtime::config::Config;
use stockade_runtime::substrate::{
    Artifact, Command, ContainerId, Denial, Event, FenceCounts, Housekeeping, Output, OutputSink,
    ProcessInfo, Result, RunResult, Substrate, SubstrateError,
};
use stockade_store::Store;

pub use stockade_node_protocol::MAX_STREAMED_STDIN;

/// Most call-back nonces remembered inside the signing window.
const CALLBACK_NONCES: usize = 100_000;

/// A container as the front knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Known {
    key: String,
    node: usize,
    id: String,
}

struct Shared {
    nodes: Vec<NodeClient>,
    containers: Mutex<HashMap<ContainerId, Known>>,
    grants: Mutex<BTreeSet<ContainerId>>,
    events: broadcast::Sender<Event>,
}

/// The remote substrate.
pub struct Remote {
    shared: Arc<Shared>,
    placements: Placements,
    heartbeat_timeout: Duration,
    /// A batch goes as one request (false: its calls one by one, the measured baseline
    /// of docs/BENCHMARKS.md's "Remote exec").
    batches: bool,
    /// A batch's opening `ensure` goes in the batch for a placed key (false: always
    /// alone first, one more round trip: the measured baseline of that cut).
    ensure_in_batch: bool,
    /// A batch's calls after its run go in the same request (false: a second request,
    /// one more round trip: the measured baseline of that cut).
    teardown_in_batch: bool,
}

/// Why the remote substrate could not start.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// No `[[remote.nodes]]`.
    #[error("substrate.kind = \"remote\" needs at least one [[remote.nodes]]")]
    NoNodes,
    /// A node's client could not be made.
    #[error(transparent)]
    Client(#[from] client::ClientError),
}

/// The front's id of a node's container (pure).
pub fn front_id(node: &str, id: &str) -> ContainerId {
    format!("{node}/{id}")
}

/// A front id's (node name, node's id) (pure; `None`: not a remote id).
pub fn split_id(container: &str) -> Option<(&str, &str)> {
    container
        .split_once('/')
        .filter(|(n, i)| !n.is_empty() && !i.is_empty())
}

/// A base64 answer (`read-artifact`).
#[derive(Deserialize)]
struct Base64(#[serde(with = "stockade_runtime::substrate::base64_bytes")] Vec<u8>);

impl Remote {
    /// The remote substrate over `config.remote.nodes`, placing keys in `store`.
    pub fn new(config: &Config, store: Arc<Store>) -> std::result::Result<Remote, RemoteError> {
        let r = &config.remote;
        if r.nodes.is_empty() {
            return Err(RemoteError::NoNodes);
        }
        let timeout = Duration::from_millis(r.call_timeout_ms);
        let heartbeat = Duration::from_millis(r.heartbeat_timeout_ms);
        let nodes = r
            .nodes
            .iter()
            .map(|n| NodeClient::new(n, timeout, heartbeat.min(timeout)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Remote {
            shared: Arc::new(Shared {
                nodes,
                containers: Mutex::new(HashMap::new()),
                grants: Mutex::new(BTreeSet::new()),
                events: broadcast::channel(256).0,
            }),
            placements: Placements::new(store),
            heartbeat_timeout: heartbeat,
            batches: true,
            ensure_in_batch: true,
            teardown_in_batch: true,
        })
    }

    /// This substrate with a batch's calls sent one request each: the same answers in
    /// as many round trips as calls (the benchmark's baseline for `batch`).
    pub fn one_request_per_call(mut self) -> Remote {
        self.batches = false;
        self
    }

    /// This substrate with a batch's opening `ensure` always made alone first (the
    /// benchmark's baseline for carrying it in the batch: one more round trip).
    pub fn ensure_alone(mut self) -> Remote {
        self.ensure_in_batch = false;
        self
    }

    /// This substrate with a batch's calls after its run sent as a second request (the
    /// benchmark's baseline for the teardown in the fence's batch: one more round trip).
    pub fn teardown_alone(mut self) -> Remote {
        self.teardown_in_batch = false;
        self
    }

    /// What the call-back route verifies a node's events with.
    pub fn callbacks(&self) -> Arc<Callbacks> {
        Arc::new(Callbacks {
            shared: self.shared.clone(),
            nonces: Mutex::new(auth::Nonces::new(CALLBACK_NONCES)),
        })
    }

    fn names(&self) -> Vec<&str> {
        self.shared.nodes.iter().map(|n| n.name()).collect()
    }

    fn node_index(&self, name: &str) -> Option<usize> {
        self.shared.nodes.iter().position(|n| n.name() == name)
    }

    fn remember(&self, key: &str, node: usize, id: &str) -> ContainerId {
        let fid = front_id(self.shared.nodes[node].name(), id);
        self.shared.containers_lock().insert(
            fid.clone(),
            Known {
                key: key.to_owned(),
                node,
                id: id.to_owned(),
            },
        );
        fid
    }

    /// The node and key of a container the front knows.
    fn target(&self, container: &str) -> Result<(&NodeClient, Known)> {
        let known = self.shared.containers_lock().get(container).cloned();
        match known {
            Some(k) => Ok((&self.shared.nodes[k.node], k)),
            None => Err(SubstrateError::Unreachable(format!(
                "no live container {container}"
            ))),
        }
    }

    /// The node `key` is placed on (`None`: not placed).
    fn placed(&self, key: &str) -> Result<Option<usize>> {
        match self.placements.get(key)? {
            None => Ok(None),
            Some(name) => match self.node_index(&name) {
                Some(i) => Ok(Some(i)),
                None => Err(SubstrateError::Unreachable(format!(
                    "key {key:?} is placed on node {name:?}, which is not configured"
                ))),
            },
        }
    }

    async fn on_container<T: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        container: &str,
    ) -> Result<T> {
        let (node, k) = self.target(container)?;
        node.call(op, &k.key, &protocol::OnContainer { container: k.id })
            .await
    }

    /// Hand every secret set through the API to every node (at start: a node that
    /// restarted or missed one gets it again). Logged per node and secret.
    pub async fn sync_secrets(&self, store: &Store) {
        let names = match store.secret_names() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(target: "stockade::remote", error = %e, "secrets not read for the nodes");
                return;
            }
        };
        for (name, _) in names {
            let (Ok(Some(value)), Ok(Some(binding))) =
                (store.secret(&name), store.secret_binding(&name))
            else {
                continue;
            };
            self.secret_set(&name, &value, &binding).await;
        }
    }
}

impl Shared {
    fn containers_lock(&self) -> std::sync::MutexGuard<'_, HashMap<ContainerId, Known>> {
        self.containers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn grants_lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<ContainerId>> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, container: &str) {
        self.containers_lock().remove(container);
        self.grants_lock().remove(container);
    }
}

#[async_trait]
impl Substrate for Remote {
    async fn ensure(&self, key: &str) -> Result<ContainerId> {
        if let Some(i) = self.placed(key)? {
            let id: String = self.shared.nodes[i]
                .call(call::ENSURE, key, &protocol::Empty {})
                .await?;
            return Ok(self.remember(key, i, &id));
        }
        let names = self.names();
        let mut refused = Vec::new();
        for i in placement::order(&names, key) {
            match self.shared.nodes[i]
                .call::<_, String>(call::ENSURE, key, &protocol::Empty {})
                .await
            {
                Ok(id) => {
                    self.placements.set(key, names[i])?;
                    tracing::info!(target: "stockade::remote", key, node = names[i], passed_over = refused.len(), "key placed");
                    return Ok(self.remember(key, i, &id));
                }
                Err(e) if placement::falls_through(&e) => {
                    tracing::info!(target: "stockade::remote", key, node = names[i], error = %e, "node passed over for a new key");
                    refused.push(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(placement::exhausted(refused))
    }

    async fn current(&self, key: &str) -> Result<Option<ContainerId>> {
        let Some(i) = self.placed(key)? else {
            return Ok(None);
        };
        let id: Option<String> = self.shared.nodes[i]
            .call(call::CURRENT, key, &protocol::Empty {})
            .await?;
        Ok(id.map(|id| self.remember(key, i, &id)))
    }

    async fn apply_grant(&self, container: &str, fence: &str, grant: Grant) -> Result<()> {
        let (node, k) = self.target(container)?;
        // Open from before it is sent: a call with no answer may have opened it (the
        // node's lease closes it; shutdown revokes it meanwhile).
        self.shared.grants_lock().insert(container.to_owned());
        let r = node
            .call::<_, ()>(
                call::APPLY_GRANT,
                &k.key,
                &protocol::ApplyGrant::new(&k.id, fence, &grant),
            )
            .await;
        if let Err(e) = &r
            && !matches!(e, SubstrateError::Unreachable(_))
        {
            self.shared.grants_lock().remove(container);
        }
        r
    }

    async fn revoke_grant(&self, container: &str) -> Result<FenceCounts> {
        let r: Result<protocol::Counts> = self.on_container(call::REVOKE_GRANT, container).await;
        if !matches!(r, Err(SubstrateError::Unreachable(_))) {
            self.shared.grants_lock().remove(container);
        }
        let c = r?;
        Ok(FenceCounts {
            admitted: c.admitted,
            denied: c.denied,
        })
    }

    async fn run(&self, container: &str, cmd: Command, timeout: Duration) -> Result<RunResult> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut r = self.run_streaming(container, cmd, timeout, tx).await?;
        while let Ok(o) = rx.try_recv() {
            match o {
                Output::Stdout(b) => r.stdout.extend(b),
                Output::Stderr(b) => r.stderr.extend(b),
                Output::Started => {}
            }
        }
        Ok(r)
    }

    async fn run_streaming(
        &self,
        container: &str,
        mut cmd: Command,
        timeout: Duration,
        sink: OutputSink,
    ) -> Result<RunResult> {
        let (node, k) = self.target(container)?;
        if let Some(stdin) = cmd.stdin_stream.take().and_then(|s| s.take()) {
            let head = protocol::RunStream {
                container: k.id,
                cmd,
                timeout_ms: timeout.as_millis() as u64,
                length: None,
                upload: None,
            };
            return node
                .run_stream(&k.key, &head, stdin, self.heartbeat_timeout, &sink)
                .await;
        }
        let req = protocol::Run {
            container: k.id,
            cmd,
            timeout_ms: timeout.as_millis() as u64,
        };
        node.run(&k.key, &req, self.heartbeat_timeout, &sink).await
    }

    /// `run-pty` on the container's node (docs/NODE.md "Terminals"): the terminal is
    /// the node's; its bytes and resizes cross the link for the run's life.
    async fn run_pty(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        session: stockade_runtime::substrate::pty::Session,
    ) -> Result<RunResult> {
        if !cmd.stdin.is_empty() || cmd.stdin_stream.is_some() {
            return Err(SubstrateError::Invalid(
                "a terminal session takes its input from the terminal, not stdin".into(),
            ));
        }
        let (node, k) = self.target(container)?;
        let head = stockade_node_protocol::pty::Head {
            container: k.id,
            cmd,
            timeout_ms: timeout.as_millis() as u64,
            rows: session.size.rows.into(),
            cols: session.size.cols.into(),
        };
        node.run_pty(&k.key, &head, session, self.heartbeat_timeout)
            .await
    }

    /// One signed `batch` request when every call names a container of one node and
    /// key (the fence's do), with no streamed stdin; else the calls one by one (the
    /// same answers, as many round trips). A batch that opens with the `ensure` of a
    /// key not placed yet makes that `ensure` alone (placement), then the rest.
    async fn batch(
        &self,
        calls: Vec<stockade_runtime::substrate::Call>,
        sink: Option<OutputSink>,
    ) -> Result<Vec<Result<stockade_runtime::substrate::Answer>>> {
        if !self.batches {
            return Ok(stockade_runtime::substrate::batch_one_by_one(self, calls, sink).await);
        }
        self.batch_in_requests(calls, sink).await
    }

    async fn start_process(&self, container: &str, cmd: Command) -> Result<String> {
        let (node, k) = self.target(container)?;
        node.call(
            call::START_PROCESS,
            &k.key,
            &protocol::StartProcess {
                container: k.id,
                cmd,
            },
        )
        .await
    }

    async fn list_processes(&self, container: &str) -> Result<Vec<ProcessInfo>> {
        let ps: Vec<protocol::Process> = self.on_container(call::LIST_PROCESSES, container).await?;
        Ok(ps.into_iter().map(process_info).collect())
    }

    async fn process_status(&self, container: &str, id: &str) -> Result<Option<ProcessInfo>> {
        let (node, k) = self.target(container)?;
        let p: Option<protocol::Process> = node
            .call(
                call::PROCESS_STATUS,
                &k.key,
                &protocol::OnProcess {
                    container: k.id,
                    id: id.to_owned(),
                },
            )
            .await?;
        Ok(p.map(process_info))
    }

    async fn kill_process(&self, container: &str, id: &str) -> Result<u32> {
        let (node, k) = self.target(container)?;
        node.call(
            call::KILL_PROCESS,
            &k.key,
            &protocol::OnProcess {
                container: k.id,
                id: id.to_owned(),
            },
        )
        .await
    }

    async fn kill_all(&self, container: &str) -> Result<u32> {
        self.on_container(call::KILL_ALL, container).await
    }

    async fn snapshot(&self, container: &str) -> Result<()> {
        self.on_container(call::SNAPSHOT, container).await
    }

    async fn save_snapshot(&self, container: &str, name: &str) -> Result<()> {
        let (node, k) = self.target(container)?;
        let body = protocol::SaveSnapshot {
            container: k.id,
            name: name.to_owned(),
        };
        node.call(call::SAVE_SNAPSHOT, &k.key, &body).await
    }

    /// A named snapshot lives on its key's node, so a fork is made there: a key with no
    /// place yet is placed on its source's node (recorded once the copy is made), and
    /// a key already placed on another node is refused (its checkpoint and artifacts
    /// are there; a copy across nodes is not made).
    async fn fork_snapshot(&self, source: &str, name: &str, key: &str) -> Result<()> {
        let Some(i) = self.placed(source)? else {
            return Err(SubstrateError::Invalid(
                stockade_grammar::names::no_snapshot(source, name),
            ));
        };
        let placed = self.placed(key)?;
        if let Some(j) = placed
            && j != i
        {
            return Err(SubstrateError::Failed(format!(
                "{key} lives on node {:?} and {source}'s snapshots on {:?}: fork onto a new key",
                self.shared.nodes[j].name(),
                self.shared.nodes[i].name()
            )));
        }
        let body = protocol::ForkSnapshot {
            source: source.to_owned(),
            name: name.to_owned(),
        };
        self.shared.nodes[i]
            .call::<_, ()>(call::FORK_SNAPSHOT, key, &body)
            .await?;
        if placed.is_none() {
            let names = self.names();
            self.placements.set(key, names[i])?;
            tracing::info!(target: "stockade::remote", key, source, node = names[i], "key placed with its fork's source");
        }
        Ok(())
    }

    async fn drop_snapshot(&self, key: &str, name: &str) -> Result<bool> {
        let Some(i) = self.placed(key)? else {
            return Ok(false);
        };
        let body = protocol::Named {
            name: name.to_owned(),
        };
        self.shared.nodes[i]
            .call(call::DROP_SNAPSHOT, key, &body)
            .await
    }

    async fn stop(&self, container: &str) -> Result<()> {
        self.on_container::<()>(call::STOP, container).await?;
        self.shared.forget(container);
        Ok(())
    }

    async fn denials(&self, key: &str) -> Result<Vec<Denial>> {
        match self.placed(key)? {
            None => Ok(Vec::new()),
            Some(i) => {
                self.shared.nodes[i]
                    .call(call::DENIALS, key, &protocol::Empty {})
                    .await
            }
        }
    }

    async fn list_artifacts(&self, key: &str) -> Result<Vec<Artifact>> {
        let Some(i) = self.placed(key)? else {
            return Ok(Vec::new());
        };
        let list: Vec<protocol::ArtifactInfo> = self.shared.nodes[i]
            .call(call::LIST_ARTIFACTS, key, &protocol::Empty {})
            .await?;
        Ok(list
            .into_iter()
            .map(|a| Artifact {
                name: a.name,
                size: a.size,
            })
            .collect())
    }

    async fn read_artifact(
        &self,
        key: &str,
        name: &str,
        offset: u64,
        length: u32,
    ) -> Result<Vec<u8>> {
        let Some(i) = self.placed(key)? else {
            return Err(SubstrateError::Invalid(format!("no artifact {name:?}")));
        };
        let b: Base64 = self.shared.nodes[i]
            .call(
                call::READ_ARTIFACT,
                key,
                &protocol::ReadArtifact {
                    name: name.to_owned(),
                    offset,
                    length,
                },
            )
            .await?;
        Ok(b.0)
    }

    /// The door is the node's: its own listener serves it and its URL names that
    /// listener (docs/NODE.md "Preview doors").
    async fn open_preview(
        &self,
        container: &str,
        port: u16,
    ) -> Result<stockade_runtime::substrate::Preview> {
        let (node, k) = self.target(container)?;
        let p: protocol::Preview = node
            .call(
                call::OPEN_PREVIEW,
                &k.key,
                &protocol::OnPort {
                    container: k.id,
                    port,
                },
            )
            .await?;
        Ok(p.into())
    }

    async fn close_preview(&self, container: &str, port: u16) -> Result<bool> {
        let (node, k) = self.target(container)?;
        node.call(
            call::CLOSE_PREVIEW,
            &k.key,
            &protocol::OnPort {
                container: k.id,
                port,
            },
        )
        .await
    }

    async fn list_previews(
        &self,
        container: &str,
    ) -> Result<Vec<stockade_runtime::substrate::Preview>> {
        let ps: Vec<protocol::Preview> = self.on_container(call::LIST_PREVIEWS, container).await?;
        Ok(ps.into_iter().map(Into::into).collect())
    }
}

/// The nodes' answers to one `answer-pending` as the front's (pure): answered on one
/// node wins; else already decided on one (409); else a node that could not be asked
/// may hold it (that node's error); else no node ever held it (404).
pub fn answered(
    id: &str,
    answers: Vec<Result<protocol::PendingAnswer>>,
) -> Result<std::result::Result<Pending, AnswerError>> {
    let mut decided = None;
    let mut failed = None;
    for a in answers {
        match a {
            Ok(protocol::PendingAnswer::Answered(p)) => return Ok(Ok(p)),
            Ok(protocol::PendingAnswer::AlreadyDecided(o)) => decided = Some(o),
            Ok(protocol::PendingAnswer::NotFound) => {}
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if let Some(o) = decided {
        // A name this front does not know (a newer node's) reads as decided all the same.
        let outcome = stockade_egress::ask::Outcome::named(&o).map_or("decided", |o| o.as_str());
        return Ok(Err(AnswerError::Decided {
            id: id.to_owned(),
            outcome,
        }));
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(Err(AnswerError::Unknown(id.to_owned()))),
    }
}

/// A batch answer's `ok` value as the call's type.
fn value<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v)
        .map_err(|e| SubstrateError::Failed(format!("a batch answer that does not parse: {e}")))
}

fn process_info(p: protocol::Process) -> ProcessInfo {
    ProcessInfo {
        id: p.id,
        running: p.running,
        exit_code: p.exit_code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_ids_name_the_node() {
        assert_eq!(front_id("node-1", "c-9"), "node-1/c-9");
        assert_eq!(split_id("node-1/c-9"), Some(("node-1", "c-9")));
        assert_eq!(split_id("node-1/a/b"), Some(("node-1", "a/b")));
        for bad in ["", "c", "/c", "n/"] {
            assert_eq!(split_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn one_answer_is_read_from_every_nodes() {
        use protocol::PendingAnswer::{AlreadyDecided, Answered, NotFound};
        let p = Pending {
            id: "i".into(),
            key: "k".into(),
            fence: "f".into(),
            method: "GET".into(),
            host: "h".into(),
            port: 80,
            path: "/".into(),
            reason: "no-rule".into(),
            at_ms: 1,
            expires_ms: 2,
            widens: "GET h:80/".into(),
        };
        fn down<T>() -> Result<T> {
            Err(SubstrateError::Unreachable("node-2".into()))
        }
        let decided = |o: &'static str| {
            Ok(Err(AnswerError::Decided {
                id: "i".into(),
                outcome: o,
            }))
        };
        /// (row, the nodes' answers, the front's)
        type Row = (
            &'static str,
            Vec<Result<protocol::PendingAnswer>>,
            Result<std::result::Result<Pending, AnswerError>>,
        );
        let rows: Vec<Row> = vec![
            (
                "answered on one node",
                vec![Ok(NotFound), Ok(Answered(p.clone()))],
                Ok(Ok(p.clone())),
            ),
            (
                "answered on one, another down",
                vec![down(), Ok(Answered(p.clone()))],
                Ok(Ok(p.clone())),
            ),
            (
                "decided on one",
                vec![Ok(AlreadyDecided("timed-out".into())), Ok(NotFound)],
                decided("timed-out"),
            ),
            (
                "decided on one, another down",
                vec![down(), Ok(AlreadyDecided("approved".into()))],
                decided("approved"),
            ),
            (
                "an outcome this front does not know",
                vec![Ok(AlreadyDecided("melted".into()))],
                decided("decided"),
            ),
            (
                "unknown everywhere",
                vec![Ok(NotFound), Ok(NotFound)],
                Ok(Err(AnswerError::Unknown("i".into()))),
            ),
            (
                "unknown where asked, a node down: it may be there",
                vec![Ok(NotFound), down()],
                down(),
            ),
            (
                "no node to ask",
                vec![],
                Ok(Err(AnswerError::Unknown("i".into()))),
            ),
        ];
        for (row, answers, want) in rows {
            assert_eq!(answered("i", answers), want, "{row}");
        }
    }

    fn fixture() -> (Remote, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("stockade-remote-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["stockade-node".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("secret"), format!("{}\n", "ab".repeat(32))).unwrap();
        let mut cfg = Config::embedded();
        cfg.remote.nodes = vec![stockade_runtime::config::RemoteNode {
            name: "node-1".into(),
            url: "https://127.0.0.1:9".into(),
            cert_file: dir.join("cert.pem"),
            secret_file: dir.join("secret"),
        }];
        let store = Arc::new(Store::open_in(&dir).unwrap());
        (Remote::new(&cfg, store).unwrap(), dir)
    }

    #[test]
    fn a_call_back_is_accepted_once_and_only_when_signed_by_its_node() {
        let (remote, dir) = fixture();
        let cb = remote.callbacks();
        let mut events = remote.subscribe();
        let body = br#"{"node":"node-1","stopped":"c1"}"#;
        let now = 1_000_000;
        let nonce = auth::nonce();
        let sign = |key: &str, nonce: &str, body: &[u8], secret: &[u8]| {
            auth::Signed {
                time_ms: now,
                nonce,
                method: "POST",
                path: protocol::EVENTS_PATH,
                key,
                idempotency: "",
                body,
            }
            .sign(secret)
        };
        let secret = "ab".repeat(32);
        let sig = sign("k", &nonce, body, secret.as_bytes());
        let t = now.to_string();
        let h = CallbackHeaders {
            node: "node-1",
            time: &t,
            nonce: &nonce,
            key: "k",
            idempotency: "",
            signature: &sig,
        };
        // Another node's name, another secret, another body: refused, no event.
        let unknown = CallbackHeaders {
            node: "node-2",
            ..h
        };
        assert!(matches!(
            cb.accept(&unknown, body, now),
            Err(CallbackRefused::Unauthenticated(_))
        ));
        let forged = sign("k", &nonce, body, b"another secret of 32 characters!");
        let bad = CallbackHeaders {
            signature: &forged,
            ..h
        };
        assert!(matches!(
            cb.accept(&bad, body, now),
            Err(CallbackRefused::Unauthenticated(_))
        ));
        assert!(matches!(
            cb.accept(&h, br#"{"node":"node-1","stopped":"c2"}"#, now),
            Err(CallbackRefused::Unauthenticated(_))
        ));
        assert!(matches!(
            cb.accept(&h, body, now + 31_000),
            Err(CallbackRefused::Unauthenticated(_))
        ));
        assert!(events.try_recv().is_err());
        // The node's: the event, with the front's id.
        assert_eq!(
            cb.accept(&h, body, now),
            Ok(Event::Stopped("node-1/c1".into()))
        );
        assert_eq!(
            events.try_recv().unwrap(),
            Event::Stopped("node-1/c1".into())
        );
        // A replay: refused.
        assert!(matches!(
            cb.accept(&h, body, now),
            Err(CallbackRefused::Unauthenticated(_))
        ));
        // Signed, but naming another node in the body: invalid.
        let n2 = auth::nonce();
        let other = br#"{"node":"node-9","stopped":"c1"}"#;
        let sig2 = sign("k", &n2, other, secret.as_bytes());
        let h2 = CallbackHeaders {
            nonce: &n2,
            signature: &sig2,
            ..h
        };
        assert!(matches!(
            cb.accept(&h2, other, now),
            Err(CallbackRefused::Invalid(_))
        ));
        assert!(events.try_recv().is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn an_unplaced_key_has_no_container_and_an_unknown_container_is_unreachable() {
        let (remote, dir) = fixture();
        assert_eq!(remote.current("k").await, Ok(None));
        assert_eq!(remote.denials("k").await, Ok(vec![]));
        assert!(matches!(
            remote.kill_all("node-1/c").await,
            Err(SubstrateError::Unreachable(_))
        ));
        // Nothing listens on port 9: a new key is unreachable, and not placed.
        assert!(matches!(
            remote.ensure("k").await,
            Err(SubstrateError::Unreachable(_))
        ));
        assert_eq!(remote.placements.get("k"), Ok(None));
        assert_eq!(remote.kind(), "remote");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
