//! HTTP/2 inside an intercepted tunnel whose client chose h2 by ALPN: each stream a
//! request decided on its own.

use crate::answer::limited;
use crate::conn::Conn;
use crate::h1::MAX_HEAD_BYTES;
use std::convert::Infallible;
use std::sync::Arc;

/// Serve HTTP/2 on `io` (an intercepted tunnel whose client chose h2 by ALPN): each
/// stream is a request decided on its own, as on HTTP/1; they run concurrently, so
/// each upstream connection is driven by a task of its own.
pub(crate) async fn serve_h2<I>(io: I, conn: Arc<Conn>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        async move {
            // Streams count across all of the container's connections: each may
            // hold an upstream socket (`budget.rs`).
            let stream = match conn.shared.budget.stream() {
                Ok(s) => s,
                Err(limit) => return Ok::<_, Infallible>(limited(limit)),
            };
            let resp = conn.handle(req).await;
            drop(stream);
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .max_header_list_size(MAX_HEAD_BYTES as u32)
        .max_concurrent_streams(MAX_H2_STREAMS)
        .serve_connection(io, service)
        .await;
}

/// Most concurrent streams on one intercepted h2 connection (each may hold an upstream
/// connection; the connection cap bounds client connections, this bounds what one of
/// them multiplexes).
pub(crate) const MAX_H2_STREAMS: u32 = 64;
