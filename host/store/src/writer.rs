//! The audit's batching writer (docs/BENCHMARKS.md, "The audit"): the egress proxy's
//! denials and admitted requests are written off the request path. The proxy's sink only
//! enqueues a row; one thread per store writes what has queued up in one transaction (with
//! the per-key retention trims once per key and batch, not once per row).
//!
//! What it guarantees:
//! * Reads see every row enqueued before them: rows leave the queue only while the
//!   connection's lock is held, and a read of the audit (`denials`, `admitted`) first
//!   writes what is queued under that same lock (read-through). A consumer that runs a
//!   command and then reads its audit sees the command's rows.
//! * Nothing is lost at shutdown: `Store::flush` (serve's shutdown path, after every
//!   container and its proxy stopped) writes the queue, and dropping the store stops
//!   the thread after it wrote the rest.
//! * The queue is bounded ([`CAPACITY`] rows). When it is full ([`admit`]): a row that
//!   must be kept (a denial, a request that carried or was refused a credential, a
//!   fence's summary row: egress/src/audit.rs's rules) is written by its caller, with
//!   everything queued before it, in one transaction (the cost the request path paid
//!   for every row before this writer, bounded by SQLite's busy timeout); an ordinary
//!   admitted row is dropped and counted, and the writer's next batch adds one summary
//!   row per fence (`via` = `summary`, `error` = [`QUEUE_FULL`], `suppressed` = the
//!   count) that `egress(key)` shows. The request path never waits on the writer.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::Connection;

use stockade_egress::audit::Denial;
use stockade_egress::audit::{Admitted, VIA_SUMMARY};

/// Most rows queued before [`admit`] stops queueing.
pub(crate) const CAPACITY: usize = 4096;

/// The `error` of the summary row counting ordinary rows dropped on a full queue.
pub const QUEUE_FULL: &str = "audit-queue-full";

/// One queued audit row.
pub(crate) enum Row {
    /// A refused request.
    Denial {
        key: String,
        container: String,
        denial: Denial,
    },
    /// An admitted request (or a fence's summary row).
    Admitted {
        key: String,
        container: String,
        admitted: Admitted,
    },
}

impl Row {
    /// Is this row never dropped (a denial, a credentialed request, a summary row)?
    fn must_keep(&self) -> bool {
        match self {
            Row::Denial { .. } => true,
            Row::Admitted { admitted, .. } => {
                admitted.credentialed() || admitted.via == VIA_SUMMARY
            }
        }
    }

    fn key(&self) -> &str {
        match self {
            Row::Denial { key, .. } | Row::Admitted { key, .. } => key,
        }
    }
}

/// What happens to a row offered to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Queued for the writer thread.
    Enqueue,
    /// The queue is full and the row must be kept: its caller writes it (and the queue).
    Inline,
    /// The queue is full and the row is ordinary: dropped, counted in a summary row.
    Drop,
}

/// Where a row goes when `queued` rows wait and `capacity` fit (pure).
pub(crate) fn admit(queued: usize, capacity: usize, must_keep: bool) -> Admit {
    if queued < capacity {
        Admit::Enqueue
    } else if must_keep {
        Admit::Inline
    } else {
        Admit::Drop
    }
}

/// (key, container, fence) of dropped rows.
type DroppedKey = (String, String, String);

#[derive(Default)]
struct Queue {
    rows: Vec<Row>,
    dropped: BTreeMap<DroppedKey, u64>,
    stop: bool,
    /// Tests hold the writer thread off to fill the queue.
    held: bool,
}

/// The connection and the queue, shared by the store and its writer thread. Lock
/// order: `conn` before `queue`.
pub(crate) struct Shared {
    pub(crate) conn: Mutex<Connection>,
    queue: Mutex<Queue>,
    wake: Condvar,
    capacity: usize,
}

impl Shared {
    pub(crate) fn new(conn: Connection, capacity: usize) -> Arc<Shared> {
        Arc::new(Shared {
            conn: Mutex::new(conn),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            capacity,
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Offer a row (the proxy's request path: never waits on the writer thread).
    pub(crate) fn enqueue(&self, row: Row) {
        let mut q = self.queue();
        match admit(q.rows.len(), self.capacity, row.must_keep()) {
            Admit::Enqueue => {
                q.rows.push(row);
                if q.rows.len() == 1 {
                    self.wake.notify_one();
                }
            }
            Admit::Drop => {
                let Row::Admitted {
                    key,
                    container,
                    admitted,
                } = row
                else {
                    return;
                };
                tracing::warn!(target: "stockade::egress", key, container, fence = admitted.fence, "egress audit queue full: ordinary record counted, not written");
                *q.dropped
                    .entry((key, container, admitted.fence))
                    .or_default() += 1;
            }
            Admit::Inline => {
                drop(q);
                let conn = self.conn();
                let key = row.key().to_owned();
                let r = self.drain_with(&conn, Some(row));
                if let Err(e) = r {
                    tracing::warn!(target: "stockade::egress", error = %e, key, "egress audit rows not stored");
                }
            }
        }
    }

    /// Write every queued row (the caller holds `conn`, taken from [`Shared::conn`]).
    pub(crate) fn drain(&self, conn: &Connection) -> rusqlite::Result<usize> {
        self.drain_with(conn, None)
    }

    fn drain_with(&self, conn: &Connection, extra: Option<Row>) -> rusqlite::Result<usize> {
        let (mut rows, dropped) = {
            let mut q = self.queue();
            (std::mem::take(&mut q.rows), std::mem::take(&mut q.dropped))
        };
        rows.extend(extra);
        rows.extend(summaries(dropped));
        if rows.is_empty() {
            return Ok(0);
        }
        let n = rows.len();
        write_batch(conn, &rows)?;
        Ok(n)
    }

    /// The writer thread: waits for rows, writes each batch in one transaction, and
    /// writes the rest when told to stop.
    pub(crate) fn run(self: Arc<Self>) {
        loop {
            {
                let mut q = self.queue();
                while ((q.rows.is_empty() && q.dropped.is_empty()) || q.held) && !q.stop {
                    q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            }
            let conn = self.conn();
            let stop = self.queue().stop;
            match self.drain(&conn) {
                Ok(n) if n > 0 => {
                    tracing::trace!(target: "stockade::store", rows = n, "egress audit batch written")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(target: "stockade::store", error = %e, "egress audit batch not stored")
                }
            }
            if stop {
                return;
            }
        }
    }

    /// Tell the writer thread to write what is queued and end.
    pub(crate) fn stop(&self) {
        self.queue().stop = true;
        self.wake.notify_all();
    }

    /// Hold the writer thread off (tests fill the queue with it held).
    #[cfg(test)]
    pub(crate) fn hold(&self, held: bool) {
        self.queue().held = held;
        self.wake.notify_all();
    }

    /// Rows waiting.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue().rows.len()
    }
}

/// One summary row per fence whose ordinary rows were dropped on a full queue.
fn summaries(dropped: BTreeMap<DroppedKey, u64>) -> impl Iterator<Item = Row> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    dropped
        .into_iter()
        .map(move |((key, container, fence), n)| {
            let mut admitted = Admitted::summary(&fence, now, n);
            admitted.error = QUEUE_FULL.to_owned();
            Row::Admitted {
                key,
                container,
                admitted,
            }
        })
}

/// Insert `rows` in one transaction, then trim each key they touched once.
pub(crate) fn write_batch(conn: &Connection, rows: &[Row]) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    let mut denied = std::collections::BTreeSet::new();
    let mut admitted = std::collections::BTreeSet::new();
    for row in rows {
        match row {
            Row::Denial {
                key,
                container,
                denial,
            } => {
                crate::rows::insert_denial(&tx, key, container, denial)?;
                denied.insert(key.as_str());
            }
            Row::Admitted {
                key,
                container,
                admitted: a,
            } => {
                crate::rows::insert_admitted(&tx, key, container, a)?;
                admitted.insert(key.as_str());
            }
        }
    }
    for key in denied {
        crate::rows::trim_denials(&tx, key)?;
    }
    for key in admitted {
        crate::rows::trim_admitted(&tx, key)?;
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_queued_until_the_queue_is_full_then_kept_inline_or_dropped() {
        let cases = [
            ("room, ordinary", 0, 4, false, Admit::Enqueue),
            ("room, must keep", 3, 4, true, Admit::Enqueue),
            ("last slot", 3, 4, false, Admit::Enqueue),
            ("full, must keep", 4, 4, true, Admit::Inline),
            ("full, ordinary", 4, 4, false, Admit::Drop),
            ("over, ordinary", 9, 4, false, Admit::Drop),
            ("no capacity, must keep", 0, 0, true, Admit::Inline),
        ];
        for (name, queued, capacity, keep, want) in cases {
            assert_eq!(admit(queued, capacity, keep), want, "{name}");
        }
    }

    #[test]
    fn denials_credentials_and_summaries_are_never_dropped() {
        let admitted = |a: Admitted| Row::Admitted {
            key: "k".into(),
            container: "c".into(),
            admitted: a,
        };
        let denial = Row::Denial {
            key: "k".into(),
            container: "c".into(),
            denial: Denial {
                at_ms: 0,
                host: "h".into(),
                method: "GET".into(),
                path: "/".into(),
                rule_set: "none".into(),
                reason: "no-grant".into(),
            },
        };
        let with = Admitted {
            credentials: vec!["authorization".into()],
            ..Admitted::default()
        };
        let withheld = Admitted {
            error: stockade_egress::audit::CREDENTIALS_WITHHELD.into(),
            ..Admitted::default()
        };
        let cases = [
            ("denial", denial, true),
            ("credential added", admitted(with), true),
            ("credential withheld", admitted(withheld), true),
            ("summary", admitted(Admitted::summary("f", 0, 3)), true),
            ("ordinary", admitted(Admitted::default()), false),
        ];
        for (name, row, keep) in cases {
            assert_eq!(row.must_keep(), keep, "{name}");
        }
    }
}
