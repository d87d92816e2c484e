//! Every error answer: `{"error": {"code": CODE, "message": TEXT}}` with a stable code a
//! consumer matches on (the message is for people).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An error answer's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The code and message of an error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// The stable code.
    pub code: ErrorCode,
    /// For people; never a secret's value.
    #[serde(default)]
    pub message: String,
}

macro_rules! codes {
    ($($(#[$doc:meta])* $variant:ident = $text:literal,)*) => {
        /// The stable code of an error answer. A code this version does not know reads
        /// as [`ErrorCode::Other`], so an older client still reads a newer server.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
            /// A code this version does not know.
            Other(String),
        }

        impl ErrorCode {
            /// The code as it is written on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorCode::$variant => $text,)*
                    ErrorCode::Other(s) => s,
                }
            }
        }

        impl From<&str> for ErrorCode {
            fn from(s: &str) -> Self {
                match s {
                    $($text => ErrorCode::$variant,)*
                    other => ErrorCode::Other(other.to_owned()),
                }
            }
        }

        #[cfg(test)]
        const ALL: &[ErrorCode] = &[$(ErrorCode::$variant,)*];
    };
}

codes! {
    /// A floor command without a valid approval (403).
    NeedsApproval = "needs-approval",
    /// The ticket gate is full (429, `Retry-After`).
    OverCapacity = "over-capacity",
    /// Malformed input; nothing changed (400).
    InvalidInput = "invalid-input",
    /// The substrate or container cannot be reached (502).
    Unreachable = "unreachable",
    /// The substrate failed (500).
    Failed = "failed",
    /// The guest trapped (500).
    Trap = "trap",
    /// The body is not the JSON the route takes (400).
    MalformedJson = "malformed-json",
    /// The body could not be read (400).
    MalformedBody = "malformed-body",
    /// The body is over the route's limit (413).
    PayloadTooLarge = "payload-too-large",
    /// No such route, artifact or secret (404).
    NotFound = "not-found",
    /// The route takes another method (405).
    MethodNotAllowed = "method-not-allowed",
    /// A missing or wrong bearer token (401).
    Unauthorized = "unauthorized",
    /// The consumer's token on a route that takes the approver's (403).
    ApproverOnly = "approver-only",
    /// A scoped consumer token on a route only the operator's token takes (403).
    OperatorOnly = "operator-only",
    /// A scoped token's keys would overlap a live token's (409).
    KeysOverlap = "keys-overlap",
    /// An egress decision already answered, timed out or dropped with its fence (409).
    AlreadyDecided = "already-decided",
    /// A grant names a secret the server does not hold (409).
    SecretNotSet = "secret-not-set",
    /// A secret defined by the configuration's files (409).
    DefinedByConfiguration = "defined-by-configuration",
    /// A file upload without a declared length (411).
    LengthRequired = "length-required",
    /// The container's `tar` refused an upload (422).
    PutFailed = "put-failed",
    /// Every upload slot of the server is taken (429, `Retry-After`).
    UploadsBusy = "uploads-busy",
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(ErrorCode::from(s.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_as_itself_and_unknown_codes_are_kept() {
        for c in ALL {
            let json = serde_json::to_string(c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(&serde_json::from_str::<ErrorCode>(&json).unwrap(), c);
        }
        let other: ErrorCode = serde_json::from_str("\"from-the-future\"").unwrap();
        assert_eq!(other, ErrorCode::Other("from-the-future".into()));
        assert_eq!(other.as_str(), "from-the-future");
    }

    #[test]
    fn an_error_body_is_code_and_message() {
        let b: ErrorBody =
            serde_json::from_str(r#"{"error":{"code":"needs-approval","message":"m"}}"#).unwrap();
        assert_eq!(b.error.code, ErrorCode::NeedsApproval);
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"error":{"code":"needs-approval","message":"m"}}"#
        );
    }
}
