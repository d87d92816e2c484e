//! An HTTP/1 client connection (the proxy's own, or the decrypted inside of an
//! intercepted tunnel): every request on it decided on its own, the kept upstream
//! connection driven by the same task.

use crate::conn::Conn;
use crate::upstream::Driver;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// Most bytes of a request head the proxy buffers (hyper's minimum is 8 KiB).
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a client may take to send a request head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve HTTP/1 on `io` for `conn` until the client closes or `stop` fires: the
/// proxy's own connections, and the decrypted inside of an intercepted tunnel.
pub(crate) async fn serve_http<I>(io: I, conn: Arc<Conn>, stop: impl Future<Output = ()>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service_conn = conn.clone();
    let service = hyper::service::service_fn(move |req| {
        let conn = service_conn.clone();
        async move { Ok::<_, Infallible>(conn.handle(req).await) }
    });
    let mut http = std::pin::pin!(
        hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD_BYTES)
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .serve_connection(io, service)
            .with_upgrades()
    );
    // The kept upstream connection is driven by this same task, not a task of its
    // own: a request and its answer then cross no task boundary inside the proxy.
    let mut driver: Option<Driver> = None;
    let rewake = Arc::new(Rewake::default());
    let inner_waker = Waker::from(rewake.clone());
    let both = std::future::poll_fn(|cx| {
        let poll_driver = |driver: &mut Option<Driver>, cx: &mut Context<'_>| {
            if let Some(next) = conn
                .new_driver
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
            {
                // Replacing the driver drops (closes) the previous upstream connection:
                // its sender was replaced with it, and its last answer is complete.
                *driver = Some(next);
            }
            if let Some(d) = driver
                && d.as_mut().poll(cx).is_ready()
            {
                *driver = None;
            }
        };
        // An answer passes driver → handler → driver (the body) → handler → client,
        // each step a wake of this same task. Caught by `Rewake`, such a wake is one
        // more round here; reaching the runtime, it is a yield that wakes another
        // worker thread (a futex wake and a context switch per step, issue 25).
        rewake.set_task(cx.waker());
        let mut inner = Context::from_waker(&inner_waker);
        for _ in 0..MAX_ROUNDS {
            rewake.begin();
            poll_driver(&mut driver, &mut inner);
            if http.as_mut().poll(&mut inner).is_ready() {
                rewake.end();
                return Poll::Ready(());
            }
            poll_driver(&mut driver, &mut inner);
            if !rewake.end() {
                return Poll::Pending;
            }
        }
        // Still woken after as many rounds: give the runtime's other tasks their turn.
        cx.waker().wake_by_ref();
        Poll::Pending
    });
    tokio::select! {
        _ = both => {}
        _ = stop => {}
    }
}

/// Most rounds one poll of a connection's task makes before it yields to the runtime.
const MAX_ROUNDS: usize = 32;

/// The waker a connection's two halves (the client's HTTP/1 server and the kept
/// upstream connection's driver) are polled with. A wake while the task itself is
/// polling them (one half waking the other) is only noted, and the poll makes one more
/// round; any other wake (the reactor, a timer, a revocation) goes to the task's own
/// waker. One atomic state, so no wake is lost between the two: a wake that finds the
/// task polling is seen by [`Rewake::end`], one that finds it idle is forwarded.
#[derive(Default)]
struct Rewake {
    state: AtomicU8,
    task: Mutex<Option<Waker>>,
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
}

impl Wake for Rewake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
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
    /// wake between polls reaches it (none is lost, none is doubled).
    #[test]
    fn a_wake_inside_a_round_is_a_round_one_outside_wakes_the_task() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        let rewake = Arc::new(Rewake::default());
        let inner = Waker::from(rewake.clone());
        rewake.set_task(&task);

        rewake.begin();
        inner.wake_by_ref();
        inner.wake_by_ref();
        assert!(rewake.end(), "woken during the round: another round");
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "the task was not woken");

        rewake.begin();
        assert!(!rewake.end(), "not woken: the poll ends");
        inner.wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "idle: the task is woken");
        inner.wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }
}
