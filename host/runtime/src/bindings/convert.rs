//! Every conversion between the contract's types (the `bindgen!` records) and the
//! host's own, in one place: the imports and the runtime call `From`/`Into` and keep
//! no mapping of their own.
//!
//! Why copies exist at all (see the comment at the `bindgen!`): wasmtime 48's `with:`
//! maps interfaces and resources, not records. Where the host's record is the
//! contract's field for field (`process-info`, `artifact`) the substrate uses the
//! generated type and nothing converts. The rest differ from the contract on purpose
//! where the contract is the guest's (a denial names its fence and
//! types its reason; the host's record keeps the API's `rule_set` and a kebab-case
//! reason, and a host `Command` may carry a streamed stdin the guest never sees).

use stockade_grammar::rules::RuleSpec;

use crate::bindings::exports::stockade::sandbox::facade::Error as FacadeError;
use crate::bindings::stockade::sandbox::policy::{Binding, FloorRule};
use crate::bindings::stockade::sandbox::records::Entry;
use crate::bindings::stockade::sandbox::substrate::{
    Command, FenceCounts, RunResult, SubstrateError,
};
use crate::bindings::stockade::sandbox::types::{
    CredentialHeader, Denial, DenialReason, DetachedInput, ExecInput, ResourceLimit, Rule,
};
use crate::substrate as sub;

/// A substrate failure as the contract's error. A `Trap` never reaches the guest as
/// an error (the imports turn it into a real trap first); should one arrive here it
/// reads as a failure.
impl From<sub::SubstrateError> for SubstrateError {
    fn from(e: sub::SubstrateError) -> Self {
        match e {
            sub::SubstrateError::Unreachable(s) => Self::Unreachable(s),
            sub::SubstrateError::OverCapacity => Self::OverCapacity,
            sub::SubstrateError::Invalid(s) => Self::Invalid(s),
            sub::SubstrateError::Failed(s) | sub::SubstrateError::Trap(s) => Self::Failed(s),
        }
    }
}

/// The guest's command. Its stdin is the guest's bytes; a streamed stdin is the
/// host's alone (set by the `run` import, never from the contract).
impl From<Command> for sub::Command {
    fn from(c: Command) -> Self {
        Self {
            argv: c.argv,
            cwd: c.cwd,
            env: c.env,
            stdin: c.stdin,
            stdin_stream: None,
        }
    }
}

impl From<sub::RunResult> for RunResult {
    fn from(r: sub::RunResult) -> Self {
        Self {
            exit_code: r.exit_code,
            stdout: r.stdout,
            stderr: r.stderr,
            timed_out: r.timed_out,
            truncated: r.truncated,
            limits: r.limits.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<sub::ResourceLimit> for ResourceLimit {
    fn from(l: sub::ResourceLimit) -> Self {
        match l {
            sub::ResourceLimit::Pids => Self::Pids,
            sub::ResourceLimit::Memory => Self::Memory,
            sub::ResourceLimit::Disk => Self::Disk,
        }
    }
}

impl From<sub::FenceCounts> for FenceCounts {
    fn from(c: sub::FenceCounts) -> Self {
        Self {
            admitted: c.admitted,
            denied: c.denied,
        }
    }
}

/// A stored denial as the contract's: its fence, and its reason as the enum.
impl From<sub::Denial> for Denial {
    fn from(d: sub::Denial) -> Self {
        Self {
            at_ms: d.at_ms,
            reason: denial_reason(&d.reason),
            host: d.host,
            method: d.method,
            path: d.path,
            fence: d.rule_set,
        }
    }
}

/// The guest's denial as the host's record: the reason by its kebab-case name and
/// the fence id as `rule_set` (the API's field).
impl From<Denial> for sub::Denial {
    fn from(d: Denial) -> Self {
        Self {
            at_ms: d.at_ms,
            host: d.host,
            method: d.method,
            path: d.path,
            rule_set: d.fence,
            reason: reason_name(d.reason).to_owned(),
        }
    }
}

/// The contract's rule as the grammar's: what the `apply-grant` import parses. The
/// WIT `rule` is the component's contract and stays its own record (bindgen's); these
/// two are its only conversions in the host.
impl From<&Rule> for RuleSpec {
    fn from(r: &Rule) -> Self {
        RuleSpec {
            host: r.host.clone(),
            methods: r.methods.clone(),
            path_prefix: r.path_prefix.clone(),
            headers: r
                .headers
                .iter()
                .map(|h| (h.name.clone(), h.secret.clone()))
                .collect(),
            intercept: r.intercept,
        }
    }
}

/// The grammar's rule (the API's, as it arrived) as the contract's, for the guest.
impl From<RuleSpec> for Rule {
    fn from(r: RuleSpec) -> Self {
        Rule {
            host: r.host,
            methods: r.methods,
            path_prefix: r.path_prefix,
            headers: r
                .headers
                .into_iter()
                .map(|(name, secret)| CredentialHeader { name, secret })
                .collect(),
            intercept: r.intercept,
        }
    }
}

/// A secret's binding as the guest sees it (never a value: a binding holds none).
impl From<stockade_grammar::binding::Binding> for Binding {
    fn from(b: stockade_grammar::binding::Binding) -> Self {
        Self {
            host: b.host,
            port: b.port,
            methods: b.methods,
            path_prefix: b.path_prefix,
        }
    }
}

/// A configured floor rule (`[floor] rules`: argv patterns).
impl From<&Vec<String>> for FloorRule {
    fn from(pattern: &Vec<String>) -> Self {
        Self {
            pattern: pattern.clone(),
        }
    }
}

/// A stored `(name, value)` record.
impl From<(String, String)> for Entry {
    fn from((name, value): (String, String)) -> Self {
        Self { name, value }
    }
}

/// The consumer's `ExecInput` as the contract's `detached-input`: a grant is refused
/// (DESIGN §2.1: a detached process holds no grant, ever), a timeout dropped (it outlives
/// any call).
impl TryFrom<&ExecInput> for DetachedInput {
    type Error = FacadeError;

    fn try_from(input: &ExecInput) -> Result<Self, FacadeError> {
        if input.grant.is_some() {
            return Err(FacadeError::InvalidInput(
                "a detached process holds no grant".into(),
            ));
        }
        Ok(Self {
            argv: input.argv.clone(),
            cwd: input.cwd.clone(),
            env: input.env.clone(),
            approval: input.approval.clone(),
            stdin: input.stdin.clone(),
        })
    }
}

/// The proxy's denial reason (its kebab-case name) as the contract's enum.
pub fn denial_reason(name: &str) -> DenialReason {
    match name {
        "no-grant" => DenialReason::NoGrant,
        "no-rule" => DenialReason::NoRule,
        "method" => DenialReason::Method,
        "path" => DenialReason::Path,
        "ambiguous-path" => DenialReason::AmbiguousPath,
        "needs-interception" => DenialReason::NeedsInterception,
        "private-target" => DenialReason::PrivateTarget,
        "resolve-failed" => DenialReason::ResolveFailed,
        "detached" => DenialReason::Detached,
        "refused-by-approver" => DenialReason::RefusedByApprover,
        "ask-timeout" => DenialReason::AskTimeout,
        "ask-full" => DenialReason::AskFull,
        other => {
            // Every reason the proxy writes is above (a table test keeps them in step):
            // a stored name that is not is a record from elsewhere, reported as the
            // most general refusal.
            tracing::warn!(target: "stockade::runtime", reason = other, "unknown denial reason in a stored denial");
            DenialReason::NoRule
        }
    }
}

/// The contract's denial reason as its kebab-case name (the API's and the store's).
pub fn reason_name(r: DenialReason) -> &'static str {
    match r {
        DenialReason::NoGrant => "no-grant",
        DenialReason::NoRule => "no-rule",
        DenialReason::Method => "method",
        DenialReason::Path => "path",
        DenialReason::AmbiguousPath => "ambiguous-path",
        DenialReason::NeedsInterception => "needs-interception",
        DenialReason::PrivateTarget => "private-target",
        DenialReason::ResolveFailed => "resolve-failed",
        DenialReason::Detached => "detached",
        DenialReason::RefusedByApprover => "refused-by-approver",
        DenialReason::AskTimeout => "ask-timeout",
        DenialReason::AskFull => "ask-full",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stockade_grammar::rules::Reason;

    #[test]
    fn every_proxy_reason_is_a_contract_reason_and_back() {
        let all = [
            Reason::NoGrant,
            Reason::NoRule,
            Reason::Method,
            Reason::Path,
            Reason::AmbiguousPath,
            Reason::NeedsInterception,
            Reason::PrivateTarget,
            Reason::ResolveFailed,
            Reason::Detached,
            Reason::RefusedByApprover,
            Reason::AskTimeout,
            Reason::AskFull,
        ];
        for r in all {
            // A reason added to the grammar fails to compile here until it is listed
            // above (and given a contract name).
            match r {
                Reason::NoGrant
                | Reason::NoRule
                | Reason::Method
                | Reason::Path
                | Reason::AmbiguousPath
                | Reason::NeedsInterception
                | Reason::PrivateTarget
                | Reason::ResolveFailed
                | Reason::Detached
                | Reason::RefusedByApprover
                | Reason::AskTimeout
                | Reason::AskFull => {}
            }
            assert_eq!(reason_name(denial_reason(r.as_str())), r.as_str(), "{r:?}");
        }
    }

    #[test]
    fn a_stored_denial_reads_the_same_after_crossing_the_guest() {
        let stored = sub::Denial {
            at_ms: 7,
            host: "example.com".into(),
            method: "CONNECT".into(),
            path: String::new(),
            rule_set: "fence-1".into(),
            reason: "needs-interception".into(),
        };
        let wit = Denial::from(stored.clone());
        assert_eq!(wit.fence, "fence-1");
        assert_eq!(wit.reason, DenialReason::NeedsInterception);
        assert_eq!(sub::Denial::from(wit), stored);
    }

    #[test]
    fn a_rule_reads_the_same_after_crossing_the_guest() {
        let rules = [
            RuleSpec {
                headers: vec![("Authorization".into(), "tok".into())],
                ..RuleSpec::new("api.example.com", &["GET", "POST"], Some("/v1/"))
            },
            RuleSpec {
                intercept: false,
                ..RuleSpec::new("*.pinned.example:8443", &[], None)
            },
        ];
        for spec in rules {
            let wit = Rule::from(spec.clone());
            assert_eq!(RuleSpec::from(&wit), spec);
        }
    }

    #[test]
    fn a_detached_input_refuses_a_grant_and_drops_the_timeout() {
        let mut input = ExecInput {
            argv: vec!["sleep".into(), "9".into()],
            cwd: None,
            env: vec![],
            timeout_ms: Some(5),
            grant: None,
            approval: Some("t".into()),
            stdin: None,
        };
        let d = DetachedInput::try_from(&input).unwrap();
        assert_eq!(
            (d.argv, d.approval),
            (input.argv.clone(), input.approval.clone())
        );
        input.grant = Some(crate::bindings::Grant {
            rules: vec![],
            ask: false,
        });
        assert_eq!(
            DetachedInput::try_from(&input),
            Err(FacadeError::InvalidInput(
                "a detached process holds no grant".into()
            ))
        );
    }
}
