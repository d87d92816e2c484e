//! Egress that can ask (docs/EGRESS.md): a request an `ask = true` grant refuses for want
//! of a rule (`Reason::askable`: `no-rule`, `method`, `path`) is held as a pending
//! decision the approver answers once, instead of denied at once.
//!
//! * **Bounded.** At most `per_container` pending per container and `total` in the
//!   server ([`room`], pure); past either the request is refused at once, `ask-full`.
//!   Each waits at most `timeout`, then it is refused `ask-timeout`.
//! * **Answered once.** [`Asks::answer`] takes the decision out of the table under its
//!   lock: a second answer (or one after the timeout or the fence's end) finds it
//!   decided ([`AnswerError::Decided`], the API's 409); an id never issued is
//!   [`AnswerError::Unknown`] (404). Ids are UUIDv4 (122 random bits from the OS CSPRNG):
//!   unguessable, and never a container's or a fence's id.
//! * **Dies with its fence.** Closing (or replacing) the fence drops every pending
//!   decision of it ([`Asks::drop_fence`]): each held request is answered 403 and can
//!   never be approved later (an approval the waiter sees after the close finds its
//!   grant gone and is `no-grant`).
//! * **Approved** widens only the fence that asked: the held request's
//!   `rules::widening` (its exact host and port, its method, its path as a prefix) is
//!   added to that open grant, which dies with it. The request is then decided again.
//!
//! Who may answer is the API's business (the approver token); this module only holds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::audit::now_ms;

/// The bounds on pending decisions (`[egress] ask_*` in `wasmtime.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskLimits {
    /// Pending decisions one container may hold at once.
    pub per_container: usize,
    /// Pending decisions the server holds at once.
    pub total: usize,
    /// How long a request is held before it is refused `ask-timeout`.
    pub timeout: Duration,
}

impl Default for AskLimits {
    fn default() -> Self {
        AskLimits {
            per_container: 8,
            total: 64,
            timeout: Duration::from_secs(120),
        }
    }
}

/// The most a configuration may set (a held request holds a client connection and a
/// task; the timeout holds the workload's `curl`).
pub const MAX_PER_CONTAINER: usize = 256;
/// See [`MAX_PER_CONTAINER`].
pub const MAX_TOTAL: usize = 4096;
/// See [`MAX_PER_CONTAINER`].
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

impl AskLimits {
    /// Check a configuration: every bound at least 1, `per_container <= total`, and
    /// none past the maxima.
    pub fn validate(&self) -> Result<(), String> {
        if self.per_container == 0 || self.per_container > MAX_PER_CONTAINER {
            return Err(format!(
                "egress.ask_pending_per_container must be 1..={MAX_PER_CONTAINER}"
            ));
        }
        if self.total == 0 || self.total > MAX_TOTAL {
            return Err(format!("egress.ask_pending_total must be 1..={MAX_TOTAL}"));
        }
        if self.per_container > self.total {
            return Err(
                "egress.ask_pending_per_container must not exceed egress.ask_pending_total".into(),
            );
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(format!(
                "egress.ask_timeout_s must be 1..={}",
                MAX_TIMEOUT.as_secs()
            ));
        }
        Ok(())
    }
}

/// Which bound a new pending decision would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The container's.
    Container,
    /// The server's.
    Server,
}

/// May one more decision be held, with `container` pending for this container and
/// `total` in all (pure)?
pub fn room(container: usize, total: usize, limits: &AskLimits) -> Result<(), Full> {
    if container >= limits.per_container {
        Err(Full::Container)
    } else if total >= limits.total {
        Err(Full::Server)
    } else {
        Ok(())
    }
}

/// A pending decision's `path`: the path as requested with its query (the approver
/// decides on what the workload asked for, and `?token=...` is part of that), bounded
/// as every client-chosen field ([`crate::bounded::MAX_FIELD`] bytes, cut on a
/// character boundary; pure). The rules and the widening never see the query.
pub fn requested_path(path: &str, query: Option<&str>) -> String {
    match query {
        Some(q) => {
            let mut s =
                String::with_capacity(crate::bounded::MAX_FIELD.min(path.len() + 1 + q.len()));
            s.push_str(crate::bounded::field(path));
            let room = crate::bounded::MAX_FIELD - s.len();
            if room > 0 {
                s.push('?');
                s.push_str(crate::bounded::cut(q, room - 1));
            }
            s
        }
        None => crate::bounded::owned(path),
    }
}

/// One pending decision, as the approver sees it: the API's type (stockade-wire), so
/// what the proxy holds, what a node sends its front and what the approver reads are
/// one definition.
pub use stockade_wire::PendingDecision as Pending;

/// The approver's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The request proceeds; the fence widens by its rule.
    Approve,
    /// The request is refused `refused-by-approver`.
    Refuse,
}

/// What became of a held request (for the waiter and the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The approver approved it.
    Approved,
    /// The approver refused it.
    Refused,
    /// Nobody answered in time.
    TimedOut,
    /// The fence closed while it was held.
    FenceClosed,
}

impl Outcome {
    /// The name in logs and in a 409's message.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Approved => "approved",
            Outcome::Refused => "refused",
            Outcome::TimedOut => "timed-out",
            Outcome::FenceClosed => "fence-closed",
        }
    }

    /// The outcome of that name (`as_str`'s inverse; a node's 409 read by its front).
    pub fn named(name: &str) -> Option<Outcome> {
        [
            Outcome::Approved,
            Outcome::Refused,
            Outcome::TimedOut,
            Outcome::FenceClosed,
        ]
        .into_iter()
        .find(|o| o.as_str() == name)
    }
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No decision of that id was ever held (or it is long gone).
    #[error("no pending egress decision {0}")]
    Unknown(String),
    /// It was already decided: answered, timed out, or its fence closed.
    #[error("egress decision {id} is already decided: {outcome}")]
    Decided {
        /// The decision.
        id: String,
        /// What it became.
        outcome: &'static str,
    },
    /// It is held for another key than the one answering (a node's keyed call:
    /// docs/NODE.md): nothing was answered.
    #[error("egress decision {0} is another key's")]
    Foreign(String),
}

struct Held {
    pending: Pending,
    container: String,
    tx: oneshot::Sender<Answer>,
}

/// How many decided ids are remembered, so a late answer is a 409 and not a 404.
const REMEMBERED: usize = 4096;

#[derive(Default)]
struct Table {
    held: HashMap<String, Held>,
    decided: HashMap<String, Outcome>,
    order: VecDeque<String>,
}

impl Table {
    fn remember(&mut self, id: String, outcome: Outcome) {
        if self.order.len() >= REMEMBERED
            && let Some(old) = self.order.pop_front()
        {
            self.decided.remove(&old);
        }
        self.order.push_back(id.clone());
        self.decided.insert(id, outcome);
    }
}

/// The server's pending decisions (one table for every container's proxy).
pub struct Asks {
    limits: AskLimits,
    table: Mutex<Table>,
}

impl std::fmt::Debug for Asks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Asks")
            .field("limits", &self.limits)
            .finish()
    }
}

/// A held request's wait (dropping it — the client went away — takes its decision out).
pub struct Waiting {
    asks: Arc<Asks>,
    id: String,
    rx: Option<oneshot::Receiver<Answer>>,
}

impl Asks {
    /// An empty table with these bounds.
    pub fn new(limits: AskLimits) -> Arc<Asks> {
        Arc::new(Asks {
            limits,
            table: Mutex::new(Table::default()),
        })
    }

    /// The bounds.
    pub fn limits(&self) -> AskLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hold `pending` (its `id`, `at_ms` and `expires_ms` are set here) for
    /// `container`, or say which bound is full. The decision stays held while the
    /// [`Waiting`] lives (the proxy's request waits on it).
    pub fn hold(
        self: &Arc<Self>,
        container: &str,
        mut pending: Pending,
    ) -> Result<(Pending, Waiting), Full> {
        let mut t = self.lock();
        let mine = t.held.values().filter(|h| h.container == container).count();
        room(mine, t.held.len(), &self.limits)?;
        pending.id = uuid::Uuid::new_v4().to_string();
        pending.at_ms = now_ms();
        pending.expires_ms = pending.at_ms + self.limits.timeout.as_millis() as u64;
        let (tx, rx) = oneshot::channel();
        t.held.insert(
            pending.id.clone(),
            Held {
                pending: pending.clone(),
                container: container.to_owned(),
                tx,
            },
        );
        let waiting = Waiting {
            asks: self.clone(),
            id: pending.id.clone(),
            rx: Some(rx),
        };
        Ok((pending, waiting))
    }

    /// The pending decisions, oldest first; of one key when `key` is given.
    pub fn pending(&self, key: Option<&str>) -> Vec<Pending> {
        let t = self.lock();
        let mut out: Vec<Pending> = t
            .held
            .values()
            .filter(|h| key.is_none_or(|k| h.pending.key == k))
            .map(|h| h.pending.clone())
            .collect();
        out.sort_by(|a, b| a.at_ms.cmp(&b.at_ms).then_with(|| a.id.cmp(&b.id)));
        out
    }

    /// One pending decision.
    pub fn get(&self, id: &str) -> Option<Pending> {
        self.lock().held.get(id).map(|h| h.pending.clone())
    }

    /// Answer decision `id`, once.
    pub fn answer(&self, id: &str, answer: Answer) -> Result<Pending, AnswerError> {
        self.answer_of(id, None, answer)
    }

    /// Answer decision `id`, once, if it is key `of`'s (`None`: whoever's): another
    /// key's is [`AnswerError::Foreign`] and stays held, checked under the same lock
    /// as the answer.
    pub fn answer_of(
        &self,
        id: &str,
        of: Option<&str>,
        answer: Answer,
    ) -> Result<Pending, AnswerError> {
        let mut t = self.lock();
        if let (Some(k), Some(held)) = (of, t.held.get(id))
            && held.pending.key != k
        {
            return Err(AnswerError::Foreign(id.to_owned()));
        }
        let Some(held) = t.held.remove(id) else {
            return Err(match t.decided.get(id) {
                Some(o) => AnswerError::Decided {
                    id: id.to_owned(),
                    outcome: o.as_str(),
                },
                None => AnswerError::Unknown(id.to_owned()),
            });
        };
        let outcome = match answer {
            Answer::Approve => Outcome::Approved,
            Answer::Refuse => Outcome::Refused,
        };
        t.remember(id.to_owned(), outcome);
        // The waiter may be gone (its client left): the answer is still taken.
        let _ = held.tx.send(answer);
        Ok(held.pending)
    }

    /// The fence `fence` closed: every decision it holds is decided `fence-closed`
    /// now (its waiter answers 403); none can be approved any more.
    pub fn drop_fence(&self, fence: &str) -> usize {
        let mut t = self.lock();
        let ids: Vec<String> = t
            .held
            .iter()
            .filter(|(_, h)| h.pending.fence == fence)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            // Dropping the sender wakes the waiter with "closed".
            t.held.remove(id);
            t.remember(id.clone(), Outcome::FenceClosed);
        }
        ids.len()
    }

    /// Decision `id` ended without an answer (`outcome`); `None` if it was answered
    /// first (the answer wins: it is in the channel).
    fn end(&self, id: &str, outcome: Outcome) -> Option<Outcome> {
        let mut t = self.lock();
        if t.held.remove(id).is_some() {
            t.remember(id.to_owned(), outcome);
            return Some(outcome);
        }
        if t.decided.get(id) == Some(&Outcome::FenceClosed) {
            return Some(Outcome::FenceClosed);
        }
        None
    }
}

impl Waiting {
    /// Wait for the answer, the timeout or the fence's end, whichever comes first.
    pub(crate) async fn wait(mut self, revoked: &CancellationToken) -> Outcome {
        let outcome = self.wait_inner(revoked).await;
        self.rx = None;
        outcome
    }

    async fn wait_inner(&mut self, revoked: &CancellationToken) -> Outcome {
        let timeout = self.asks.limits.timeout;
        let Some(rx) = self.rx.as_mut() else {
            return Outcome::FenceClosed;
        };
        let ended = tokio::select! {
            answer = &mut *rx => match answer {
                Ok(Answer::Approve) => return Outcome::Approved,
                Ok(Answer::Refuse) => return Outcome::Refused,
                // The sender was dropped: the fence closed.
                Err(_) => return Outcome::FenceClosed,
            },
            () = tokio::time::sleep(timeout) => Outcome::TimedOut,
            () = revoked.cancelled() => Outcome::FenceClosed,
        };
        match self.asks.end(&self.id, ended) {
            Some(o) => o,
            // Answered in the same instant: the answer is in the channel.
            None => match rx.try_recv() {
                Ok(Answer::Approve) => Outcome::Approved,
                Ok(Answer::Refuse) => Outcome::Refused,
                Err(_) => ended,
            },
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        // Dropped while still waiting (the client went away, the connection was cut):
        // the decision leaves the table, so nobody answers a request that is gone.
        if self.rx.is_some() {
            self.asks.end(&self.id, Outcome::FenceClosed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_path_keeps_its_query_within_the_bound() {
        use crate::bounded::MAX_FIELD;
        let long = "q".repeat(2 * MAX_FIELD);
        let long_path = format!("/{}", "p".repeat(2 * MAX_FIELD));
        let rows: &[(&str, &str, Option<&str>, String)] = &[
            ("no query", "/a/b", None, "/a/b".into()),
            (
                "a query is kept",
                "/a/b",
                Some("q=1&r=2"),
                "/a/b?q=1&r=2".into(),
            ),
            ("an empty query keeps its ?", "/a", Some(""), "/a?".into()),
            (
                "a long query is cut at the bound",
                "/a",
                Some(&long),
                format!("/a?{}", &long[..MAX_FIELD - 3]),
            ),
            (
                "a path at the bound leaves no room for the query",
                &long_path,
                Some("q=1"),
                long_path[..MAX_FIELD].to_owned(),
            ),
            (
                "cut on a character boundary",
                "/a",
                Some(&"é".repeat(MAX_FIELD)),
                format!("/a?{}", "é".repeat((MAX_FIELD - 3) / 2)),
            ),
        ];
        for (name, path, query, want) in rows {
            let got = requested_path(path, *query);
            assert_eq!(&got, want, "{name}");
            assert!(got.len() <= MAX_FIELD, "{name}");
        }
    }

    fn limits(per_container: usize, total: usize) -> AskLimits {
        AskLimits {
            per_container,
            total,
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn room_is_bounded_per_container_then_in_all() {
        /// (row, pending in the container, pending in all, bounds, answer)
        type Row = (&'static str, usize, usize, AskLimits, Result<(), Full>);
        let rows: &[Row] = &[
            ("empty", 0, 0, limits(2, 4), Ok(())),
            (
                "one below the container's bound",
                1,
                3,
                limits(2, 4),
                Ok(()),
            ),
            (
                "at the container's bound",
                2,
                2,
                limits(2, 4),
                Err(Full::Container),
            ),
            (
                "at the server's bound",
                1,
                4,
                limits(2, 4),
                Err(Full::Server),
            ),
            (
                "both: the container's is named",
                2,
                4,
                limits(2, 4),
                Err(Full::Container),
            ),
        ];
        for (name, mine, total, l, want) in rows {
            assert_eq!(room(*mine, *total, l), *want, "{name}");
        }
    }

    #[test]
    fn a_configuration_out_of_bounds_is_refused() {
        let ok = AskLimits::default();
        assert_eq!(ok.validate(), Ok(()));
        let rows: &[(&str, AskLimits)] = &[
            (
                "no room per container",
                AskLimits {
                    per_container: 0,
                    ..ok
                },
            ),
            ("no room in all", AskLimits { total: 0, ..ok }),
            (
                "per container above total",
                AskLimits {
                    per_container: 9,
                    total: 8,
                    ..ok
                },
            ),
            (
                "no time",
                AskLimits {
                    timeout: Duration::ZERO,
                    ..ok
                },
            ),
            (
                "past the maximum time",
                AskLimits {
                    timeout: MAX_TIMEOUT + Duration::from_secs(1),
                    ..ok
                },
            ),
            (
                "past the maximum total",
                AskLimits {
                    total: MAX_TOTAL + 1,
                    ..ok
                },
            ),
        ];
        for (name, l) in rows {
            assert!(l.validate().is_err(), "{name}");
        }
    }

    fn pending(key: &str, fence: &str) -> Pending {
        Pending {
            id: String::new(),
            key: key.into(),
            fence: fence.into(),
            method: "GET".into(),
            host: "example.com".into(),
            port: 80,
            path: "/x".into(),
            reason: "no-rule".into(),
            at_ms: 0,
            expires_ms: 0,
            widens: "GET example.com:80/x".into(),
        }
    }

    #[tokio::test]
    async fn an_answer_is_taken_once_and_a_late_one_is_decided() {
        let asks = Asks::new(limits(2, 4));
        let (p, w) = asks.hold("c1", pending("k", "f1")).expect("room");
        assert_eq!(p.id.len(), 36);
        assert_eq!(asks.pending(Some("k")).len(), 1);
        assert!(asks.pending(Some("other")).is_empty());
        assert_eq!(
            asks.answer(&p.id, Answer::Approve).map(|p| p.key),
            Ok("k".into())
        );
        assert_eq!(w.wait(&CancellationToken::new()).await, Outcome::Approved);
        assert!(matches!(
            asks.answer(&p.id, Answer::Refuse),
            Err(AnswerError::Decided {
                outcome: "approved",
                ..
            })
        ));
        assert!(matches!(
            asks.answer("00000000-0000-4000-8000-000000000000", Answer::Approve),
            Err(AnswerError::Unknown(_))
        ));
        assert!(asks.pending(None).is_empty());
    }

    #[tokio::test]
    async fn an_answer_of_a_key_never_takes_another_keys_decision() {
        let asks = Asks::new(limits(2, 4));
        let (p, w) = asks.hold("c1", pending("k", "f1")).expect("room");
        assert_eq!(
            asks.answer_of(&p.id, Some("other"), Answer::Approve),
            Err(AnswerError::Foreign(p.id.clone()))
        );
        assert_eq!(asks.pending(Some("k")).len(), 1, "still held");
        assert_eq!(
            asks.answer_of(&p.id, Some("k"), Answer::Refuse)
                .map(|p| p.key),
            Ok("k".into())
        );
        assert_eq!(w.wait(&CancellationToken::new()).await, Outcome::Refused);
        // Every outcome's name reads back as itself (a node's answer, on its front).
        for o in [
            Outcome::Approved,
            Outcome::Refused,
            Outcome::TimedOut,
            Outcome::FenceClosed,
        ] {
            assert_eq!(Outcome::named(o.as_str()), Some(o));
        }
        assert_eq!(Outcome::named("maybe"), None);
    }

    #[tokio::test]
    async fn the_bound_refuses_at_once_and_frees_when_decided() {
        let asks = Asks::new(limits(1, 2));
        let (a, _wa) = asks.hold("c1", pending("k", "f1")).expect("room");
        assert_eq!(
            asks.hold("c1", pending("k", "f1")).err(),
            Some(Full::Container)
        );
        let (_b, _wb) = asks.hold("c2", pending("k2", "f2")).expect("room");
        assert_eq!(
            asks.hold("c3", pending("k3", "f3")).err(),
            Some(Full::Server)
        );
        asks.answer(&a.id, Answer::Refuse).expect("pending");
        assert!(asks.hold("c1", pending("k", "f1")).is_ok());
    }

    #[tokio::test]
    async fn a_closed_fence_drops_its_decisions_and_none_is_approved_later() {
        let asks = Asks::new(limits(4, 4));
        let (p, w) = asks.hold("c1", pending("k", "f1")).expect("room");
        let (q, _wq) = asks.hold("c2", pending("k2", "f2")).expect("room");
        assert_eq!(asks.drop_fence("f1"), 1);
        assert!(matches!(
            asks.answer(&p.id, Answer::Approve),
            Err(AnswerError::Decided {
                outcome: "fence-closed",
                ..
            })
        ));
        assert_eq!(
            w.wait(&CancellationToken::new()).await,
            Outcome::FenceClosed
        );
        assert_eq!(
            asks.pending(None)
                .into_iter()
                .map(|p| p.id)
                .collect::<Vec<_>>(),
            vec![q.id]
        );
    }

    #[tokio::test]
    async fn a_decision_nobody_answers_times_out_and_a_dropped_wait_leaves_the_table() {
        let asks = Asks::new(AskLimits {
            timeout: Duration::from_millis(50),
            ..limits(4, 4)
        });
        let (p, w) = asks.hold("c1", pending("k", "f1")).expect("room");
        assert_eq!(w.wait(&CancellationToken::new()).await, Outcome::TimedOut);
        assert!(matches!(
            asks.answer(&p.id, Answer::Approve),
            Err(AnswerError::Decided {
                outcome: "timed-out",
                ..
            })
        ));
        let (_q, wq) = asks.hold("c1", pending("k", "f1")).expect("room");
        drop(wq);
        assert!(asks.pending(None).is_empty());
        let revoked = CancellationToken::new();
        let (_r, wr) = asks.hold("c1", pending("k", "f1")).expect("room");
        revoked.cancel();
        assert_eq!(wr.wait(&revoked).await, Outcome::FenceClosed);
    }
}
