//! One body type for everything the proxy sends, either way: a buffered body (replays,
//! problems, recorded responses, guarded requests) or a stream from the other side,
//! optionally behind bytes already read from it (a response too large to keep).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

#[derive(Debug)]
pub enum ProxyBody {
    Full(Option<Bytes>),
    Stream {
        prefix: Option<Bytes>,
        rest: Incoming,
    },
}

impl ProxyBody {
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
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ProxyBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Stream { prefix, rest } => match prefix.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Pin::new(rest).poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(bytes) => bytes.is_none(),
            ProxyBody::Stream { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
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
        }
    }
}

/// A body read up to a limit.
#[derive(Debug)]
pub enum Capped {
    Complete(Bytes),
    /// More than the limit arrived: what was read so far, and the unread rest.
    Overflow {
        prefix: Bytes,
        rest: Incoming,
    },
}

/// Reads `body` whole unless it grows past `limit` bytes. Trailers are dropped.
pub async fn collect_capped(mut body: Incoming, limit: u64) -> Result<Capped, hyper::Error> {
    use http_body_util::BodyExt;
    let mut buf = BytesMut::new();
    let mut first: Option<Bytes> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        // A single-frame body is kept as it came, without a copy.
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
        match first.take() {
            None if buf.is_empty() => first = Some(data),
            None => buf.extend_from_slice(&data),
            Some(f) => {
                buf.extend_from_slice(&f);
                buf.extend_from_slice(&data);
            }
        }
    }
    Ok(Capped::Complete(first.unwrap_or_else(|| buf.freeze())))
}
