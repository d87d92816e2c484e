//! `run-pty` (docs/NODE.md "Terminals"): a run whose stdin, stdout and stderr are a
//! terminal on the node (`stockade shell` through a remote front), carried on a
//! WebSocket for the run's life.
//!
//! * **The request** is `GET /node/v1/run-pty` with `Upgrade: websocket`, the usual
//!   signed headers (method `GET`) and the **head**, [`Head`] as JSON, base64 in the
//!   [`HEAD_HEADER`] header: the signature is computed with the head's JSON as the body,
//!   so it covers the command, the container, the size and the key, and a replayed
//!   upgrade is 401 before anything runs. The head is checked as a `run`'s body: the
//!   signature (401), the key and the head (400), the container the key's (403), all
//!   before the upgrade; a request that is no WebSocket upgrade is 400.
//! * **Front to node**, binary messages only, each a [`Sealer`]'s frame:
//!
//!   ```text
//!   frame = kind: u8 | payload | tag: 32 bytes
//!   tag   = HMAC-SHA256(secret, "stockade-pty-v1\n" | request signature (hex) | "\n"
//!                               | seq: u64 BE | kind: u8 | len: u32 BE | SHA-256(payload))
//!   ```
//!
//!   `kind` 0 is bytes typed (1 to [`MAX_INPUT`]), 1 a resize (rows, cols: u16 BE
//!   each, 1 to 1000), 2 "alive" (empty; sent after [`ALIVE_EVERY`] of the front's
//!   silence). `seq` counts the session's frames from 0, so a frame from another
//!   session, a reordered, repeated, dropped or altered one does not verify. (A man in
//!   the middle cannot exist under the pinned TLS; the tags make the frames the
//!   request's as its head is, the way `run-stream`'s are.) A text message, an unknown
//!   kind, a bad tag or a bad size closes the session 1008 and a message over
//!   [`MAX_MESSAGE`] 1009, each after an `error` line (`invalid`).
//! * **Node to front**: binary messages are the terminal's output; text messages are
//!   [`RunLine`]s: `{"heartbeat": node_ms}` every heartbeat, whatever else was sent,
//!   then one `{"result": …}` (its output went as binary) or `{"error": …}`, then a
//!   close (1000).
//! * **Liveness**: a front that hears nothing for its silence bound calls the node
//!   `unreachable`; a node that hears no frame for [`LINK_SILENCE`] calls the link dead.
//! * **The end**: a session that ends before its run (the front closed the socket, the
//!   link died, a refused frame) abandons the run: the substrate's run is dropped (on
//!   linux the terminal's master closes: the kernel hangs the terminal up, SIGHUP to its
//!   session), and the grant's lease falls back from the run's timeout to the grace.
//!   A front that is still there tears the fence down as after any run (the guest's
//!   kill-all or selective kill, then the revoke); one that is gone leaves it to the
//!   lease, which kills every tree of the container and revokes when the grace runs
//!   out.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ring::hmac;
use serde::{Deserialize, Serialize};

use stockade_runtime::substrate::Command;
use stockade_runtime::substrate::pty::Size;

/// The call's path.
pub const PATH: &str = "/node/v1/run-pty";

/// The header that carries the head (its JSON, standard base64).
pub const HEAD_HEADER: &str = "x-stockade-head";

/// The longest head (its JSON).
pub const MAX_HEAD: usize = 64 * 1024;

/// Most bytes typed one frame carries (a front splits more).
pub const MAX_INPUT: usize = 64 * 1024;

/// The tag's length.
pub const TAG: usize = 32;

/// The largest message a front sends (an input frame of [`MAX_INPUT`]).
pub const MAX_MESSAGE: usize = 1 + MAX_INPUT + TAG;

/// The largest message a node reads at all: a message over [`MAX_MESSAGE`] but within
/// this is read whole and refused (1009) with an error line; past it the socket's own
/// bound refuses it (1009, the line may be lost to the peer's reset).
pub const MAX_READ: usize = 4 * MAX_MESSAGE;

/// The largest message a node sends (an output chunk, or a result line).
pub const MAX_NODE_MESSAGE: usize = 1 << 20;

/// A front that has sent nothing for this long sends an "alive" frame.
pub const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// A node that hears no frame for this long calls the link dead.
pub const LINK_SILENCE: Duration = Duration::from_secs(3);

const DOMAIN: &[u8] = b"stockade-pty-v1\n";

/// `run-pty`'s head: a `run` with a terminal of `rows` x `cols` in place of stdin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    /// The node's container id.
    pub container: String,
    /// The command (its `stdin` empty: the terminal is the input).
    pub cmd: Command,
    /// The run's timeout.
    pub timeout_ms: u64,
    /// The terminal's rows at start.
    pub rows: u64,
    /// The terminal's columns at start.
    pub cols: u64,
}

/// A frame's kind: bytes typed.
pub const INPUT: u8 = 0;
/// A frame's kind: the window's new size.
pub const RESIZE: u8 = 1;
/// A frame's kind: the front is there.
pub const ALIVE: u8 = 2;

/// What a front's frame says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Bytes typed.
    Input(Bytes),
    /// The window's new size.
    Resize(Size),
    /// The front is there.
    Alive,
}

/// Why a front's frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Shorter than a kind and a tag.
    #[error("a frame of {0} bytes (at least {n})", n = 1 + TAG)]
    TooShort(usize),
    /// The tag does not verify (altered, reordered, repeated, another session's).
    #[error("frame {0}'s tag does not verify")]
    BadTag(u64),
    /// A kind the protocol has not.
    #[error("frame {seq}: no kind {kind}")]
    UnknownKind {
        /// The frame.
        seq: u64,
        /// Its kind.
        kind: u8,
    },
    /// A payload its kind does not take.
    #[error("frame {seq}: {why}")]
    BadPayload {
        /// The frame.
        seq: u64,
        /// What is wrong.
        why: String,
    },
    /// A text message (every front message is a binary frame).
    #[error("a text message (the front's frames are binary)")]
    Text,
}

fn tag(key: &hmac::Key, signature: &str, seq: u64, kind: u8, payload: &[u8]) -> hmac::Tag {
    let mut cx = hmac::Context::with_key(key);
    cx.update(DOMAIN);
    cx.update(signature.as_bytes());
    cx.update(b"\n");
    cx.update(&seq.to_be_bytes());
    cx.update(&[kind]);
    cx.update(&(payload.len() as u32).to_be_bytes());
    cx.update(ring::digest::digest(&ring::digest::SHA256, payload).as_ref());
    cx.sign()
}

/// Frames a session's messages (the front's side).
pub struct Sealer {
    key: hmac::Key,
    signature: String,
    seq: u64,
}

impl Sealer {
    /// The sealer of the session whose upgrade was signed `signature`, under `secret`.
    pub fn new(secret: &[u8], signature: &str) -> Sealer {
        Sealer {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            signature: signature.to_owned(),
            seq: 0,
        }
    }

    /// Bytes typed, as frames of at most [`MAX_INPUT`] (none for no bytes).
    pub fn input(&mut self, data: &[u8]) -> Vec<Bytes> {
        data.chunks(MAX_INPUT)
            .map(|c| self.seal(INPUT, c))
            .collect()
    }

    /// A resize.
    pub fn resize(&mut self, size: Size) -> Bytes {
        let mut p = [0u8; 4];
        p[..2].copy_from_slice(&size.rows.to_be_bytes());
        p[2..].copy_from_slice(&size.cols.to_be_bytes());
        self.seal(RESIZE, &p)
    }

    /// "Alive".
    pub fn alive(&mut self) -> Bytes {
        self.seal(ALIVE, &[])
    }

    /// A frame of any kind and payload (tests send hostile ones).
    pub fn seal(&mut self, kind: u8, payload: &[u8]) -> Bytes {
        let t = tag(&self.key, &self.signature, self.seq, kind, payload);
        self.seq += 1;
        let mut b = BytesMut::with_capacity(1 + payload.len() + TAG);
        b.extend_from_slice(&[kind]);
        b.extend_from_slice(payload);
        b.extend_from_slice(t.as_ref());
        b.freeze()
    }
}

/// Verifies a session's frames in order (the node's side).
pub struct Opener {
    key: hmac::Key,
    signature: String,
    seq: u64,
}

impl Opener {
    /// The opener of the session whose upgrade was signed `signature` (verified).
    pub fn new(secret: &[u8], signature: &str) -> Opener {
        Opener {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            signature: signature.to_owned(),
            seq: 0,
        }
    }

    /// The next frame, verified (pure but for the count).
    pub fn open(&mut self, msg: &[u8]) -> Result<Frame, Refused> {
        if msg.len() < 1 + TAG {
            return Err(Refused::TooShort(msg.len()));
        }
        let seq = self.seq;
        let (kind, rest) = (msg[0], &msg[1..]);
        let (payload, got) = rest.split_at(rest.len() - TAG);
        let want = tag(&self.key, &self.signature, seq, kind, payload);
        let same = want.as_ref().len() == got.len()
            && want
                .as_ref()
                .iter()
                .zip(got)
                .fold(0u8, |acc, (x, y)| acc | (x ^ y))
                == 0;
        if !same {
            return Err(Refused::BadTag(seq));
        }
        self.seq += 1;
        let bad = |why: String| Refused::BadPayload { seq, why };
        match kind {
            INPUT if payload.is_empty() || payload.len() > MAX_INPUT => Err(bad(format!(
                "input is 1 to {MAX_INPUT} bytes, not {}",
                payload.len()
            ))),
            INPUT => Ok(Frame::Input(Bytes::copy_from_slice(payload))),
            RESIZE => {
                let [r0, r1, c0, c1] =
                    <[u8; 4]>::try_from(payload).map_err(|_| bad("a resize is 4 bytes".into()))?;
                let (rows, cols) = (u16::from_be_bytes([r0, r1]), u16::from_be_bytes([c0, c1]));
                Size::new(rows.into(), cols.into())
                    .map(Frame::Resize)
                    .map_err(bad)
            }
            ALIVE if payload.is_empty() => Ok(Frame::Alive),
            ALIVE => Err(bad("an alive frame is empty".into())),
            kind => Err(Refused::UnknownKind { seq, kind }),
        }
    }
}
