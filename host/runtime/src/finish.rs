//! A call that runs to its end whether or not its caller waits for it.
//!
//! A facade call that changes a sandbox must not be cut between its apply and its
//! revoke, or its start and its declaration, by a caller that stops waiting (an HTTP
//! client that disconnects, a dropped future). It used to be spawned as a task of its
//! own, which the caller then awaited: every call paid a hand-over to another task
//! and back, and for a caller outside the runtime's workers (a library caller in
//! `block_on`) two cross-thread wake-ups, each an inter-processor interrupt on a
//! small VM (docs/BENCHMARKS.md, "A call polled in its caller's task").
//!
//! [`Finish`] polls the call in the caller's own task instead. Only if it is dropped
//! before the call ended does it hand the rest of the call to the runtime, as a task
//! of its own that runs to the end: the future is boxed and pinned from the start,
//! so moving the box into the task does not move the call. A panic in the call is
//! caught and answered as the task's failure was.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

type Call<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A call polled where it is awaited, finished on the runtime if dropped unfinished.
pub struct Finish<T: Send + 'static> {
    call: Option<Call<T>>,
    runtime: tokio::runtime::Handle,
}

/// The call panicked; the message, if it had one.
#[derive(Debug, PartialEq, Eq)]
pub struct Panicked(pub String);

impl<T: Send + 'static> Finish<T> {
    /// Needs a Tokio runtime: the one it is created in finishes the call if the
    /// caller drops it.
    pub fn new(call: impl Future<Output = T> + Send + 'static) -> Self {
        Finish {
            call: Some(Box::pin(call)),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

impl<T: Send + 'static> Future for Finish<T> {
    type Output = Result<T, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(call) = self.call.as_mut() else {
            panic!("Finish polled after it answered");
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => {
                self.call = None;
                Poll::Ready(Ok(v))
            }
            Err(panic) => {
                // The call's state is not to be polled again: dropped here, as a
                // panicked task's is.
                self.call = None;
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Poll::Ready(Err(Panicked(message)))
            }
        }
    }
}

impl<T: Send + 'static> Drop for Finish<T> {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // The caller stopped waiting: the rest runs on the runtime, to its end.
            // (On a runtime shutting down the task is dropped, as any task then.)
            self.runtime.spawn(async move {
                let _ = call.await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_call_runs_in_the_callers_task() {
        let caller = std::thread::current().id();
        let ran_on = Finish::new(async { std::thread::current().id() })
            .await
            .unwrap();
        assert_eq!(ran_on, caller);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_whose_caller_stops_waiting_runs_to_its_end() {
        let (began, began_rx) = tokio::sync::oneshot::channel();
        let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (ended, ended_rx) = tokio::sync::oneshot::channel();
        let mut call = Box::pin(Finish::new(async move {
            began.send(()).unwrap();
            go_rx.await.unwrap();
            ended.send(()).unwrap();
        }));
        // Polled until it waits in the middle (between "apply" and "revoke").
        tokio::select! {
            _ = &mut call => unreachable!("the call cannot end before it is let go"),
            r = began_rx => r.unwrap(),
        }
        drop(call);
        go.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), ended_rx)
            .await
            .expect("the dropped call ended on the runtime")
            .expect("its end was reported");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_dropped_before_its_first_poll_still_runs() {
        let ran = Arc::new(AtomicBool::new(false));
        let (ended, ended_rx) = tokio::sync::oneshot::channel();
        let r = ran.clone();
        drop(Finish::new(async move {
            r.store(true, Ordering::SeqCst);
            ended.send(()).unwrap();
        }));
        tokio::time::timeout(Duration::from_secs(10), ended_rx)
            .await
            .unwrap()
            .unwrap();
        assert!(ran.load(Ordering::SeqCst));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_in_the_call_is_answered_not_propagated() {
        let r = Finish::new(async {
            if std::hint::black_box(true) {
                panic!("the guest's host import broke");
            }
        })
        .await;
        assert_eq!(r, Err(Panicked("the guest's host import broke".into())));
        let r = Finish::new(async {
            if std::hint::black_box(true) {
                panic!("{} broke", "formatted");
            }
        })
        .await;
        assert_eq!(r, Err(Panicked("formatted broke".into())));
    }
}
