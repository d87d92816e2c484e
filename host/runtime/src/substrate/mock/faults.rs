//! A fault as a consumer asks for one (`POST /v1/mock/faults`, docs/MOCK.md "Faults
//! on demand"): which call, which failure, for how many calls, for which key. Pure:
//! parsing only; [`super::Mock::arm`] arms what it answers.

use serde::Deserialize;

use super::Fault;
use crate::substrate::SubstrateError;

/// Every substrate call a fault can be armed on (the WIT names, the trace's ops).
pub const SUBSTRATE_OPS: &[&str] = &[
    "ensure",
    "current",
    "apply-grant",
    "revoke-grant",
    "run",
    "start-process",
    "list-processes",
    "process-status",
    "kill-process",
    "kill-all",
    "snapshot",
    "stop",
    "denials",
    "list-artifacts",
    "read-artifact",
    "open-preview",
    "close-preview",
    "list-previews",
];

/// The other imports a fault can be armed on (never traced; never one key's).
pub const OTHER_OPS: &[&str] = &[
    "records.put",
    "records.get",
    "records.remove",
    "records.list",
    "records.find",
    "policy.floor-rules",
    "policy.approval",
    "policy.spend-approval",
    "policy.secret-binding",
];

/// A fault to arm, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The call.
    pub op: String,
    /// What it does instead of answering.
    pub fault: Fault,
    /// Calls to let through first.
    pub skip: u32,
    /// How many calls it fires on (`None`: until the faults are cleared).
    pub times: Option<u32>,
    /// Only calls about this key's sandbox.
    pub key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    op: String,
    fault: String,
    #[serde(default)]
    skip: u32,
    #[serde(default)]
    times: Option<Times>,
    #[serde(default)]
    key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Times {
    N(u32),
    Word(String),
}

/// Parse a fault request (a JSON value); the error says what is wrong.
pub fn parse(v: &serde_json::Value) -> Result<Request, String> {
    if !v.is_object() {
        return Err("a fault is a JSON object: {\"op\": …, \"fault\": …}".into());
    }
    let d: Doc = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let substrate = SUBSTRATE_OPS.contains(&d.op.as_str());
    if !substrate && !OTHER_OPS.contains(&d.op.as_str()) {
        return Err(format!(
            "op {:?}: one of {}, {}",
            d.op,
            SUBSTRATE_OPS.join(", "),
            OTHER_OPS.join(", ")
        ));
    }
    let injected = |what: &str| format!("injected by the consumer ({what})");
    let fault = match d.fault.as_str() {
        "failed" => Fault::Error(SubstrateError::Failed(injected("failed"))),
        "unreachable" => Fault::Error(SubstrateError::Unreachable(injected("unreachable"))),
        "over-capacity" => Fault::Error(SubstrateError::OverCapacity),
        "invalid" => Fault::Error(SubstrateError::Invalid(injected("invalid"))),
        "trap" => Fault::Trap,
        other => {
            return Err(format!(
                "fault {other:?}: failed, unreachable, over-capacity, invalid or trap"
            ));
        }
    };
    if !substrate && !matches!(d.fault.as_str(), "failed" | "trap") {
        return Err(format!(
            "fault {:?} on {}: a records or policy call fails or traps only",
            d.fault, d.op
        ));
    }
    if !substrate && d.key.is_some() {
        return Err(format!(
            "key: {} is no key's call (a key's fault is armed on substrate calls)",
            d.op
        ));
    }
    let times = match d.times {
        None => Some(1),
        Some(Times::N(0)) => return Err("times: at least 1 (or \"always\")".into()),
        Some(Times::N(n)) => Some(n),
        Some(Times::Word(w)) if w == "always" => None,
        Some(Times::Word(w)) => return Err(format!("times {w:?}: a count, or \"always\"")),
    };
    if let Some(k) = &d.key
        && k.is_empty()
    {
        return Err("key: empty".into());
    }
    Ok(Request {
        op: d.op,
        fault,
        skip: d.skip,
        times,
        key: d.key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_fault_request_reads_op_fault_count_and_key() {
        let r =
            parse(&json!({"op": "process-status", "fault": "unreachable", "key": "ci"})).unwrap();
        assert_eq!(r.op, "process-status");
        assert!(matches!(
            r.fault,
            Fault::Error(SubstrateError::Unreachable(_))
        ));
        assert_eq!(
            (r.skip, r.times, r.key.as_deref()),
            (0, Some(1), Some("ci")),
            "the next call"
        );
        let r = parse(&json!({"op": "ensure", "fault": "over-capacity", "times": 3, "skip": 2}))
            .unwrap();
        assert_eq!(
            (r.fault, r.skip, r.times),
            (Fault::Error(SubstrateError::OverCapacity), 2, Some(3))
        );
        let r = parse(&json!({"op": "records.list", "fault": "trap", "times": "always"})).unwrap();
        assert_eq!((r.fault, r.times), (Fault::Trap, None));
    }

    #[test]
    fn a_bad_fault_request_is_refused_saying_why() {
        let rows = [
            (
                json!({"op": "fork", "fault": "failed"}),
                "op \"fork\": one of ensure",
            ),
            (json!({"op": "run", "fault": "boom"}), "fault \"boom\""),
            (json!({"op": "run"}), "missing field `fault`"),
            (
                json!({"op": "run", "fault": "failed", "when": 1}),
                "unknown field `when`",
            ),
            (
                json!({"op": "run", "fault": "failed", "times": 0}),
                "times: at least 1",
            ),
            (
                json!({"op": "run", "fault": "failed", "times": "often"}),
                "times \"often\"",
            ),
            (
                json!({"op": "run", "fault": "failed", "key": ""}),
                "key: empty",
            ),
            (
                json!({"op": "records.list", "fault": "unreachable"}),
                "fails or traps only",
            ),
            (
                json!({"op": "policy.approval", "fault": "failed", "key": "k"}),
                "no key's call",
            ),
            (json!([]), "a fault is a JSON object"),
        ];
        for (doc, want) in rows {
            let e = parse(&doc).expect_err(&doc.to_string());
            assert!(e.contains(want), "{doc}: {e:?} does not say {want:?}");
        }
    }
}
