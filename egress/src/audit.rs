//! The egress audit: what the fence let through, next to what it refused, so a
//! consumer can see everything a command did on the network (`egress(key)`).
//!
//! An admitted request is recorded when it ends (its answer sent, cut off or failed),
//! with the bytes that crossed each way: the request body upstream, the answer body
//! back. A blind tunnel is one record (method `CONNECT`, status 200, the bytes spliced).
//! Credentials appear only as the names of the headers the proxy added.
//!
//! Records are rate-bounded per container, but a request that carried a credential (or
//! had one withheld) is always recorded, and what the bound left out is counted per
//! fence: when the fence closes, one summary row (`via` = [`VIA_SUMMARY`]) says how many
//! admitted requests have no row of their own (a flood must not hide what a fence let
//! through: docs/EGRESS.md, "The audit: what got out").

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::bounded;

// The records are the API's types (stockade-wire: serde only, pure), defined once:
// what the proxy records, the store keeps, a node sends its front and the API answers
// are the same value, never converted field by field.
pub use stockade_wire::{
    Admitted, CREDENTIALS_WITHHELD, Denial, EgressEvent as Event, VIA_SUMMARY,
};

/// Both records of a key in one timeline, oldest first; at the same millisecond a
/// denial comes before an admission (pure).
pub fn timeline(admitted: Vec<Admitted>, denied: Vec<Denial>) -> Vec<Event> {
    let mut out: Vec<Event> = denied
        .into_iter()
        .map(Event::Deny)
        .chain(admitted.into_iter().map(Event::Allow))
        .collect();
    // Stable: within each kind the store's order (by id) is kept.
    out.sort_by_key(|e| match e {
        Event::Deny(d) => (d.at_ms, false),
        Event::Allow(a) => (a.at_ms, true),
    });
    out
}

/// Denials logged and recorded per container: a burst, then a steady rate. Past it a
/// denial is still refused and counted (the exec's `denials`), not written: a command
/// looping on refused requests must not fill the host's disk with lines (red team: 120
/// MB/s of log). The next line written says how many were left out.
pub(crate) const DENIAL_BURST: f64 = 100.0;
pub(crate) const DENIALS_PER_SECOND: f64 = 20.0;

/// Allow lines logged per container (one per admitted request): as the audit's bound.
pub(crate) const ALLOW_LINE_BURST: f64 = 1000.0;
pub(crate) const ALLOW_LINES_PER_SECOND: f64 = 200.0;

/// Upstream-failure lines logged per container: as denials (red team: 34 MiB of them
/// in 4 s against a dead port).
pub(crate) const FAILURE_LINE_BURST: f64 = 100.0;
pub(crate) const FAILURE_LINES_PER_SECOND: f64 = 20.0;

/// Admitted requests recorded per container: a generous burst, then a steady rate
/// (the same reasoning as for denials; the line written after a gap says how many
/// records were left out).
pub(crate) const ADMITTED_BURST: f64 = 1000.0;
pub(crate) const ADMITTED_PER_SECOND: f64 = 200.0;

/// A token bucket for log lines and records.
pub(crate) struct Throttle {
    pub(crate) burst: f64,
    pub(crate) rate: f64,
    pub(crate) tokens: f64,
    pub(crate) at: std::time::Instant,
    pub(crate) suppressed: u64,
}

impl Throttle {
    pub(crate) fn new(burst: f64, rate: f64) -> Throttle {
        Throttle {
            burst,
            rate,
            tokens: burst,
            at: std::time::Instant::now(),
            suppressed: 0,
        }
    }

    /// May one more record be written? `Some(n)`: yes, and `n` were left out before it.
    pub(crate) fn take(&mut self, now: std::time::Instant) -> Option<u64> {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// Where denials and the audit of admitted requests go (the store, in production).
pub trait DenialSink: Send + Sync + 'static {
    /// Record one refused request for `key`'s container `container`.
    fn record(&self, key: &str, container: &str, denial: Denial);
    /// Record one admitted request, when it has ended.
    fn record_admitted(&self, _key: &str, _container: &str, _admitted: Admitted) {}
}

/// One token of `throttle`: `Some(n)` when a line or record may be written (`n` were
/// left out before it).
pub(crate) fn take(throttle: &Mutex<Throttle>) -> Option<u64> {
    throttle
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take(std::time::Instant::now())
}

/// One egress decision as its canonical line says it. Every decision the proxy makes
/// about a request (an allow, a deny, a request that is no proxy request at all) is
/// one of these, written by [`DecisionLine::emit`]: the one place the
/// `CANONICAL-EGRESS-DECISION` line is made, with one field set. A field a decision
/// does not have is left out of its line (a deny has no `rule`, an allow no `reason`).
/// What the client chose (host, method, path) is kept to [`bounded::MAX_FIELD`] bytes.
pub(crate) struct DecisionLine<'a> {
    /// `allow`, `deny` or `invalid`.
    pub(crate) decision: &'static str,
    /// The rule that admitted the request (allow).
    pub(crate) rule: Option<usize>,
    /// Why it was refused: the denial's reason, or why it is no proxy request.
    pub(crate) reason: Option<&'a str>,
    /// How an admitted request went: `http`, `https`, `tunnel`, `intercept` (the
    /// CONNECT of an intercepted tunnel) or `upstream-failed`.
    pub(crate) via: Option<&'static str>,
    /// The host decided on.
    pub(crate) host: Option<&'a str>,
    /// Its port.
    pub(crate) port: Option<u16>,
    /// The request's method (`CONNECT` for tunnels).
    pub(crate) method: &'a str,
    /// The path decided on (empty for a tunnel).
    pub(crate) path: Option<&'a str>,
    /// The fence open when it was decided, or `none`.
    pub(crate) fence: &'a str,
    /// A leaf was minted for this host (an intercepted CONNECT).
    pub(crate) minted: Option<bool>,
}

impl DecisionLine<'_> {
    /// Write the line for `key`'s container `container`; `suppressed`: how many lines
    /// of its kind the rate bound left out before it (`None`: the kind is not bounded).
    pub(crate) fn emit(&self, key: &str, container: &str, suppressed: Option<u64>) {
        tracing::info!(
            target: "stockade::egress",
            decision = self.decision,
            rule = self.rule,
            reason = self.reason,
            via = self.via,
            host = self.host.map(bounded::field),
            port = self.port,
            method = bounded::field(self.method),
            path = self.path.map(bounded::field),
            key = %key,
            container = %container,
            fence = self.fence,
            minted = self.minted,
            suppressed,
            "CANONICAL-EGRESS-DECISION"
        );
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(at_ms: u64, path: &str) -> Admitted {
        Admitted {
            at_ms,
            fence: "f".into(),
            method: "GET".into(),
            host: "h".into(),
            port: 443,
            path: path.into(),
            rule: 0,
            via: "https".into(),
            status: 200,
            bytes_up: 0,
            bytes_down: 1,
            error: String::new(),
            credentials: vec![],
            suppressed: 0,
        }
    }

    fn deny(at_ms: u64, path: &str) -> Denial {
        Denial {
            at_ms,
            host: "h".into(),
            method: "GET".into(),
            path: path.into(),
            rule_set: "f".into(),
            reason: "path".into(),
        }
    }

    #[test]
    fn the_timeline_interleaves_by_time_and_keeps_each_kinds_order() {
        let t = timeline(
            vec![allow(5, "/a1"), allow(5, "/a2"), allow(9, "/a3")],
            vec![deny(1, "/d1"), deny(5, "/d2"), deny(10, "/d3")],
        );
        let paths: Vec<&str> = t
            .iter()
            .map(|e| match e {
                Event::Allow(a) => a.path.as_str(),
                Event::Deny(d) => d.path.as_str(),
            })
            .collect();
        assert_eq!(paths, ["/d1", "/d2", "/a1", "/a2", "/a3", "/d3"]);
        let json = serde_json::to_value(&t[2]).unwrap();
        assert_eq!(json["decision"], "allow");
        assert_eq!(json["via"], "https");
        assert_eq!(serde_json::to_value(&t[0]).unwrap()["decision"], "deny");
    }

    /// A fence's summary row sits in the timeline where the fence closed, after what
    /// the fence admitted and denied, and says how many requests it stands for.
    #[test]
    fn a_fence_summary_shows_in_the_timeline_after_the_fences_records() {
        let t = timeline(
            vec![allow(5, "/a1"), Admitted::summary("f", 20, 4000)],
            vec![deny(7, "/d1"), deny(30, "/next-fence")],
        );
        let json: Vec<serde_json::Value> =
            t.iter().map(|e| serde_json::to_value(e).unwrap()).collect();
        assert_eq!(json[2]["decision"], "allow");
        assert_eq!(json[2]["via"], VIA_SUMMARY);
        assert_eq!(json[2]["suppressed"], 4000);
        assert_eq!(json[2]["fence"], "f");
        assert_eq!(json[3]["path"], "/next-fence");
        assert_eq!(json[0]["suppressed"], 0);
        assert!(!Admitted::summary("f", 1, 1).credentialed());
    }
}
