//! `substrate`: the WIT calls onto the host's [`Substrate`](crate::substrate::Substrate),
//! the host's record of open fences, and import-time accounting. The types cross
//! through [`convert`](crate::bindings::convert).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::bindings::convert::rule_spec;
use crate::bindings::stockade::sandbox::substrate::{
    Command, FenceCounts, Host, ProcessInfo, RunResult, SubstrateError,
};
use crate::bindings::stockade::sandbox::types::{Artifact, Denial, Grant, Preview};
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
            Err(e) => Ok(Err(e.into())),
        }
    }
}

/// The WIT grant, parsed by the egress rule module (the one grammar for rules).
pub fn parse_grant(g: &Grant) -> Result<ParsedGrant, String> {
    let specs: Vec<RuleSpec> = g.rules.iter().map(rule_spec).collect();
    ParsedGrant::parse(&specs)
        .map(|p| p.with_ask(g.ask))
        .map_err(|e| e.to_string())
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
        r.map(|r| r.map(Into::into))
    }

    async fn run(&mut self, container: String, cmd: Command, timeout_ms: u64) -> R<RunResult> {
        let s = self.substrate.clone();
        let (mut cmd, timeout) = (sub::Command::from(cmd), Duration::from_millis(timeout_ms));
        cmd.stdin_stream = self.stdin.take();
        let session = self.pty.take().and_then(|a| a.take());
        let run = match (session, self.output.clone()) {
            // A terminal session: the run's I/O is the terminal's (the guest decided
            // and fenced it as any run).
            (Some(session), _) => s.run_pty(&container, cmd, timeout, session),
            (None, Some(sink)) => {
                let _ = sink.send(sub::Output::Started);
                s.run_streaming(&container, cmd, timeout, sink)
            }
            (None, None) => s.run(&container, cmd, timeout),
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
        Ok(r.map(Into::into))
    }

    async fn start_process(&mut self, container: String, cmd: Command) -> R<String> {
        let s = self.substrate.clone();
        let r = self.timed(s.start_process(&container, cmd.into())).await;
        if let Ok(Ok(id)) = &r {
            self.started_processes.push((container, id.clone()));
        }
        r
    }

    async fn list_processes(&mut self, container: String) -> R<Vec<ProcessInfo>> {
        let s = self.substrate.clone();
        self.timed(s.list_processes(&container)).await
    }

    async fn process_status(&mut self, container: String, id: String) -> R<Option<ProcessInfo>> {
        let s = self.substrate.clone();
        self.timed(s.process_status(&container, &id)).await
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
        Ok(r.map(|v| v.into_iter().map(Denial::from).collect()))
    }

    async fn list_artifacts(&mut self, key: String) -> R<Vec<Artifact>> {
        let s = self.substrate.clone();
        self.timed(s.list_artifacts(&key)).await
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

    async fn open_preview(&mut self, container: String, port: u16) -> R<Preview> {
        let s = self.substrate.clone();
        self.timed(s.open_preview(&container, port)).await
    }

    async fn close_preview(&mut self, container: String, port: u16) -> R<bool> {
        let s = self.substrate.clone();
        self.timed(s.close_preview(&container, port)).await
    }

    async fn list_previews(&mut self, container: String) -> R<Vec<Preview>> {
        let s = self.substrate.clone();
        self.timed(s.list_previews(&container)).await
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
