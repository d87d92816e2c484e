//! An interactive terminal attached to a fenced run (`stockade shell`, DESIGN §8):
//! what the caller hands the substrate in place of captured output.
//!
//! The terminal is an I/O mode of the run, not a call of its own: the guest's `exec`
//! decides, ensures, applies the grant, runs and tears down exactly as for any
//! command (floor, approval, kill-all, revoke); the host only attaches a session to
//! the run the guest asks for ([`crate::runtime::ExecIo::pty`]), as it attaches an
//! upload's streamed stdin. No WIT change: the guest never sees the bytes (a
//! terminal's output is the consumer's, not the guest's to bound), and a substrate
//! that cannot open a terminal answers a typed error ([`super::Substrate::run_pty`]).

use bytes::Bytes;
use tokio::sync::mpsc;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Size {
    /// Rows (1 to [`MAX_CELLS`]).
    pub rows: u16,
    /// Columns (1 to [`MAX_CELLS`]).
    pub cols: u16,
}

/// The most rows or columns a terminal may have (a bigger "resize" is hostile input).
pub const MAX_CELLS: u16 = 1000;

impl Size {
    /// A size both of whose sides are 1 to [`MAX_CELLS`] (pure).
    pub fn new(rows: u64, cols: u64) -> Result<Size, String> {
        let side = |what: &str, n: u64| match u16::try_from(n) {
            Ok(n) if (1..=MAX_CELLS).contains(&n) => Ok(n),
            _ => Err(format!("{what} must be 1 to {MAX_CELLS}, not {n}")),
        };
        Ok(Size {
            rows: side("rows", rows)?,
            cols: side("cols", cols)?,
        })
    }
}

impl Default for Size {
    fn default() -> Self {
        Size { rows: 24, cols: 80 }
    }
}

/// What the caller sends a running session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Bytes typed (Ctrl-C, Ctrl-D included: the terminal's line discipline makes them
    /// signals or end of file).
    Data(Bytes),
    /// The window's new size (the program gets SIGWINCH).
    Resize(Size),
}

/// One session's ends, the substrate's side: where input comes from and output goes.
/// The caller's dropping the input sender ends nothing by itself (the caller's
/// presence does: [`crate::runtime::ExecIo::caller`]); the substrate drops the output
/// sender when the terminal closes, after the last byte.
#[derive(Debug)]
pub struct Session {
    /// The size at start.
    pub size: Size,
    /// Bytes typed and resizes, in order.
    pub input: mpsc::Receiver<Input>,
    /// The terminal's output, chunk by chunk. Bounded: a caller that does not read
    /// stops the reading of the terminal, which stops the program's writes (the
    /// session's deadline still ends it).
    pub output: mpsc::Sender<Bytes>,
}

/// A session waiting for its run, taken once (by the run the call makes).
#[derive(Debug, Clone, Default)]
pub struct Attach(std::sync::Arc<std::sync::Mutex<Option<Session>>>);

impl Attach {
    /// A session to attach.
    pub fn new(s: Session) -> Attach {
        Attach(std::sync::Arc::new(std::sync::Mutex::new(Some(s))))
    }

    /// The session (`None` once taken).
    pub fn take(&self) -> Option<Session> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// A substrate whose terminals echo (a test double beside the [`mock`](super::super::mock),
/// for the node's and the remote substrate's tests): the mock for everything else.
pub mod echo {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::{Input, Session};
    use crate::substrate::mock::Mock;
    use crate::substrate::{
        Artifact, Command, ContainerId, Denial, Event, FenceCounts, Housekeeping, ProcessInfo,
        Result, RunResult, Substrate,
    };
    use stockade_egress::rules::Grant;

    /// The mock, whose `run_pty` says `ready RxC`, echoes what is typed, says `size
    /// RxC` on a resize and ends (exit 0) on Ctrl-D; counts the runs it started and the
    /// ones dropped before they ended (abandoned).
    pub struct Echo {
        /// Everything else.
        pub mock: Arc<Mock>,
        /// Terminal runs started.
        pub started: AtomicU32,
        /// Terminal runs dropped before they ended.
        pub abandoned: Arc<AtomicU32>,
        /// Woken when a run is abandoned.
        pub gone: Arc<tokio::sync::Notify>,
    }

    impl Echo {
        /// Over a mock of ceiling 4.
        pub fn new() -> Arc<Echo> {
            Arc::new(Echo {
                mock: Arc::new(Mock::new(4)),
                started: AtomicU32::new(0),
                abandoned: Arc::new(AtomicU32::new(0)),
                gone: Arc::new(tokio::sync::Notify::new()),
            })
        }
    }

    /// Counts the run as abandoned unless disarmed (its end).
    struct Armed(Option<(Arc<AtomicU32>, Arc<tokio::sync::Notify>)>);

    impl Drop for Armed {
        fn drop(&mut self) {
            if let Some((n, gone)) = self.0.take() {
                n.fetch_add(1, Ordering::SeqCst);
                gone.notify_waiters();
                gone.notify_one();
            }
        }
    }

    #[async_trait]
    impl Housekeeping for Echo {
        fn kind(&self) -> &'static str {
            "mock"
        }
        fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
            self.mock.subscribe()
        }
        async fn idle(&self, idle_for: Duration) -> Vec<String> {
            self.mock.idle(idle_for).await
        }
        fn open_grants(&self) -> Vec<ContainerId> {
            self.mock.open_grants()
        }
        async fn shutdown(&self) {
            self.mock.shutdown().await
        }
    }

    #[async_trait]
    impl Substrate for Echo {
        async fn ensure(&self, key: &str) -> Result<ContainerId> {
            self.mock.ensure(key).await
        }
        async fn current(&self, key: &str) -> Result<Option<ContainerId>> {
            self.mock.current(key).await
        }
        async fn apply_grant(&self, c: &str, fence: &str, grant: Grant) -> Result<()> {
            self.mock.apply_grant(c, fence, grant).await
        }
        async fn revoke_grant(&self, c: &str) -> Result<FenceCounts> {
            self.mock.revoke_grant(c).await
        }
        async fn run(&self, c: &str, cmd: Command, timeout: Duration) -> Result<RunResult> {
            self.mock.run(c, cmd, timeout).await
        }
        async fn run_pty(
            &self,
            _container: &str,
            cmd: Command,
            timeout: Duration,
            mut session: Session,
        ) -> Result<RunResult> {
            self.started.fetch_add(1, Ordering::SeqCst);
            let mut armed = Armed(Some((self.abandoned.clone(), self.gone.clone())));
            let say = |s: String| Bytes::from(s.into_bytes());
            let size = session.size;
            let _ = session
                .output
                .send(say(format!(
                    "ready {}x{} {}\r\n",
                    size.rows,
                    size.cols,
                    cmd.argv.join(" ")
                )))
                .await;
            let ended = tokio::time::timeout(timeout, async {
                while let Some(i) = session.input.recv().await {
                    match i {
                        Input::Data(b) if b.contains(&4) => return,
                        Input::Data(b) => {
                            let _ = session.output.send(b).await;
                        }
                        Input::Resize(s) => {
                            let _ = session
                                .output
                                .send(say(format!("size {}x{}\r\n", s.rows, s.cols)))
                                .await;
                        }
                    }
                }
                // The caller gave up its input: wait for the timeout (or the drop).
                std::future::pending::<()>().await
            })
            .await;
            armed.0 = None;
            Ok(RunResult {
                exit_code: if ended.is_ok() { 0 } else { -libc::SIGKILL },
                timed_out: ended.is_err(),
                ..Default::default()
            })
        }
        async fn start_process(&self, c: &str, cmd: Command) -> Result<String> {
            self.mock.start_process(c, cmd).await
        }
        async fn list_processes(&self, c: &str) -> Result<Vec<ProcessInfo>> {
            self.mock.list_processes(c).await
        }
        async fn process_status(&self, c: &str, id: &str) -> Result<Option<ProcessInfo>> {
            self.mock.process_status(c, id).await
        }
        async fn kill_process(&self, c: &str, id: &str) -> Result<u32> {
            self.mock.kill_process(c, id).await
        }
        async fn kill_all(&self, c: &str) -> Result<u32> {
            self.mock.kill_all(c).await
        }
        async fn snapshot(&self, c: &str) -> Result<()> {
            self.mock.snapshot(c).await
        }
        async fn stop(&self, c: &str) -> Result<()> {
            self.mock.stop(c).await
        }
        async fn denials(&self, key: &str) -> Result<Vec<Denial>> {
            self.mock.denials(key).await
        }
        async fn list_artifacts(&self, key: &str) -> Result<Vec<Artifact>> {
            self.mock.list_artifacts(key).await
        }
        async fn read_artifact(
            &self,
            key: &str,
            name: &str,
            offset: u64,
            length: u32,
        ) -> Result<Vec<u8>> {
            self.mock.read_artifact(key, name, offset, length).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::substrate::{Command, Substrate, SubstrateError};

    /// A substrate that opens no terminal (the mock: the trait's default) answers a
    /// typed `invalid` "unsupported", never a run without one.
    #[tokio::test]
    async fn a_substrate_without_terminals_answers_unsupported() {
        let mock = crate::substrate::mock::Mock::new(1);
        let c = mock.ensure("k").await.unwrap();
        let (_in_tx, input) = mpsc::channel(1);
        let (output, _out_rx) = mpsc::channel(1);
        let session = Session {
            size: Size::default(),
            input,
            output,
        };
        let cmd = Command {
            argv: vec!["sh".into()],
            cwd: String::new(),
            env: vec![],
            stdin: vec![],
            stdin_stream: None,
        };
        let r = mock
            .run_pty(&c, cmd, std::time::Duration::from_secs(1), session)
            .await;
        assert!(
            matches!(&r, Err(SubstrateError::Invalid(m)) if m.starts_with("unsupported")),
            "{r:?}"
        );
    }

    #[test]
    fn a_size_is_bounded_on_both_sides() {
        let rows: &[(u64, u64, bool)] = &[
            (24, 80, true),
            (1, 1, true),
            (1000, 1000, true),
            (0, 80, false),
            (24, 0, false),
            (1001, 80, false),
            (24, 65_536, false),
            (u64::MAX, 80, false),
        ];
        for &(r, c, ok) in rows {
            assert_eq!(Size::new(r, c).is_ok(), ok, "{r}x{c}");
        }
    }
}
