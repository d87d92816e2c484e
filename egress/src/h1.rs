//! An HTTP/1 client connection (the proxy's own, or the decrypted inside of an
//! intercepted tunnel): every request on it decided on its own, the kept upstream
//! connection driven by the same task.

use crate::body::{BoxError, ProxyBody};
use crate::conn::Conn;
use crate::upstream::Driver;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Most bytes of a request head the proxy buffers (hyper's minimum is 8 KiB).
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a client may take to send a request head: from the connection's start, or
/// from the end of its last answer (so a keep-alive connection idle that long ends too);
/// never while a request is in flight, however long its answer takes.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve HTTP/1 on `io` for `conn` until the client closes, `stop` fires, or the
/// client takes longer than the head timeout (`Shared::head_timeout`) to send a
/// request head: the proxy's own connections, and the decrypted inside of an
/// intercepted tunnel.
pub(crate) async fn serve_http<I>(io: I, conn: Arc<Conn>, stop: impl Future<Output = ()>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    // The head timeout is kept here, not by hyper's `header_read_timeout`: hyper arms
    // a new timer for every request head, and registering it woke the runtime's I/O
    // driver (a write to its eventfd, an extra epoll event) once per request.
    // One timer per connection, re-armed only when it fires, bounds the same thing.
    let idle = Arc::new(Idle::new());
    let head_timeout = conn.shared.head_timeout;
    let service_conn = conn.clone();
    let service_idle = idle.clone();
    let service = hyper::service::service_fn(move |req| {
        let conn = service_conn.clone();
        let busy = Busy::new(&service_idle);
        async move {
            let resp = conn.handle(req).await;
            Ok::<_, Infallible>(resp.map(|body| Answer { body, _busy: busy }))
        }
    });
    let mut http = std::pin::pin!(
        hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(io, service)
            .with_upgrades()
    );
    // The kept upstream connection is driven by this same task, not a task of its
    // own: a request and its answer then cross no task boundary inside the proxy.
    let mut driver: Option<Driver> = None;
    let rewake = Arc::new(Rewake::default());
    let http_waker = Waker::from(Arc::new(Half {
        rewake: rewake.clone(),
        half: HTTP,
    }));
    let driver_waker = Waker::from(Arc::new(Half {
        rewake: rewake.clone(),
        half: DRIVER,
    }));
    let both = std::future::poll_fn(|cx| {
        // The driver is polled when it was woken, and at once when it is new (its first
        // poll writes the request it was made for).
        let poll_driver = |driver: &mut Option<Driver>| {
            let next = conn
                .new_driver
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let fresh = next.is_some();
            if let Some(next) = next {
                // Replacing the driver drops (closes) the previous upstream connection:
                // its sender was replaced with it, and its last answer is complete.
                *driver = Some(next);
            }
            if !(fresh || rewake.take(DRIVER)) {
                return;
            }
            let mut cx = Context::from_waker(&driver_waker);
            if let Some(d) = driver
                && d.as_mut().poll(&mut cx).is_ready()
            {
                *driver = None;
            }
        };
        // An answer passes driver → handler → driver (the body) → handler → client, each
        // step a wake of this same task. Caught by `Rewake`, such a wake is one more
        // round here; reaching the runtime, it is a yield that wakes another worker
        // thread (a futex wake and a context switch per step). A round polls only the
        // halves that were woken: a hyper connection polled for nothing still walks its
        // read, write and flush states (the proxy's profile: docs/BENCHMARKS.md).
        rewake.set_task(cx.waker());
        for _ in 0..MAX_ROUNDS {
            rewake.begin();
            poll_driver(&mut driver);
            if rewake.take(HTTP)
                && http
                    .as_mut()
                    .poll(&mut Context::from_waker(&http_waker))
                    .is_ready()
            {
                rewake.end();
                return Poll::Ready(());
            }
            poll_driver(&mut driver);
            if !rewake.end() {
                return Poll::Pending;
            }
        }
        // Still woken after as many rounds: give the runtime's other tasks their turn
        // (what was woken stays marked for the next poll).
        cx.waker().wake_by_ref();
        Poll::Pending
    });
    tokio::select! {
        biased;
        _ = both => {}
        _ = stop => {}
        _ = idle.expired(head_timeout) => {}
    }
}

/// A connection's requests in flight and when it last became idle, for the head
/// timeout.
struct Idle {
    /// Requests read whose answers have not ended.
    busy: AtomicUsize,
    /// When the connection began, or its last answer ended.
    since: Mutex<Instant>,
}

impl Idle {
    fn new() -> Idle {
        Idle {
            busy: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        }
    }

    /// Ends once the connection has been idle (no request in flight) for `timeout`:
    /// a head not sent within it. The timer is re-armed only when it fires.
    async fn expired(&self, timeout: Duration) {
        let mut at = Instant::now() + timeout;
        loop {
            tokio::time::sleep_until(at.into()).await;
            let now = Instant::now();
            if self.busy.load(Ordering::SeqCst) > 0 {
                at = now + timeout;
                continue;
            }
            let until = *self.since.lock().unwrap_or_else(|p| p.into_inner()) + timeout;
            if until <= now {
                return;
            }
            at = until;
        }
    }
}

/// One request in flight, from its head to the end of its answer's body.
struct Busy(Arc<Idle>);

impl Busy {
    fn new(idle: &Arc<Idle>) -> Busy {
        idle.busy.fetch_add(1, Ordering::SeqCst);
        Busy(idle.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        // `since` first: a check that sees no request in flight sees this end.
        *self.0.since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An answer's body, holding its request's place among those in flight until hyper
/// is done with it.
struct Answer {
    body: ProxyBody,
    _busy: Busy,
}

impl hyper::body::Body for Answer {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, BoxError>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Most rounds one poll of a connection's task makes before it yields to the runtime.
const MAX_ROUNDS: usize = 32;

/// The client's HTTP/1 server, one of a connection's two halves.
const HTTP: u8 = 1;
/// The kept upstream connection's driver, the other half.
const DRIVER: u8 = 2;

/// The wakers a connection's two halves (the client's HTTP/1 server and the kept
/// upstream connection's driver) are polled with share one of these. A wake while the
/// task itself is polling them (one half waking the other) is only noted, and the poll
/// makes one more round; any other wake (the reactor, a timer, a revocation) goes to the
/// task's own waker. Either way the woken half is marked, and a round polls only the
/// marked halves. One atomic state, so no wake is lost between the two: a wake that
/// finds the task polling is seen by [`Rewake::end`], one that finds it idle is
/// forwarded; a half's mark is set before either.
struct Rewake {
    state: AtomicU8,
    /// The halves woken and not polled since ([`HTTP`], [`DRIVER`]).
    woken: AtomicU8,
    task: Mutex<Option<Waker>>,
}

impl Default for Rewake {
    /// Both halves marked: the first poll polls both.
    fn default() -> Self {
        Rewake {
            state: AtomicU8::new(IDLE),
            woken: AtomicU8::new(HTTP | DRIVER),
            task: Mutex::new(None),
        }
    }
}

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

impl Rewake {
    /// The task's own waker, for wakes that come from outside its poll.
    fn set_task(&self, waker: &Waker) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if !task.as_ref().is_some_and(|t| t.will_wake(waker)) {
            *task = Some(waker.clone());
        }
    }

    /// A round of polling begins.
    fn begin(&self) {
        self.state.store(POLLING, Ordering::SeqCst);
    }

    /// The round ended: was the task woken during it (poll again)?
    fn end(&self) -> bool {
        self.state.swap(IDLE, Ordering::SeqCst) == WOKEN
    }

    /// Was `half` woken since it was last polled? Clears its mark: the caller polls it.
    fn take(&self, half: u8) -> bool {
        self.woken.fetch_and(!half, Ordering::SeqCst) & half != 0
    }

    /// `half` was woken: mark it, then another round, or the task woken.
    fn wake(&self, half: u8) {
        self.woken.fetch_or(half, Ordering::SeqCst);
        match self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::SeqCst, Ordering::SeqCst)
        {
            // Seen by `end`: the running poll makes another round.
            Ok(_) | Err(WOKEN) => {}
            // Idle: the task must be woken.
            Err(_) => {
                let task = self.task.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(t) = task.as_ref() {
                    t.wake_by_ref();
                }
            }
        }
    }
}

/// The waker of one half of a connection.
struct Half {
    rewake: Arc<Rewake>,
    half: u8,
}

impl Wake for Half {
    fn wake(self: Arc<Self>) {
        self.rewake.wake(self.half);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.rewake.wake(self.half);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A wake during a round is kept for the next round and never reaches the task; a
    /// wake between polls reaches it (none is lost, none is doubled). Either way only the
    /// half that was woken is marked to be polled.
    #[test]
    fn a_wake_inside_a_round_is_a_round_one_outside_wakes_the_task() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        let rewake = Arc::new(Rewake::default());
        let half = |half| {
            Waker::from(Arc::new(Half {
                rewake: rewake.clone(),
                half,
            }))
        };
        let (http, driver) = (half(HTTP), half(DRIVER));
        rewake.set_task(&task);
        assert!(
            rewake.take(HTTP) && rewake.take(DRIVER),
            "the first poll polls both halves"
        );

        rewake.begin();
        driver.wake_by_ref();
        driver.wake_by_ref();
        assert!(rewake.end(), "woken during the round: another round");
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "the task was not woken");
        assert!(!rewake.take(HTTP), "the client's half was not woken");
        assert!(rewake.take(DRIVER), "the driver was");
        assert!(!rewake.take(DRIVER), "once");

        rewake.begin();
        assert!(!rewake.end(), "not woken: the poll ends");
        http.wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "idle: the task is woken");
        http.wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(rewake.take(HTTP) && !rewake.take(DRIVER));
    }
}
