//! The record of one admitted request while it is in flight: its bytes counted both
//! ways, its status and error set as the exchange goes, written to the audit sink when
//! the last of its bodies is done (or counted in its fence's summary row when the rate
//! bound leaves it out, never when it carried a credential).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hyper::header::HeaderName;
use hyper::{Method, Uri};

use crate::audit::{Admitted, CREDENTIALS_WITHHELD, Throttle, take};
use crate::bounded;
use crate::fence::{CLOSED, Open};
use crate::shared::Shared;

/// The record of one admitted request, written when the last of its bodies is done.
pub(crate) struct Audit {
    pub(crate) shared: Arc<Shared>,
    /// The grant that admitted the request: it counts it, and the records the rate
    /// bound leaves out.
    pub(crate) open: Arc<Open>,
    pub(crate) record: Mutex<Draft>,
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    /// The request was denied after all (a private target): nothing to record.
    pub(crate) discard: std::sync::atomic::AtomicBool,
    /// The request body was all handed to the upstream connection.
    pub(crate) up_done: std::sync::atomic::AtomicBool,
    /// The upstream answered before the request body was all sent: the rest of it is
    /// not sent (an upstream done with the request would read it as a new one).
    pub(crate) cut_up: std::sync::atomic::AtomicBool,
}

/// What an admitted request's record will say, held without copies: the strings of an
/// [`Admitted`] row are made only when the row is written (made at once they were five
/// copies per request, most of them for rows the rate bound then left out).
pub(crate) struct Draft {
    pub(crate) at_ms: u64,
    pub(crate) method: Method,
    /// The host decided on (shared with the request's target).
    pub(crate) host: Arc<str>,
    pub(crate) port: u16,
    /// The request as the client sent it: its path is the record's (`None`: a tunnel).
    pub(crate) uri: Option<Uri>,
    pub(crate) rule: u32,
    /// `http`, `https` or `tunnel`.
    pub(crate) via: &'static str,
    pub(crate) status: u16,
    /// Empty, or why the upstream failed or the answer was cut off.
    pub(crate) error: &'static str,
    /// The credential headers added (their names only).
    pub(crate) credentials: Vec<HeaderName>,
}

impl Draft {
    /// Did the proxy add (or withhold) a credential? As [`Admitted::credentialed`].
    pub(crate) fn credentialed(&self) -> bool {
        !self.credentials.is_empty() || self.error == CREDENTIALS_WITHHELD
    }

    /// The row, for the fence `fence`, with the bytes that crossed.
    pub(crate) fn admitted(&self, fence: &str, bytes_up: u64, bytes_down: u64) -> Admitted {
        Admitted {
            at_ms: self.at_ms,
            fence: fence.to_owned(),
            method: bounded::owned(self.method.as_str()),
            host: bounded::owned(&self.host),
            port: self.port,
            path: self
                .uri
                .as_ref()
                .map_or_else(String::new, |u| bounded::owned(u.path())),
            rule: self.rule,
            via: self.via.to_owned(),
            status: self.status,
            bytes_up,
            bytes_down,
            error: self.error.to_owned(),
            credentials: self.credentials.iter().map(|n| n.to_string()).collect(),
            suppressed: 0,
        }
    }
}

impl Audit {
    pub(crate) fn new(shared: &Arc<Shared>, open: &Arc<Open>, record: Draft) -> Arc<Audit> {
        open.admitted.fetch_add(1, Ordering::SeqCst);
        Arc::new(Audit {
            shared: shared.clone(),
            open: open.clone(),
            record: Mutex::new(record),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            discard: std::sync::atomic::AtomicBool::new(false),
            up_done: std::sync::atomic::AtomicBool::new(false),
            cut_up: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Not an admitted request after all (its target was private): not recorded, not
    /// counted.
    pub(crate) fn discard(&self) {
        if !self.discard.swap(true, Ordering::SeqCst) {
            self.open.admitted.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn set(&self, status: u16, error: &'static str) {
        let mut r = self.record.lock().unwrap_or_else(|p| p.into_inner());
        if status != 0 {
            r.status = status;
        }
        if !error.is_empty() && r.error.is_empty() {
            r.error = error;
        }
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        if self.discard.load(Ordering::Relaxed) {
            return;
        }
        let draft = self.record.get_mut().unwrap_or_else(|p| p.into_inner());
        let fence = &self.shared.fence.0;
        let (write, left_out) = record_written(
            draft.credentialed(),
            &self.shared.admitted_throttle,
            &self.open.suppressed,
        );
        if left_out > 0 {
            tracing::warn!(target: "stockade::egress", key = %fence.key, container = %fence.container, suppressed = left_out, "egress audit records left out (rate)");
        }
        if write {
            let record = draft.admitted(
                &self.open.id,
                self.up.load(Ordering::Relaxed),
                self.down.load(Ordering::Relaxed),
            );
            self.shared
                .sink
                .record_admitted(&fence.key, &fence.container, record);
        }
    }
}

/// Is the record of an ended request written? A request that carried (or was refused) a
/// credential (`credentialed`) always is: a flood of others must not hide it. Another is
/// when the rate bound has a token (the second value: how many were left out before it);
/// otherwise it is counted in `suppressed` for its fence's summary row, unless the fence
/// already closed and wrote its summary (then it is written after all: at most what was
/// in flight when the fence closed).
pub(crate) fn record_written(
    credentialed: bool,
    throttle: &Mutex<Throttle>,
    suppressed: &AtomicU64,
) -> (bool, u64) {
    if credentialed {
        return (true, 0);
    }
    if let Some(left_out) = take(throttle) {
        return (true, left_out);
    }
    let closed = suppressed
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n != CLOSED).then(|| n + 1)
        })
        .is_err();
    (closed, 0)
}
