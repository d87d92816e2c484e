//! A fenced run with a terminal (`stockade shell`): the host opens the pseudo-terminal
//! pair, keeps the master, and sends the slave to the supervisor with the `run`
//! request (`SCM_RIGHTS`, as an upload's stdin pipe goes: [`super::handoff`]); the
//! supervisor makes it the command's stdin, stdout, stderr and controlling terminal
//! (`setsid`, `TIOCSCTTY`: `stockade_supervisor::exec`).
//!
//! Why the host opens the pair, not the supervisor inside the container: a container
//! mounts no `devpts` of its own (its `/dev` holds six device nodes), and the pair is
//! usable through its descriptors alone. The host's side is then two descriptors it
//! already knows how to move, and no new answer travels from the supervisor (a master
//! sent back would need a second descriptor path, supervisor to host). What a
//! workload holds is a slave descriptor only: it can read and write its own terminal,
//! never open another (`ttyname` finds no name inside the container: `tty` says "not a
//! tty"; `isatty`, `stty` and job control work).
//!
//! Two pumps run beside the request: the master's output to the session (until the
//! last holder of the slave closes it: `EIO`), and the session's input to the master
//! (bytes, and resizes as `TIOCSWINSZ`, which signals the foreground group
//! `SIGWINCH`). Both end with the run (an abort on drop): a caller that goes away
//! drops the run's future, the master closes, and the guest's teardown kills the
//! tree and revokes the grant.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::calls::{end_run, spec, unexpected};
use super::protocol::{Request, Response};
use super::{CALL_TIMEOUT, Inner, limits};
use stockade_runtime::substrate::pty::{Input, Session, Size};
use stockade_runtime::substrate::{Command, Result, RunResult, SubstrateError};

/// How long the output of a run that ended may still drain (a background process
/// that keeps the terminal open holds it no longer: the teardown kills it).
const DRAIN: Duration = Duration::from_millis(500);

/// Most bytes read from the master at once (one output chunk).
const CHUNK: usize = 16 * 1024;

impl Inner {
    /// A fenced run whose stdin, stdout and stderr are a terminal, `session`'s.
    pub(super) async fn run_pty(
        &self,
        container: &str,
        cmd: Command,
        timeout: Duration,
        session: Session,
    ) -> Result<RunResult> {
        if !cmd.stdin.is_empty() || cmd.stdin_stream.is_some() {
            return Err(SubstrateError::Invalid(
                "a terminal session takes its input from the terminal, not stdin".into(),
            ));
        }
        let c = self.get(container)?;
        let (master, slave) = open_pair(session.size)
            .map_err(|e| SubstrateError::Failed(format!("pseudo-terminal: {e}")))?;
        let mut spec = spec(cmd);
        spec.tree = super::calls::begin_run(&c)?;
        let tree = spec.tree.clone();
        spec.pty = true;
        let req = Request::Run {
            spec,
            timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
            output_limit: self.cfg.output_limit,
            stream: false,
        };
        let master = Arc::new(
            watch(master).map_err(|e| SubstrateError::Failed(format!("pseudo-terminal: {e}")))?,
        );
        let mut reader = Abort(tokio::spawn(read_output(master.clone(), session.output)));
        let _writer = Abort(tokio::spawn(write_input(master, session.input)));
        let before = c.limits.as_ref().map(|l| l.counters()).unwrap_or_default();
        tracing::info!(target: "stockade::substrate", container, rows = session.size.rows, cols = session.size.cols, "a terminal session starts");
        let answer = self
            .call_with(container, req, Some(slave), timeout + CALL_TIMEOUT, |_| {})
            .await;
        // What the command wrote before it exited is still in the master: read it to
        // its end (every holder of the slave closed), for a moment at most.
        let _ = tokio::time::timeout(DRAIN, &mut reader.0).await;
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
        tracing::info!(target: "stockade::substrate", container, exit_code = result.exit_code, timed_out = result.timed_out, "a terminal session ended");
        Ok(result)
    }
}

/// A task aborted when dropped.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A new pseudo-terminal of `size`: (master, non-blocking; slave), both close-on-exec,
/// neither a controlling terminal of this process.
pub fn open_pair(size: Size) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    let master = rustix::fs::open(
        "/dev/ptmx",
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    let unlock: libc::c_int = 0;
    // SAFETY: `master` is an open ptmx descriptor; TIOCSPTLCK reads one int from the
    // pointer, which lives across the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    set_size(master.as_fd(), size)?;
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor.
    let slave = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if slave < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a new descriptor that nothing else owns.
    Ok((master, unsafe { OwnedFd::from_raw_fd(slave) }))
}

/// `fd` in the runtime's reactor.
fn watch(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is open, and owned by the `AsyncFd` until it drops: its
    // number names the same description all that time.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// Set the terminal's window size (the kernel signals its foreground group SIGWINCH
/// when it changes).
pub fn set_size(fd: impl AsFd, size: Size) -> std::io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which lives across the
    // call.
    if unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The master's output to `out`, chunk by chunk, until the slave's last holder closes
/// it (`EIO`) or the session stops listening.
async fn read_output(master: Arc<AsyncFd<OwnedFd>>, out: mpsc::Sender<Bytes>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let Ok(mut ready) = master.readable().await else {
            return;
        };
        match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut buf[..])?)) {
            Ok(Ok(0)) | Ok(Err(_)) => return, // EIO: the terminal closed
            Ok(Ok(n)) => {
                if out.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                    return;
                }
            }
            Err(_would_block) => continue,
        }
    }
}

/// The session's input to the master: bytes written whole, resizes applied.
async fn write_input(master: Arc<AsyncFd<OwnedFd>>, mut input: mpsc::Receiver<Input>) {
    while let Some(i) = input.recv().await {
        match i {
            Input::Resize(size) => {
                if let Err(e) = set_size(master.get_ref(), size) {
                    tracing::debug!(target: "stockade::substrate", error = %e, "a resize failed");
                }
            }
            Input::Data(bytes) => {
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    let Ok(mut ready) = master.writable().await else {
                        return;
                    };
                    match ready.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), rest)?)) {
                        Ok(Ok(n)) => rest = &rest[n..],
                        Ok(Err(_)) => return, // the terminal closed
                        Err(_would_block) => continue,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pair_carries_bytes_both_ways_and_its_size() {
        let (master, slave) = open_pair(Size {
            rows: 33,
            cols: 101,
        })
        .unwrap();
        let mut ws: libc::winsize = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the pointer.
        assert!(unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) } == 0);
        assert_eq!((ws.ws_row, ws.ws_col), (33, 101));
        let master = Arc::new(watch(master).unwrap());
        let (out_tx, mut out_rx) = mpsc::channel(8);
        let (in_tx, in_rx) = mpsc::channel(8);
        let reader = tokio::spawn(read_output(master.clone(), out_tx));
        let _writer = Abort(tokio::spawn(write_input(master, in_rx)));
        let mut slave = std::fs::File::from(slave);
        slave.write_all(b"out\n").unwrap();
        let got = out_rx.recv().await.unwrap();
        assert_eq!(&got[..], b"out\r\n", "the line discipline's newline");
        in_tx
            .send(Input::Resize(Size { rows: 5, cols: 7 }))
            .await
            .unwrap();
        in_tx
            .send(Input::Data(Bytes::from_static(b"typed\n")))
            .await
            .unwrap();
        let mut line = [0u8; 6];
        slave.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"typed\n");
        // SAFETY: as above.
        assert!(unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) } == 0);
        assert_eq!((ws.ws_row, ws.ws_col), (5, 7));
        // The echo of what was typed, then the end once the slave closes.
        drop(slave);
        let mut echoed = Vec::new();
        while let Some(b) = out_rx.recv().await {
            echoed.extend_from_slice(&b);
        }
        assert!(echoed.starts_with(b"typed"), "{echoed:?}");
        reader.await.unwrap();
    }
}
