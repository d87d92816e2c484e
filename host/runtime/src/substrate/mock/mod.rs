//! The mock substrate: in memory, deterministic, records the ordered call trace and
//! injects faults per call. The conformance suite drives the real guest against it;
//! `edge/` mirrors it in JavaScript (docs/CONFORMANCE.md states the semantics both
//! implement).
//!
//! A run's behaviour is scripted by its argv:
//! * `echo A B` → stdout `A B\n`, exit 0;
//! * `cat` → stdout = the command's stdin, exit 0;
//! * `exit N` → exit code N (for `start-process`: an already exited process);
//! * `background` → exit 0, and leaves a running tracked process behind (what a
//!   fenced command backgrounded);
//! * `hang` → timed out, exit -1;
//! * `deny HOST` → while a grant is open, one egress denial for HOST;
//! * `admit` → while a grant is open, one admitted egress request;
//! * `rules` → stdout the open grant's number of rules (`0\n` for one with none),
//!   `none\n` when no grant is open (which grant a command runs under);
//! * anything else → exit 0, no output.
//!
//! A [`script::Script`] set on the mock (`stockade serve --mock`, docs/MOCK.md) answers
//! before that vocabulary: the first rule matching the argv, else its default.

pub mod control;
pub mod faults;
pub mod script;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::{
    Artifact, Command, ContainerId, Denial, Event, FenceCounts, Housekeeping, Output, OutputSink,
    Preview, ProcessInfo, Result, RunResult, Substrate, SubstrateError,
};
use stockade_egress::rules::Grant;

/// One recorded substrate call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The WIT name of the call (`ensure`, `apply-grant`, …).
    pub op: &'static str,
    /// Its main argument: the key, container or process id.
    pub target: String,
}

/// An injected fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The call returns this error.
    Error(SubstrateError),
    /// The host traps the guest call (proves the host-side revoke).
    Trap,
}

#[derive(Debug, Clone)]
struct Armed {
    op: String,
    fault: Fault,
    /// Calls of `op` to let through before the fault fires.
    skip: u32,
    remaining: Option<u32>,
    /// Only calls about this key's sandbox (`None`: any call of `op`).
    key: Option<String>,
}

/// The most calls a key's trace keeps (the oldest go first): a mock server lives as
/// long as a consumer's test run, however many calls it makes.
pub const KEY_TRACE_CAP: usize = 10_000;
/// The most calls the whole trace keeps (the conformance suite clears it every step).
const TRACE_CAP: usize = 100_000;

/// The ops whose target is the key itself (every other names a container or a process).
const KEY_OPS: &[&str] = &[
    "ensure",
    "current",
    "denials",
    "list-artifacts",
    "read-artifact",
    "fork-snapshot",
    "drop-snapshot",
];

#[derive(Debug, Default)]
struct Container {
    key: String,
    processes: BTreeMap<String, ProcessInfo>,
    grant: Option<(String, usize)>,
    denied_while_open: u32,
    admitted_while_open: u32,
    /// Open preview doors by port (they go with the container, whichever way it goes).
    previews: BTreeMap<u16, super::Preview>,
}

#[derive(Debug, Default)]
struct State {
    trace: Vec<Call>,
    /// Every op a fault can be injected into, in call order: the trace's ops and the
    /// untraced ones (`records.*`, `policy.*`). The fault matrix enumerates its cells
    /// from it.
    all_ops: Vec<String>,
    faults: Vec<Armed>,
    containers: HashMap<ContainerId, Container>,
    keys: HashMap<String, ContainerId>,
    next_container: u64,
    next_process: u64,
    denials: HashMap<String, Vec<Denial>>,
    artifacts: HashMap<String, BTreeMap<String, Vec<u8>>>,
    snapshots: Vec<ContainerId>,
    /// Named snapshots by (key, name): the container they were taken of.
    named: BTreeMap<(String, String), ContainerId>,
    /// Each key whose restore cache a fork set: (source, name).
    forked: HashMap<String, (String, String)>,
    /// Each key's calls, in order (`GET /v1/mock/trace/{key}`).
    by_key: HashMap<String, Vec<Call>>,
    /// Whose every container and process was (ids are never reused): a call about one
    /// that is gone (lost, unreachable) is still its key's.
    owners: HashMap<String, String>,
    /// Scripted detached processes' ends: process id → (when, exit code).
    exits: HashMap<String, (Instant, i32)>,
}

/// The mock substrate.
pub struct Mock {
    ceiling: usize,
    state: Mutex<State>,
    events: broadcast::Sender<Event>,
    idle: Mutex<IdleScript>,
    /// Pending egress decisions a test holds (the mock has no proxy to hold them).
    asks: Arc<stockade_egress::ask::Asks>,
    /// The scripted outcomes, and the document they were read from.
    script: Mutex<(Arc<script::Script>, serde_json::Value)>,
}

/// What `idle` answers (the mock has no clock): the keys a test declared idle, and an
/// optional pause inside the call (to order a race deterministically).
#[derive(Default)]
struct IdleScript {
    keys: Vec<String>,
    pause: Option<(Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>)>,
}

impl Mock {
    /// A mock admitting at most `ceiling` live containers.
    pub fn new(ceiling: usize) -> Self {
        Self {
            ceiling,
            state: Mutex::new(State::default()),
            events: broadcast::channel(64).0,
            idle: Mutex::new(IdleScript::default()),
            asks: stockade_egress::ask::Asks::new(Default::default()),
            script: Mutex::new((Arc::default(), serde_json::json!({}))),
        }
    }

    /// Answer runs and detached starts from `script` from now on (replacing the last).
    pub fn set_script(&self, script: script::Script, doc: serde_json::Value) {
        *self.script.lock().unwrap_or_else(|p| p.into_inner()) = (Arc::new(script), doc);
    }

    /// The script's document as it was set (`{}`: none).
    pub fn script_doc(&self) -> serde_json::Value {
        self.script
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// What the script says `argv` does (`None`: the built-in vocabulary).
    fn scripted(&self, argv: &[String]) -> Option<script::Outcome> {
        let s = self
            .script
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone();
        s.pick(argv).cloned()
    }

    /// Arm a fault a consumer asked for ([`faults::parse`]).
    pub fn arm(&self, r: faults::Request) {
        self.state().faults.push(Armed {
            op: r.op,
            fault: r.fault,
            skip: r.skip,
            remaining: r.times,
            key: r.key,
        });
    }

    /// Carry out a consumer's direct control ([`control::parse`]); an error (nothing
    /// done) names what is not there.
    pub fn control(&self, c: control::Control) -> std::result::Result<(), String> {
        use control::{Control, Which};
        let container = |st: &State, w: &Which| match w {
            Which::Key(k) => st
                .keys
                .get(k)
                .cloned()
                .ok_or_else(|| format!("key {k:?} has no live container")),
            Which::Container(c) if st.containers.contains_key(c) => Ok(c.clone()),
            Which::Container(c) => Err(format!("no container {c:?}")),
        };
        let process = |st: &State, c: &str, id: &str| {
            if st.containers[c].processes.contains_key(id) {
                Ok(())
            } else {
                Err(format!("container {c:?} tracks no process {id:?}"))
            }
        };
        match c {
            Control::StopContainer(w) => {
                let c = container(&self.state(), &w)?;
                self.stop_from_outside(&c);
            }
            Control::ExitProcess(w, id, code) => {
                let c = {
                    let st = self.state();
                    let c = container(&st, &w)?;
                    process(&st, &c, &id)?;
                    c
                };
                self.exit_process(&c, &id, code);
            }
            Control::LoseProcess(w, id) => {
                let c = {
                    let st = self.state();
                    let c = container(&st, &w)?;
                    process(&st, &c, &id)?;
                    c
                };
                self.lose_process(&c, &id);
            }
            Control::PutArtifact { key, name, bytes } => self.put_artifact(&key, &name, &bytes),
        }
        Ok(())
    }

    /// The calls made about `key`'s sandbox, in order (the last [`KEY_TRACE_CAP`]).
    pub fn key_trace(&self, key: &str) -> Vec<Call> {
        self.state().by_key.get(key).cloned().unwrap_or_default()
    }

    /// Forget `key`'s trace.
    pub fn clear_key_trace(&self, key: &str) {
        self.state().by_key.remove(key);
    }

    /// The pending egress decisions `pending` and `answer_pending` answer from: a test
    /// holds one here as a proxy would (`Asks::hold`).
    pub fn asks(&self) -> &Arc<stockade_egress::ask::Asks> {
        &self.asks
    }

    /// Make `idle` answer `keys` (while they have a live container).
    pub fn set_idle(&self, keys: &[&str]) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).keys =
            keys.iter().map(|k| k.to_string()).collect();
    }

    /// Pause the next `idle` call: `entered` is notified inside it, and it returns once
    /// `release` is notified.
    pub fn pause_idle(&self) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        let entered = Arc::new(tokio::sync::Notify::new());
        let release = Arc::new(tokio::sync::Notify::new());
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pause =
            Some((entered.clone(), release.clone()));
        (entered, release)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ordered call trace so far.
    pub fn trace(&self) -> Vec<Call> {
        self.state().trace.clone()
    }

    /// The ops of the trace (`["ensure", "apply-grant", …]`).
    pub fn ops(&self) -> Vec<&'static str> {
        self.state().trace.iter().map(|c| c.op).collect()
    }

    /// Every injectable op called so far, untraced ones included.
    pub fn all_ops(&self) -> Vec<String> {
        self.state().all_ops.clone()
    }

    /// Forget the trace (a test step boundary).
    pub fn clear_trace(&self) {
        let mut st = self.state();
        st.trace.clear();
        st.all_ops.clear();
    }

    /// Make `op` fail with `fault`, `times` times (`None`: until cleared).
    pub fn inject(&self, op: &str, fault: Fault, times: Option<u32>) {
        self.inject_after(op, 0, fault, times);
    }

    /// Like [`Mock::inject`], letting the first `skip` calls of `op` through.
    pub fn inject_after(&self, op: &str, skip: u32, fault: Fault, times: Option<u32>) {
        self.state().faults.push(Armed {
            op: op.to_string(),
            fault,
            skip,
            remaining: times,
            key: None,
        });
    }

    /// Remove every armed fault.
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// Put an artifact under the key's `/artifacts`.
    pub fn put_artifact(&self, key: &str, name: &str, bytes: &[u8]) {
        self.state()
            .artifacts
            .entry(key.to_string())
            .or_default()
            .insert(name.to_string(), bytes.to_vec());
    }

    /// Processes the container tracks (test inspection; no trace entry).
    pub fn processes(&self, container: &str) -> Vec<ProcessInfo> {
        self.state()
            .containers
            .get(container)
            .map(|c| c.processes.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Containers with a grant open (test inspection).
    pub fn open_grants_now(&self) -> Vec<ContainerId> {
        Housekeeping::open_grants(self)
    }

    /// Every tracked process with its container and the container's key (test
    /// inspection; no trace entry).
    pub fn tracked(&self) -> Vec<(String, ContainerId, ProcessInfo)> {
        let st = self.state();
        st.containers
            .iter()
            .flat_map(|(id, c)| {
                c.processes
                    .values()
                    .map(|p| (c.key.clone(), id.clone(), p.clone()))
            })
            .collect()
    }

    /// Make a tracked process exit with `code` (test control; no trace entry).
    pub fn exit_process(&self, container: &str, id: &str, code: i32) {
        if let Some(p) = self
            .state()
            .containers
            .get_mut(container)
            .and_then(|c| c.processes.get_mut(id))
        {
            p.running = false;
            p.exit_code = Some(code);
        }
    }

    /// Forget a tracked process without the guest knowing (the container lost it).
    pub fn lose_process(&self, container: &str, id: &str) {
        if let Some(c) = self.state().containers.get_mut(container) {
            c.processes.remove(id);
        }
    }

    /// The container stops on its own: it is gone and `Event::Stopped` is sent.
    pub fn stop_from_outside(&self, container: &str) {
        {
            let mut st = self.state();
            if let Some(c) = st.containers.remove(container) {
                st.keys.remove(&c.key);
            }
        }
        let _ = self.events.send(Event::Stopped(container.to_string()));
    }

    /// The (source, name) a fork set `key`'s restore cache from, if one did.
    pub fn forked_from(&self, key: &str) -> Option<(String, String)> {
        self.state().forked.get(key).cloned()
    }

    /// Containers snapshotted so far.
    pub fn snapshots(&self) -> Vec<ContainerId> {
        self.state().snapshots.clone()
    }

    /// Live containers.
    pub fn live(&self) -> usize {
        self.state().containers.len()
    }

    /// Fire an armed fault for an op the trace does not record (records, policy).
    fn fire(&self, op: &str) -> Option<SubstrateError> {
        let mut st = self.state();
        st.armed(op, None)
    }

    /// Record the call, then fire an armed fault for it if there is one.
    fn enter(&self, op: &'static str, target: &str) -> Result<std::sync::MutexGuard<'_, State>> {
        let mut st = self.state();
        st.settle_exits(Instant::now());
        let call = Call {
            op,
            target: target.to_string(),
        };
        if st.trace.len() >= TRACE_CAP {
            st.trace.drain(..TRACE_CAP / 2);
            let n = st.all_ops.len().min(TRACE_CAP / 2);
            st.all_ops.drain(..n);
        }
        let key = st.key_of(op, target);
        if let Some(k) = &key {
            let t = st.by_key.entry(k.clone()).or_default();
            if t.len() >= KEY_TRACE_CAP {
                t.remove(0);
            }
            t.push(call.clone());
        }
        st.trace.push(call);
        match st.armed(op, key.as_deref()) {
            Some(e @ SubstrateError::Unreachable(_)) => {
                // Unreachable means gone (the linux substrate decides it from the
                // container's own state): the container the op is about dies now, as
                // one killed from outside would, on-stop included.
                let gone = st.gone(target);
                drop(st);
                if let Some(c) = gone {
                    let _ = self.events.send(Event::Stopped(c));
                }
                Err(e)
            }
            Some(e) => Err(e),
            None => Ok(st),
        }
    }
}

/// A streamed stdin is read to its end first: the same bytes as `stdin`.
async fn read_stdin(cmd: &mut Command) {
    if let Some(mut chunks) = cmd.stdin_stream.take().and_then(|s| s.take()) {
        while let Some(chunk) = chunks.recv().await {
            cmd.stdin.extend_from_slice(&chunk);
        }
    }
}

impl Mock {
    /// Play a scripted run: its output at its moments (to `sink` as it goes, or whole
    /// at the end), for its duration, or until `timeout` if that comes first (then it is
    /// timed out, exit -1, as the built-in `hang` is). No lock is held while it plays.
    async fn play(
        &self,
        container: &str,
        o: &script::Outcome,
        timeout: Duration,
        sink: Option<&OutputSink>,
    ) -> Result<RunResult> {
        {
            let mut st = self.enter("run", container)?;
            st.container(container)?;
        }
        let ends = o.ends_at();
        let timed_out = ends > timeout;
        let until = if timed_out { timeout } else { ends };
        let start = tokio::time::Instant::now();
        let mut r = RunResult::default();
        match sink {
            None => {
                let (out, err) = o.whole(until);
                (r.stdout, r.stderr) = (out, err);
            }
            Some(sink) => {
                if !o.stdout.is_empty() {
                    let _ = sink.send(Output::Stdout(o.stdout.clone()));
                }
                if !o.stderr.is_empty() {
                    let _ = sink.send(Output::Stderr(o.stderr.clone()));
                }
                for c in o.chunks.iter().filter(|c| c.at <= until) {
                    tokio::time::sleep_until(start + c.at).await;
                    let _ = sink.send(match c.stream {
                        script::Stream::Stdout => Output::Stdout(c.bytes.clone()),
                        script::Stream::Stderr => Output::Stderr(c.bytes.clone()),
                    });
                }
            }
        }
        tokio::time::sleep_until(start + until).await;
        if timed_out {
            r.timed_out = true;
            r.exit_code = -1;
        } else {
            r.exit_code = o.exit_code;
        }
        Ok(r)
    }
}

fn unreachable(c: &str) -> SubstrateError {
    SubstrateError::Unreachable(format!("no container {c}"))
}

impl State {
    /// Log `op`, then fire the first armed fault for it (and for `key`, when the fault
    /// names one) whose skips are used up.
    fn armed(&mut self, op: &str, key: Option<&str>) -> Option<SubstrateError> {
        self.all_ops.push(op.to_string());
        let i = self
            .faults
            .iter()
            .position(|f| f.op == op && (f.key.is_none() || f.key.as_deref() == key))?;
        let armed = &mut self.faults[i];
        if armed.skip > 0 {
            armed.skip -= 1;
            return None;
        }
        let fault = armed.fault.clone();
        if let Some(n) = &mut armed.remaining {
            *n -= 1;
            if *n == 0 {
                self.faults.remove(i);
            }
        }
        Some(match fault {
            Fault::Error(e) => e,
            Fault::Trap => SubstrateError::Trap(format!("injected into {op}")),
        })
    }

    /// The key whose sandbox a call of `op` on `target` is about, if it is known.
    fn key_of(&self, op: &str, target: &str) -> Option<String> {
        if KEY_OPS.contains(&op) {
            return Some(target.to_string());
        }
        self.owners.get(target).cloned()
    }

    /// Scripted detached processes whose life ended by `now` have exited.
    fn settle_exits(&mut self, now: Instant) {
        if self.exits.is_empty() {
            return;
        }
        let ended: Vec<(String, i32)> = self
            .exits
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(id, (_, code))| (id.clone(), *code))
            .collect();
        for (id, code) in ended {
            self.exits.remove(&id);
            if let Some(p) = self
                .containers
                .values_mut()
                .find_map(|c| c.processes.get_mut(&id))
            {
                p.running = false;
                p.exit_code = Some(code);
            }
        }
    }

    /// Remove the container `target` names (its id, its key, or one of its processes).
    fn gone(&mut self, target: &str) -> Option<ContainerId> {
        let id = if self.containers.contains_key(target) {
            target.to_string()
        } else if let Some(c) = self.keys.get(target) {
            c.clone()
        } else {
            self.containers
                .iter()
                .find(|(_, c)| c.processes.contains_key(target))
                .map(|(id, _)| id.clone())?
        };
        let c = self.containers.remove(&id)?;
        self.keys.remove(&c.key);
        Some(id)
    }

    fn container(&mut self, c: &str) -> Result<&mut Container> {
        self.containers.get_mut(c).ok_or_else(|| unreachable(c))
    }

    fn new_process(&mut self, c: &str, running: bool, exit_code: Option<i32>) -> Result<String> {
        self.next_process += 1;
        let id = format!("00000000-0000-4000-8000-{:012x}", self.next_process);
        let info = ProcessInfo {
            id: id.clone(),
            running,
            exit_code,
        };
        let container = self.container(c)?;
        container.processes.insert(id.clone(), info);
        let key = container.key.clone();
        self.owners.insert(id.clone(), key);
        Ok(id)
    }
}

#[async_trait]
impl Substrate for Mock {
    async fn ensure(&self, key: &str) -> Result<ContainerId> {
        let mut st = self.enter("ensure", key)?;
        if let Some(c) = st.keys.get(key) {
            return Ok(c.clone());
        }
        if st.containers.len() >= self.ceiling {
            return Err(SubstrateError::OverCapacity);
        }
        st.next_container += 1;
        let id = format!("mock-c{}", st.next_container);
        st.containers.insert(
            id.clone(),
            Container {
                key: key.to_string(),
                ..Default::default()
            },
        );
        st.keys.insert(key.to_string(), id.clone());
        st.owners.insert(id.clone(), key.to_string());
        Ok(id)
    }

    async fn current(&self, key: &str) -> Result<Option<ContainerId>> {
        let st = self.enter("current", key)?;
        Ok(st.keys.get(key).cloned())
    }

    async fn apply_grant(&self, container: &str, fence: &str, grant: Grant) -> Result<()> {
        let mut st = self.enter("apply-grant", container)?;
        let c = st.container(container)?;
        c.grant = Some((fence.to_string(), grant.len()));
        c.denied_while_open = 0;
        c.admitted_while_open = 0;
        Ok(())
    }

    async fn revoke_grant(&self, container: &str) -> Result<FenceCounts> {
        let mut st = self.enter("revoke-grant", container)?;
        let c = st.container(container)?;
        c.grant = None;
        Ok(FenceCounts {
            admitted: std::mem::take(&mut c.admitted_while_open),
            denied: std::mem::take(&mut c.denied_while_open),
        })
    }

    async fn run(&self, container: &str, mut cmd: Command, timeout: Duration) -> Result<RunResult> {
        read_stdin(&mut cmd).await;
        if let Some(o) = self.scripted(&cmd.argv) {
            return self.play(container, &o, timeout, None).await;
        }
        if cmd.argv[0] == "sleep-ms" {
            // Time really spent inside the import (no lock held): the runtime's
            // deadline must not count it against the guest.
            let ms = cmd.argv.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
            {
                let mut st = self.enter("run", container)?;
                st.container(container)?;
            }
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return Ok(RunResult::default());
        }
        let mut st = self.enter("run", container)?;
        st.container(container)?;
        let args = &cmd.argv[1..];
        let mut r = RunResult::default();
        match cmd.argv[0].as_str() {
            "echo" => r.stdout = format!("{}\n", args.join(" ")).into_bytes(),
            "cat" => r.stdout = cmd.stdin.clone(),
            "exit" => r.exit_code = args.first().and_then(|a| a.parse().ok()).unwrap_or(1),
            "background" => {
                st.new_process(container, true, None)?;
            }
            "hang" => {
                r.timed_out = true;
                r.exit_code = -1;
            }
            "rules" => {
                let c = st.container(container)?;
                r.stdout = match &c.grant {
                    Some((_, n)) => format!("{n}\n"),
                    None => "none\n".into(),
                }
                .into_bytes();
            }
            "admit" => {
                // A request the open grant admitted (counted in the outcome).
                let c = st.container(container)?;
                if c.grant.is_some() {
                    c.admitted_while_open += 1;
                }
            }
            "deny" => {
                let host = args.first().cloned().unwrap_or_default();
                let c = st.container(container)?;
                let Some((fence, _)) = c.grant.clone() else {
                    return Ok(r);
                };
                c.denied_while_open += 1;
                let key = c.key.clone();
                st.denials.entry(key).or_default().push(Denial {
                    at_ms: 0,
                    host,
                    method: "GET".into(),
                    path: "/".into(),
                    rule_set: fence,
                    reason: "no-rule".into(),
                });
                r.exit_code = 22;
            }
            _ => {}
        }
        Ok(r)
    }

    async fn run_streaming(
        &self,
        container: &str,
        mut cmd: Command,
        timeout: Duration,
        sink: OutputSink,
    ) -> Result<RunResult> {
        read_stdin(&mut cmd).await;
        if let Some(o) = self.scripted(&cmd.argv) {
            return self.play(container, &o, timeout, Some(&sink)).await;
        }
        // The built-in vocabulary: all of the output at the end (the trait's default).
        let mut r = self.run(container, cmd, timeout).await?;
        let (out, err) = (std::mem::take(&mut r.stdout), std::mem::take(&mut r.stderr));
        if !out.is_empty() {
            let _ = sink.send(Output::Stdout(out));
        }
        if !err.is_empty() {
            let _ = sink.send(Output::Stderr(err));
        }
        Ok(r)
    }

    async fn start_process(&self, container: &str, cmd: Command) -> Result<String> {
        let scripted = self.scripted(&cmd.argv);
        let mut st = self.enter("start-process", container)?;
        if let Some(o) = scripted {
            return match o.detached {
                // Runs until it is killed.
                None => st.new_process(container, true, None),
                Some(life) if life.runs.is_zero() => {
                    st.new_process(container, false, Some(life.exit_code))
                }
                Some(life) => {
                    let id = st.new_process(container, true, None)?;
                    st.exits
                        .insert(id.clone(), (Instant::now() + life.runs, life.exit_code));
                    Ok(id)
                }
            };
        }
        match cmd.argv[0].as_str() {
            "exit" => {
                let code = cmd.argv.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
                st.new_process(container, false, Some(code))
            }
            _ => st.new_process(container, true, None),
        }
    }

    async fn list_processes(&self, container: &str) -> Result<Vec<ProcessInfo>> {
        let mut st = self.enter("list-processes", container)?;
        Ok(st
            .container(container)?
            .processes
            .values()
            .cloned()
            .collect())
    }

    async fn process_status(&self, container: &str, id: &str) -> Result<Option<ProcessInfo>> {
        let mut st = self.enter("process-status", id)?;
        Ok(st.container(container)?.processes.get(id).cloned())
    }

    async fn kill_process(&self, container: &str, id: &str) -> Result<u32> {
        let mut st = self.enter("kill-process", id)?;
        let p = st.container(container)?.processes.remove(id);
        Ok(p.is_some_and(|p| p.running) as u32)
    }

    async fn kill_all(&self, container: &str) -> Result<u32> {
        let mut st = self.enter("kill-all", container)?;
        let c = st.container(container)?;
        let n = c.processes.values().filter(|p| p.running).count() as u32;
        c.processes.clear();
        Ok(n)
    }

    async fn snapshot(&self, container: &str) -> Result<()> {
        let mut st = self.enter("snapshot", container)?;
        st.container(container)?;
        st.snapshots.push(container.to_string());
        Ok(())
    }

    async fn save_snapshot(&self, container: &str, name: &str) -> Result<()> {
        let mut st = self.enter("save-snapshot", container)?;
        let key = st.container(container)?.key.clone();
        st.named
            .insert((key, name.to_owned()), container.to_owned());
        Ok(())
    }

    async fn fork_snapshot(&self, source: &str, name: &str, key: &str) -> Result<()> {
        // Traced on the forked key (KEY_OPS), the call's own.
        let mut st = self.enter("fork-snapshot", key)?;
        if !st.named.contains_key(&(source.to_owned(), name.to_owned())) {
            return Err(SubstrateError::Invalid(format!(
                "{source} holds no snapshot named {name:?}"
            )));
        }
        st.forked
            .insert(key.to_owned(), (source.to_owned(), name.to_owned()));
        Ok(())
    }

    async fn drop_snapshot(&self, key: &str, name: &str) -> Result<bool> {
        let mut st = self.enter("drop-snapshot", key)?;
        Ok(st
            .named
            .remove(&(key.to_owned(), name.to_owned()))
            .is_some())
    }

    async fn stop(&self, container: &str) -> Result<()> {
        let mut st = self.enter("stop", container)?;
        let c = st
            .containers
            .remove(container)
            .ok_or_else(|| unreachable(container))?;
        st.keys.remove(&c.key);
        Ok(())
    }

    async fn denials(&self, key: &str) -> Result<Vec<Denial>> {
        let st = self.enter("denials", key)?;
        Ok(st.denials.get(key).cloned().unwrap_or_default())
    }

    async fn list_artifacts(&self, key: &str) -> Result<Vec<Artifact>> {
        let st = self.enter("list-artifacts", key)?;
        Ok(st
            .artifacts
            .get(key)
            .map(|m| {
                m.iter()
                    .map(|(name, b)| Artifact {
                        name: name.clone(),
                        size: b.len() as u64,
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn read_artifact(
        &self,
        key: &str,
        name: &str,
        offset: u64,
        length: u32,
    ) -> Result<Vec<u8>> {
        let st = self.enter("read-artifact", key)?;
        let bytes = st
            .artifacts
            .get(key)
            .and_then(|m| m.get(name))
            .ok_or_else(|| SubstrateError::Invalid(format!("no artifact {name:?}")))?;
        let start = (offset as usize).min(bytes.len());
        let end = start.saturating_add(length as usize).min(bytes.len());
        Ok(bytes[start..end].to_vec())
    }

    async fn open_preview(&self, container: &str, port: u16) -> Result<Preview> {
        let mut st = self.enter("open-preview", container)?;
        let c = st.container(container)?;
        if let Some(p) = c.previews.get(&port) {
            return Ok(p.clone());
        }
        let token = crate::preview::token::fresh().map_err(SubstrateError::Failed)?;
        let p = Preview {
            port,
            url: format!("http://{PREVIEW_AUTHORITY}/p/{token}/"),
            token,
        };
        c.previews.insert(port, p.clone());
        Ok(p)
    }

    async fn close_preview(&self, container: &str, port: u16) -> Result<bool> {
        let mut st = self.enter("close-preview", container)?;
        Ok(st.container(container)?.previews.remove(&port).is_some())
    }

    async fn list_previews(&self, container: &str) -> Result<Vec<Preview>> {
        let mut st = self.enter("list-previews", container)?;
        Ok(st
            .container(container)?
            .previews
            .values()
            .cloned()
            .collect())
    }
}

/// Where the mock's doors say they answer (it serves none: the contract's semantics
/// only, as the linux substrate's table keeps them).
pub const PREVIEW_AUTHORITY: &str = "preview.mock.invalid";

#[async_trait]
impl Housekeeping for Mock {
    fn kind(&self) -> &'static str {
        "mock"
    }

    async fn pending(&self, key: Option<&str>) -> Result<Vec<stockade_egress::ask::Pending>> {
        Ok(self.asks.pending(key))
    }

    async fn answer_pending(
        &self,
        id: &str,
        of: Option<&str>,
        answer: stockade_egress::ask::Answer,
    ) -> Result<std::result::Result<stockade_egress::ask::Pending, stockade_egress::ask::AnswerError>>
    {
        Ok(self.asks.answer_of(id, of, answer))
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    async fn idle(&self, _idle_for: Duration) -> Vec<String> {
        let (keys, pause) = {
            let mut script = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            (script.keys.clone(), script.pause.take())
        };
        if let Some((entered, release)) = pause {
            entered.notify_one();
            release.notified().await;
        }
        let st = self.state();
        keys.into_iter()
            .filter(|k| st.containers.values().any(|c| &c.key == k))
            .collect()
    }

    fn open_grants(&self) -> Vec<ContainerId> {
        self.state()
            .containers
            .iter()
            .filter(|(_, c)| c.grant.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn injected(&self, op: &str) -> Option<SubstrateError> {
        self.fire(op)
    }

    async fn shutdown(&self) {
        let mut st = self.state();
        st.containers.clear();
        st.keys.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(argv: &[&str]) -> Command {
        Command {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: "/workspace".into(),
            env: vec![],
            stdin: vec![],
            stdin_stream: None,
        }
    }

    #[tokio::test]
    async fn a_keys_trace_keeps_calls_about_what_it_lost_and_a_keys_fault_fires_for_it_alone() {
        let m = Mock::new(4);
        let a = m.ensure("a").await.unwrap();
        let b = m.ensure("b").await.unwrap();
        let p = m.start_process(&a, cmd(&["server"])).await.unwrap();
        m.lose_process(&a, &p);
        assert_eq!(m.process_status(&a, &p).await.unwrap(), None);
        m.arm(
            faults::parse(
                &serde_json::json!({"op": "kill-all", "fault": "unreachable", "key": "a"}),
            )
            .unwrap(),
        );
        assert_eq!(m.kill_all(&b).await, Ok(0), "another key's call");
        assert!(matches!(
            m.kill_all(&a).await,
            Err(SubstrateError::Unreachable(_))
        ));
        // The container is gone: a call about it is still the key's.
        assert!(m.revoke_grant(&a).await.is_err());
        let ops = |k: &str| m.key_trace(k).iter().map(|c| c.op).collect::<Vec<_>>();
        assert_eq!(
            ops("a"),
            [
                "ensure",
                "start-process",
                "process-status",
                "kill-all",
                "revoke-grant"
            ]
        );
        assert_eq!(ops("b"), ["ensure", "kill-all"]);
        m.clear_key_trace("a");
        assert!(m.key_trace("a").is_empty());
    }

    #[tokio::test]
    async fn a_scripted_run_and_a_scripted_life_play_as_written() {
        let m = Mock::new(4);
        let doc = serde_json::json!({"rules": [
            {"argv": ["build"], "exit_code": 2, "stdout": "a", "chunks": [{"at_ms": 30, "stderr": "b"}]},
            {"argv": ["slow"], "duration_ms": 5000},
            {"argv": ["worker"], "detached": {"runs_ms": 30, "exit_code": 4}},
        ]});
        m.set_script(script::Script::from_value(&doc).unwrap(), doc);
        let c = m.ensure("k").await.unwrap();
        let r = m
            .run(&c, cmd(&["build"]), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(
            (r.exit_code, &r.stdout[..], &r.stderr[..]),
            (2, &b"a"[..], &b"b"[..])
        );
        let r = m
            .run(&c, cmd(&["slow"]), Duration::from_millis(20))
            .await
            .unwrap();
        assert_eq!(
            (r.timed_out, r.exit_code),
            (true, -1),
            "its timeout came first"
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let r = m
            .run_streaming(&c, cmd(&["build"]), Duration::from_secs(5), tx)
            .await
            .unwrap();
        assert_eq!(r.exit_code, 2);
        assert_eq!(rx.recv().await, Some(Output::Stdout(b"a".to_vec())));
        assert_eq!(rx.recv().await, Some(Output::Stderr(b"b".to_vec())));
        let p = m.start_process(&c, cmd(&["worker"])).await.unwrap();
        assert!(m.process_status(&c, &p).await.unwrap().unwrap().running);
        tokio::time::sleep(Duration::from_millis(40)).await;
        let s = m.process_status(&c, &p).await.unwrap().unwrap();
        assert_eq!((s.running, s.exit_code), (false, Some(4)));
        // Unscripted: the built-in vocabulary.
        let r = m
            .run(&c, cmd(&["echo", "hi"]), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(r.stdout, b"hi\n");
    }
}
