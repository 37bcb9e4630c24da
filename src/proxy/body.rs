//! One body type for everything the proxy sends, either way: a buffered body (replays,
//! problems, recorded responses, guarded requests) or a stream from the other side,
//! optionally behind bytes already read from it (a response too large to keep).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;

use super::budget::Held;
use crate::error::BoxError;

#[derive(Debug)]
pub enum ProxyBody {
    Full(Option<Bytes>),
    Stream {
        prefix: Option<Bytes>,
        rest: Incoming,
    },
    /// A request body of another type than hyper's (the handler tests' in-memory bodies).
    Boxed(UnsyncBoxBody<Bytes, BoxError>),
}

/// What the handler accepts as a request body: hyper's own, streamed as it is, or any
/// other body (boxed once).
pub trait RequestBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

impl<B: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static> RequestBody for B {}

impl ProxyBody {
    /// A request body to stream upstream: hyper's `Incoming` as it is (the server's
    /// case, without an allocation), any other body boxed.
    pub fn from_request<B: RequestBody>(body: B) -> Self {
        let mut slot = Some(body);
        if let Some(incoming) = (&mut slot as &mut dyn Any).downcast_mut::<Option<Incoming>>()
            && let Some(rest) = incoming.take()
        {
            return ProxyBody::stream(rest);
        }
        match slot {
            Some(body) => ProxyBody::Boxed(body.map_err(Into::into).boxed_unsync()),
            None => ProxyBody::empty(),
        }
    }

    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        ProxyBody::Full((!bytes.is_empty()).then_some(bytes))
    }

    pub fn empty() -> Self {
        ProxyBody::Full(None)
    }

    pub fn stream(rest: Incoming) -> Self {
        ProxyBody::Stream { prefix: None, rest }
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
            ProxyBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Stream { prefix, rest } => match prefix.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Pin::new(rest).poll_frame(cx).map_err(Into::into),
            },
            ProxyBody::Boxed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(bytes) => bytes.is_none(),
            ProxyBody::Stream { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
            ProxyBody::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            ProxyBody::Stream { prefix, rest } => {
                let extra = prefix.as_ref().map_or(0, |b| b.len() as u64);
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + extra);
                }
                hint
            }
            ProxyBody::Boxed(body) => body.size_hint(),
        }
    }
}

/// A request body that fails with [`Stalled::Stalled`] when no frame arrives for
/// `stall` (`listen_body_timeout`): a client that sends a byte now and then must not
/// hold a connection and its buffered bytes for as long as it likes.
pub(crate) struct StallGuard<B> {
    inner: B,
    stall: std::time::Duration,
    /// Armed when the body first makes the reader wait: a body already in hyper's
    /// buffer (most guarded bodies) costs no timer.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the timer counts the current wait (it is reset when a wait begins).
    waiting: bool,
}

/// Why a [`StallGuard`]ed body failed.
#[derive(Debug)]
pub(crate) enum Stalled<E> {
    Stalled,
    Body(E),
}

impl<B> StallGuard<B> {
    pub(crate) fn new(inner: B, stall: std::time::Duration) -> Self {
        Self {
            inner,
            stall,
            timer: None,
            waiting: false,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for StallGuard<B> {
    type Data = Bytes;
    type Error = Stalled<B::Error>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                // The next wait starts its own stall period.
                this.waiting = false;
                Poll::Ready(frame.map(|f| f.map_err(Stalled::Body)))
            }
            Poll::Pending => {
                let stall = this.stall;
                let timer = match &mut this.timer {
                    Some(timer) => {
                        if !this.waiting {
                            timer.as_mut().reset(tokio::time::Instant::now() + stall);
                        }
                        timer
                    }
                    None => this.timer.insert(Box::pin(tokio::time::sleep(stall))),
                };
                this.waiting = true;
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Stalled::Stalled))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A body read up to a limit.
#[derive(Debug)]
pub(crate) enum Capped<B> {
    Complete(Bytes),
    /// More than the limit arrived: what was read so far, and the unread rest.
    Overflow {
        prefix: Bytes,
        rest: B,
    },
    /// `max_buffered_bytes` has no room for the next bytes.
    OverBudget,
}

/// Reads `body` whole unless it grows past `limit` bytes, accounting for every byte held
/// in `held`. Trailers are dropped.
pub(crate) async fn collect_capped<B: Body<Data = Bytes> + Unpin>(
    mut body: B,
    limit: u64,
    held: &mut Held,
) -> Result<Capped<B>, B::Error> {
    // A known length sizes the buffer once enough of it arrived: a buffer grown by
    // doubling can hold twice, one reserved up front would hold memory for bytes a
    // client only announced (`max_buffered_bytes` counts what arrived).
    let expected = body.size_hint().exact().unwrap_or(0).min(limit);
    let mut buf = BytesMut::new();
    let mut first: Option<Bytes> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if !held.fill(data.len() as u64) {
            return Ok(Capped::OverBudget);
        }
        let held = first.as_ref().map_or(0, Bytes::len) + buf.len();
        if (held + data.len()) as u64 > limit {
            if let Some(f) = first.take() {
                buf.extend_from_slice(&f);
            }
            buf.extend_from_slice(&data);
            return Ok(Capped::Overflow {
                prefix: buf.freeze(),
                rest: body,
            });
        }
        // A body that arrives in one frame is kept as it came, without a copy. One that
        // arrives in pieces is copied into a buffer that doubles up to its declared size,
        // so that no piece keeps a larger read buffer of hyper's alive meanwhile.
        let whole = expected == 0 || data.len() as u64 >= expected;
        let arrived = first.as_ref().map_or(0, Bytes::len) + buf.len() + data.len();
        if buf.capacity() < arrived && (first.is_some() || !whole) {
            let most = if expected == 0 {
                u64::MAX
            } else {
                expected.max(arrived as u64)
            };
            let size = (arrived as u64).saturating_mul(2).min(most);
            buf.reserve(usize::try_from(size).unwrap_or(arrived) - buf.len());
        }
        match first.take() {
            None if buf.is_empty() && whole => first = Some(data),
            None => buf.extend_from_slice(&data),
            Some(f) => {
                buf.extend_from_slice(&f);
                buf.extend_from_slice(&data);
            }
        }
    }
    Ok(Capped::Complete(first.unwrap_or_else(|| buf.freeze())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[tokio::test]
    async fn another_body_type_is_boxed_and_streams_the_same_bytes() {
        let body = ProxyBody::from_request(Full::new(Bytes::from_static(b"abc")));
        assert!(matches!(body, ProxyBody::Boxed(_)));
        let bytes = body.collect().await.expect("in memory").to_bytes();
        assert_eq!(bytes, "abc");
    }

    #[tokio::test]
    async fn collect_capped_reports_what_was_read_past_the_limit() {
        let body = Full::new(Bytes::from_static(b"0123456789"));
        let budget = super::super::budget::Budget::new(100);
        let mut held = budget.strict();
        match collect_capped(body, 4, &mut held).await.expect("in memory") {
            Capped::Overflow { prefix, .. } => assert_eq!(prefix, "0123456789"),
            _ => panic!("not capped"),
        }
        drop(held);
        let body = Full::new(Bytes::from_static(b"0123"));
        assert!(matches!(
            collect_capped(body, 4, &mut budget.strict()).await.expect("in memory"),
            Capped::Complete(b) if b == "0123"
        ));
        let body = Full::new(Bytes::from_static(b"0123"));
        let mut full = budget.strict();
        assert!(full.grow(98));
        assert!(matches!(
            collect_capped(body, 4, &mut budget.strict())
                .await
                .expect("in memory"),
            Capped::OverBudget
        ));
    }
}
