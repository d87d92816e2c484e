//! `substrate`: the WIT calls onto the host's [`Substrate`](crate::substrate::Substrate),
//! with type conversions, the host's record of open fences, and import-time accounting.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::bindings::stockade::sandbox::substrate::{
    Command, Host, ProcessInfo, RunResult, SubstrateError,
};
use crate::bindings::stockade::sandbox::types::{Artifact, Denial, Grant};
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
    let specs: Vec<RuleSpec> = g
        .rules
        .iter()
        .map(|r| RuleSpec {
            host: r.host.clone(),
            methods: r.methods.clone(),
            path_prefix: r.path_prefix.clone(),
            headers: r
                .headers
                .iter()
                .map(|h| (h.name.clone(), h.secret.clone()))
                .collect(),
            intercept: r.intercept,
        })
        .collect();
    ParsedGrant::parse(&specs).map_err(|e| e.to_string())
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

    async fn apply_grant(&mut self, container: String, fence: String, grant: Grant) -> R<()> {
        let parsed = match parse_grant(&grant) {
            Ok(p) => p,
            Err(e) => return Ok(Err(SubstrateError::Invalid(e))),
        };
        let s = self.substrate.clone();
        let r = self.timed(s.apply_grant(&container, &fence, parsed)).await;
        // Recorded even if the call failed half-way: a revoke of a closed fence is harmless,
        // a grant left open is not.
        self.open_fences.push(container);
        r
    }

    async fn revoke_grant(&mut self, container: String) -> R<u32> {
        let s = self.substrate.clone();
        let r = self.timed(s.revoke_grant(&container)).await;
        // Unreachable is decided from the container's own state (it is gone), and a
        // grant does not outlive its container: either way the fence is closed.
        if matches!(r, Ok(Ok(_) | Err(SubstrateError::Unreachable(_)))) {
            self.open_fences.retain(|c| *c != container);
        }
        r
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
                    host: d.host,
                    method: d.method,
                    path: d.path,
                    rule_set: d.rule_set,
                    reason: d.reason,
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
