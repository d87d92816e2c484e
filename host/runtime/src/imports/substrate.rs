//! `substrate`: the WIT calls onto the host's [`Substrate`](crate::substrate::Substrate),
//! the host's record of open fences, and import-time accounting. The types cross
//! through [`convert`](crate::bindings::convert).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::bindings::stockade::sandbox::substrate::{
    ApplyGrantCall, Call, CallAnswer, Command, FenceCounts, Host, PreviewCall, ProcessCall,
    ProcessInfo, RunCall, RunResult, SaveSnapshotCall, StartProcessCall, SubstrateError, Target,
};
use crate::bindings::stockade::sandbox::types::{Artifact, Denial, Grant, Preview};
use crate::imports::Ctx;
use crate::substrate as sub;
use stockade_egress::rules::{Grant as ParsedGrant, RuleSpec};

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

/// The WIT grant, parsed by the grammar into what a substrate applies. The guest has
/// validated it already (`guest/src/decide/validate.rs`, before any substrate call):
/// a rule refused here is defence in depth against a guest that did not, and it is
/// refused by the same function ([`ParsedGrant::parse`]), with the same words.
pub fn parse_grant(g: &Grant) -> Result<ParsedGrant, String> {
    let specs: Vec<RuleSpec> = g.rules.iter().map(RuleSpec::from).collect();
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
        let r = self.timed(s.current(&key)).await;
        // A batch that opened with this key's ensure and whose outcome is not known may
        // have opened a fence on this container: it is the guest's to close now, and
        // the runtime's if the call ends without closing it.
        if let Ok(Ok(Some(c))) = &r
            && let Some(i) = self.unresolved_fences.iter().position(|k| *k == key)
        {
            self.unresolved_fences.swap_remove(i);
            self.open_fences.push((c.clone(), FenceState::Applied));
        }
        r
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
        // bad input: DESIGN §2.3).
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

    async fn save_snapshot(&mut self, container: String, name: String) -> R<()> {
        let s = self.substrate.clone();
        self.timed(s.save_snapshot(&container, &name)).await
    }

    async fn fork_snapshot(&mut self, source: String, name: String, key: String) -> R<()> {
        let s = self.substrate.clone();
        self.timed(s.fork_snapshot(&source, &name, &key)).await
    }

    async fn drop_snapshot(&mut self, key: String, name: String) -> R<bool> {
        let s = self.substrate.clone();
        self.timed(s.drop_snapshot(&key, &name)).await
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

    async fn batch(&mut self, calls: Vec<Call>) -> R<Vec<Result<CallAnswer, SubstrateError>>> {
        let mut plan: Plan = match sub::batch::Plan::new(calls.iter().map(step).collect()) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e.into())),
        };
        let runs = calls.iter().any(|c| matches!(c, Call::Run(_)));
        if (runs && (self.stdin.is_some() || self.pty.is_some())) || !calls.iter().all(carried) {
            return self.batch_by_imports(plan, calls).await;
        }
        // The host's choices, as each call alone makes them: the fence's id (never the
        // consumer's), the grant parsed. A grant that does not parse is that call's
        // `invalid`: the calls before it are made, it and those after are not.
        let mut made = Vec::with_capacity(calls.len());
        let mut refused = None;
        for (i, call) in calls.into_iter().enumerate() {
            made.push(match call {
                Call::Ensure(key) => sub::Call::Ensure { key },
                Call::ApplyGrant(a) => match parse_grant(&a.grant) {
                    Ok(grant) => {
                        let fence = uuid::Uuid::new_v4().to_string();
                        sub::Call::ApplyGrant {
                            container: target(a.container),
                            fence,
                            grant,
                        }
                    }
                    Err(e) => {
                        refused = Some((i, SubstrateError::Invalid(e)));
                        break;
                    }
                },
                Call::Run(r) => sub::Call::Run {
                    container: target(r.container),
                    cmd: r.cmd.into(),
                    timeout: Duration::from_millis(r.timeout_ms),
                },
                Call::KillAll(t) => sub::Call::KillAll {
                    container: target(t),
                },
                Call::RevokeGrant(t) => sub::Call::RevokeGrant {
                    container: target(t),
                },
                // Made one at a time above (`carried`): never reached.
                _ => {
                    refused = Some((
                        i,
                        SubstrateError::Invalid(
                            "a call the substrate's batch does not carry".into(),
                        ),
                    ));
                    break;
                }
            });
        }
        let s = self.substrate.clone();
        let sink = if runs { self.output.clone() } else { None };
        let caller = if runs { self.caller.clone() } else { None };
        let going = s.batch(made.clone(), sink);
        let t0 = Instant::now();
        let r = match caller {
            None => going.await,
            Some(mut caller) => tokio::select! {
                r = going => r,
                // Only the sender's drop ends this wait (nothing is ever sent).
                _ = caller.changed() => {
                    tracing::info!(target: "stockade::runtime", "the caller went away: its run is abandoned, and the teardown kills it");
                    abandoned(&made).ok_or_else(|| sub::SubstrateError::Unreachable("the caller went away".into()))
                }
            },
        };
        self.in_imports += t0.elapsed();
        let answers = match r {
            Ok(a) => a,
            Err(sub::SubstrateError::Trap(why)) => {
                return Err(wasmtime::Error::msg(format!("injected trap: {why}")));
            }
            Err(e) => {
                self.after_batch(&made, None);
                return Ok(Err(e.into()));
            }
        };
        self.after_batch(&made, Some(&answers));
        for (c, a) in made.iter().zip(answers) {
            plan.answer(match (c, a) {
                (sub::Call::ApplyGrant { fence, .. }, Ok(_)) => {
                    Ok(CallAnswer::ApplyGrant(fence.clone()))
                }
                (_, Ok(sub::Answer::ApplyGrant)) => Err(SubstrateError::Failed(
                    "the substrate answered a call with another's answer".into(),
                )),
                (_, Ok(sub::Answer::Ensure(c))) => Ok(CallAnswer::Ensure(c)),
                (_, Ok(sub::Answer::Run(r))) => Ok(CallAnswer::Run(r.into())),
                (_, Ok(sub::Answer::KillAll(n))) => Ok(CallAnswer::KillAll(n)),
                (_, Ok(sub::Answer::RevokeGrant(c))) => Ok(CallAnswer::RevokeGrant(c.into())),
                (_, Err(sub::SubstrateError::Trap(why))) => {
                    return Err(wasmtime::Error::msg(format!("injected trap: {why}")));
                }
                (_, Err(e)) => Err(e.into()),
            });
        }
        // The call refused before it was sent is answered at its turn, if the batch
        // got there.
        if let Some((i, e)) = refused
            && plan.next().is_some_and(|n| n.index == i)
        {
            plan.answer(Err(e));
        }
        Ok(Ok(plan.into_answers()))
    }
}

impl Ctx {
    /// `batch` one call at a time through this host's own imports: a batch whose run
    /// has a terminal session or a streamed stdin (the run's own I/O, which only the
    /// plain `run` import hands on), and one with a call the substrate's batch does not
    /// carry (the guest's calls alone: a batch of one, as the named import).
    async fn batch_by_imports(
        &mut self,
        mut plan: Plan,
        calls: Vec<Call>,
    ) -> R<Vec<Result<CallAnswer, SubstrateError>>> {
        let mut calls: Vec<Option<Call>> = calls.into_iter().map(Some).collect();
        while let Some(next) = plan.next() {
            let Some(call) = calls[next.index].take() else {
                break;
            };
            let on = next.container.unwrap_or_default();
            let r = match call {
                Call::Ensure(key) => self.ensure(key).await?.map(CallAnswer::Ensure),
                Call::ApplyGrant(a) => self
                    .apply_grant(on, a.grant)
                    .await?
                    .map(CallAnswer::ApplyGrant),
                Call::Run(r) => self
                    .run(on, r.cmd, r.timeout_ms)
                    .await?
                    .map(CallAnswer::Run),
                Call::KillAll(_) => self.kill_all(on).await?.map(CallAnswer::KillAll),
                Call::RevokeGrant(_) => self.revoke_grant(on).await?.map(CallAnswer::RevokeGrant),
                Call::Current(key) => self.current(key).await?.map(CallAnswer::Current),
                Call::StartProcess(p) => self
                    .start_process(on, p.cmd)
                    .await?
                    .map(CallAnswer::StartProcess),
                Call::ListProcesses(_) => self
                    .list_processes(on)
                    .await?
                    .map(CallAnswer::ListProcesses),
                Call::ProcessStatus(p) => self
                    .process_status(on, p.id)
                    .await?
                    .map(CallAnswer::ProcessStatus),
                Call::KillProcess(p) => self
                    .kill_process(on, p.id)
                    .await?
                    .map(CallAnswer::KillProcess),
                Call::Snapshot(_) => self.snapshot(on).await?.map(|()| CallAnswer::Snapshot),
                Call::Stop(_) => self.stop(on).await?.map(|()| CallAnswer::Stop),
                Call::Denials(key) => self.denials(key).await?.map(CallAnswer::Denials),
                Call::ListArtifacts(key) => self
                    .list_artifacts(key)
                    .await?
                    .map(CallAnswer::ListArtifacts),
                Call::ReadArtifact(a) => self
                    .read_artifact(a.key, a.name, a.offset, a.length)
                    .await?
                    .map(CallAnswer::ReadArtifact),
                Call::OpenPreview(p) => self
                    .open_preview(on, p.port)
                    .await?
                    .map(CallAnswer::OpenPreview),
                Call::ClosePreview(p) => self
                    .close_preview(on, p.port)
                    .await?
                    .map(CallAnswer::ClosePreview),
                Call::ListPreviews(_) => {
                    self.list_previews(on).await?.map(CallAnswer::ListPreviews)
                }
                Call::SaveSnapshot(c) => self
                    .save_snapshot(on, c.name)
                    .await?
                    .map(|()| CallAnswer::SaveSnapshot),
                Call::ForkSnapshot(c) => self
                    .fork_snapshot(c.source, c.name, c.key)
                    .await?
                    .map(|()| CallAnswer::ForkSnapshot),
                Call::DropSnapshot(c) => self
                    .drop_snapshot(c.key, c.name)
                    .await?
                    .map(CallAnswer::DropSnapshot),
            };
            plan.answer(r);
        }
        Ok(Ok(plan.into_answers()))
    }

    /// The host's record of open fences after a batch's answers, as each call alone
    /// keeps it (`apply_grant`, `revoke_grant`); `None` (what was made is not known):
    /// every apply of the batch may have opened its fence.
    fn after_batch(&mut self, calls: &[sub::Call], answers: Option<&[sub::Result<sub::Answer>]>) {
        let Some(answers) = answers else {
            for c in calls {
                match c {
                    sub::Call::ApplyGrant {
                        container: sub::Target::Container(container),
                        ..
                    } => self
                        .open_fences
                        .push((container.clone(), FenceState::Applied)),
                    // Its container is not known: the key's current one, asked when
                    // the guest asks (`current`) or by the runtime's settle.
                    sub::Call::ApplyGrant {
                        container: sub::Target::Ensured,
                        ..
                    } => {
                        if let Some(sub::Call::Ensure { key }) = calls.first() {
                            self.unresolved_fences.push(key.clone());
                        }
                    }
                    _ => {}
                }
            }
            return;
        };
        let ensured = match answers.first() {
            Some(Ok(sub::Answer::Ensure(c))) => c.as_str(),
            _ => "",
        };
        for (c, a) in calls.iter().zip(answers) {
            match c {
                sub::Call::ApplyGrant { container, .. } => {
                    let state = match a {
                        Ok(_) => FenceState::Applied,
                        Err(_) => FenceState::ApplyFailed,
                    };
                    let container = match container {
                        sub::Target::Ensured => ensured.to_owned(),
                        sub::Target::Container(c) => c.clone(),
                    };
                    self.open_fences.push((container, state));
                }
                sub::Call::RevokeGrant { container }
                    if matches!(a, Ok(_) | Err(sub::SubstrateError::Unreachable(_))) =>
                {
                    let container = match container {
                        sub::Target::Ensured => ensured,
                        sub::Target::Container(c) => c.as_str(),
                    };
                    self.open_fences.retain(|(c, _)| c != container);
                }
                _ => {}
            }
        }
    }
}

/// The WIT target as the host's.
fn target(t: Target) -> sub::Target {
    match t {
        Target::Ensured => sub::Target::Ensured,
        Target::Container(c) => sub::Target::Container(c),
    }
}

/// A WIT call as its batch's [`sub::batch::Plan`] sees it.
fn step(c: &Call) -> sub::batch::Step {
    use sub::batch::{Kind, On, Step};
    let kind = match c {
        Call::Ensure(_) => Kind::Ensure,
        Call::ApplyGrant(_) => Kind::ApplyGrant,
        Call::KillAll(_) | Call::RevokeGrant(_) => Kind::Teardown,
        _ => Kind::Other,
    };
    let t = match c {
        Call::ApplyGrant(ApplyGrantCall { container, .. })
        | Call::Run(RunCall { container, .. })
        | Call::StartProcess(StartProcessCall { container, .. })
        | Call::ProcessStatus(ProcessCall { container, .. })
        | Call::KillProcess(ProcessCall { container, .. })
        | Call::OpenPreview(PreviewCall { container, .. })
        | Call::ClosePreview(PreviewCall { container, .. })
        | Call::SaveSnapshot(SaveSnapshotCall { container, .. })
        | Call::KillAll(container)
        | Call::RevokeGrant(container)
        | Call::ListProcesses(container)
        | Call::Snapshot(container)
        | Call::Stop(container)
        | Call::ListPreviews(container) => Some(container),
        Call::Ensure(_)
        | Call::Current(_)
        | Call::Denials(_)
        | Call::ListArtifacts(_)
        | Call::ReadArtifact(_)
        | Call::ForkSnapshot(_)
        | Call::DropSnapshot(_) => None,
    };
    let on = match t {
        None => On::Key,
        Some(Target::Ensured) => On::Ensured,
        Some(Target::Container(c)) => On::Container(c.clone()),
    };
    Step { kind, on }
}

/// The plan of a WIT batch: its answers the WIT's.
type Plan = sub::batch::Plan<CallAnswer, SubstrateError>;

impl sub::batch::Answered for CallAnswer {
    fn ensured(&self) -> Option<&str> {
        match self {
            CallAnswer::Ensure(c) => Some(c),
            _ => None,
        }
    }
}

/// Whether the substrate's own batch ([`sub::Call`]) carries this call: the fence's
/// calls. A batch with any other is made one call at a time through the imports.
fn carried(c: &Call) -> bool {
    matches!(
        c,
        Call::Ensure(_)
            | Call::ApplyGrant(_)
            | Call::Run(_)
            | Call::KillAll(_)
            | Call::RevokeGrant(_)
    )
}

/// The answers of a batch whose caller went away during its run: what `run` answers
/// then (the run abandoned, killed by the teardown), every apply before it open. A
/// call before the run that is neither is not known: `None`.
fn abandoned(calls: &[sub::Call]) -> Option<Vec<sub::Result<sub::Answer>>> {
    let mut answers = Vec::new();
    for c in calls {
        match c {
            sub::Call::ApplyGrant { .. } => answers.push(Ok(sub::Answer::ApplyGrant)),
            sub::Call::Run { .. } => {
                answers.push(Ok(sub::Answer::Run(sub::RunResult {
                    exit_code: -libc::SIGKILL,
                    ..Default::default()
                })));
                return Some(answers);
            }
            _ => return None,
        }
    }
    None
}

/// Whether a fence the call opened may have run something (see `apply_grant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceState {
    /// Applied: a run may have started under it.
    Applied,
    /// The apply failed: nothing ran.
    ApplyFailed,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use wasmtime::StoreLimitsBuilder;

    use super::*;
    use crate::substrate::mock::Mock;

    /// A call's imports over the mock, its store in a directory of its own.
    struct Call0 {
        ctx: Ctx,
        dir: std::path::PathBuf,
    }

    impl Drop for Call0 {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn call() -> Call0 {
        let dir = std::env::temp_dir().join(format!("stockade-imports-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Arc::new(stockade_store::Store::open_in(&dir).expect("a store"));
        let secrets = stockade_egress::secrets::Secrets::new(store.clone(), Default::default());
        let ctx = Ctx::new(
            Arc::new(Mock::new(4)),
            store,
            Arc::new(vec![]),
            secrets,
            StoreLimitsBuilder::new().build(),
        );
        Call0 { ctx, dir }
    }

    fn cmd() -> Command {
        Command {
            argv: vec!["sleep".into(), "60".into()],
            cwd: "/workspace".into(),
            env: vec![],
            stdin: vec![],
        }
    }

    /// The guest's calls outside a fence go through `batch`: each is made as the named
    /// call, with the host's bookkeeping of it (a started process is killed if the call
    /// traps), on the container the opening `ensure` answered.
    #[tokio::test]
    async fn a_batch_of_calls_the_substrate_does_not_carry_is_made_as_the_named_calls() {
        let mut c = call();
        let answers = c
            .ctx
            .batch(vec![
                Call::Ensure("k".into()),
                Call::StartProcess(StartProcessCall {
                    container: Target::Ensured,
                    cmd: cmd(),
                }),
            ])
            .await
            .expect("no trap")
            .expect("made");
        let [
            Ok(CallAnswer::Ensure(container)),
            Ok(CallAnswer::StartProcess(id)),
        ] = answers.as_slice()
        else {
            panic!("the answers: {answers:?}");
        };
        assert_eq!(
            c.ctx.take_started_processes(),
            vec![(container.clone(), id.clone())],
            "a process started through the batch is the call's to kill if it traps"
        );

        // A batch of one: the named call's answer.
        let status = c
            .ctx
            .batch(vec![Call::ProcessStatus(ProcessCall {
                container: Target::Container(container.clone()),
                id: id.clone(),
            })])
            .await
            .expect("no trap")
            .expect("made");
        assert!(
            matches!(status.as_slice(), [Ok(CallAnswer::ProcessStatus(Some(p)))] if p.id == *id && p.running),
            "{status:?}"
        );

        // The named call's error is the call's error; the calls after it are not made.
        let failed = c
            .ctx
            .batch(vec![
                Call::Stop(Target::Container("no-such-container".into())),
                Call::Current("k".into()),
            ])
            .await
            .expect("no trap")
            .expect("made");
        assert!(matches!(failed.as_slice(), [Err(_)]), "{failed:?}");

        // The shape is checked whole first: nothing is made.
        let refused = c
            .ctx
            .batch(vec![Call::KillProcess(ProcessCall {
                container: Target::Ensured,
                id: id.clone(),
            })])
            .await
            .expect("no trap");
        assert!(
            matches!(refused, Err(SubstrateError::Invalid(_))),
            "{refused:?}"
        );
        let still = c
            .ctx
            .batch(vec![Call::ListProcesses(Target::Container(
                container.clone(),
            ))])
            .await
            .expect("no trap")
            .expect("made");
        assert!(
            matches!(still.as_slice(), [Ok(CallAnswer::ListProcesses(ps))] if ps.len() == 1 && ps[0].running),
            "{still:?}"
        );
    }
}
