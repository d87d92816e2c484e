//! An interactive terminal attached to a fenced run (`stockade shell`, issue 24 item 2):
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::substrate::{Command, Substrate, SubstrateError};

    /// A substrate that opens no terminal (the mock; the remote one alike: the trait's
    /// default) answers a typed `invalid` "unsupported", never a run without one.
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
