//! The events of `POST …/exec/stream`, one NDJSON line each: output chunks as the
//! command writes them, then one last event, the outcome without its output (`exit`)
//! or the error that ended the call after it started (`error`).

use serde::{Deserialize, Serialize};

use crate::error::ErrorDetail;
use crate::records::{ExecOutcome, Limit};

/// One line of the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum StreamEvent {
    /// A chunk of standard output.
    Stdout(OutputEvent),
    /// A chunk of standard error.
    Stderr(OutputEvent),
    /// The run ended: its outcome.
    Exit(ExitEvent),
    /// The call failed after the run started.
    Error(ErrorEvent),
}

/// One chunk: `data` when it is UTF-8, `data_base64` when it is not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputEvent {
    /// The chunk as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The chunk as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
}

/// The outcome without its output (already streamed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitEvent {
    /// The command's exit code (negative: killed by that signal; -1 on timeout).
    pub exit_code: i32,
    /// The run hit its timeout and was killed.
    pub timed_out: bool,
    /// Output beyond the bound was discarded.
    pub truncated: bool,
    /// Processes the fence's teardown killed.
    pub killed: u32,
    /// Egress requests refused while the fence was open.
    pub denials: u32,
    /// Egress requests admitted while the fence was open.
    pub admitted: u32,
    /// Container limits the run reached.
    pub limits: Vec<Limit>,
}

impl From<&ExecOutcome> for ExitEvent {
    fn from(o: &ExecOutcome) -> Self {
        ExitEvent {
            exit_code: o.exit_code,
            timed_out: o.timed_out,
            truncated: o.truncated,
            killed: o.killed,
            denials: o.denials,
            admitted: o.admitted,
            limits: o.limits.clone(),
        }
    }
}

/// The call failed after the run started: the status and error a plain answer would
/// have had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEvent {
    /// The HTTP status the error stands for.
    pub status: u16,
    /// Its code and message.
    pub error: ErrorDetail,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use serde_json::json;

    #[test]
    fn events_read_as_the_server_writes_them() {
        let rows = [
            (
                json!({"type": "stdout", "data": "hi\n"}),
                StreamEvent::Stdout(OutputEvent {
                    data: Some("hi\n".into()),
                    data_base64: None,
                }),
            ),
            (
                json!({"type": "stderr", "data_base64": "/w=="}),
                StreamEvent::Stderr(OutputEvent {
                    data: None,
                    data_base64: Some("/w==".into()),
                }),
            ),
            (
                json!({"type": "exit", "exit_code": 3, "timed_out": false, "truncated": false,
                       "killed": 0, "denials": 1, "admitted": 2, "limits": ["memory"]}),
                StreamEvent::Exit(ExitEvent {
                    exit_code: 3,
                    denials: 1,
                    admitted: 2,
                    limits: vec![Limit::Memory],
                    ..ExitEvent::default()
                }),
            ),
            (
                json!({"type": "error", "status": 502,
                       "error": {"code": "unreachable", "message": "gone"}}),
                StreamEvent::Error(ErrorEvent {
                    status: 502,
                    error: ErrorDetail {
                        code: ErrorCode::Unreachable,
                        message: "gone".into(),
                    },
                }),
            ),
        ];
        for (j, ev) in rows {
            assert_eq!(serde_json::to_value(&ev).unwrap(), j);
            assert_eq!(serde_json::from_value::<StreamEvent>(j).unwrap(), ev);
        }
    }
}
