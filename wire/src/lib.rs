//! The HTTP API's request and answer types, exactly as they travel as JSON: the server
//! (`stockade-host`'s `api`) answers with them, the Rust client (`stockade-client`, used
//! by the CLI and `stockade mcp`) reads them, and the tests build requests with them.
//! `docs/openapi.json` describes the same JSON; the e2e schema test holds the server to
//! it, so a field renamed here is a documented change, not a silent one.
//!
//! Pure: serde and the grammar's rule type only (a grant's rule is
//! `stockade_grammar::rules::RuleSpec`, whose JSON is the API's), no I/O, no host types.
//! The egress proxy's records (`Admitted`, `Denial`, `PendingDecision`) are these types
//! too, so the proxy, the store, a node and the API share one definition. What turns
//! these into the facade's inputs (base64, the WIT records) lives in the server.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod ask;
mod command;
mod error;
mod preview;
mod records;
mod stream;
mod tokens;

pub use ask::{Decided, PendingDecision, PendingDecisions, Verdict, VerdictBody};
pub use command::{CommandBody, GrantBody, RuleSpec};
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use preview::{ExposeBody, Preview, Previews, Unexposed};
pub use records::{
    Aborted, Admitted, Approval, ApprovalBody, Artifact, Artifacts, CREDENTIALS_WITHHELD,
    Checkpointed, Denial, Denials, DetachedState, Egress, EgressEvent, Ensured, ExecOutcome,
    Forgotten, ForkBody, Forked, GoneReason, Health, Lifetime, LifetimeBody, Limit, MetadataBody,
    OnEnd, SandboxInfo, SandboxList, SecretBody, SecretInfo, Secrets, Snapshot, SnapshotBody,
    SnapshotDeleted, Snapshots, Started, Stopped, Uploaded, VIA_SUMMARY,
};
pub use stream::{ErrorEvent, ExitEvent, OutputEvent, StreamEvent};
pub use tokens::{Revoked, TokenBody, TokenCreated, TokenInfo, TokenSelf, Tokens};
