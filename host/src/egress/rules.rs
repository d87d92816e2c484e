//! Egress allow rules: parsing (typed errors) and the pure admit/deny decision.
//! PLACEHOLDER API (kept by the real implementation): `RuleSpec`, `Grant::parse`,
//! `Grant::deny_all`, `Grant::len`, `RuleError`.

use serde::{Deserialize, Serialize};

/// A rule as a consumer writes it (WIT `rule`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleSpec {
    /// Exact host or `*.suffix`.
    pub host: String,
    /// Upper-case methods; empty = any.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Optional path prefix starting with `/`.
    #[serde(default)]
    pub path_prefix: Option<String>,
}

/// A rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {index}: {message}")]
pub struct RuleError {
    /// Which rule.
    pub index: usize,
    /// What is wrong.
    pub message: String,
}

/// A parsed grant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    specs: Vec<RuleSpec>,
}

impl Grant {
    /// Parse rule specs.
    pub fn parse(specs: &[RuleSpec]) -> Result<Grant, RuleError> {
        Ok(Grant {
            specs: specs.to_vec(),
        })
    }
    /// The grant that admits nothing.
    pub fn deny_all() -> Grant {
        Grant::default()
    }
    /// Number of rules.
    pub fn len(&self) -> usize {
        self.specs.len()
    }
    /// No rules.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }
}
