//! The node protocol: what a front (`stockade serve` over `kind = "remote"`, or the
//! edge Worker) sends a node (`stockade node`), and what it answers. One route per WIT
//! `substrate` call, JSON in and out; docs/NODE.md is the same contract in prose.
//!
//! * Every request is `POST {base}/node/v1/{call}` with a JSON body and the signed
//!   headers of [`super::auth`]. The sandbox key a call acts for is the
//!   `x-stockade-key` header (signed), never a body field: a container owned by
//!   another key is refused with 403 before anything is done.
//! * An answer is `200` with [`Answer`]: `{"ok": T}` or `{"error": {"kind", "message"}}`,
//!   the WIT `substrate-error` (a substrate failure is an answer, not an HTTP error).
//!   `401` is a request whose signature, time or nonce is refused; `403` a container
//!   of another key; `400` a body that does not parse (`{"error": …}` too).
//! * `run` answers NDJSON: [`RunLine`]s (output chunks and heartbeats as the command
//!   runs), then exactly one `result` or `error` line.
//! * The node calls its front back when a container stops on its own:
//!   `POST {front}/v1/nodes/events` with [`NodeEvent`], signed the same way.

pub mod auth;
pub mod pty;
pub mod stream;
pub mod upload;

use serde::{Deserialize, Serialize};
use stockade_grammar::rules::RuleSpec;

use stockade_runtime::substrate::{Command, RunResult, SubstrateError};

/// The path prefix of every node route.
pub const PREFIX: &str = "/node/v1/";

/// The front's route a node calls back (signed with the node's secret).
pub const EVENTS_PATH: &str = "/v1/nodes/events";

/// Every node route: one per WIT `substrate` call, then the node's own.
/// The largest stdin a `run` body carries (a streamed one goes as `run-stream`,
/// unbounded): what a node's `run` body bound is made from.
pub const MAX_STREAMED_STDIN: usize = 64 << 20;

pub mod call {
    /// `{}` → container id (the key is the header).
    pub const ENSURE: &str = "ensure";
    /// `{}` → container id or null.
    pub const CURRENT: &str = "current";
    /// [`super::ApplyGrant`] → null.
    pub const APPLY_GRANT: &str = "apply-grant";
    /// [`super::OnContainer`] → [`super::Counts`].
    pub const REVOKE_GRANT: &str = "revoke-grant";
    /// [`super::Run`] → NDJSON [`super::RunLine`]s.
    pub const RUN: &str = "run";
    /// [`super::RunStream`] as the body's first line, then the stdin as frames
    /// ([`crate::stream`]) → NDJSON [`super::RunLine`]s, as `run`.
    pub const RUN_STREAM: &str = "run-stream";
    /// `GET`, a WebSocket upgrade: a run with a terminal ([`crate::pty`]); not
    /// in [`ALL`] (the `POST` calls).
    pub const RUN_PTY: &str = "run-pty";
    /// [`super::StartProcess`] → process id.
    pub const START_PROCESS: &str = "start-process";
    /// [`super::OnContainer`] → [`super::Process`] list.
    pub const LIST_PROCESSES: &str = "list-processes";
    /// [`super::OnProcess`] → [`super::Process`] or null.
    pub const PROCESS_STATUS: &str = "process-status";
    /// [`super::OnProcess`] → processes killed.
    pub const KILL_PROCESS: &str = "kill-process";
    /// [`super::OnContainer`] → processes killed.
    pub const KILL_ALL: &str = "kill-all";
    /// [`super::OnContainer`] → null.
    pub const SNAPSHOT: &str = "snapshot";
    /// [`super::OnContainer`] → null.
    pub const STOP: &str = "stop";
    /// [`super::SaveSnapshot`] → null: the container's `/workspace` archived under a
    /// name, for its key.
    pub const SAVE_SNAPSHOT: &str = "save-snapshot";
    /// [`super::ForkSnapshot`] → null: the source key's snapshot copied into the
    /// signed key's restore cache (both on this node: the front places a forked key
    /// on its source's node).
    pub const FORK_SNAPSHOT: &str = "fork-snapshot";
    /// [`super::Named`] → whether the key's snapshot of that name existed (now gone).
    pub const DROP_SNAPSHOT: &str = "drop-snapshot";
    /// `{}` → the key's denials (the egress crate's `Denial`).
    pub const DENIALS: &str = "denials";
    /// `{}` → the key's admitted egress requests (the egress crate's `Admitted`): with
    /// `denials`, the front's egress audit (`GET /v1/sandboxes/{key}/egress`).
    pub const ADMITTED: &str = "admitted";
    /// `{}` → [`super::ArtifactInfo`] list.
    pub const LIST_ARTIFACTS: &str = "list-artifacts";
    /// [`super::ReadArtifact`] → base64 bytes.
    pub const READ_ARTIFACT: &str = "read-artifact";
    /// Node-wide (empty key): `{}` → [`super::Health`].
    pub const HEALTH: &str = "health";
    /// Node-wide: [`super::Idle`] → keys.
    pub const IDLE: &str = "idle";
    /// Node-wide: [`super::PutSecret`] → null.
    pub const PUT_SECRET: &str = "put-secret";
    /// Node-wide: [`super::RemoveSecret`] → whether it existed.
    pub const REMOVE_SECRET: &str = "remove-secret";
    /// Node-wide: `{}` → container ids with a grant open right now.
    pub const OPEN_GRANTS: &str = "open-grants";
    /// [`super::Batch`] → NDJSON: a run's [`super::RunLine`]s and one
    /// [`super::RunLine::Answer`] per call made (the WIT `batch`).
    pub const BATCH: &str = "batch";
    /// [`super::OnPort`] → [`super::Preview`]: the node's own listener opens (or
    /// answers the open) door onto the port (docs/PREVIEW.md).
    pub const OPEN_PREVIEW: &str = "open-preview";
    /// [`super::OnPort`] → whether a door was open.
    pub const CLOSE_PREVIEW: &str = "close-preview";
    /// [`super::OnContainer`] → [`super::Preview`] list.
    pub const LIST_PREVIEWS: &str = "list-previews";
    /// Keyed or node-wide: `{}` → the pending egress decisions (the egress crate's
    /// `Pending`, oldest first) of the key, or of every key when node-wide.
    pub const PENDING: &str = "pending";
    /// Keyed or node-wide: [`super::AnswerPending`] → [`super::PendingAnswer`]; keyed,
    /// a decision of another key is `403` and stays held.
    pub const ANSWER_PENDING: &str = "answer-pending";

    /// Every call a node serves, in the order above.
    pub const ALL: [&str; 31] = [
        ENSURE,
        CURRENT,
        APPLY_GRANT,
        REVOKE_GRANT,
        RUN,
        RUN_STREAM,
        START_PROCESS,
        LIST_PROCESSES,
        PROCESS_STATUS,
        KILL_PROCESS,
        KILL_ALL,
        SNAPSHOT,
        STOP,
        SAVE_SNAPSHOT,
        FORK_SNAPSHOT,
        DROP_SNAPSHOT,
        DENIALS,
        ADMITTED,
        LIST_ARTIFACTS,
        READ_ARTIFACT,
        HEALTH,
        IDLE,
        PUT_SECRET,
        REMOVE_SECRET,
        OPEN_GRANTS,
        BATCH,
        OPEN_PREVIEW,
        CLOSE_PREVIEW,
        LIST_PREVIEWS,
        PENDING,
        ANSWER_PENDING,
    ];

    /// Calls that act for the key they are signed with, or node-wide when it is empty
    /// (the front's approver API: docs/NODE.md "Pending egress decisions").
    pub fn keyed_or_node_wide(call: &str) -> bool {
        matches!(call, PENDING | ANSWER_PENDING)
    }

    /// Calls that act on no key (their `x-stockade-key` is empty).
    pub fn node_wide(call: &str) -> bool {
        matches!(
            call,
            HEALTH | IDLE | PUT_SECRET | REMOVE_SECRET | OPEN_GRANTS
        )
    }
}

/// A node's answer to every call but `run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer<T> {
    /// It worked.
    Ok(T),
    /// The WIT `substrate-error`.
    Error(WireError),
}

impl<T> Answer<T> {
    /// The answer as the substrate's result.
    pub fn into_result(self) -> Result<T, SubstrateError> {
        match self {
            Answer::Ok(t) => Ok(t),
            Answer::Error(e) => Err(e.into()),
        }
    }

    /// A substrate result as an answer (a `Trap` becomes `failed`: a node injects none).
    pub fn from_result(r: Result<T, SubstrateError>) -> Answer<T> {
        match r {
            Ok(t) => Answer::Ok(t),
            Err(e) => Answer::Error(e.into()),
        }
    }
}

/// The WIT `substrate-error` on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// `unreachable`, `over-capacity`, `invalid` or `failed` (anything else reads as
    /// `failed`).
    pub kind: String,
    /// For people.
    #[serde(default)]
    pub message: String,
}

impl From<SubstrateError> for WireError {
    fn from(e: SubstrateError) -> Self {
        let (kind, message) = match e {
            SubstrateError::Unreachable(m) => ("unreachable", m),
            SubstrateError::OverCapacity => ("over-capacity", String::new()),
            SubstrateError::Invalid(m) => ("invalid", m),
            SubstrateError::Failed(m) | SubstrateError::Trap(m) => ("failed", m),
        };
        WireError {
            kind: kind.to_owned(),
            message,
        }
    }
}

impl From<WireError> for SubstrateError {
    fn from(e: WireError) -> Self {
        match e.kind.as_str() {
            "unreachable" => SubstrateError::Unreachable(e.message),
            "over-capacity" => SubstrateError::OverCapacity,
            "invalid" => SubstrateError::Invalid(e.message),
            _ => SubstrateError::Failed(e.message),
        }
    }
}

/// A call on one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnContainer {
    /// The node's container id.
    pub container: String,
}

/// `save-snapshot`'s body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaveSnapshot {
    /// The node's container id.
    pub container: String,
    /// The snapshot's name (checked again by the node's substrate).
    pub name: String,
}

/// `fork-snapshot`'s body (the key it forks onto is the signed key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkSnapshot {
    /// The key holding the snapshot.
    pub source: String,
    /// The snapshot's name.
    pub name: String,
}

/// A call on one of the signed key's named snapshots (`drop-snapshot`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Named {
    /// The snapshot's name.
    pub name: String,
}

/// A call on one port of a container (`open-preview`, `close-preview`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnPort {
    /// The node's container id.
    pub container: String,
    /// The port inside it, 1-65535 (0 is `invalid`; past 65535 does not parse).
    pub port: u16,
}

/// A preview door (WIT `preview`): its port, its token, and the URL the node's own
/// listener answers it at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preview {
    /// The port inside the container.
    pub port: u16,
    /// The door's token (the node's CSPRNG's).
    pub token: String,
    /// Where the node's listener serves it.
    pub url: String,
}

impl From<stockade_runtime::substrate::Preview> for Preview {
    fn from(p: stockade_runtime::substrate::Preview) -> Self {
        Preview {
            port: p.port,
            token: p.token,
            url: p.url,
        }
    }
}

impl From<Preview> for stockade_runtime::substrate::Preview {
    fn from(p: Preview) -> Self {
        stockade_runtime::substrate::Preview {
            port: p.port,
            token: p.token,
            url: p.url,
        }
    }
}

/// A call on one tracked process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnProcess {
    /// The node's container id.
    pub container: String,
    /// The process's UUID.
    pub id: String,
}

/// How the node protocol writes a rule: the grammar's [`RuleSpec`] (the one rule type,
/// the API's too), in the form fronts and nodes have always exchanged, which the edge
/// Worker writes as well (`edge/src/nodes.js`): every field present, `path_prefix`
/// `null` when absent, headers as `[name, secret]` pairs. Not a second rule type: a
/// serde `remote` definition, so a field added to `RuleSpec` fails to compile here until
/// the node's form says how to write it. The API's JSON is the grammar's own
/// (`grammar/src/rules/json.rs`); the two forms differ, and each wire keeps its bytes.
#[derive(Serialize, Deserialize)]
#[serde(remote = "RuleSpec", deny_unknown_fields)]
struct NodeRule {
    host: String,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    path_prefix: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default = "yes")]
    intercept: bool,
}

fn yes() -> bool {
    true
}

/// A grant's rules in the node's form ([`NodeRule`]).
mod node_rules {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use stockade_grammar::rules::RuleSpec;

    struct Out<'a>(&'a RuleSpec);

    impl Serialize for Out<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            super::NodeRule::serialize(self.0, s)
        }
    }

    #[derive(Deserialize)]
    struct In(#[serde(with = "super::NodeRule")] RuleSpec);

    pub(super) fn serialize<S: Serializer>(rules: &[RuleSpec], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(rules.iter().map(Out))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RuleSpec>, D::Error> {
        Ok(Vec::<In>::deserialize(d)?
            .into_iter()
            .map(|r| r.0)
            .collect())
    }
}

/// `apply-grant`: open `rules` as fence `fence` on the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyGrant {
    /// The node's container id.
    pub container: String,
    /// The fence's id (the front's, a UUID).
    pub fence: String,
    /// The grant's rules (the grammar's, in the node's form: [`NodeRule`]).
    #[serde(with = "node_rules")]
    pub rules: Vec<RuleSpec>,
    /// `ask = true`: a request the rules refuse for want of a rule is held for the
    /// approver (DESIGN §5); absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ask: bool,
}

impl ApplyGrant {
    /// The request for a parsed grant.
    pub fn new(container: &str, fence: &str, grant: &stockade_egress::rules::Grant) -> Self {
        ApplyGrant {
            container: container.to_owned(),
            fence: fence.to_owned(),
            rules: grant.specs().to_vec(),
            ask: grant.ask(),
        }
    }

    /// The grant, parsed again on the node (a rule that does not parse: `invalid`).
    /// Defence in depth: the guest validated it before any substrate call
    /// (`guest/src/decide/validate.rs`), and the front parsed it to send it; a node
    /// trusts neither, and parses with the same function ([`Grant::parse`]).
    ///
    /// [`Grant::parse`]: stockade_egress::rules::Grant::parse
    pub fn grant(&self) -> Result<stockade_egress::rules::Grant, SubstrateError> {
        stockade_egress::rules::Grant::parse(&self.rules)
            .map(|g| g.with_ask(self.ask))
            .map_err(|e| SubstrateError::Invalid(e.to_string()))
    }
}

/// `revoke-grant`'s answer: what the fence admitted and denied while open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests admitted.
    pub admitted: u32,
    /// Requests denied.
    pub denied: u32,
}

/// `run`: a command in its own tree, waited for up to `timeout_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    /// The node's container id.
    pub container: String,
    /// The command (its `stdin` as base64 is the `Command`'s own serde form).
    pub cmd: Command,
    /// The run's timeout.
    pub timeout_ms: u64,
}

/// `run-stream`'s head (the body's first line, what the signature covers): a `run`
/// whose stdin follows as verified frames ([`crate::stream`]), `length` bytes
/// if the front knows it beforehand. The command's own `stdin` must be empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunStream {
    /// The node's container id.
    pub container: String,
    /// The command (its `stdin` empty).
    pub cmd: Command,
    /// The run's timeout.
    pub timeout_ms: u64,
    /// The stdin's length in bytes, exactly, when known before it streams (an
    /// upload's checked archive is not: its end frame alone ends it).
    #[serde(default)]
    pub length: Option<u64>,
    /// The stdin is an upload the node checks as it streams (the edge's uploads:
    /// the same checker as `stockade serve`'s, `crate::upload`), answered in an
    /// `upload` line before the result; absent: the stdin goes to the run as it is.
    #[serde(default)]
    pub upload: Option<UploadCheck>,
}

/// How a node checks a streamed upload (`crate::upload::check_stream`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum UploadCheck {
    /// A tar archive: every entry checked, its end replaced by the completion entry
    /// for `marker`.
    Archive {
        /// The upload's marker (the unpack command's completion entry).
        marker: String,
    },
    /// One file's `len` bytes, named `path` (checked), framed as an archive of one.
    File {
        /// Its path, relative to `/workspace`.
        path: String,
        /// Its length.
        len: u64,
        /// The upload's marker.
        marker: String,
    },
}

/// A checked upload's answer (`run-stream` with `upload`): the `upload` line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UploadLine {
    /// Every entry passed: how many (the completion entry went to the run).
    Entries(usize),
    /// The archive is refused: why (no completion entry went to the run).
    Refused(String),
}

/// `batch`: calls the front's guest already decided, made by the node in order,
/// stopping at the first error (the WIT `batch`; docs/NODE.md "Batches").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// The calls, 1 to [`stockade_runtime::substrate::MAX_BATCH`].
    pub calls: Vec<BatchCall>,
}

/// `{}`: the body of a call that takes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// The container id a call of a [`Batch`] that opens with `ensure` names the container
/// that `ensure` answered by (never a node's id).
pub const ENSURED: &str = "";

/// One call of a [`Batch`]: `{"ensure": {}}` (only as the first), `{"apply-grant": …}`,
/// `{"run": …}`, `{"kill-all": …}` or `{"revoke-grant": …}`, each with the body of the
/// call of that name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum BatchCall {
    /// `ensure`, for the request's key.
    Ensure(Empty),
    /// `apply-grant`.
    ApplyGrant(ApplyGrant),
    /// `run` (its output goes in the batch's lines).
    Run(Run),
    /// `kill-all`.
    KillAll(OnContainer),
    /// `revoke-grant`.
    RevokeGrant(OnContainer),
}

impl BatchCall {
    /// The container the call names ([`ENSURED`] for an `ensure`: the one it answers).
    pub fn container(&self) -> &str {
        match self {
            BatchCall::Ensure(_) => ENSURED,
            BatchCall::ApplyGrant(a) => &a.container,
            BatchCall::Run(r) => &r.container,
            BatchCall::KillAll(c) | BatchCall::RevokeGrant(c) => &c.container,
        }
    }

    /// The call's name.
    pub fn name(&self) -> &'static str {
        match self {
            BatchCall::Ensure(_) => call::ENSURE,
            BatchCall::ApplyGrant(_) => call::APPLY_GRANT,
            BatchCall::Run(_) => call::RUN,
            BatchCall::KillAll(_) => call::KILL_ALL,
            BatchCall::RevokeGrant(_) => call::REVOKE_GRANT,
        }
    }

    /// The call's shape for [`stockade_runtime::substrate::check_batch`].
    pub fn shape(&self) -> stockade_runtime::substrate::Shape {
        self.step().shape()
    }

    /// The call as its batch's plan sees it ([`stockade_runtime::substrate::batch`]):
    /// [`ENSURED`] is the placeholder.
    pub fn step(&self) -> stockade_runtime::substrate::batch::Step {
        use stockade_runtime::substrate::batch::{Kind, On, Step};
        let kind = match self {
            BatchCall::Ensure(_) => Kind::Ensure,
            BatchCall::ApplyGrant(_) => Kind::ApplyGrant,
            BatchCall::KillAll(_) | BatchCall::RevokeGrant(_) => Kind::Teardown,
            BatchCall::Run(_) => Kind::Other,
        };
        let on = match self {
            BatchCall::Ensure(_) => On::Key,
            _ if self.container() == ENSURED => On::Ensured,
            _ => On::Container(self.container().to_owned()),
        };
        Step { kind, on }
    }

    /// Name `container` in place of what the call names (the plan's placeholder
    /// resolved); an `ensure` names none.
    pub fn set_container(&mut self, container: &str) {
        match self {
            BatchCall::Ensure(_) => {}
            BatchCall::ApplyGrant(ApplyGrant { container: c, .. })
            | BatchCall::Run(Run { container: c, .. })
            | BatchCall::KillAll(OnContainer { container: c })
            | BatchCall::RevokeGrant(OnContainer { container: c }) => container.clone_into(c),
        }
    }
}

/// `start-process`: a tracked process in its own tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    /// The node's container id.
    pub container: String,
    /// The command.
    pub cmd: Command,
}

/// A tracked process (WIT `process-info`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Its UUID.
    pub id: String,
    /// Its tree still has live processes.
    pub running: bool,
    /// Its leader's exit code, once the leader exited.
    pub exit_code: Option<i32>,
}

/// A file under `/artifacts` (WIT `artifact`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactInfo {
    /// Its path under `/artifacts`.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
}

/// `read-artifact`: part of one artifact of the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadArtifact {
    /// The artifact's name (validated again on the node).
    pub name: String,
    /// Where to start.
    pub offset: u64,
    /// At most this many bytes.
    pub length: u32,
}

/// `health`: what the node is and how full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// The node's name.
    pub node: String,
    /// The node's substrate (`linux`, or `mock` in a test).
    pub substrate: String,
    /// Containers holding a ticket.
    pub live: u32,
    /// The ticket gate's ceiling.
    pub ceiling: u32,
}

/// `idle`: keys whose container has been idle this long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Idle {
    /// How long without a process or a call.
    pub idle_for_ms: u64,
}

/// `put-secret`: a secret the node's egress proxy may add to requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutSecret {
    /// Its name.
    pub name: String,
    /// Its value (the request is inside TLS; never logged).
    pub value: String,
    /// Where it may go: exact host.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Methods it may be sent with.
    pub methods: Vec<String>,
    /// Path prefix it may be sent under.
    pub path_prefix: String,
}

/// `remove-secret`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveSecret {
    /// Its name.
    pub name: String,
}

/// `answer-pending`: the approver's answer to one pending egress decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerPending {
    /// The decision's id (a UUID).
    pub id: String,
    /// `approve` or `refuse` (the API's).
    pub decision: stockade_wire::Verdict,
}

/// `answer-pending`'s answer: what became of the decision (each an `ok`: the node did
/// what it was asked; the front makes them the API's 200, 409 and 404).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PendingAnswer {
    /// Answered now: the decision as it was held.
    Answered(stockade_egress::ask::Pending),
    /// Already decided: what it became (`approved`, `refused`, `timed-out`,
    /// `fence-closed`).
    AlreadyDecided(String),
    /// This node never held it.
    NotFound,
}

/// One line of `run`'s NDJSON answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunLine {
    /// Bytes the command wrote to its stdout (base64).
    Stdout(#[serde(with = "stockade_runtime::substrate::base64_bytes")] Vec<u8>),
    /// Bytes the command wrote to its stderr (base64).
    Stderr(#[serde(with = "stockade_runtime::substrate::base64_bytes")] Vec<u8>),
    /// The run is alive: the node's clock in ms. Sent every `heartbeat_ms` without
    /// other output; a front that hears nothing for a few of them calls the node
    /// unreachable.
    Heartbeat(u64),
    /// The run ended; its output went in the lines before (the result carries none).
    Result(RunResult),
    /// The run could not be done.
    Error(WireError),
    /// A checked upload's verdict (`run-stream` with `upload`), before the last line.
    Upload(UploadLine),
    /// A `batch`'s answer to one of its calls, in order (`ok` the value the call alone
    /// answers: `run`'s is its `result`, without output, which went in lines before).
    Answer(Answer<serde_json::Value>),
}

/// What a node tells its front on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEvent {
    /// The node's name.
    pub node: String,
    /// The container that stopped without being asked to (the node's id).
    pub stopped: String,
}

/// The idempotency key header: one per logical call, the same on every retry.
pub const IDEMPOTENCY_HEADER: &str = "x-stockade-idempotency";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_substrate_error_round_trips_through_the_wire() {
        for e in [
            SubstrateError::Unreachable("gone".into()),
            SubstrateError::OverCapacity,
            SubstrateError::Invalid("bad".into()),
            SubstrateError::Failed("no".into()),
        ] {
            let w: WireError = e.clone().into();
            let back: SubstrateError =
                serde_json::from_str::<WireError>(&serde_json::to_string(&w).unwrap())
                    .unwrap()
                    .into();
            assert_eq!(back, e);
        }
        // A trap is a front's own; on the wire it is a failure. An unknown kind too.
        let t: WireError = SubstrateError::Trap("x".into()).into();
        assert_eq!(t.kind, "failed");
        let u = WireError {
            kind: "melted".into(),
            message: "m".into(),
        };
        assert_eq!(SubstrateError::from(u), SubstrateError::Failed("m".into()));
    }

    #[test]
    fn answers_and_run_lines_have_one_shape() {
        let a: Answer<String> = Answer::Ok("c1".into());
        assert_eq!(serde_json::to_string(&a).unwrap(), r#"{"ok":"c1"}"#);
        let e: Answer<()> = Answer::from_result(Err(SubstrateError::OverCapacity));
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"error":{"kind":"over-capacity","message":""}}"#
        );
        let l = RunLine::Stdout(b"hi\n".to_vec());
        assert_eq!(serde_json::to_string(&l).unwrap(), r#"{"stdout":"aGkK"}"#);
        assert_eq!(
            serde_json::to_string(&RunLine::Heartbeat(7)).unwrap(),
            r#"{"heartbeat":7}"#
        );
    }

    #[test]
    fn a_grant_goes_over_the_wire_and_parses_to_itself() {
        use stockade_grammar::rules::RuleSpec;
        let mut spec = RuleSpec::new("api.example.com", &["GET"], Some("/v1"));
        spec.headers = vec![("authorization".into(), "tok".into())];
        let g = stockade_egress::rules::Grant::parse(&[
            spec,
            RuleSpec::new("*.pkg.example", &[], None),
        ])
        .unwrap();
        let req = ApplyGrant::new("c", "f", &g);
        let json = serde_json::to_string(&req).unwrap();
        let back: ApplyGrant = serde_json::from_str(&json).unwrap();
        assert_eq!(back.grant().unwrap(), g);
        // `ask` goes over the wire only when set, and parses back set.
        assert!(!json.contains("ask"), "{json}");
        let asking = ApplyGrant::new("c", "f", &g.clone().with_ask(true));
        let back: ApplyGrant =
            serde_json::from_str(&serde_json::to_string(&asking).unwrap()).unwrap();
        assert!(back.grant().unwrap().ask());
        // A rule that does not parse on the node is `invalid`, whatever the front sent.
        let bad = ApplyGrant {
            container: "c".into(),
            fence: "f".into(),
            rules: vec![RuleSpec::new("*", &[], None)],
            ask: false,
        };
        assert!(matches!(bad.grant(), Err(SubstrateError::Invalid(_))));
        // Unknown fields are refused, not ignored.
        assert!(serde_json::from_str::<OnContainer>(r#"{"container":"c","key":"k"}"#).is_err());
    }

    #[test]
    fn a_rule_the_api_takes_is_the_rule_a_node_applies() {
        // The API's JSON, read by the API's type (stockade-wire), sent to a node in
        // the node's form, read by the node: the same value, and the node's bytes are
        // the form fronts, nodes and the edge Worker have always exchanged.
        let api = r#"{"rules":[{"host":"api.example.com","methods":["GET"],"path_prefix":"/v1/","headers":{"Authorization":{"secret":"tok"}}},{"host":"pinned.example","methods":[],"intercept":false},{"host":"*.pkg.example"}]}"#;
        let grant: stockade_wire::GrantBody = serde_json::from_str(api).unwrap();
        let parsed = stockade_egress::rules::Grant::parse(&grant.rules).unwrap();
        let req = ApplyGrant::new("c", "f", &parsed);
        let node = serde_json::to_string(&req).unwrap();
        assert_eq!(
            node,
            r#"{"container":"c","fence":"f","rules":[{"host":"api.example.com","methods":["GET"],"path_prefix":"/v1/","headers":[["Authorization","tok"]],"intercept":true},{"host":"pinned.example","methods":[],"path_prefix":null,"headers":[],"intercept":false},{"host":"*.pkg.example","methods":[],"path_prefix":null,"headers":[],"intercept":true}]}"#
        );
        let back: ApplyGrant = serde_json::from_str(&node).unwrap();
        assert_eq!(back.rules, grant.rules);
        assert_eq!(back.grant().unwrap(), parsed);
        // And back out in the API's form, byte for byte what came in, but for the
        // empty `methods` the API's rule type has always written.
        let again = stockade_wire::GrantBody {
            rules: back.rules,
            ask: false,
        };
        assert_eq!(
            serde_json::to_string(&again).unwrap(),
            api.replace(
                r#"{"host":"*.pkg.example"}"#,
                r#"{"host":"*.pkg.example","methods":[]}"#
            )
        );
        // The node's form takes what older fronts omit, and refuses what it does not know.
        let short: ApplyGrant =
            serde_json::from_str(r#"{"container":"c","fence":"f","rules":[{"host":"h"}]}"#)
                .unwrap();
        assert_eq!(short.rules, vec![RuleSpec::new("h", &[], None)]);
        assert!(
            serde_json::from_str::<ApplyGrant>(
                r#"{"container":"c","fence":"f","rules":[{"host":"h","x":1}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn the_call_list_is_complete_and_unique() {
        let mut all = call::ALL.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), call::ALL.len());
        assert_eq!(call::ALL.iter().filter(|c| call::node_wide(c)).count(), 5);
        let b: Batch = serde_json::from_str(
            r#"{"calls":[{"kill-all":{"container":"c"}},{"revoke-grant":{"container":"c"}}]}"#,
        )
        .unwrap();
        assert_eq!(b.calls[1].name(), call::REVOKE_GRANT);
        assert_eq!(b.calls[0].container(), "c");
        // An ensure takes nothing and answers the container the calls after it name by
        // the empty id.
        let b: Batch = serde_json::from_str(
            r#"{"calls":[{"ensure":{}},{"run":{"container":"","cmd":{"argv":["true"],"cwd":"/","env":[],"stdin":""},"timeout_ms":1}}]}"#,
        )
        .unwrap();
        assert_eq!(b.calls[0].name(), call::ENSURE);
        assert_eq!(
            b.calls[0].shape(),
            stockade_runtime::substrate::Shape::Ensure
        );
        assert_eq!(
            b.calls[1].shape(),
            stockade_runtime::substrate::Shape::OnEnsured
        );
        // A call a batch does not carry, or an unknown field, is refused.
        for bad in [
            r#"{"calls":[{"ensure":{"key":"k"}}]}"#,
            r#"{"calls":[{"current":{}}]}"#,
            r#"{"calls":[{"stop":{"container":"c"}}]}"#,
            r#"{"calls":[{"kill-all":{"container":"c","key":"k"}}]}"#,
        ] {
            assert!(serde_json::from_str::<Batch>(bad).is_err(), "{bad}");
        }
    }
}
