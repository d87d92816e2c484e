//! Live output as the API streams it (`POST …/exec/stream`): one NDJSON event per
//! chunk, `{"type": "stdout" | "stderr", "data": TEXT}` (or `"data_base64"` when the
//! bytes are not UTF-8), then one final event, `{"type": "exit", …}` (the outcome
//! without its output) or `{"type": "error", "error": {…}}`.
//!
//! A chunk boundary may fall inside a multi-byte UTF-8 character: [`Utf8Chunker`] holds
//! such an incomplete tail (at most 3 bytes) until the next chunk completes it, so a
//! client that concatenates `data` gets the program's text intact. Bytes that are not
//! UTF-8 at all go out as base64, exactly.

use base64::Engine as _;
use serde_json::{Value, json};

/// One chunk's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Valid UTF-8.
    Text(String),
    /// Anything else, base64-encoded.
    Base64(String),
}

/// Per stream: turns byte chunks into payloads, holding an incomplete UTF-8 tail.
#[derive(Debug, Default)]
pub struct Utf8Chunker {
    held: Vec<u8>,
}

impl Utf8Chunker {
    /// The payload for `data` (with what was held before it), if any is ready.
    pub fn push(&mut self, data: &[u8]) -> Option<Payload> {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(data);
        match std::str::from_utf8(&buf) {
            Ok(_) => Some(Payload::Text(String::from_utf8(buf).unwrap_or_default()))
                .filter(|p| *p != Payload::Text(String::new())),
            // Only an incomplete character at the very end: hold it.
            Err(e) if e.error_len().is_none() => {
                let valid = e.valid_up_to();
                self.held = buf.split_off(valid);
                (valid > 0).then(|| Payload::Text(String::from_utf8(buf).unwrap_or_default()))
            }
            Err(_) => Some(Payload::Base64(
                base64::engine::general_purpose::STANDARD.encode(&buf),
            )),
        }
    }

    /// What is still held when the stream ends (an incomplete character: base64).
    pub fn finish(&mut self) -> Option<Payload> {
        let held = std::mem::take(&mut self.held);
        (!held.is_empty())
            .then(|| Payload::Base64(base64::engine::general_purpose::STANDARD.encode(held)))
    }
}

/// One output event.
pub fn output_event(stream: &str, p: Payload) -> Value {
    match p {
        Payload::Text(t) => json!({ "type": stream, "data": t }),
        Payload::Base64(b) => json!({ "type": stream, "data_base64": b }),
    }
}

/// An event as one NDJSON line.
pub fn line(v: &Value) -> bytes::Bytes {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Option<Payload> {
        Some(Payload::Text(s.into()))
    }

    #[test]
    fn chunks_become_text_holding_a_split_character_and_base64_for_the_rest() {
        let b64 = |b: &[u8]| {
            Some(Payload::Base64(
                base64::engine::general_purpose::STANDARD.encode(b),
            ))
        };
        let euro = "€".as_bytes(); // e2 82 ac
        // (chunks, payloads after each, payload at finish)
        type Row<'a> = (Vec<&'a [u8]>, Vec<Option<Payload>>, Option<Payload>);
        let rows: Vec<Row> = vec![
            (vec![b"hello\n"], vec![text("hello\n")], None),
            (vec![b""], vec![None], None),
            // a character split over two chunks, then three
            (
                vec![b"a\xe2\x82", b"\xac b"],
                vec![text("a"), text("€ b")],
                None,
            ),
            (
                vec![&euro[..1], &euro[1..2], &euro[2..]],
                vec![None, None, text("€")],
                None,
            ),
            // invalid bytes: the whole chunk as base64
            (vec![b"x\xffy"], vec![b64(b"x\xffy")], None),
            // a stream that ends inside a character: the held bytes as base64
            (vec![b"ok\xe2\x82"], vec![text("ok")], b64(b"\xe2\x82")),
        ];
        for (chunks, want, end) in rows {
            let mut c = Utf8Chunker::default();
            let got: Vec<_> = chunks.iter().map(|ch| c.push(ch)).collect();
            assert_eq!(got, want, "{chunks:?}");
            assert_eq!(c.finish(), end, "{chunks:?}");
        }
    }

    #[test]
    fn events_are_one_line_each() {
        let l = line(&output_event("stdout", Payload::Text("a\nb".into())));
        assert_eq!(&l[..], b"{\"data\":\"a\\nb\",\"type\":\"stdout\"}\n");
    }
}
