//! An HTTP/1 client connection (the proxy's own, or the decrypted inside of an
//! intercepted tunnel): every request on it decided on its own, the kept upstream
//! connection driven by the same task.

use crate::conn::Conn;
use crate::upstream::Driver;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
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
        // An answer passes driver → handler → driver (the body) → handler → client:
        // a few rounds here carry it through in one poll of the task instead of a
        // reschedule per step. Polling a side that has nothing to do is cheap.
        for _ in 0..3 {
            poll_driver(&mut driver, cx);
            if http.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        poll_driver(&mut driver, cx);
        Poll::Pending
    });
    tokio::select! {
        _ = both => {}
        _ = stop => {}
    }
}
