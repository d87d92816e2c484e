//! The substrate: the sandbox machinery the guest drives, behind one trait.
//!
//! Three implementations: [`mock`] here (in-memory, deterministic, records every call,
//! injects faults) for the conformance suite, `stockade-linux` (real containers on one
//! machine) for production, and `stockade-remote` (the linux substrate of other
//! machines, `stockade node`, over HTTPS). The same guest `.wasm` drives them all.

pub mod batch;
pub mod mock;
pub mod pty;

use std::time::Duration;

use async_trait::async_trait;

use stockade_egress::rules::Grant;

pub use stockade_egress::FenceCounts;

/// An opaque container id chosen by the substrate.
pub type ContainerId = String;

/// Why a substrate call failed. Mirrors the WIT `substrate-error`, plus `Trap`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubstrateError {
    /// The container or the substrate cannot be reached.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The ticket gate is full.
    #[error("over capacity")]
    OverCapacity,
    /// The request was refused as malformed.
    #[error("invalid: {0}")]
    Invalid(String),
    /// The operation failed.
    #[error("failed: {0}")]
    Failed(String),
    /// Abort the guest call with a trap (only the mock's fault injection produces it):
    /// it proves the host revokes a grant a trapped call left open.
    #[error("trap: {0}")]
    Trap(String),
}

/// Bytes as base64 text in serde formats (the supervisor crate's).
pub use stockade_supervisor::process::base64_bytes;

/// Shorthand for substrate results.
pub type Result<T> = std::result::Result<T, SubstrateError>;

/// A command for the container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Command {
    /// Program and arguments (never empty: the guest validated it).
    pub argv: Vec<String>,
    /// Working directory inside the container.
    pub cwd: String,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Standard input: these bytes, then end of file (empty: `/dev/null`). Base64 in
    /// serde formats (the node protocol's `stdin: base64`, docs/NODE.md).
    #[serde(default, with = "base64_bytes")]
    pub stdin: Vec<u8>,
    /// Standard input that arrives while the command runs, in place of `stdin`: an upload's
    /// archive, streamed from the request's body as it is checked (never held whole:
    /// docs/SECURITY.md, "Uploads"). Set only by the host (never from the guest's
    /// contract).
    #[serde(skip)]
    pub stdin_stream: Option<StdinStream>,
}

/// Standard input streamed into a run: chunks in order; the sender's drop is the end
/// of file. The receiving end is taken once, by the substrate that runs the command.
#[derive(Clone, Default)]
pub struct StdinStream(
    std::sync::Arc<std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<bytes::Bytes>>>>,
);

impl StdinStream {
    /// A stream fed by the sender of `rx`.
    pub fn new(rx: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(Some(rx))))
    }

    /// The chunks' receiver (`None` once taken).
    pub fn take(&self) -> Option<tokio::sync::mpsc::Receiver<bytes::Bytes>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl std::fmt::Debug for StdinStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StdinStream")
    }
}

/// Two streams are equal when they are the same stream.
impl PartialEq for StdinStream {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StdinStream {}

/// What a fenced run produced, and a limit of the container a run reached: what the
/// supervisor's process API answers (the supervisor crate's types).
pub use stockade_supervisor::process::{ResourceLimit, RunResult};

/// A tracked process: the contract's `process-info` itself (the supervisor's record of
/// it, [`stockade_supervisor::ProcessInfo`], converts into it in the linux substrate).
pub use crate::bindings::stockade::sandbox::substrate::ProcessInfo;

/// An egress request the fence refused (the egress crate's record of it).
pub use stockade_egress::audit::Denial;

/// A file under a container's `/artifacts`: the contract's `artifact` itself.
pub use crate::bindings::Artifact;

/// Live output of a fenced run, in the order it was produced per stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// The run is about to start (sent by the runtime before the substrate's run: the
    /// API answers errors before it as a plain error, streams after it).
    Started,
    /// Bytes the command wrote to its stdout.
    Stdout(Vec<u8>),
    /// Bytes the command wrote to its stderr.
    Stderr(Vec<u8>),
}

/// Where a run's live output goes. Unbounded, but what a run sends is bounded by the
/// output limit (`substrate.output_limit` per stream): a slow reader holds at most
/// that much, and never slows the command or its fence.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<Output>;

/// Something the substrate saw happen on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The container stopped without being asked to (its supervisor died, it was
    /// killed from outside). The runtime tells the guest (`on-stop`).
    Stopped(ContainerId),
}

/// What the guest drives: every method is one WIT `substrate` import. A substrate
/// also does the host's own [`Housekeeping`].
#[async_trait]
pub trait Substrate: Housekeeping {
    /// Admit the key behind the ticket gate and return its live container.
    async fn ensure(&self, key: &str) -> Result<ContainerId>;
    /// The key's live container, if any; never creates one.
    async fn current(&self, key: &str) -> Result<Option<ContainerId>>;
    /// Open `grant` as fence `fence` on the container's egress proxy.
    async fn apply_grant(&self, container: &str, fence: &str, grant: Grant) -> Result<()>;
    /// Close the container's fence; the number of requests denied while it was open.
    async fn revoke_grant(&self, container: &str) -> Result<FenceCounts>;
    /// Run a command in its own tree and wait for its leader.
    async fn run(&self, container: &str, cmd: Command, timeout: Duration) -> Result<RunResult>;
    /// [`Substrate::run`], sending the output to `sink` as it is produced; the result
    /// then carries none (it went to the sink). By default, all of it at the end.
    async fn run_streaming(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        sink: OutputSink,
    ) -> Result<RunResult> {
        let mut r = self.run(container, cmd, timeout).await?;
        let (out, err) = (std::mem::take(&mut r.stdout), std::mem::take(&mut r.stderr));
        if !out.is_empty() {
            let _ = sink.send(Output::Stdout(out));
        }
        if !err.is_empty() {
            let _ = sink.send(Output::Stderr(err));
        }
        Ok(r)
    }
    /// [`Substrate::run`] with an interactive terminal in place of captured output
    /// (`stockade shell`): the command's stdin, stdout and stderr are the terminal,
    /// whose ends are `session`'s. By default: a typed `invalid` (this substrate opens
    /// no terminal: the mock; the remote one opens the node's, docs/NODE.md "Terminals").
    async fn run_pty(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        session: pty::Session,
    ) -> Result<RunResult> {
        let _ = (container, cmd, timeout, session);
        Err(SubstrateError::Invalid(
            "unsupported: this substrate opens no terminal sessions".into(),
        ))
    }
    /// Start a tracked process; its UUID.
    async fn start_process(&self, container: &str, cmd: Command) -> Result<String>;
    /// Every tracked process.
    async fn list_processes(&self, container: &str) -> Result<Vec<ProcessInfo>>;
    /// One tracked process, or `None` if the container does not track it.
    async fn process_status(&self, container: &str, id: &str) -> Result<Option<ProcessInfo>>;
    /// Kill one tracked tree and forget it; processes killed.
    async fn kill_process(&self, container: &str, id: &str) -> Result<u32>;
    /// Kill every tracked tree; processes killed.
    async fn kill_all(&self, container: &str) -> Result<u32>;
    /// Snapshot `/workspace` as the key's restore cache.
    async fn snapshot(&self, container: &str) -> Result<()>;
    /// Archive `/workspace` under `name` for the container's key, replacing one of that
    /// name; the container runs on (named snapshots, docs/DESIGN.md §2). By default a
    /// typed refusal: this substrate keeps no named snapshots.
    async fn save_snapshot(&self, _container: &str, _name: &str) -> Result<()> {
        Err(no_snapshots(self.kind()))
    }
    /// Copy `source`'s snapshot `name` into `key`'s restore cache; `Invalid` when
    /// `source` holds no such snapshot.
    async fn fork_snapshot(&self, _source: &str, _name: &str, _key: &str) -> Result<()> {
        Err(no_snapshots(self.kind()))
    }
    /// Delete `key`'s snapshot `name`; true if it existed.
    async fn drop_snapshot(&self, _key: &str, _name: &str) -> Result<bool> {
        Err(no_snapshots(self.kind()))
    }
    /// Stop the container; frees its ticket.
    async fn stop(&self, container: &str) -> Result<()>;
    /// Denials recorded for the key.
    async fn denials(&self, key: &str) -> Result<Vec<Denial>>;
    /// Files under the key's `/artifacts`.
    async fn list_artifacts(&self, key: &str) -> Result<Vec<Artifact>>;
    /// Part of one artifact (name validated by the guest; checked again here).
    async fn read_artifact(
        &self,
        key: &str,
        name: &str,
        offset: u64,
        length: u32,
    ) -> Result<Vec<u8>>;
    /// Open (or answer the open) preview door onto `port` of the container (DESIGN §8):
    /// the substrate's own inbound route (`remote`: the node's, docs/NODE.md "Preview
    /// doors"). By default a typed refusal: this substrate serves no preview route.
    async fn open_preview(&self, _container: &str, _port: u16) -> Result<Preview> {
        Err(no_previews(self.kind()))
    }
    /// Close the container's door onto `port`; true if one was open.
    async fn close_preview(&self, _container: &str, _port: u16) -> Result<bool> {
        Err(no_previews(self.kind()))
    }
    /// The container's open doors, by port.
    async fn list_previews(&self, _container: &str) -> Result<Vec<Preview>> {
        Err(no_previews(self.kind()))
    }
    /// Calls the guest already decided (the WIT `batch`), made in order and stopping at
    /// the first error: one answer per call made. A run's output goes to `sink` when
    /// there is one, after [`Output::Started`] (sent just before the run starts: a call
    /// that fails before it leaves the caller's answer a plain error). `Err`: what was
    /// made is not known (no answer came back). By default the calls one by one, which
    /// is what the in-process substrates do; `remote` sends one request.
    async fn batch(
        &self,
        calls: Vec<Call>,
        sink: Option<OutputSink>,
    ) -> Result<Vec<Result<Answer>>> {
        Ok(batch_one_by_one(self, calls, sink).await)
    }
}

/// The most calls one batch carries (the WIT `batch`'s bound).
pub const MAX_BATCH: usize = 16;

/// The container a batch's apply or run acts on (the WIT `target`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The container the [`Call::Ensure`] that opens the batch answered.
    Ensured,
    /// This container.
    Container(ContainerId),
}

/// One call of a [`Substrate::batch`], with the host's own choices already made (the
/// fence's id, the grant parsed).
#[derive(Debug, Clone)]
pub enum Call {
    /// [`Substrate::ensure`] for this key: only as a batch's first call.
    Ensure {
        /// The key.
        key: String,
    },
    /// [`Substrate::apply_grant`].
    ApplyGrant {
        /// The container.
        container: Target,
        /// The fence's id.
        fence: String,
        /// The parsed grant.
        grant: Grant,
    },
    /// [`Substrate::run`] (or [`Substrate::run_streaming`] with a sink).
    Run {
        /// The container.
        container: Target,
        /// The command.
        cmd: Command,
        /// Its timeout.
        timeout: Duration,
    },
    /// [`Substrate::kill_all`].
    KillAll {
        /// The container.
        container: Target,
    },
    /// [`Substrate::revoke_grant`].
    RevokeGrant {
        /// The container.
        container: Target,
    },
}

impl Call {
    /// The container the call acts on (`None`: an `ensure`).
    pub fn target(&self) -> Option<&Target> {
        match self {
            Call::Ensure { .. } => None,
            Call::ApplyGrant { container, .. }
            | Call::Run { container, .. }
            | Call::KillAll { container }
            | Call::RevokeGrant { container } => Some(container),
        }
    }

    /// The call's name (the node protocol's, the WIT's).
    pub fn name(&self) -> &'static str {
        match self {
            Call::Ensure { .. } => "ensure",
            Call::ApplyGrant { .. } => "apply-grant",
            Call::Run { .. } => "run",
            Call::KillAll { .. } => "kill-all",
            Call::RevokeGrant { .. } => "revoke-grant",
        }
    }
}

/// What a batch's shape check needs to know of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// An `ensure`.
    Ensure,
    /// A call on [`Target::Ensured`].
    OnEnsured,
    /// Any other call.
    Other,
}

impl Call {
    /// The call's [`Shape`].
    pub fn shape(&self) -> Shape {
        self.step().shape()
    }

    /// The call as its batch's [`batch::Plan`] sees it.
    pub fn step(&self) -> batch::Step {
        let kind = match self {
            Call::Ensure { .. } => batch::Kind::Ensure,
            Call::ApplyGrant { .. } => batch::Kind::ApplyGrant,
            Call::KillAll { .. } | Call::RevokeGrant { .. } => batch::Kind::Teardown,
            Call::Run { .. } => batch::Kind::Other,
        };
        let on = match self.target() {
            None => batch::On::Key,
            Some(Target::Ensured) => batch::On::Ensured,
            Some(Target::Container(c)) => batch::On::Container(c.clone()),
        };
        batch::Step { kind, on }
    }

    /// The container the call acts on, mutable (`None`: an `ensure`).
    pub fn target_mut(&mut self) -> Option<&mut Target> {
        match self {
            Call::Ensure { .. } => None,
            Call::ApplyGrant { container, .. }
            | Call::Run { container, .. }
            | Call::KillAll { container }
            | Call::RevokeGrant { container } => Some(container),
        }
    }
}

/// A batch's shape, checked whole before any call is made (the WIT `batch`'s
/// `invalid`; the host's import, the node and the remote front check the same way):
/// 1 to [`MAX_BATCH`] calls, an `ensure` only as the first, and [`Target::Ensured`]
/// only in a batch that opens with one.
pub fn check_batch(shapes: impl ExactSizeIterator<Item = Shape>) -> Result<()> {
    let n = shapes.len();
    if n == 0 || n > MAX_BATCH {
        return Err(SubstrateError::Invalid(format!(
            "a batch carries 1 to {MAX_BATCH} calls, not {n}"
        )));
    }
    let mut opens = false;
    for (i, shape) in shapes.enumerate() {
        match shape {
            Shape::Ensure if i == 0 => opens = true,
            Shape::Ensure => {
                return Err(SubstrateError::Invalid(format!(
                    "call {i} of the batch is an ensure: only its first may be"
                )));
            }
            Shape::OnEnsured if !opens => {
                return Err(SubstrateError::Invalid(format!(
                    "call {i} of the batch names the ensured container, and the batch does not open with an ensure"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// What one call of a [`Substrate::batch`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The key's container.
    Ensure(ContainerId),
    /// The grant is open.
    ApplyGrant,
    /// The run's result (its output in the sink, when there was one).
    Run(RunResult),
    /// Processes killed.
    KillAll(u32),
    /// What the fence admitted and denied.
    RevokeGrant(FenceCounts),
}

/// [`Substrate::batch`] made one call at a time, as its [`batch::Plan`] says.
pub async fn batch_one_by_one<S: Substrate + ?Sized>(
    s: &S,
    calls: Vec<Call>,
    sink: Option<OutputSink>,
) -> Vec<Result<Answer>> {
    // Callers check the shape whole first (an `invalid` for the whole batch); one
    // that did not gets the refusal as the first call's answer, nothing made.
    let mut plan: batch::Plan<Answer, SubstrateError> =
        match batch::Plan::new(calls.iter().map(Call::step).collect()) {
            Ok(p) => p,
            Err(e) => return vec![Err(e)],
        };
    let mut calls: Vec<Option<Call>> = calls.into_iter().map(Some).collect();
    while let Some(next) = plan.next() {
        let Some(call) = calls[next.index].take() else {
            break;
        };
        let on = next.container.unwrap_or_default();
        let r = match call {
            Call::Ensure { key } => s.ensure(&key).await.map(Answer::Ensure),
            Call::ApplyGrant { fence, grant, .. } => s
                .apply_grant(&on, &fence, grant)
                .await
                .map(|()| Answer::ApplyGrant),
            Call::Run { cmd, timeout, .. } => match &sink {
                Some(sink) => {
                    let _ = sink.send(Output::Started);
                    s.run_streaming(&on, cmd, timeout, sink.clone()).await
                }
                None => s.run(&on, cmd, timeout).await,
            }
            .map(Answer::Run),
            Call::KillAll { .. } => s.kill_all(&on).await.map(Answer::KillAll),
            Call::RevokeGrant { .. } => s.revoke_grant(&on).await.map(Answer::RevokeGrant),
        };
        plan.answer(r);
    }
    plan.into_answers()
}

/// A preview door as the contract answers it.
pub use crate::bindings::Preview;

/// The refusal of a substrate that serves no preview route.
pub fn no_previews(kind: &str) -> SubstrateError {
    SubstrateError::Failed(format!("previews are not served by the {kind} substrate"))
}

/// The refusal of a substrate that keeps no named snapshots.
pub fn no_snapshots(kind: &str) -> SubstrateError {
    SubstrateError::Failed(format!(
        "named snapshots are not kept by the {kind} substrate"
    ))
}

/// The host's housekeeping of a substrate, which the guest never drives: what it is,
/// the events it saw on its own, idle containers, open grants at shutdown, shutdown.
#[async_trait]
pub trait Housekeeping: Send + Sync + 'static {
    /// `mock`, `linux` or `remote`.
    fn kind(&self) -> &'static str;
    /// The pending egress decisions (`ask = true` grants, DESIGN §5) the substrate's
    /// proxies hold, oldest first; of `key` only when given. A substrate whose proxies
    /// hold none lists none.
    async fn pending(&self, _key: Option<&str>) -> Result<Vec<stockade_egress::ask::Pending>> {
        Ok(Vec::new())
    }
    /// Answer pending decision `id` once, and only if it is key `of`'s when given
    /// (another key's: [`AnswerError::Foreign`], nothing answered). The inner result is
    /// the decision's: answered, already decided, unknown; the outer the substrate's
    /// (a node that could not be asked). None held: every id is unknown.
    ///
    /// [`AnswerError::Foreign`]: stockade_egress::ask::AnswerError::Foreign
    async fn answer_pending(
        &self,
        id: &str,
        _of: Option<&str>,
        _answer: stockade_egress::ask::Answer,
    ) -> Result<std::result::Result<stockade_egress::ask::Pending, stockade_egress::ask::AnswerError>>
    {
        Ok(Err(stockade_egress::ask::AnswerError::Unknown(
            id.to_owned(),
        )))
    }
    /// Events the substrate saw on its own (containers that stopped).
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event>;
    /// Keys whose container has had no running process and no call for `idle_for`.
    async fn idle(&self, idle_for: Duration) -> Vec<String>;
    /// Containers with a grant open right now (the runtime's shutdown revokes them).
    fn open_grants(&self) -> Vec<ContainerId>;
    /// Stop every container (graceful shutdown).
    async fn shutdown(&self);
    /// A secret was set through the API. A substrate whose egress proxies run on other
    /// machines (`remote`) hands it to them; by default nothing (the proxy reads the
    /// store).
    async fn secret_set(
        &self,
        _name: &str,
        _value: &str,
        _binding: &stockade_grammar::binding::Binding,
    ) {
    }
    /// A secret was removed through the API (see [`Housekeeping::secret_set`]).
    async fn secret_removed(&self, _name: &str) {}
    /// The key's egress audit (admitted requests, denials) when it is kept elsewhere
    /// (`remote`: on the key's node, whose proxy decided them); `None`: in this
    /// process's store, where the API reads it.
    async fn egress_audit(
        &self,
        _key: &str,
    ) -> Option<Result<(Vec<stockade_egress::audit::Admitted>, Vec<Denial>)>> {
        None
    }
    /// A fault armed for an import that is not a substrate call (`records.list`,
    /// `policy.approval`, …): the mock's fault injection reaches the whole import
    /// surface through it. Real substrates inject nothing.
    fn injected(&self, _op: &str) -> Option<SubstrateError> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_BATCH, Shape, check_batch};

    #[test]
    fn a_batch_shape_is_checked_whole() {
        use Shape::{Ensure as E, OnEnsured as On, Other as O};
        let rows: Vec<(&str, Vec<Shape>, bool)> = vec![
            ("the fence's first batch", vec![E, On, On], true),
            ("the teardown's batch", vec![O, O], true),
            ("an ensure alone", vec![E], true),
            ("an ensure then named containers", vec![E, O, O], true),
            ("empty", vec![], false),
            ("too many", vec![O; MAX_BATCH + 1], false),
            ("the most", vec![O; MAX_BATCH], true),
            ("the ensured container, no ensure", vec![On, O], false),
            ("an ensure not first", vec![O, E, On], false),
            ("two ensures", vec![E, E], false),
        ];
        for (what, shapes, ok) in rows {
            assert_eq!(check_batch(shapes.into_iter()).is_ok(), ok, "{what}");
        }
    }
}
