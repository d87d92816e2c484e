//! `substrate`: the WIT calls onto the host's [`Substrate`](crate::substrate::Substrate),
//! with type conversions, the host's record of open fences, and import-time accounting.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::bindings::stockade::sandbox::substrate::{
    Command, FenceCounts, Host, ProcessInfo, RunResult, SubstrateError,
};
use crate::bindings::stockade::sandbox::types::{Artifact, Denial, DenialReason, Grant};
use crate::egress::rules::{Grant as ParsedGrant, RuleSpec};
use crate::imports::Ctx;
use crate::substrate as sub;

type R<T> = wasmtime::Result<Result<T, SubstrateError>>;

impl Ctx {
    /// Await a substrate future, counting its time as import time, and turn an
    /// injected trap into a real one.
    async fn timed<T>(&mut self, f: impl Future<Output = sub::Result<T>>) -> R<T> {
        let t0 = Instant::now();
        let r = f.await;
        self.in_imports += t0.elapsed();
        match r {
            Ok(v) => Ok(Ok(v)),
            Err(sub::SubstrateError::Trap(why)) => {
                Err(wasmtime::Error::msg(format!("injected trap: {why}")))
            }
            Err(e) => Ok(Err(to_wit(e))),
        }
    }
}

fn to_wit(e: sub::SubstrateError) -> SubstrateError {
    match e {
        sub::SubstrateError::Unreachable(s) => SubstrateError::Unreachable(s),
        sub::SubstrateError::OverCapacity => SubstrateError::OverCapacity,
        sub::SubstrateError::Invalid(s) => SubstrateError::Invalid(s),
        sub::SubstrateError::Failed(s) | sub::SubstrateError::Trap(s) => SubstrateError::Failed(s),
    }
}

fn command(c: Command) -> sub::Command {
    sub::Command {
        argv: c.argv,
        cwd: c.cwd,
        env: c.env,
        stdin: c.stdin,
    }
}

/// The WIT grant, parsed by the egress rule module (the one grammar for rules).
pub fn parse_grant(g: &Grant) -> Result<ParsedGrant, String> {
    let specs: Vec<RuleSpec> = g.rules.iter().map(rule_spec).collect();
    ParsedGrant::parse(&specs).map_err(|e| e.to_string())
}

/// The grammar's view of a contract rule (the API checks rules with it too).
pub fn rule_spec(r: &crate::bindings::Rule) -> RuleSpec {
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

impl Host for Ctx {
    async fn ensure(&mut self, key: String) -> R<String> {
        let s = self.substrate.clone();
        self.timed(s.ensure(&key)).await
    }

    async fn current(&mut self, key: String) -> R<Option<String>> {
        let s = self.substrate.clone();
        self.timed(s.current(&key)).await
    }

    async fn apply_grant(&mut self, container: String, grant: Grant) -> R<String> {
        let parsed = match parse_grant(&grant) {
            Ok(p) => p,
            Err(e) => return Ok(Err(SubstrateError::Invalid(e))),
        };
        // The fence's id: chosen here, never the consumer's and never a container id
        // (denials and the audit name it).
        let fence = uuid::Uuid::new_v4().to_string();
        let s = self.substrate.clone();
        let r = self.timed(s.apply_grant(&container, &fence, parsed)).await;
        // An apply that answered opened a fence whose run may start: the runtime tears
        // it down and revokes it if the call ends without revoking (a trap). An apply
        // that failed opened nothing and ran nothing: the runtime only revokes, in case
        // a substrate failed half-way, and kills nothing (a declared process survives
        // bad input; issue 21).
        let state = match &r {
            Ok(Ok(())) => FenceState::Applied,
            _ => FenceState::ApplyFailed,
        };
        self.open_fences.push((container, state));
        r.map(|r| r.map(|()| fence))
    }

    async fn revoke_grant(&mut self, container: String) -> R<FenceCounts> {
        let s = self.substrate.clone();
        let r = self.timed(s.revoke_grant(&container)).await;
        // Unreachable is decided from the container's own state (it is gone), and a
        // grant does not outlive its container: either way the fence is closed. A
        // revoke that failed otherwise stays open: the runtime kills and revokes.
        if matches!(r, Ok(Ok(_) | Err(SubstrateError::Unreachable(_)))) {
            self.open_fences.retain(|(c, _)| *c != container);
        }
        r.map(|r| {
            r.map(|c| FenceCounts {
                admitted: c.admitted,
                denied: c.denied,
            })
        })
    }

    async fn run(&mut self, container: String, cmd: Command, timeout_ms: u64) -> R<RunResult> {
        let s = self.substrate.clone();
        let (mut cmd, timeout) = (command(cmd), Duration::from_millis(timeout_ms));
        if let Some(bytes) = self.stdin.take() {
            cmd.stdin = bytes;
        }
        let run = match self.output.clone() {
            Some(sink) => {
                let _ = sink.send(sub::Output::Started);
                s.run_streaming(&container, cmd, timeout, sink)
            }
            None => s.run(&container, cmd, timeout),
        };
        let caller = self.caller.clone();
        let c = container.clone();
        let r = self
            .timed(async move {
                let Some(mut caller) = caller else {
                    return run.await;
                };
                tokio::select! {
                    r = run => r,
                    // Only the sender's drop ends this wait (nothing is ever sent).
                    _ = caller.changed() => {
                        tracing::info!(target: "stockade::runtime", container = %c, "the caller went away: its run is abandoned, and the teardown kills it");
                        Ok(sub::RunResult {
                            exit_code: -libc::SIGKILL,
                            ..Default::default()
                        })
                    }
                }
            })
            .await?;
        Ok(r.map(|r| RunResult {
            exit_code: r.exit_code,
            stdout: r.stdout,
            stderr: r.stderr,
            timed_out: r.timed_out,
            truncated: r.truncated,
            limits: r.limits.into_iter().map(resource_limit).collect(),
        }))
    }

    async fn start_process(&mut self, container: String, cmd: Command) -> R<String> {
        let s = self.substrate.clone();
        let r = self.timed(s.start_process(&container, command(cmd))).await;
        if let Ok(Ok(id)) = &r {
            self.started_processes.push((container, id.clone()));
        }
        r
    }

    async fn list_processes(&mut self, container: String) -> R<Vec<ProcessInfo>> {
        let s = self.substrate.clone();
        let r = self.timed(s.list_processes(&container)).await?;
        Ok(r.map(|v| v.into_iter().map(info).collect()))
    }

    async fn process_status(&mut self, container: String, id: String) -> R<Option<ProcessInfo>> {
        let s = self.substrate.clone();
        let r = self.timed(s.process_status(&container, &id)).await?;
        Ok(r.map(|p| p.map(info)))
    }

    async fn kill_process(&mut self, container: String, id: String) -> R<u32> {
        let s = self.substrate.clone();
        self.timed(s.kill_process(&container, &id)).await
    }

    async fn kill_all(&mut self, container: String) -> R<u32> {
        let s = self.substrate.clone();
        self.timed(s.kill_all(&container)).await
    }

    async fn snapshot(&mut self, container: String) -> R<()> {
        let s = self.substrate.clone();
        self.timed(s.snapshot(&container)).await
    }

    async fn stop(&mut self, container: String) -> R<()> {
        let s = self.substrate.clone();
        self.timed(s.stop(&container)).await
    }

    async fn denials(&mut self, key: String) -> R<Vec<Denial>> {
        let s = self.substrate.clone();
        let r = self.timed(s.denials(&key)).await?;
        Ok(r.map(|v| {
            v.into_iter()
                .map(|d| Denial {
                    at_ms: d.at_ms,
                    reason: denial_reason(&d.reason),
                    host: d.host,
                    method: d.method,
                    path: d.path,
                    fence: d.rule_set,
                })
                .collect()
        }))
    }

    async fn list_artifacts(&mut self, key: String) -> R<Vec<Artifact>> {
        let s = self.substrate.clone();
        let r = self.timed(s.list_artifacts(&key)).await?;
        Ok(r.map(|v| {
            v.into_iter()
                .map(|a| Artifact {
                    name: a.name,
                    size: a.size,
                })
                .collect()
        }))
    }

    async fn read_artifact(
        &mut self,
        key: String,
        name: String,
        offset: u64,
        length: u32,
    ) -> R<Vec<u8>> {
        let s = self.substrate.clone();
        self.timed(s.read_artifact(&key, &name, offset, length))
            .await
    }
}

/// Whether a fence the call opened may have run something (see `apply_grant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceState {
    /// Applied: a run may have started under it.
    Applied,
    /// The apply failed: nothing ran.
    ApplyFailed,
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
    }
}

fn info(p: sub::ProcessInfo) -> ProcessInfo {
    ProcessInfo {
        id: p.id,
        running: p.running,
        exit_code: p.exit_code,
    }
}

/// The substrate's limit as the contract's.
fn resource_limit(l: crate::substrate::ResourceLimit) -> crate::bindings::ResourceLimit {
    use crate::bindings::ResourceLimit as W;
    use crate::substrate::ResourceLimit as S;
    match l {
        S::Pids => W::Pids,
        S::Memory => W::Memory,
        S::Disk => W::Disk,
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
                | Reason::Detached => {}
            }
            assert_eq!(reason_name(denial_reason(r.as_str())), r.as_str(), "{r:?}");
        }
    }
}
