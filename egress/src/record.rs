//! The record of one admitted request while it is in flight: its bytes counted both
//! ways, its status and error set as the exchange goes, written to the audit sink when
//! the last of its bodies is done (or counted in its fence's summary row when the rate
//! bound leaves it out, never when it carried a credential).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::audit::{Admitted, Throttle, take};
use crate::fence::{CLOSED, Open};
use crate::shared::Shared;

/// The record of one admitted request, written when the last of its bodies is done.
pub(crate) struct Audit {
    pub(crate) shared: Arc<Shared>,
    /// The grant that admitted the request: it counts it, and the records the rate
    /// bound leaves out.
    pub(crate) open: Arc<Open>,
    pub(crate) record: Mutex<Admitted>,
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

impl Audit {
    pub(crate) fn new(shared: &Arc<Shared>, open: &Arc<Open>, record: Admitted) -> Arc<Audit> {
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

    pub(crate) fn set(&self, status: u16, error: &str) {
        let mut r = self.record.lock().unwrap_or_else(|p| p.into_inner());
        if status != 0 {
            r.status = status;
        }
        if !error.is_empty() && r.error.is_empty() {
            r.error = error.to_owned();
        }
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        if self.discard.load(Ordering::Relaxed) {
            return;
        }
        let mut record =
            std::mem::take(&mut *self.record.lock().unwrap_or_else(|p| p.into_inner()));
        record.bytes_up = self.up.load(Ordering::Relaxed);
        record.bytes_down = self.down.load(Ordering::Relaxed);
        let fence = &self.shared.fence.0;
        let (write, left_out) = record_written(
            &record,
            &self.shared.admitted_throttle,
            &self.open.suppressed,
        );
        if left_out > 0 {
            tracing::warn!(target: "stockade::egress", key = %fence.key, container = %fence.container, suppressed = left_out, "egress audit records left out (rate)");
        }
        if write {
            self.shared
                .sink
                .record_admitted(&fence.key, &fence.container, record);
        }
    }
}

/// Is the record of an ended request written? A request that carried (or was refused)
/// a credential always is: a flood of others must not hide it (issue 21). Another is
/// when the rate bound has a token (the second value: how many were left out before
/// it); otherwise it is counted in `suppressed` for its fence's summary row, unless the
/// fence already closed and wrote its summary (then it is written after all: at most
/// what was in flight when the fence closed).
pub(crate) fn record_written(
    record: &Admitted,
    throttle: &Mutex<Throttle>,
    suppressed: &AtomicU64,
) -> (bool, u64) {
    if record.credentialed() {
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
