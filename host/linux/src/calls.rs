//! A call to a container's supervisor, as the substrate makes it: the request and its
//! answer (a failed request to a living supervisor is an error, never "gone"), a fenced
//! run (its tree named by the fence, a streamed stdin, live output, the limits it
//! reached), and the status path that needs no call.

use std::time::Duration;

use stockade_runtime::config::KillMode;
use stockade_runtime::substrate::{
    Command, Output, OutputSink, ProcessInfo, Result, RunResult, SubstrateError,
};

use super::container::Container;
use super::protocol::{OutStream, Request, Response, Spec};
use super::{CALL_TIMEOUT, Inner, limits};

impl Inner {
    /// The status path is hot: in cgroup mode a tree whose leaf cgroup is populated is
    /// running, and the host reads that itself, without a supervisor round trip. An
    /// empty or missing leaf (exited, killed, never started here) needs the
    /// supervisor's answer: the exit code, or not tracked.
    pub(super) fn populated_leaf(&self, container: &str, id: &str) -> bool {
        let uuid_shaped = id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        if self.mode != KillMode::Cgroup || !uuid_shaped {
            return false;
        }
        let Some(root) = &self.cgroup_root else {
            return false;
        };
        root.child_populated(&format!("{container}/{id}"))
            .unwrap_or(false)
    }

    pub(super) async fn call(
        &self,
        container: &str,
        req: Request,
        timeout: Duration,
    ) -> Result<Response> {
        self.call_with(container, req, None, timeout, |_| {}).await
    }

    /// [`Inner::call`], with a descriptor sent along (a run's stdin pipe) and a
    /// streaming run's output frames handed to `on_output`.
    pub(super) async fn call_with(
        &self,
        container: &str,
        req: Request,
        fd: Option<std::os::fd::OwnedFd>,
        timeout: Duration,
        on_output: impl FnMut(Response) + Send,
    ) -> Result<Response> {
        let c = self.get(container)?;
        c.touch();
        let sent =
            matches!(req, Request::Start { .. } | Request::Run { .. }).then(|| c.trees.sending());
        let r = c.client.call_with(&req, fd, timeout, on_output).await;
        c.touch();
        if let (Some(at), Ok(Response::Ran { trees, .. })) = (sent, &r) {
            c.trees.answered(at, *trees);
        }
        // "Gone" is decided from the container's own state, never from a failed
        // request: a slow or broken connection to a living supervisor is an error the
        // caller sees (the guest would otherwise clear the records of a container that
        // still runs, and a stop would answer success having killed nothing).
        let r = match r {
            Err(SubstrateError::Unreachable(why)) if c.alive() => Err(SubstrateError::Failed(
                format!("{why} (the container is alive: not gone)"),
            )),
            r => r,
        };
        match r? {
            Response::Invalid { message } => Err(SubstrateError::Invalid(message)),
            Response::Failed { message } => Err(SubstrateError::Failed(message)),
            other => Ok(other),
        }
    }

    /// A fenced run, its output streamed to `sink` if there is one; the limits it
    /// reached are read from the container's counters around it.
    pub(super) async fn run(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        sink: Option<OutputSink>,
    ) -> Result<RunResult> {
        let c = self.get(container)?;
        // The fenced run's tree gets an id the fence knows: the proxy adds credentials
        // only to connections that tree's processes hold.
        let stream = cmd.stdin_stream.as_ref().and_then(|s| s.take());
        let mut spec = spec(cmd);
        spec.tree = begin_run(&c)?;
        let tree = spec.tree.clone();
        // A streamed stdin (an upload) goes as a pipe: its read end to the supervisor
        // with the request, its write end fed here from the stream, chunk by chunk.
        let (stdin_fd, feed) = match stream {
            Some(chunks) => {
                let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                    .map_err(|e| SubstrateError::Failed(format!("stdin pipe: {e}")))?;
                spec.stdin_fd = true;
                (Some(r), Some(feed_stdin(w, chunks)?))
            }
            None => (None, None),
        };
        let req = Request::Run {
            spec,
            timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
            output_limit: self.cfg.output_limit,
            stream: sink.is_some(),
        };
        let before = c.limits.as_ref().map(|l| l.counters()).unwrap_or_default();
        let on_output = move |frame: Response| {
            if let (Some(sink), Response::Output { stream, data }) = (&sink, frame) {
                let _ = sink.send(match stream {
                    OutStream::Stdout => Output::Stdout(data),
                    OutStream::Stderr => Output::Stderr(data),
                });
            }
        };
        let answer = self
            .call_with(container, req, stdin_fd, timeout + CALL_TIMEOUT, on_output)
            .await;
        if let Some(feed) = feed {
            // The run is over: whatever its stdin had left is not for it.
            feed.abort();
        }
        let mut result = match answer? {
            Response::Ran { result, kept, .. } => {
                end_run(&c, tree.as_deref(), kept);
                result
            }
            r => return Err(unexpected(r)),
        };
        let after = c.limits.as_ref().map(|l| l.counters()).unwrap_or_default();
        let full = c.storage.as_ref().is_some_and(|s| s.full());
        result.limits = limits::limits_hit(before, after, full);
        if !result.limits.is_empty() {
            tracing::info!(target: "stockade::substrate", container, limits = ?result.limits, "a run reached the container's limits");
        }
        Ok(result)
    }
}

/// A fenced run's answer came: its tree id goes back to the fence if the supervisor
/// kept the run's leaf (the tree ended empty), so the next run starts there.
pub(super) fn end_run(c: &Container, tree: Option<&str>, kept: bool) {
    if let Some(tree) = tree {
        c.egress.fence.run_answered(tree);
        if kept {
            c.egress.fence.end_run(tree);
        }
    }
}

/// A fenced run's tree id ([`stockade_egress::Fence::begin_run`]); refused once its
/// grant's teardown began: the teardown's kill may already have reached the
/// supervisor, and a run that starts after it would outlive its fence (docs/LINUX.md,
/// "A teardown that overtakes its run").
pub(super) fn begin_run(c: &Container) -> Result<Option<String>> {
    c.egress.fence.begin_run().map_err(|_| {
        SubstrateError::Failed(
            "the fence's teardown began before this run started: it is not started".into(),
        )
    })
}

/// The supervisor's record of a tracked process as the contract's.
pub(super) fn process_info(p: stockade_supervisor::ProcessInfo) -> ProcessInfo {
    ProcessInfo {
        id: p.id,
        running: p.running,
        exit_code: p.exit_code,
    }
}

pub(super) fn unexpected(r: Response) -> SubstrateError {
    SubstrateError::Failed(format!("unexpected answer from the supervisor: {r:?}"))
}

pub(super) fn spec(cmd: Command) -> Spec {
    Spec {
        argv: cmd.argv,
        cwd: cmd.cwd,
        env: cmd.env,
        stdin: cmd.stdin,
        tree: None,
        stdin_fd: false,
        pty: false,
    }
}

/// Write a streamed stdin's chunks into the pipe `w`, then close it (the end of
/// file); a reader that closed its end ends the copy (EPIPE: the rest is dropped,
/// and the stream's sender sees its receiver gone).
pub(super) fn feed_stdin(
    w: std::os::fd::OwnedFd,
    mut chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>,
) -> Result<tokio::task::JoinHandle<()>> {
    use tokio::io::AsyncWriteExt as _;
    let mut pipe = tokio::net::unix::pipe::Sender::from_owned_fd(w)
        .map_err(|e| SubstrateError::Failed(format!("stdin pipe: {e}")))?;
    Ok(tokio::spawn(async move {
        while let Some(chunk) = chunks.recv().await {
            if pipe.write_all(&chunk).await.is_err() {
                return;
            }
        }
    }))
}
