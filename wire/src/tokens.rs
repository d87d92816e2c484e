//! Scoped consumer tokens (`/v1/tokens`, the operator's token only; docs/TENANTS.md).

use serde::{Deserialize, Serialize};

/// `POST /v1/tokens`: a token reaching `keys` (`ci-*` or one key), holding at most
/// `ceiling` live containers (default: the server's whole ceiling).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// The key pattern: one key, or a prefix ending in `*`.
    pub keys: String,
    /// Its share of the ceiling (at least 1; above the server's ceiling, the
    /// server's). A whole number, which JSON may write as `4.0`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::command::whole_number"
    )]
    pub ceiling: Option<u64>,
    /// A label for people (default: the pattern).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::command::present"
    )]
    pub name: Option<String>,
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// The public id (`stk_<id>_…`'s middle; what `DELETE /v1/tokens/{id}` takes).
    pub id: String,
    /// The label.
    pub name: String,
    /// The key pattern.
    pub keys: String,
    /// Its share of the ceiling.
    pub ceiling: u32,
    /// When it was made (ms since the epoch).
    pub created_ms: u64,
    /// When it was revoked, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_ms: Option<u64>,
}

/// `POST /v1/tokens`'s answer: the token, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCreated {
    /// The bearer token (`stk_<id>_<secret>`); the server keeps only its digest.
    pub token: String,
    /// What was made.
    #[serde(flatten)]
    pub info: TokenInfo,
}

/// `GET /v1/tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    /// Every token, live and revoked, oldest first.
    pub tokens: Vec<TokenInfo>,
}

/// `DELETE /v1/tokens/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revoked {
    /// The id revoked.
    pub revoked: String,
}

/// `GET /v1/tokens/self`: which keys the presenting token reaches (any consumer
/// token; a layer in front of the API, E2B's, learns where it may make keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenSelf {
    /// The key pattern: `*` for the operator's token, else the scoped token's.
    pub keys: String,
    /// The scoped token's public id (none for the operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}
