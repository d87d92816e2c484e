//! The bodies the proxy sends: its own short answers, and message bodies streamed from
//! the other side that end in an error the moment the admitting grant is revoked,
//! counted for the audit.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::record::Audit;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body the proxy sends: a short answer of its own, or a message body streamed from
/// the other side that ends in an error the moment the admitting grant is revoked.
pub(crate) enum ProxyBody {
    Full(Option<Bytes>),
    Fenced {
        /// A frame already read from `inner`, sent first.
        first: Option<Frame<Bytes>>,
        inner: Incoming,
        revoked: Pin<Box<WaitForCancellationFutureOwned>>,
        /// The audit record this body's bytes count towards.
        audit: Option<(Arc<Audit>, Direction)>,
        /// An answer's upstream connection, kept for the next request once this body
        /// ends cleanly (dropped, and so closed, otherwise).
        keep: Option<Keep>,
    },
}

/// Which way a body goes, for the audit.
#[derive(Clone, Copy)]
pub(crate) enum Direction {
    /// The command's request body, to the upstream.
    Up,
    /// The upstream's answer body, to the command.
    Down,
}

impl ProxyBody {
    pub(crate) fn empty() -> Self {
        ProxyBody::Full(None)
    }

    pub(crate) fn full(s: String) -> Self {
        ProxyBody::Full(Some(Bytes::from(s)))
    }

    pub(crate) fn fenced(
        inner: Incoming,
        revoked: &CancellationToken,
        audit: Option<(Arc<Audit>, Direction)>,
    ) -> Self {
        ProxyBody::Fenced {
            first: None,
            inner,
            revoked: Box::pin(revoked.clone().cancelled_owned()),
            audit,
            keep: None,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Fenced {
                first,
                inner,
                revoked,
                audit,
                keep,
            } => {
                if revoked.as_mut().poll(cx).is_ready() {
                    if let Some((a, _)) = audit {
                        a.set(0, "revoked");
                    }
                    return Poll::Ready(Some(Err("egress grant revoked".into())));
                }
                if let Some((a, Direction::Up)) = audit.as_ref()
                    && a.cut_up.load(Ordering::SeqCst)
                {
                    // The upstream is done with this request: whatever is left of the
                    // body would be read as a new one. The connection ends instead.
                    a.set(0, "answered-before-the-body");
                    return Poll::Ready(Some(Err(
                        "the upstream answered before the request body was sent".into(),
                    )));
                }
                if let Some(frame) = first.take() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                let polled = Pin::new(&mut *inner).poll_frame(cx);
                let ended = match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some((a, direction)) = audit.as_ref() {
                            let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                            match direction {
                                Direction::Up => a.up.fetch_add(n, Ordering::Relaxed),
                                Direction::Down => a.down.fetch_add(n, Ordering::Relaxed),
                            };
                        }
                        inner.is_end_stream()
                    }
                    Poll::Ready(Some(Err(_))) => {
                        if let Some((a, _)) = audit.as_ref() {
                            a.set(0, "body-error");
                        }
                        // A broken body leaves the connection out of step: not kept.
                        keep.take();
                        false
                    }
                    Poll::Ready(None) => true,
                    Poll::Pending => false,
                };
                if ended {
                    if let Some((a, Direction::Up)) = audit.as_ref() {
                        a.up_done.store(true, Ordering::SeqCst);
                    }
                    if let Some(k) = keep.take() {
                        k.put_back();
                    }
                }
                polled.map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Fenced { first, inner, .. } => first.is_none() && inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            ProxyBody::Fenced { first, inner, .. } => {
                let already = first
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |b| b.len() as u64);
                let rest = inner.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + already);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + already);
                }
                hint
            }
        }
    }
}

/// An upstream connection on its way back to its client connection, once the answer it
/// carries has ended cleanly: putting it back is all a body knows of it.
pub(crate) struct Keep(Box<dyn FnOnce() + Send>);

impl Keep {
    /// A connection `put_back` returns to its slot.
    pub(crate) fn new(put_back: impl FnOnce() + Send + 'static) -> Keep {
        Keep(Box::new(put_back))
    }

    pub(crate) fn put_back(self) {
        (self.0)()
    }
}
