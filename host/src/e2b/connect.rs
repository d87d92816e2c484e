//! The Connect protocol's framing, as envd speaks it to the E2B SDK (JSON codec: the
//! Python SDK sends `application/json` for unary calls and `application/connect+json`
//! for server streams, `e2b/envd/client_shared.py`).
//!
//! A streamed message is an envelope: one flag byte, a 4-byte big-endian length, then
//! that many bytes of JSON. Flag `0x00` is a message; `0x02` ends the stream, its JSON
//! `{}` or `{"error": {"code", "message"}}` (the trailer). A compressed envelope (flag
//! `0x01`) is refused: this server offers no compression, so a client never sends one.
//! Pure; table-tested, malformed envelopes included.

use serde_json::{Value, json};

/// A message envelope's flag.
pub const FLAG_MESSAGE: u8 = 0x00;
/// The compressed bit (refused).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// The end-of-stream envelope's flag.
pub const FLAG_END: u8 = 0x02;

/// The most a request envelope may hold (a StartRequest is a command line and its
/// environment; 1 MiB is far past one).
pub const MAX_REQUEST: usize = 1 << 20;

/// One envelope (pure).
pub fn envelope(flag: u8, json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flag);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json);
    out
}

/// A message envelope of `v`.
pub fn message(v: &Value) -> Vec<u8> {
    envelope(FLAG_MESSAGE, v.to_string().as_bytes())
}

/// The end-of-stream envelope: `{}`, or the error's trailer.
pub fn end(error: Option<&RpcError>) -> Vec<u8> {
    let body = match error {
        None => json!({}),
        Some(e) => json!({"error": e.json()}),
    };
    envelope(FLAG_END, body.to_string().as_bytes())
}

/// Why a request body is not one message envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer than 5 bytes, or fewer than the length says.
    Truncated,
    /// Bytes after the one envelope (a server stream's request is one message).
    Trailing,
    /// A flag other than a plain message (compressed, end-of-stream, unknown).
    Flag(u8),
    /// Longer than [`MAX_REQUEST`].
    TooLarge,
}

/// The JSON of the single message envelope a server-streaming request's body must be
/// (pure). Anything else is refused whole.
pub fn single(body: &[u8]) -> Result<&[u8], FrameError> {
    if body.len() < 5 {
        return Err(FrameError::Truncated);
    }
    let flag = body[0];
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > MAX_REQUEST {
        return Err(FrameError::TooLarge);
    }
    if flag != FLAG_MESSAGE {
        return Err(FrameError::Flag(flag));
    }
    let rest = &body[5..];
    match rest.len().cmp(&len) {
        std::cmp::Ordering::Less => Err(FrameError::Truncated),
        std::cmp::Ordering::Greater => Err(FrameError::Trailing),
        std::cmp::Ordering::Equal => Ok(rest),
    }
}

/// The most a client stream's body may hold in all (StreamInput: its input as it
/// comes; 64 MiB is far past a typed session or a pasted file).
pub const MAX_CLIENT_STREAM: usize = 64 << 20;

/// A client stream's envelopes, read as its body arrives (StreamInput): bytes are
/// pushed, whole message envelopes taken out. Bounded: an envelope over
/// [`MAX_REQUEST`], a body over [`MAX_CLIENT_STREAM`], a flag other than a plain
/// message (a client sends no end-of-stream; compression is not offered) are errors,
/// and nothing after one is read. Pure.
#[derive(Debug, Default)]
pub struct Envelopes {
    buf: Vec<u8>,
    total: usize,
}

impl Envelopes {
    /// More of the body.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), FrameError> {
        self.total = self.total.saturating_add(bytes.len());
        if self.total > MAX_CLIENT_STREAM {
            return Err(FrameError::TooLarge);
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The next whole message's JSON, if one has arrived.
    pub fn next_message(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flag = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_REQUEST {
            return Err(FrameError::TooLarge);
        }
        if flag != FLAG_MESSAGE {
            return Err(FrameError::Flag(flag));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let msg = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        Ok(Some(msg))
    }

    /// The body ended: bytes of a partial envelope left are [`FrameError::Truncated`].
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated)
        }
    }
}

/// A Connect error code (the ones this layer answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `invalid_argument` (HTTP 400).
    InvalidArgument,
    /// `unauthenticated` (401).
    Unauthenticated,
    /// `not_found` (404).
    NotFound,
    /// `already_exists` (409): envd's MakeDir of a directory already there.
    AlreadyExists,
    /// `resource_exhausted` (429).
    ResourceExhausted,
    /// `failed_precondition` (400): a call the process's kind cannot take (input to a
    /// command with no live stdin).
    FailedPrecondition,
    /// `deadline_exceeded` (408 in Connect's table; only ever in a trailer here).
    DeadlineExceeded,
    /// `unimplemented` (501).
    Unimplemented,
    /// `unavailable` (503).
    Unavailable,
    /// `internal` (500).
    Internal,
}

impl Code {
    /// The protocol's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::Unauthenticated => "unauthenticated",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status a unary error answers with (Connect's mapping).
    pub fn http(self) -> u16 {
        match self {
            Code::InvalidArgument => 400,
            Code::Unauthenticated => 401,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 400,
            Code::DeadlineExceeded => 408,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Internal => 500,
        }
    }

    /// The code of a Stockade API status (pure).
    pub fn of_status(status: u16) -> Code {
        match status {
            400 | 413 | 422 => Code::InvalidArgument,
            401 | 403 => Code::Unauthenticated,
            404 => Code::NotFound,
            429 => Code::ResourceExhausted,
            502 | 503 => Code::Unavailable,
            _ => Code::Internal,
        }
    }
}

/// A Connect error: its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// The code.
    pub code: Code,
    /// For people.
    pub message: String,
}

impl RpcError {
    /// An error of `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Its JSON (a unary error's body, a trailer's `error`).
    pub fn json(&self) -> Value {
        json!({"code": self.code.name(), "message": self.message})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_flag_length_json() {
        for (flag, json, want) in [
            (FLAG_MESSAGE, &b"{}"[..], &b"\x00\x00\x00\x00\x02{}"[..]),
            (FLAG_END, b"{}", b"\x02\x00\x00\x00\x02{}"),
            (FLAG_MESSAGE, b"", b"\x00\x00\x00\x00\x00"),
        ] {
            assert_eq!(envelope(flag, json), want);
        }
        let big = vec![b'x'; 70_000];
        let e = envelope(0, &big);
        assert_eq!(&e[1..5], &70_000u32.to_be_bytes());
    }

    #[test]
    fn a_request_is_exactly_one_message_envelope() {
        let one = envelope(FLAG_MESSAGE, br#"{"a":1}"#);
        let mut two = one.clone();
        two.extend_from_slice(&one);
        let mut huge = vec![0u8];
        huge.extend_from_slice(&((MAX_REQUEST + 1) as u32).to_be_bytes());
        type Case<'a> = (&'a str, &'a [u8], Result<&'a [u8], FrameError>);
        let cases: &[Case] = &[
            ("one message", &one, Ok(br#"{"a":1}"#)),
            ("empty message", b"\x00\x00\x00\x00\x00", Ok(b"")),
            ("nothing", b"", Err(FrameError::Truncated)),
            (
                "a short header",
                b"\x00\x00\x00",
                Err(FrameError::Truncated),
            ),
            (
                "shorter than its length",
                b"\x00\x00\x00\x00\x09{}",
                Err(FrameError::Truncated),
            ),
            ("two envelopes", &two, Err(FrameError::Trailing)),
            (
                "compressed",
                b"\x01\x00\x00\x00\x02{}",
                Err(FrameError::Flag(1)),
            ),
            (
                "end-of-stream",
                b"\x02\x00\x00\x00\x02{}",
                Err(FrameError::Flag(2)),
            ),
            (
                "unknown flag",
                b"\x80\x00\x00\x00\x02{}",
                Err(FrameError::Flag(0x80)),
            ),
            ("too large", &huge, Err(FrameError::TooLarge)),
        ];
        for (what, body, want) in cases {
            assert_eq!(single(body), *want, "{what}");
        }
    }

    #[test]
    fn a_client_streams_envelopes_are_taken_as_they_arrive_and_bounded() {
        let a = envelope(FLAG_MESSAGE, br#"{"a":1}"#);
        let b = envelope(FLAG_MESSAGE, br#"{"b":2}"#);
        let mut body = a.clone();
        body.extend_from_slice(&b);
        // Byte by byte: each message comes out exactly when its last byte arrives.
        let mut r = Envelopes::default();
        let mut got = Vec::new();
        for byte in &body {
            r.push(&[*byte]).unwrap();
            while let Some(m) = r.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![br#"{"a":1}"#.to_vec(), br#"{"b":2}"#.to_vec()]);
        assert_eq!(r.finish(), Ok(()));
        // A partial envelope at the end.
        let mut r = Envelopes::default();
        r.push(&a[..4]).unwrap();
        assert_eq!(r.next_message(), Ok(None));
        assert_eq!(r.finish(), Err(FrameError::Truncated));
        // Flags a client never sends, an envelope over the bound, a body over its own.
        for (flag, want) in [
            (FLAG_END, FrameError::Flag(2)),
            (FLAG_COMPRESSED, FrameError::Flag(1)),
        ] {
            let mut r = Envelopes::default();
            r.push(&envelope(flag, b"{}")).unwrap();
            assert_eq!(r.next_message(), Err(want));
        }
        let mut r = Envelopes::default();
        let mut huge = vec![0u8];
        huge.extend_from_slice(&((MAX_REQUEST + 1) as u32).to_be_bytes());
        r.push(&huge).unwrap();
        assert_eq!(r.next_message(), Err(FrameError::TooLarge));
        let mut r = Envelopes::default();
        r.push(&vec![0u8; MAX_CLIENT_STREAM]).unwrap();
        assert_eq!(r.push(&[0]), Err(FrameError::TooLarge));
    }

    #[test]
    fn the_end_carries_the_error() {
        assert_eq!(end(None), envelope(FLAG_END, b"{}"));
        let e = end(Some(&RpcError::new(Code::NotFound, "gone")));
        assert_eq!(e[0], FLAG_END);
        let v: Value = serde_json::from_slice(&e[5..]).unwrap();
        assert_eq!(
            v,
            json!({"error": {"code": "not_found", "message": "gone"}})
        );
    }

    #[test]
    fn statuses_map_to_codes() {
        for (status, code) in [
            (400, Code::InvalidArgument),
            (401, Code::Unauthenticated),
            (404, Code::NotFound),
            (429, Code::ResourceExhausted),
            (502, Code::Unavailable),
            (500, Code::Internal),
        ] {
            assert_eq!(Code::of_status(status), code, "{status}");
        }
    }
}
