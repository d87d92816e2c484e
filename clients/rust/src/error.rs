//! What a call can fail with, and the CLI's exit code for each (sysexits): invalid
//! input 65, unreachable 69, failed or trapped 70, over capacity 75, needs approval or
//! unauthorized 77, usage 2.

use stockade_wire::{ErrorBody, ErrorCode};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error (its status, code and message).
    #[error("{code} (HTTP {status}): {message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable code.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The server could not be reached, or the connection broke.
    #[error("{0}")]
    Unreachable(String),
    /// The server answered something that is not the API's answer.
    #[error("{0}")]
    BadAnswer(String),
    /// The call could not be built from what was given (a bad `--server`).
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// The error of a non-2xx answer: its body's code and message (`failed` and no
    /// message when the body is not the API's error).
    pub(crate) fn answer(status: u16, body: &[u8]) -> Self {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(b) => Error::Api {
                status,
                code: b.error.code,
                message: b.error.message,
            },
            Err(_) => Error::Api {
                status,
                code: ErrorCode::Failed,
                message: String::new(),
            },
        }
    }

    /// The server's code, when the server answered.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The CLI's exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Api { code, .. } => match code {
                ErrorCode::InvalidInput
                | ErrorCode::MalformedJson
                | ErrorCode::MalformedBody
                | ErrorCode::PayloadTooLarge => 65,
                ErrorCode::Unreachable => 69,
                ErrorCode::OverCapacity => 75,
                ErrorCode::NeedsApproval | ErrorCode::Unauthorized => 77,
                _ => 70,
            },
            Error::Unreachable(_) => 69,
            Error::BadAnswer(_) => 70,
            Error::Usage(_) => 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_maps_to_the_clis_exit_code() {
        let rows: &[(&str, i32)] = &[
            ("invalid-input", 65),
            ("malformed-json", 65),
            ("malformed-body", 65),
            ("payload-too-large", 65),
            ("unreachable", 69),
            ("over-capacity", 75),
            ("needs-approval", 77),
            ("unauthorized", 77),
            ("failed", 70),
            ("trap", 70),
            ("not-found", 70),
            ("something-new", 70),
        ];
        for (code, exit) in rows {
            let body = format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#);
            let e = Error::answer(400, body.as_bytes());
            assert_eq!(e.exit_code(), *exit, "{code}");
            assert_eq!(e.to_string(), format!("{code} (HTTP 400): m"));
        }
        let e = Error::answer(502, b"<html>bad gateway</html>");
        assert_eq!(e.to_string(), "failed (HTTP 502): ");
        assert_eq!(e.exit_code(), 70);
        assert_eq!(Error::Unreachable("x".into()).exit_code(), 69);
        assert_eq!(Error::Usage("x".into()).exit_code(), 2);
    }
}
