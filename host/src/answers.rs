//! The API's answers made from the facade's records, and its command made into the
//! facade's input: every conversion between the host's types (the `bindgen!` records,
//! the substrate's and the egress audit's) and the wire types (`stockade-wire`) the
//! API speaks, in one place. Pure; the handlers (`crate::api`) only call these.

use base64::Engine as _;
use stockade_wire as wire;

use stockade_runtime::bindings::{DetachedState, ExecInput, ExecOutcome, GoneReason, Grant, Rule};

/// A command's facade input; `Err` names what is malformed (both stdin forms, bad
/// base64).
pub fn exec_input(c: wire::CommandBody) -> Result<ExecInput, String> {
    let stdin = match (c.stdin, c.stdin_base64) {
        (Some(_), Some(_)) => return Err("give stdin or stdin_base64, not both".into()),
        (Some(text), None) => Some(text.into_bytes()),
        (None, Some(b)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| format!("stdin_base64: {e}"))?,
        ),
        (None, None) => None,
    };
    Ok(ExecInput {
        argv: c.argv,
        cwd: c.cwd,
        env: c.env.into_iter().collect(),
        timeout_ms: c.timeout_ms,
        grant: c.grant.map(grant),
        approval: c.approval,
        stdin,
    })
}

/// A grant as the facade takes it.
pub fn grant(g: wire::GrantBody) -> Grant {
    Grant {
        rules: g.rules.into_iter().map(Rule::from).collect(),
        ask: g.ask,
    }
}

/// A grant as the API answers it (a key's network).
pub fn grant_body(g: &Grant) -> wire::GrantBody {
    wire::GrantBody {
        rules: g.rules.iter().map(wire::RuleSpec::from).collect(),
        ask: g.ask,
    }
}

/// The exec outcome as the API answers it: output as text (lossy UTF-8) and exact
/// base64.
pub fn outcome(o: &ExecOutcome) -> wire::ExecOutcome {
    let b64 = base64::engine::general_purpose::STANDARD;
    wire::ExecOutcome {
        exit_code: o.exit_code,
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        stdout_base64: b64.encode(&o.stdout),
        stderr_base64: b64.encode(&o.stderr),
        timed_out: o.timed_out,
        truncated: o.truncated,
        killed: o.killed,
        denials: o.denials,
        admitted: o.admitted,
        limits: o.limits.iter().map(limit).collect(),
    }
}

/// A resource limit as the API names it (`pids`, `memory`, `disk`).
pub fn limit(l: &stockade_runtime::bindings::ResourceLimit) -> wire::Limit {
    use stockade_runtime::bindings::ResourceLimit as L;
    match l {
        L::Pids => wire::Limit::Pids,
        L::Memory => wire::Limit::Memory,
        L::Disk => wire::Limit::Disk,
    }
}

/// A detached state as the API answers it: `{"state": "running"}`,
/// `{"state": "exited", "code": N}`, `{"state": "gone", "reason": …}`.
pub fn detached_state(s: &DetachedState) -> wire::DetachedState {
    match s {
        DetachedState::Running => wire::DetachedState::Running,
        DetachedState::Exited(code) => wire::DetachedState::Exited { code: *code },
        DetachedState::Gone(r) => wire::DetachedState::Gone {
            reason: match r {
                GoneReason::Unknown => wire::GoneReason::Unknown,
                GoneReason::NotTracked => wire::GoneReason::NotTracked,
                GoneReason::ContainerUnreachable => wire::GoneReason::ContainerUnreachable,
            },
        },
    }
}

/// A secret's listing entry (never its value).
pub fn secret_info(i: stockade_egress::secrets::SecretInfo) -> wire::SecretInfo {
    wire::SecretInfo {
        name: i.name,
        source: i.source.to_owned(),
        updated_ms: i.updated_ms,
        binding: i.binding,
    }
}

/// A file under `/artifacts`.
pub fn artifact(a: stockade_runtime::bindings::Artifact) -> wire::Artifact {
    wire::Artifact {
        name: a.name,
        size: a.size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn detached_states_answer_as_the_api_documents() {
        let rows = [
            (DetachedState::Running, json!({"state": "running"})),
            (
                DetachedState::Exited(-9),
                json!({"state": "exited", "code": -9}),
            ),
            (
                DetachedState::Gone(GoneReason::Unknown),
                json!({"state": "gone", "reason": "unknown"}),
            ),
            (
                DetachedState::Gone(GoneReason::NotTracked),
                json!({"state": "gone", "reason": "not-tracked"}),
            ),
            (
                DetachedState::Gone(GoneReason::ContainerUnreachable),
                json!({"state": "gone", "reason": "container-unreachable"}),
            ),
        ];
        for (state, want) in rows {
            assert_eq!(serde_json::to_value(detached_state(&state)).unwrap(), want);
        }
    }
}
