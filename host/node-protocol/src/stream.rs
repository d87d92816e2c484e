//! A streamed stdin on the node protocol (`run-stream`, docs/NODE.md "Streamed
//! stdin"): how its bytes are framed and bound to the signed request (pure).
//!
//! Decision: the request's signature cannot cover a body hash that is known only when
//! the stream ends, and a node must not hand the container a byte it has not
//! verified. So the signed part is the **head** (the body's first line: the command,
//! the container, the timeout and, when the front knows it, the stdin's `length`),
//! and every later byte travels in a **frame** that carries its own tag:
//!
//! ```text
//! frame = len: u32 BE | data: len bytes | tag: 32 bytes
//! tag   = HMAC-SHA256(secret, "stockade-stream-v1\n" | request signature (hex) | "\n"
//!                             | seq: u64 BE | len: u32 BE | SHA-256(data))
//! ```
//!
//! (The data's digest, not the data, goes into the HMAC: a front whose HMAC takes one
//! contiguous message, WebCrypto's, need not copy each frame behind a prefix; the
//! digest binds the data as tightly.)
//!
//! `seq` counts frames from 0; a frame of length 0 is the **end** (its tag as any
//! other's), after which nothing may follow. The node forwards a frame's data only
//! once its tag verified. So a frame from another request (another signature), a
//! reordered, repeated, dropped or altered frame, a stream cut short (no end frame:
//! the end is authenticated, so no signed length is needed to see a truncation),
//! one longer or shorter than a signed length, or bytes after its end are each
//! refused at the first bad byte; the request itself is covered by the usual nonce
//! cache (a replay is 401 before any frame is read). A frame's data is at most
//! [`MAX_FRAME`]: the node holds one frame, not the stream.

use bytes::{Buf, Bytes, BytesMut};
use ring::hmac;

/// The largest frame's data.
pub const MAX_FRAME: usize = 1 << 20;

/// The tag's length.
pub const TAG: usize = 32;

const DOMAIN: &[u8] = b"stockade-stream-v1\n";

fn tag(key: &hmac::Key, signature: &str, seq: u64, data: &[u8]) -> hmac::Tag {
    let mut cx = hmac::Context::with_key(key);
    cx.update(DOMAIN);
    cx.update(signature.as_bytes());
    cx.update(b"\n");
    cx.update(&seq.to_be_bytes());
    cx.update(&(data.len() as u32).to_be_bytes());
    cx.update(ring::digest::digest(&ring::digest::SHA256, data).as_ref());
    cx.sign()
}

/// Whether two tags are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Frames a stream for the request signed `signature` (the sending side).
pub struct Framer {
    key: hmac::Key,
    signature: String,
    seq: u64,
}

impl Framer {
    /// The framer of the request whose signature is `signature`, under `secret`.
    pub fn new(secret: &[u8], signature: &str) -> Framer {
        Framer {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            signature: signature.to_owned(),
            seq: 0,
        }
    }

    /// `data` as frames (each at most [`MAX_FRAME`]; empty data: none).
    pub fn frames(&mut self, data: &[u8]) -> Vec<Bytes> {
        data.chunks(MAX_FRAME).map(|c| self.frame(c)).collect()
    }

    /// The end frame.
    pub fn end(&mut self) -> Bytes {
        self.frame(&[])
    }

    fn frame(&mut self, data: &[u8]) -> Bytes {
        let t = tag(&self.key, &self.signature, self.seq, data);
        self.seq += 1;
        let mut b = BytesMut::with_capacity(4 + data.len() + TAG);
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        b.extend_from_slice(t.as_ref());
        b.freeze()
    }
}

/// Why a stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A frame's declared length is over [`MAX_FRAME`].
    #[error("a frame of {0} bytes (at most {MAX_FRAME})")]
    FrameTooLarge(u32),
    /// A frame's tag does not verify (altered, reordered, or another request's).
    #[error("frame {0}'s tag does not verify")]
    BadTag(u64),
    /// More data than the signed length.
    #[error("the stream is longer than its signed length {0}")]
    TooLong(u64),
    /// The end frame came before the signed length.
    #[error("the stream ended at {got} of its signed {length} bytes")]
    TooShort {
        /// Bytes received.
        got: u64,
        /// The signed length.
        length: u64,
    },
    /// Bytes after the end frame.
    #[error("bytes after the stream's end")]
    AfterEnd,
    /// The body ended without an end frame.
    #[error("the stream broke off after {0} bytes (no end frame)")]
    BrokenOff(u64),
}

/// What [`Deframer::push`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Verified data, in order.
    Data(Bytes),
    /// The verified end (the stream had exactly its signed length).
    End,
}

/// Verifies a framed stream as its bytes arrive (the receiving side).
pub struct Deframer {
    key: hmac::Key,
    signature: String,
    length: Option<u64>,
    seq: u64,
    got: u64,
    ended: bool,
    buf: BytesMut,
}

impl Deframer {
    /// The deframer of the request signed `signature` (already verified), whose head
    /// declared `length` bytes of stdin (`None`: any length).
    pub fn new(secret: &[u8], signature: &str, length: Option<u64>) -> Deframer {
        Deframer {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            signature: signature.to_owned(),
            length,
            seq: 0,
            got: 0,
            ended: false,
            buf: BytesMut::new(),
        }
    }

    /// Add received bytes; the verified pieces they complete, or why the stream is
    /// refused. Holds at most one frame.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Piece>, Refused> {
        if self.ended && !data.is_empty() {
            return Err(Refused::AfterEnd);
        }
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            if self.buf.len() < 4 {
                break;
            }
            let n = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
            if n as usize > MAX_FRAME {
                return Err(Refused::FrameTooLarge(n));
            }
            let whole = 4 + n as usize + TAG;
            if self.buf.len() < whole {
                break;
            }
            if self.ended {
                return Err(Refused::AfterEnd);
            }
            let mut frame = self.buf.split_to(whole);
            frame.advance(4);
            let data = frame.split_to(n as usize).freeze();
            let expected = tag(&self.key, &self.signature, self.seq, &data);
            if !same(expected.as_ref(), &frame) {
                return Err(Refused::BadTag(self.seq));
            }
            self.seq += 1;
            if data.is_empty() {
                if let Some(length) = self.length
                    && self.got != length
                {
                    return Err(Refused::TooShort {
                        got: self.got,
                        length,
                    });
                }
                self.ended = true;
                out.push(Piece::End);
                continue;
            }
            self.got += data.len() as u64;
            if let Some(length) = self.length
                && self.got > length
            {
                return Err(Refused::TooLong(length));
            }
            out.push(Piece::Data(data));
        }
        if self.ended && !self.buf.is_empty() {
            return Err(Refused::AfterEnd);
        }
        Ok(out)
    }

    /// The body ended: fine only after the end frame.
    pub fn finish(&self) -> Result<(), Refused> {
        if self.ended {
            Ok(())
        } else {
            Err(Refused::BrokenOff(self.got))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn framed(sig: &str, data: &[u8], step: usize) -> Vec<u8> {
        let mut f = Framer::new(SECRET, sig);
        let mut out = Vec::new();
        for c in data.chunks(step.max(1)) {
            for fr in f.frames(c) {
                out.extend_from_slice(&fr);
            }
        }
        out.extend_from_slice(&f.end());
        out
    }

    /// Feed `wire` to a deframer in pieces of `cut`; the data it verified and how it
    /// ended.
    fn receive(
        sig: &str,
        length: Option<u64>,
        wire: &[u8],
        cut: usize,
    ) -> (Vec<u8>, Result<(), Refused>) {
        let mut d = Deframer::new(SECRET, sig, length);
        let mut got = Vec::new();
        for c in wire.chunks(cut) {
            match d.push(c) {
                Ok(pieces) => {
                    for p in pieces {
                        if let Piece::Data(b) = p {
                            got.extend_from_slice(&b);
                        }
                    }
                }
                Err(e) => return (got, Err(e)),
            }
        }
        let end = d.finish();
        (got, end)
    }

    #[test]
    fn a_stream_arrives_whole_however_it_is_cut() {
        let data: Vec<u8> = (0..3 * MAX_FRAME + 17).map(|i| (i % 251) as u8).collect();
        for (step, cut) in [
            (MAX_FRAME, 1 << 16),
            (1000, 7),
            (5, 100_000),
            (usize::MAX, 1),
        ] {
            let wire = framed("sig", &data, step.min(data.len()));
            let cut = if cut == 1 { 4093 } else { cut };
            for length in [Some(data.len() as u64), None] {
                let (got, end) = receive("sig", length, &wire, cut);
                assert_eq!(end, Ok(()), "step {step} cut {cut}");
                assert!(got == data, "step {step} cut {cut}");
            }
        }
        // An empty stream is its end frame alone.
        let (got, end) = receive("sig", Some(0), &framed("sig", b"", 1), 3);
        assert_eq!((got.len(), end), (0, Ok(())));
    }

    #[test]
    fn every_tampering_is_refused_before_its_bytes_are_handed_on() {
        let data = b"hello, stream; a second frame; a third".to_vec();
        let wire = framed("sig", &data, 10);
        let frame = 4 + 10 + TAG;
        // (why, the wire, the signature the node verified, the signed length, the
        // refusal, how many data bytes got through first)
        let mut flipped = wire.clone();
        flipped[frame + 6] ^= 1;
        let mut swapped = wire.clone();
        swapped[..2 * frame].rotate_left(frame);
        let mut repeated = wire[..frame].to_vec();
        repeated.extend_from_slice(&wire[..frame]);
        let dropped: Vec<u8> = wire[frame..].to_vec();
        let mut after = wire.clone();
        after.extend_from_slice(&wire[..frame]);
        let mut huge = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        huge.extend_from_slice(&[0; 64]);
        type Row = (
            &'static str,
            Vec<u8>,
            &'static str,
            Option<u64>,
            Refused,
            usize,
        );
        let rows: Vec<Row> = vec![
            (
                "another request's stream (spliced)",
                wire.clone(),
                "other",
                Some(38),
                Refused::BadTag(0),
                0,
            ),
            (
                "a flipped bit",
                flipped,
                "sig",
                Some(38),
                Refused::BadTag(1),
                10,
            ),
            (
                "two frames swapped",
                swapped,
                "sig",
                Some(38),
                Refused::BadTag(0),
                0,
            ),
            (
                "a frame repeated",
                repeated,
                "sig",
                Some(38),
                Refused::BadTag(1),
                10,
            ),
            (
                "the first frame dropped",
                dropped,
                "sig",
                Some(38),
                Refused::BadTag(0),
                0,
            ),
            (
                "cut before the end frame",
                wire[..wire.len() - 1].to_vec(),
                "sig",
                Some(38),
                Refused::BrokenOff(38),
                38,
            ),
            (
                "cut, no length signed",
                wire[..wire.len() - 1].to_vec(),
                "sig",
                None,
                Refused::BrokenOff(38),
                38,
            ),
            (
                "longer than signed",
                wire.clone(),
                "sig",
                Some(20),
                Refused::TooLong(20),
                20,
            ),
            (
                "shorter than signed",
                wire.clone(),
                "sig",
                Some(39),
                Refused::TooShort {
                    got: 38,
                    length: 39,
                },
                38,
            ),
            (
                "bytes after the end",
                after,
                "sig",
                Some(38),
                Refused::AfterEnd,
                38,
            ),
            (
                "a frame past the bound",
                huge,
                "sig",
                Some(38),
                Refused::FrameTooLarge(MAX_FRAME as u32 + 1),
                0,
            ),
        ];
        for (why, wire, sig, length, refusal, through) in rows {
            for cut in [1, 13, 1 << 20] {
                let (got, end) = receive(sig, length, &wire, cut);
                assert_eq!(end, Err(refusal.clone()), "{why} (cut {cut})");
                assert!(
                    got.len() <= through,
                    "{why}: {} bytes got through",
                    got.len()
                );
                assert_eq!(got[..], data[..got.len()], "{why}: only verified bytes");
            }
        }
    }
}
