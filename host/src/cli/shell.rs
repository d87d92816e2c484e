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

use futures_util::{SinkExt, StreamExt};
use stockade_wire::{CommandBody, GrantBody, StreamEvent};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

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

/// The WebSocket address of `key`'s terminal on `server` (`http://` only).
pub(super) fn pty_url(server: &str, key: &str) -> Result<String, Failure> {
    let rest = server.strip_prefix("http://").ok_or_else(|| {
        Failure::new(
            2,
            format!("stockade shell speaks to an http:// server, not {server:?}"),
        )
    })?;
    let key: String = key
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    Ok(format!(
        "ws://{}/v1/sandboxes/{key}/pty",
        rest.trim_end_matches('/')
    ))
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
    let mut req = pty_url(server, &a.key)?
        .into_client_request()
        .map_err(|e| Failure::new(2, format!("the server's address: {e}")))?;
    let auth = format!("Bearer {token}")
        .parse()
        .map_err(|_| Failure::new(2, "the token is not a header value"))?;
    req.headers_mut().insert("authorization", auth);
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(r) => {
                let status = r.status().as_u16();
                let body = r.body().as_deref().unwrap_or_default();
                Failure::from(refused(status, body))
            }
            e => Failure::new(69, format!("{server}: {e}")),
        })?;
    let start =
        serde_json::json!({"type": "start", "command": command, "rows": rows, "cols": cols});
    ws.send(Message::text(start.to_string()))
        .await
        .map_err(|e| Failure::new(69, format!("the terminal: {e}")))?;
    let stdin = std::io::stdin();
    let raw = Raw::enter(stdin.as_fd_compat());
    let code = session(&mut ws).await;
    drop(raw);
    code
}

/// The error of a refused upgrade: its body's code and message.
fn refused(status: u16, body: &[u8]) -> stockade_client::Error {
    #[derive(serde::Deserialize)]
    struct Body {
        error: stockade_wire::ErrorDetail,
    }
    match serde_json::from_slice::<Body>(body) {
        Ok(b) => stockade_client::Error::Api {
            status,
            code: b.error.code,
            message: b.error.message,
        },
        Err(_) => stockade_client::Error::BadAnswer(format!(
            "the server refused the terminal: HTTP {status}"
        )),
    }
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
async fn session<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>) -> Result<i32, Failure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
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
    let broken = |e: tokio_tungstenite::tungstenite::Error| {
        Failure::new(69, format!("the terminal's connection broke: {e}"))
    };
    loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    use std::io::Write;
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&b).and_then(|()| out.flush());
                }
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<StreamEvent>(t.as_str()) {
                    Ok(StreamEvent::Exit(e)) => return Ok(super::commands::exit_status(&e)),
                    Ok(StreamEvent::Error(e)) => {
                        let err = stockade_client::Error::Api {
                            status: e.status,
                            code: e.error.code,
                            message: e.error.message,
                        };
                        return Err(Failure::from(err));
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(f))) => {
                    let why = f.map(|f| format!("{} {}", u16::from(f.code), f.reason)).unwrap_or_default();
                    return Err(Failure::new(69, format!("the server closed the terminal without an exit: {why}")));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(broken(e)),
                None => return Err(Failure::new(69, "the terminal's connection closed without an exit")),
            },
            chunk = input.recv(), if input_open => match chunk {
                Some(b) => ws.send(Message::Binary(b.into())).await.map_err(broken)?,
                None => input_open = false,
            },
            _ = winch.recv() => {
                if let Some((rows, cols)) = window_size() {
                    let m = serde_json::json!({"type": "resize", "rows": rows, "cols": cols});
                    ws.send(Message::text(m.to_string())).await.map_err(broken)?;
                }
            }
            _ = term.recv() => return Ok(128 + libc::SIGTERM),
            _ = hup.recv() => return Ok(128 + libc::SIGHUP),
            _ = int.recv() => return Ok(128 + libc::SIGINT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_terminal_address_is_the_servers_with_ws() {
        let rows: &[(&str, &str, Option<&str>)] = &[
            (
                "http://127.0.0.1:8787",
                "demo",
                Some("ws://127.0.0.1:8787/v1/sandboxes/demo/pty"),
            ),
            (
                "http://h:1/",
                "a b/c",
                Some("ws://h:1/v1/sandboxes/a%20b%2Fc/pty"),
            ),
            ("https://h", "k", None),
        ];
        for (server, key, want) in rows {
            assert_eq!(
                pty_url(server, key).ok().as_deref(),
                *want,
                "{server} {key}"
            );
        }
    }
}
