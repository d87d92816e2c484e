//! Egress that can ask (docs/EGRESS.md): the approver's view of the requests an
//! `ask = true` grant holds, and the answer.

use serde::{Deserialize, Serialize};

/// One request held for the approver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDecision {
    /// The decision's id (a UUIDv4): what the approver answers.
    pub id: String,
    /// The sandbox key whose fenced command asked.
    pub key: String,
    /// The fence that holds it (approving widens this fence only).
    pub fence: String,
    /// The request's method.
    pub method: String,
    /// The target host.
    pub host: String,
    /// The target port.
    pub port: u16,
    /// The path as requested (query included; at most 256 bytes).
    pub path: String,
    /// Why the rules refused it: `no-rule`, `method` or `path`.
    pub reason: String,
    /// When it was held (ms since the epoch).
    pub at_ms: u64,
    /// When it is refused `ask-timeout` unless answered.
    pub expires_ms: u64,
    /// What approving adds to the fence, until it closes: `METHOD host:port/prefix`.
    pub widens: String,
}

/// `GET /v1/egress/pending`, `GET /v1/sandboxes/{key}/egress/pending`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDecisions {
    /// Oldest first.
    pub pending: Vec<PendingDecision>,
}

/// The approver's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The request proceeds, and the fence widens by its rule.
    Approve,
    /// The request is refused `refused-by-approver`.
    Refuse,
}

/// `POST /v1/egress/pending/{id}`'s body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerdictBody {
    /// `approve` or `refuse`.
    pub decision: Verdict,
}

/// `POST /v1/egress/pending/{id}`'s answer: what was decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decided {
    /// The decision that was answered.
    pub pending: PendingDecision,
    /// The answer taken.
    pub decision: Verdict,
}
