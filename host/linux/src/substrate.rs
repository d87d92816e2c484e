//! The linux substrate's calls: the `Substrate` trait the runtime drives (each a call
//! to the container's supervisor, its fence or the host's own files) and the
//! `Housekeeping` the `stockade` binary uses (idle containers, open grants, shutdown).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::broadcast;

use stockade_egress::rules::Grant;
use stockade_grammar::names;
use stockade_runtime::substrate::{
    Artifact, Command, ContainerId, Denial, Event, FenceCounts, Housekeeping, OutputSink,
    ProcessInfo, Result, RunResult, Substrate, SubstrateError,
};

use super::calls::{process_info, spec, unexpected};
use super::protocol::{Request, Response};
use super::{CALL_TIMEOUT, Linux, STOP_DEADLINE, artifacts, kill, snapshot};

#[async_trait]
impl Substrate for Linux {
    async fn ensure(&self, key: &str) -> Result<ContainerId> {
        let inner = &self.inner;
        let lock = inner.gate.key_lock(key);
        let _guard = lock.lock().await;
        let existing = inner.registry.of_key(key);
        if let Some(id) = existing
            && let Ok(c) = inner.get(&id)
            && !*c.exited.borrow()
        {
            c.touch();
            return Ok(id);
        }
        let ticket = inner.gate.admit().await?;
        let c = match inner.take_warm().await {
            Some(built) => inner.assign(key, built, ticket, true).await?,
            None => inner.create(key, ticket).await?,
        };
        inner.registry.insert(&c);
        if *c.exited.borrow() {
            inner.teardown(&c).await;
            return Err(SubstrateError::Unreachable(format!(
                "container {} stopped at once",
                c.id
            )));
        }
        Ok(c.id.clone())
    }

    async fn current(&self, key: &str) -> Result<Option<ContainerId>> {
        Ok(self.inner.registry.of_key(key))
    }

    async fn apply_grant(&self, container: &str, fence: &str, grant: Grant) -> Result<()> {
        let c = self.inner.get(container)?;
        c.touch();
        // Defense in depth (DESIGN §5; the guest's check is the one that decides): every
        // credential rule sits inside its secret's binding, or the fence does not open (the
        // API and the guest refused it first).
        stockade_grammar::binding::grant_within(&grant, |name| self.inner.secrets.binding(name))
            .map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        // The values of the secrets the rules name, read now: a fence whose secret is
        // not set does not open (a typed error naming it, never a value).
        let secrets = self
            .inner
            .secrets
            .resolve(&grant.secret_names())
            .map_err(SubstrateError::Invalid)?;
        c.egress.fence.apply_with_secrets(fence, grant, secrets);
        Ok(())
    }

    async fn revoke_grant(&self, container: &str) -> Result<FenceCounts> {
        let c = self.inner.get(container)?;
        c.touch();
        Ok(c.egress.fence.revoke_counts())
    }

    async fn run(&self, container: &str, cmd: Command, timeout: Duration) -> Result<RunResult> {
        self.inner.run(container, cmd, timeout, None).await
    }

    async fn run_streaming(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        sink: OutputSink,
    ) -> Result<RunResult> {
        self.inner.run(container, cmd, timeout, Some(sink)).await
    }

    async fn run_pty(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        session: stockade_runtime::substrate::pty::Session,
    ) -> Result<RunResult> {
        self.inner.run_pty(container, cmd, timeout, session).await
    }

    async fn start_process(&self, container: &str, cmd: Command) -> Result<String> {
        match self
            .inner
            .call(container, Request::Start { spec: spec(cmd) }, CALL_TIMEOUT)
            .await?
        {
            Response::Started { id } => Ok(id),
            r => Err(unexpected(r)),
        }
    }

    async fn list_processes(&self, container: &str) -> Result<Vec<ProcessInfo>> {
        match self
            .inner
            .call(container, Request::List, CALL_TIMEOUT)
            .await?
        {
            Response::Processes { processes } => {
                Ok(processes.into_iter().map(process_info).collect())
            }
            r => Err(unexpected(r)),
        }
    }

    async fn process_status(&self, container: &str, id: &str) -> Result<Option<ProcessInfo>> {
        let c = self.inner.get(container)?;
        if self.inner.populated_leaf(container, id) {
            c.touch();
            return Ok(Some(ProcessInfo {
                id: id.to_string(),
                running: true,
                exit_code: None,
            }));
        }
        match self
            .inner
            .call(container, Request::Status { id: id.into() }, CALL_TIMEOUT)
            .await?
        {
            Response::Process { process } => Ok(process.map(process_info)),
            r => Err(unexpected(r)),
        }
    }

    async fn kill_process(&self, container: &str, id: &str) -> Result<u32> {
        match self
            .inner
            .call(container, Request::Kill { id: id.into() }, CALL_TIMEOUT)
            .await?
        {
            Response::Killed { count, .. } => Ok(count),
            r => Err(unexpected(r)),
        }
    }

    async fn kill_all(&self, container: &str) -> Result<u32> {
        // The fence's teardown after a run whose answer said the supervisor tracks no
        // tree (its own was empty and forgotten), nothing started since: nothing to
        // kill, and no round trip (`container::Trees`).
        //
        // A fenced run that began and has not answered may still be on its way to the
        // supervisor, overtaken by this kill (another connection): the kill names its
        // tree, and the supervisor refuses the run if it comes later; no run begins
        // under this grant from now on (docs/LINUX.md, "A teardown that overtakes its
        // run").
        let c = self.inner.get(container)?;
        let tree = c.egress.fence.kill_runs();
        if tree.is_none() && c.trees.none() {
            return Ok(0);
        }
        match self
            .inner
            .call(container, Request::KillAll { tree }, CALL_TIMEOUT)
            .await?
        {
            Response::Killed { count, .. } => Ok(count),
            r => Err(unexpected(r)),
        }
    }

    async fn snapshot(&self, container: &str) -> Result<()> {
        let c = self.inner.get(container)?;
        let dest = snapshot::path(&self.inner.data_dir, &c.key);
        self.archive(container, dest).await
    }

    async fn save_snapshot(&self, container: &str, name: &str) -> Result<()> {
        names::snapshot_name(name).map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        let c = self.inner.get(container)?;
        let dest = snapshot::named(&self.inner.data_dir, &c.key, name);
        self.archive(container, dest).await
    }

    async fn fork_snapshot(&self, source: &str, name: &str, key: &str) -> Result<()> {
        names::snapshot_name(name).map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        let from = snapshot::named(&self.inner.data_dir, source, name);
        let to = snapshot::path(&self.inner.data_dir, key);
        tokio::task::spawn_blocking(move || snapshot::copy(&from, &to))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    SubstrateError::Invalid(names::no_snapshot(source, name))
                }
                _ => SubstrateError::Failed(format!("fork: {e}")),
            })
    }

    async fn drop_snapshot(&self, key: &str, name: &str) -> Result<bool> {
        names::snapshot_name(name).map_err(|e| SubstrateError::Invalid(e.to_string()))?;
        match std::fs::remove_file(snapshot::named(&self.inner.data_dir, key, name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(SubstrateError::Failed(format!(
                "deleting the snapshot: {e}"
            ))),
        }
    }

    async fn stop(&self, container: &str) -> Result<()> {
        let c = self.inner.get(container)?;
        self.inner.kill_container(&c).await;
        Ok(())
    }

    async fn denials(&self, key: &str) -> Result<Vec<Denial>> {
        self.inner
            .store
            .denials(key)
            .map_err(|e| SubstrateError::Failed(e.to_string()))
    }

    async fn list_artifacts(&self, key: &str) -> Result<Vec<Artifact>> {
        let Some(id) = self.inner.latest(key) else {
            return Ok(Vec::new());
        };
        let dir = self.inner.artifacts_dir(&id);
        tokio::task::spawn_blocking(move || artifacts::list(&dir))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
            .map_err(|e| SubstrateError::Failed(format!("artifacts: {e}")))
    }

    async fn read_artifact(
        &self,
        key: &str,
        name: &str,
        offset: u64,
        length: u32,
    ) -> Result<Vec<u8>> {
        if !artifacts::valid_name(name) {
            return Err(SubstrateError::Invalid(format!("artifact name {name:?}")));
        }
        let Some(id) = self.inner.latest(key) else {
            return Err(SubstrateError::Invalid(format!("no artifact {name:?}")));
        };
        let dir = self.inner.artifacts_dir(&id);
        let name = name.to_string();
        tokio::task::spawn_blocking(move || artifacts::read(&dir, &name, offset, length))
            .await
            .map_err(|e| SubstrateError::Failed(e.to_string()))?
    }

    async fn open_preview(
        &self,
        container: &str,
        port: u16,
    ) -> Result<stockade_runtime::substrate::Preview> {
        self.inner.open_preview(container, port)
    }

    async fn close_preview(&self, container: &str, port: u16) -> Result<bool> {
        self.inner.close_preview(container, port)
    }

    async fn list_previews(
        &self,
        container: &str,
    ) -> Result<Vec<stockade_runtime::substrate::Preview>> {
        self.inner.list_previews(container)
    }
}

#[async_trait]
impl Housekeeping for Linux {
    async fn pending(&self, key: Option<&str>) -> Result<Vec<stockade_egress::ask::Pending>> {
        Ok(self.inner.asks.pending(key))
    }

    async fn answer_pending(
        &self,
        id: &str,
        of: Option<&str>,
        answer: stockade_egress::ask::Answer,
    ) -> Result<std::result::Result<stockade_egress::ask::Pending, stockade_egress::ask::AnswerError>>
    {
        Ok(self.inner.asks.answer_of(id, of, answer))
    }

    fn kind(&self) -> &'static str {
        "linux"
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    async fn idle(&self, idle_for: Duration) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.inner.live() {
            let last = *c.last_call.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() < idle_for {
                continue;
            }
            // Asking the supervisor is not a call: it must not reset the clock.
            let busy = match c.client.call(&Request::List, CALL_TIMEOUT).await {
                Ok(Response::Processes { processes }) => processes.iter().any(|p| p.running),
                _ => false,
            };
            if !busy {
                out.push(c.key.clone());
            }
        }
        out.sort();
        out
    }

    fn open_grants(&self) -> Vec<ContainerId> {
        let mut v: Vec<_> = self
            .inner
            .live()
            .into_iter()
            .filter(|c| c.egress.fence.is_open())
            .map(|c| c.id.clone())
            .collect();
        v.sort();
        v
    }

    async fn shutdown(&self) {
        self.inner.close_warm().await;
        for c in self.inner.live() {
            self.inner.kill_container(&c).await;
        }
        self.inner.remove_roots();
    }
}

impl Linux {
    /// Archive the container's `/workspace` into `dest`, the container frozen while
    /// the host walks it (a checkpoint's restore cache, or a named snapshot).
    async fn archive(&self, container: &str, dest: std::path::PathBuf) -> Result<()> {
        let c = self.inner.get(container)?;
        c.touch();
        let ws = c.workspace();
        let cg = match &self.inner.cgroup_root {
            Some(root) => root.open_child(container).ok(),
            None => None,
        };
        let budget = self.inner.cfg.limits.disk_mib << 20;
        tokio::task::spawn_blocking(move || {
            // Nothing in the container moves while the host walks its workspace.
            let frozen = match &cg {
                Some(cg) => cg
                    .freeze(Instant::now() + STOP_DEADLINE)
                    .map_err(|e| SubstrateError::Failed(format!("freezing the container: {e}")))?,
                None => {
                    kill::log_degradation(
                        "no cgroup v2: a checkpoint walks a running container (every path is still opened without following symlinks)",
                    );
                    true
                }
            };
            let written = if frozen {
                snapshot::write(&ws, &dest, budget)
                    .map_err(|e| SubstrateError::Failed(format!("snapshot: {e}")))
            } else {
                Err(SubstrateError::Failed(
                    "the container did not freeze in time".into(),
                ))
            };
            if let Some(cg) = &cg {
                let _ = cg.thaw();
            }
            written
        })
        .await
        .map_err(|e| SubstrateError::Failed(e.to_string()))?
    }
}
