//! `stockade shell KEY [-- CMD…]`: an interactive terminal in the key's container over
//! the API's WebSocket (`GET …/pty`, `crate::api` "pty"; docs/LINUX.md).
//!
//! The local terminal goes raw for the session (every key, Ctrl-C and Ctrl-D
//! included, is a byte for the remote terminal's line discipline) and is restored on
//! every way out (a guard's drop: the exit event, an error, a broken socket, a
//! SIGTERM/SIGHUP/SIGINT sent to this process). SIGWINCH becomes a resize message. The
//! exit code is the command's (128+N for a signal N, 124 for the timeout), or the
//! CLI's code for the server's error.

use std::os::fd::{AsRawFd, BorrowedFd};

use stockade_client::{Pty, PtyEvent};
use stockade_wire::{CommandBody, GrantBody};

use super::Failure;
use super::args::ShellArgs;

/// The local terminal in raw mode; restored when dropped.
struct Raw {
    fd: i32,
    saved: libc::termios,
}

impl Raw {
    /// Raw mode on `fd`, if it is a terminal.
    fn enter(fd: BorrowedFd<'_>) -> Option<Raw> {
        let fd = fd.as_raw_fd();
        // SAFETY: `termios` is plain data; tcgetattr fills it or fails (not a tty).
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open (stdin) and `saved` lives across the call.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw only edits the struct it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: as tcgetattr.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(Raw { fd, saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the settings read at entry, written back to the same descriptor.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// The local window's size (rows, cols), if stdout or stdin is a terminal.
fn window_size() -> Option<(u16, u16)> {
    for fd in [1, 0] {
        // SAFETY: `winsize` is plain data, filled by TIOCGWINSZ or left alone.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the pointer.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_row > 0 {
            return Some((ws.ws_row, ws.ws_col));
        }
    }
    None
}

/// Standard input, read by a thread of its own (a blocking read the runtime need not
/// wait for at exit), chunk by chunk; the channel closes at end of file.
fn read_stdin() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin().lock();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// `stockade shell`.
pub(super) async fn shell(
    server: &str,
    token: &str,
    a: &ShellArgs,
    grant: Option<GrantBody>,
) -> Result<i32, Failure> {
    let mut env = std::collections::BTreeMap::new();
    for e in &a.env {
        let (k, v) = e
            .split_once('=')
            .ok_or_else(|| Failure::new(2, format!("--env {e:?} is not NAME=VALUE")))?;
        env.insert(k.to_string(), v.to_string());
    }
    let command = CommandBody {
        argv: a.argv.clone(),
        cwd: a.cwd.clone(),
        env,
        timeout_ms: a.timeout,
        grant,
        approval: a.approval.clone(),
        ..CommandBody::default()
    };
    let (rows, cols) = window_size().unwrap_or((24, 80));
    let client = stockade_client::Client::new(server, token).map_err(|e| match e {
        stockade_client::Error::Usage(m) => Failure::new(2, m),
        e => Failure::from(e),
    })?;
    let mut pty = client
        .pty(&a.key, &command, rows, cols)
        .await
        .map_err(Failure::from)?;
    let stdin = std::io::stdin();
    let raw = Raw::enter(stdin.as_fd_compat());
    let code = session(&mut pty).await;
    drop(raw);
    code
}

/// A `BorrowedFd` of stdin (std's `Stdin` is `AsFd`).
trait AsFdCompat {
    fn as_fd_compat(&self) -> BorrowedFd<'_>;
}

impl AsFdCompat for std::io::Stdin {
    fn as_fd_compat(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}

/// The session's loop, the terminal raw; the exit code.
async fn session(pty: &mut Pty) -> Result<i32, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut input = read_stdin();
    let mut input_open = true;
    let sig = |k: SignalKind| signal(k).map_err(|e| Failure::new(70, format!("signals: {e}")));
    let (mut winch, mut term, mut hup, mut int) = (
        sig(SignalKind::window_change())?,
        sig(SignalKind::terminate())?,
        sig(SignalKind::hangup())?,
        sig(SignalKind::interrupt())?,
    );
    loop {
        tokio::select! {
            ev = pty.next() => match ev {
                Some(PtyEvent::Output(b)) => {
                    use std::io::Write;
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&b).and_then(|()| out.flush());
                }
                Some(PtyEvent::Exit(e)) => return Ok(super::commands::exit_status(&e)),
                Some(PtyEvent::Failed(e)) => return Err(Failure::from(e)),
                None => return Err(Failure::new(69, "the terminal's connection closed without an exit")),
            },
            chunk = input.recv(), if input_open => match chunk {
                Some(b) => pty.send(b).await?,
                None => input_open = false,
            },
            _ = winch.recv() => {
                if let Some((rows, cols)) = window_size() {
                    pty.resize(rows, cols).await?;
                }
            }
            _ = term.recv() => return Ok(128 + libc::SIGTERM),
            _ = hup.recv() => return Ok(128 + libc::SIGHUP),
            _ = int.recv() => return Ok(128 + libc::SIGINT),
        }
    }
}
