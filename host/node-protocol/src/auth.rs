//! Signed node requests: an HMAC-SHA256 over the time, a nonce, the method, the path,
//! the key, the idempotency key and the body's hash, with one secret per node. A node
//! refuses (401) a signature that does not match, a time outside ±[`WINDOW`], and a
//! nonce it has already seen inside the window (a replay). The same scheme signs the
//! node's call back to its front. Pure but for the clock the caller passes in.
//!
//! The canonical text (every field on its own line, in this order):
//!
//! ```text
//! stockade-node-v1
//! {time ms}
//! {nonce}
//! {METHOD}
//! {path}
//! {key}
//! {idempotency key, or empty}
//! {hex sha-256 of the body}
//! ```
//!
//! The signature is the lower-case hex of HMAC-SHA256(secret, canonical text).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use ring::{digest, hmac};

/// How far a request's time may be from the node's clock, either way.
pub const WINDOW: Duration = Duration::from_secs(30);

/// Header: the request's time, Unix milliseconds.
pub const TIME_HEADER: &str = "x-stockade-time";
/// Header: a random nonce (16 to 64 characters of `[0-9a-f]`).
pub const NONCE_HEADER: &str = "x-stockade-nonce";
/// Header: the sandbox key the call acts for (empty for a node-wide call).
pub const KEY_HEADER: &str = "x-stockade-key";
/// Header: the signature.
pub const SIGNATURE_HEADER: &str = "x-stockade-signature";
/// Header: which node signed a call back to the front.
pub const NODE_HEADER: &str = "x-stockade-node";

/// What a signature covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signed<'a> {
    /// Unix milliseconds.
    pub time_ms: u64,
    /// The nonce.
    pub nonce: &'a str,
    /// Upper-case method.
    pub method: &'a str,
    /// The path (no query: node routes take none).
    pub path: &'a str,
    /// The sandbox key ("" for a node-wide call).
    pub key: &'a str,
    /// The idempotency key ("" for none).
    pub idempotency: &'a str,
    /// The body.
    pub body: &'a [u8],
}

impl Signed<'_> {
    /// The canonical text the signature is computed over.
    pub fn canonical(&self) -> String {
        format!(
            "stockade-node-v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.time_ms,
            self.nonce,
            self.method,
            self.path,
            self.key,
            self.idempotency,
            hex(digest::digest(&digest::SHA256, self.body).as_ref())
        )
    }

    /// The signature under `secret`.
    pub fn sign(&self, secret: &[u8]) -> String {
        let k = hmac::Key::new(hmac::HMAC_SHA256, secret);
        hex(hmac::sign(&k, self.canonical().as_bytes()).as_ref())
    }
}

/// Why a signed request was refused (each a 401; the message is for the log only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A signing header is missing or malformed.
    #[error("a signing header is missing or malformed")]
    Malformed,
    /// The time is outside the window.
    #[error("the request's time is outside the window")]
    Expired,
    /// The signature does not match.
    #[error("the signature does not match")]
    BadSignature,
    /// The nonce was already used inside the window.
    #[error("the nonce was already used (a replay)")]
    Replayed,
    /// The nonce cache is full: refused rather than forgetting a live nonce.
    #[error("too many requests inside the window")]
    Busy,
}

/// A fresh nonce: 32 hex characters from the operating system's CSPRNG.
pub fn nonce() -> String {
    let mut b = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .expect("the system's random source");
    hex(&b)
}

/// A fresh secret for a node: 32 random bytes as 64 hex characters.
pub fn new_secret() -> String {
    let mut b = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .expect("the system's random source");
    hex(&b)
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

fn well_formed_nonce(n: &str) -> bool {
    (16..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What can be checked of a request from its signing headers alone, before its body
/// is read: the nonce and the signature well-formed, the time inside the window. A
/// node refuses a request failing it without reading a byte of its body (the body
/// may be megabytes an unauthenticated client holds open). [`verify`] checks it again.
pub fn precheck(time_ms: u64, nonce: &str, signature: &str, now_ms: u64) -> Result<(), Refused> {
    if !well_formed_nonce(nonce) || signature.len() != 64 || unhex(signature).is_none() {
        return Err(Refused::Malformed);
    }
    if now_ms.abs_diff(time_ms) > WINDOW.as_millis() as u64 {
        return Err(Refused::Expired);
    }
    Ok(())
}

/// Check a request's signature and time; the nonce is checked by [`Nonces`].
pub fn verify(
    req: &Signed<'_>,
    signature: &str,
    secret: &[u8],
    now_ms: u64,
) -> Result<(), Refused> {
    precheck(req.time_ms, req.nonce, signature, now_ms)?;
    let Some(tag) = unhex(signature) else {
        return Err(Refused::Malformed);
    };
    let k = hmac::Key::new(hmac::HMAC_SHA256, secret);
    // Constant time: ring's verify.
    hmac::verify(&k, req.canonical().as_bytes(), &tag).map_err(|_| Refused::BadSignature)
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The nonces seen inside the window: a nonce is accepted once. Entries older than
/// twice the window are forgotten (a request that old is refused by its time), and
/// when `capacity` live nonces are held, new requests are refused ([`Refused::Busy`])
/// rather than forgetting one that could be replayed.
#[derive(Debug)]
pub struct Nonces {
    seen: HashMap<String, u64>,
    order: VecDeque<(u64, String)>,
    capacity: usize,
}

impl Nonces {
    /// A cache holding at most `capacity` nonces.
    pub fn new(capacity: usize) -> Nonces {
        Nonces {
            seen: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// Accept `nonce` (seen at `now_ms`) once; a second time inside the window is a replay.
    pub fn accept(&mut self, nonce: &str, now_ms: u64) -> Result<(), Refused> {
        self.check(nonce, now_ms)?;
        self.seen.insert(nonce.to_owned(), now_ms);
        self.order.push_back((now_ms, nonce.to_owned()));
        Ok(())
    }

    /// Would [`Nonces::accept`] take `nonce` now? The same answer, but no slot is
    /// taken: what a node asks before reading a body whose signature it has not yet
    /// checked (a forged request never takes a slot; a replay is refused unread).
    pub fn check(&mut self, nonce: &str, now_ms: u64) -> Result<(), Refused> {
        let horizon = 2 * WINDOW.as_millis() as u64;
        while let Some((t, _)) = self.order.front()
            && now_ms.saturating_sub(*t) > horizon
        {
            let (_, n) = self.order.pop_front().expect("front exists");
            self.seen.remove(&n);
        }
        if self.seen.contains_key(nonce) {
            return Err(Refused::Replayed);
        }
        if self.seen.len() >= self.capacity {
            return Err(Refused::Busy);
        }
        Ok(())
    }

    /// Nonces held.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const N: &str = "00112233445566778899aabbccddeeff";

    fn req(body: &[u8]) -> Signed<'_> {
        Signed {
            time_ms: 1_000_000,
            nonce: N,
            method: "POST",
            path: "/node/v1/ensure",
            key: "alpha",
            idempotency: "i1",
            body,
        }
    }

    #[test]
    fn the_canonical_text_is_the_documented_one() {
        // The edge Worker computes the same text in JavaScript: keep them in step.
        assert_eq!(
            req(b"{}").canonical(),
            "stockade-node-v1\n1000000\n00112233445566778899aabbccddeeff\nPOST\n/node/v1/ensure\nalpha\ni1\n\
             44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn a_good_signature_verifies_and_every_changed_field_does_not() {
        let body = br#"{"container":"c"}"#;
        let good = req(body);
        let sig = good.sign(SECRET);
        assert_eq!(verify(&good, &sig, SECRET, 1_000_000), Ok(()));
        let other_body = br#"{"container":"d"}"#;
        let changed: Vec<(&str, Signed<'_>)> = vec![
            (
                "time",
                Signed {
                    time_ms: 1_000_001,
                    ..good
                },
            ),
            (
                "nonce",
                Signed {
                    nonce: "ffffffffffffffffffffffffffffffff",
                    ..good
                },
            ),
            (
                "method",
                Signed {
                    method: "GET",
                    ..good
                },
            ),
            (
                "path",
                Signed {
                    path: "/node/v1/stop",
                    ..good
                },
            ),
            (
                "key",
                Signed {
                    key: "beta",
                    ..good
                },
            ),
            (
                "idempotency",
                Signed {
                    idempotency: "",
                    ..good
                },
            ),
            (
                "body",
                Signed {
                    body: other_body,
                    ..good
                },
            ),
        ];
        for (what, r) in changed {
            assert_eq!(
                verify(&r, &sig, SECRET, 1_000_000),
                Err(Refused::BadSignature),
                "{what}"
            );
        }
        assert_eq!(
            verify(&good, &sig, b"another secret", 1_000_000),
            Err(Refused::BadSignature)
        );
    }

    #[test]
    fn time_outside_the_window_and_malformed_headers_are_refused() {
        let r = req(b"");
        let sig = r.sign(SECRET);
        assert_eq!(verify(&r, &sig, SECRET, 1_000_000 + 30_000), Ok(()));
        assert_eq!(
            verify(&r, &sig, SECRET, 1_000_000 + 30_001),
            Err(Refused::Expired)
        );
        assert_eq!(
            verify(&r, &sig, SECRET, 1_000_000 - 30_001),
            Err(Refused::Expired)
        );
        assert_eq!(verify(&r, "zz", SECRET, 1_000_000), Err(Refused::Malformed));
        assert_eq!(
            verify(&r, &"g".repeat(64), SECRET, 1_000_000),
            Err(Refused::Malformed)
        );
        let short = Signed { nonce: "abc", ..r };
        assert_eq!(
            verify(&short, &short.sign(SECRET), SECRET, 1_000_000),
            Err(Refused::Malformed)
        );
        let upper = Signed {
            nonce: "00112233445566778899AABBCCDDEEFF",
            ..r
        };
        assert_eq!(
            verify(&upper, &upper.sign(SECRET), SECRET, 1_000_000),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn a_nonce_is_accepted_once_within_the_window_and_the_cache_is_bounded() {
        let mut n = Nonces::new(2);
        assert_eq!(n.accept("a", 0), Ok(()));
        assert_eq!(n.accept("a", 10), Err(Refused::Replayed));
        assert_eq!(n.accept("b", 20), Ok(()));
        // Full: refused, never a live nonce forgotten.
        assert_eq!(n.accept("c", 30), Err(Refused::Busy));
        assert_eq!(n.accept("a", 30), Err(Refused::Replayed));
        // Past twice the window the old ones go (their time is refused by `verify`).
        assert_eq!(n.accept("c", 60_021), Ok(()));
        assert_eq!(n.len(), 1);
        assert_eq!(n.accept("a", 60_022), Ok(()));
        assert_eq!(n.len(), 2);
    }

    #[test]
    fn the_headers_alone_are_prechecked_as_verify_checks_them() {
        let sig = req(b"").sign(SECRET);
        // (what, the request's time, nonce, signature, now, the answer)
        type Row<'a> = (&'a str, u64, &'a str, &'a str, u64, Result<(), Refused>);
        let rows: &[Row<'_>] = &[
            (
                "well formed, in time",
                1_000_000,
                N,
                &sig,
                1_000_000,
                Ok(()),
            ),
            (
                "at the window's edge",
                1_000_000,
                N,
                &sig,
                1_030_000,
                Ok(()),
            ),
            (
                "past the window",
                1_000_000,
                N,
                &sig,
                1_030_001,
                Err(Refused::Expired),
            ),
            (
                "before the window",
                1_000_000,
                N,
                &sig,
                969_999,
                Err(Refused::Expired),
            ),
            (
                "a short nonce",
                1_000_000,
                "abc",
                &sig,
                1_000_000,
                Err(Refused::Malformed),
            ),
            (
                "a short signature",
                1_000_000,
                N,
                "ab",
                1_000_000,
                Err(Refused::Malformed),
            ),
            (
                "a signature not hex",
                1_000_000,
                N,
                &"g".repeat(64),
                1_000_000,
                Err(Refused::Malformed),
            ),
        ];
        for (name, time, nonce, signature, now, want) in rows {
            assert_eq!(precheck(*time, nonce, signature, *now), *want, "{name}");
        }
    }

    #[test]
    fn a_nonce_checked_takes_no_slot_and_a_seen_one_is_a_replay() {
        let mut n = Nonces::new(1);
        assert_eq!(n.check("a", 0), Ok(()));
        assert_eq!(n.check("a", 0), Ok(()));
        assert!(n.is_empty());
        assert_eq!(n.accept("a", 0), Ok(()));
        assert_eq!(n.check("a", 10), Err(Refused::Replayed));
        assert_eq!(n.check("b", 10), Err(Refused::Busy));
        assert_eq!(n.check("b", 60_001), Ok(()));
        assert!(n.is_empty());
    }

    #[test]
    fn nonces_and_secrets_are_fresh_hex() {
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b);
        assert!(well_formed_nonce(&a));
        assert_eq!(new_secret().len(), 64);
    }
}
