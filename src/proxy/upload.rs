//! A streamed request body (docs/behaviour.md §19): forwarded as it arrives, hashed on
//! the way, never kept. [`Upload`] is the body handed to the upstream client (or read to
//! the end and discarded, for a retry that must compare its body); its [`Ending`] tells
//! the exchange how the body ended: whole, with its full fingerprint, or cut short by
//! the client, in which case nothing may be recorded.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

use super::body::Stalled;
use super::budget::Held;
use crate::error::{BoxError, ProxyError};
use crate::idempotency::{Fingerprint, StreamedHash};

/// The client's side of a streamed body, after what was buffered of it.
pub(crate) type Rest = UnsyncBoxBody<Bytes, Stalled<BoxError>>;

/// How a streamed body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Every byte arrived: the request's full fingerprint.
    Whole(Fingerprint),
    /// The client's body did not arrive whole: the upstream request is aborted.
    Cut(Cut),
}

/// Why a streamed body was cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Fewer bytes than its `Content-Length`, or more.
    Length,
    /// Past `max_streamed_body`.
    TooLarge { limit: u64 },
    /// Nothing arrived for `listen_body_timeout`.
    Stalled,
    /// The client's connection failed (it disconnected).
    Failed,
}

impl Cut {
    /// What the client is answered, if it is still there.
    pub(crate) fn error(self) -> ProxyError {
        match self {
            Cut::TooLarge { limit } => ProxyError::BodyTooLarge { limit },
            Cut::Stalled => ProxyError::BodyTimeout,
            Cut::Length | Cut::Failed => ProxyError::BadRequestBody(Box::new(CutShort(self))),
        }
    }
}

/// The error an [`Upload`] fails with, which aborts the upstream request.
#[derive(Debug, thiserror::Error)]
#[error("the request body was cut short ({0:?})")]
pub(crate) struct CutShort(Cut);

/// Where the exchange learns how the body it forwards ended, once it has.
#[derive(Debug, Clone)]
pub(crate) struct Ending(Arc<OnceLock<Ended>>);

impl Ending {
    pub(crate) fn get(&self) -> Option<Ended> {
        self.0.get().copied()
    }

    /// Why the body was cut short, if it was.
    pub(crate) fn cut(&self) -> Option<Cut> {
        match self.get() {
            Some(Ended::Cut(cut)) => Some(cut),
            _ => None,
        }
    }

    /// The full fingerprint, once every byte went by.
    pub(crate) fn whole(&self) -> Option<Fingerprint> {
        match self.get() {
            Some(Ended::Whole(full)) => Some(full),
            _ => None,
        }
    }
}

/// A streamed request body: the bytes already buffered, then the rest as it arrives,
/// each hashed before it is passed on. It holds, of `max_buffered_bytes`, the buffered
/// prefix until it is passed on, then the one frame in hand.
pub(crate) struct Upload {
    prefix: Option<Bytes>,
    rest: Rest,
    hash: Option<StreamedHash>,
    declared: Option<u64>,
    limit: u64,
    /// The buffered prefix's share, given back once it is passed on.
    prefix_held: Option<Held>,
    /// The share of the frame in hand.
    held: Held,
    ending: Ending,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload")
            .field("hash", &self.hash)
            .field("declared", &self.declared)
            .field("ending", &self.ending.get())
            .finish_non_exhaustive()
    }
}

/// What an [`Upload`] is made of.
pub(crate) struct Parts {
    /// Read before the body was known to be too large to buffer, with its share.
    pub(crate) prefix: Option<(Bytes, Held)>,
    pub(crate) rest: Rest,
    /// The body's `Content-Length`, if it has one.
    pub(crate) declared: Option<u64>,
    /// `max_streamed_body`.
    pub(crate) limit: u64,
    /// An empty share that grows and shrinks with the frame in hand.
    pub(crate) held: Held,
}

impl Upload {
    pub(crate) fn new(parts: Parts, upfront: &Fingerprint) -> Self {
        let (prefix, prefix_held) = match parts.prefix {
            Some((bytes, held)) => (Some(bytes), Some(held)),
            None => (None, None),
        };
        Self {
            prefix,
            rest: parts.rest,
            hash: Some(StreamedHash::new(upfront)),
            declared: parts.declared,
            limit: parts.limit,
            prefix_held,
            held: parts.held,
            ending: Ending(Arc::default()),
        }
    }

    /// The body's `Content-Length`, if it has one: part of its up-front fingerprint.
    pub(crate) fn declared(&self) -> Option<u64> {
        self.declared
    }

    /// Hashes the body under `upfront` instead: the fingerprint its record's rules made
    /// (docs/behaviour.md §24). Called after the claim, before a byte has gone by.
    pub(crate) fn rehash(&mut self, upfront: &Fingerprint) {
        if self.hash.as_ref().is_some_and(StreamedHash::is_empty) {
            self.hash = Some(StreamedHash::new(upfront));
        }
    }

    pub(crate) fn ending(&self) -> Ending {
        self.ending.clone()
    }

    /// Reads the body to its end, discarding it: a retry's full fingerprint.
    pub(crate) async fn drain(mut self) -> Result<Fingerprint, Cut> {
        while let Some(frame) = self.frame().await {
            if frame.is_err() {
                break;
            }
        }
        match self.ending.get() {
            Some(Ended::Whole(full)) => Ok(full),
            Some(Ended::Cut(cut)) => Err(cut),
            // A body ends whole or cut: `poll_frame` settles one before it says so.
            None => Err(Cut::Failed),
        }
    }

    fn cut(&mut self, cut: Cut) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.hash = None;
        let _ = self.ending.0.set(Ended::Cut(cut));
        Poll::Ready(Some(Err(Box::new(CutShort(cut)))))
    }

    /// Hashes `data`; `Err` when it breaks the length the body may have.
    fn take(&mut self, data: &[u8]) -> Result<(), Cut> {
        let Some(hash) = self.hash.as_mut() else {
            return Ok(());
        };
        hash.update(data);
        let seen = hash.len();
        if self.declared.is_some_and(|declared| seen > declared) {
            return Err(Cut::Length);
        }
        if seen > self.limit {
            return Err(Cut::TooLarge { limit: self.limit });
        }
        Ok(())
    }

    /// Settles the ending once every byte is known to have arrived: before the last
    /// frame is passed on, so that an upstream that answers after reading it finds the
    /// full fingerprint there.
    fn finish(&mut self) {
        if let Some(hash) = self.hash.take() {
            let _ = self.ending.0.set(Ended::Whole(hash.finish()));
        }
    }

    fn complete(&self) -> bool {
        match (&self.hash, self.declared) {
            (Some(hash), Some(declared)) => hash.len() == declared,
            _ => false,
        }
    }
}

impl Body for Upload {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.ending.get().is_some() {
            return match this.ending.get() {
                Some(Ended::Cut(cut)) => Poll::Ready(Some(Err(Box::new(CutShort(cut))))),
                _ => Poll::Ready(None),
            };
        }
        if let Some(prefix) = this.prefix.take() {
            if let Err(cut) = this.take(&prefix) {
                return this.cut(cut);
            }
            if this.complete() {
                this.finish();
            }
            // Passed on: hyper holds it now, not this request's buffer.
            this.prefix_held = None;
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        loop {
            let frame = match Pin::new(&mut this.rest).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    if this.declared.is_some() && !this.complete() {
                        return this.cut(Cut::Length);
                    }
                    this.finish();
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(Stalled::Stalled))) => return this.cut(Cut::Stalled),
                Poll::Ready(Some(Err(Stalled::Body(_)))) => return this.cut(Cut::Failed),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            // Trailers are not forwarded, as for a buffered body.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if let Err(cut) = this.take(&data) {
                return this.cut(cut);
            }
            this.held.resize(data.len() as u64);
            if this.complete() || this.rest.is_end_stream() {
                this.finish();
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && matches!(self.ending.get(), Some(Ended::Whole(_)))
    }

    fn size_hint(&self) -> SizeHint {
        match self.declared {
            Some(declared) => SizeHint::with_exact(declared),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::proxy::budget::Budget;

    /// A client body, frame by frame, ready at every poll.
    struct Frames(VecDeque<Result<Bytes, Stalled<BoxError>>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Stalled<BoxError>;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|piece| piece.map(Frame::data)))
        }
    }

    fn upload(
        pieces: Vec<Result<&'static [u8], Stalled<BoxError>>>,
        declared: Option<u64>,
        limit: u64,
    ) -> Upload {
        let budget = Budget::new(1 << 20);
        let frames = pieces
            .into_iter()
            .map(|piece| piece.map(Bytes::from_static))
            .collect();
        let parts = Parts {
            prefix: Some((Bytes::from_static(b"ab"), budget.strict())),
            rest: Frames(frames).boxed_unsync(),
            declared,
            limit,
            held: budget.counting(),
        };
        Upload::new(parts, &Fingerprint::from_bytes([1; 32]))
    }

    fn expected(body: &[u8]) -> Fingerprint {
        let mut hash = StreamedHash::new(&Fingerprint::from_bytes([1; 32]));
        hash.update(body);
        hash.finish()
    }

    #[tokio::test]
    async fn a_whole_body_ends_with_its_full_fingerprint() {
        let body = upload(vec![Ok(b"cd"), Ok(b"ef")], Some(6), 100);
        let ending = body.ending();
        assert_eq!(body.drain().await, Ok(expected(b"abcdef")));
        assert_eq!(ending.whole(), Some(expected(b"abcdef")));
        let chunked = upload(vec![Ok(b"cdef")], None, 100);
        assert_eq!(chunked.drain().await, Ok(expected(b"abcdef")));
    }

    /// The ending is settled before the last frame is passed on: an upstream that has
    /// read every byte finds the full fingerprint.
    #[tokio::test]
    async fn the_full_fingerprint_is_known_before_the_last_frame_leaves() {
        let mut body = upload(vec![Ok(b"cd")], Some(4), 100);
        let ending = body.ending();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"ab")));
        assert_eq!(ending.get(), None);
        let last = body.frame().await.expect("a frame").expect("data");
        assert_eq!(last.into_data().ok(), Some(Bytes::from_static(b"cd")));
        assert_eq!(ending.whole(), Some(expected(b"abcd")));
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn a_body_cut_short_says_why() {
        let short = upload(vec![Ok(b"cd")], Some(6), 100);
        let ending = short.ending();
        assert_eq!(short.drain().await, Err(Cut::Length));
        assert_eq!(ending.cut(), Some(Cut::Length));
        let long = upload(vec![Ok(b"cdefg")], Some(6), 100);
        assert_eq!(long.drain().await, Err(Cut::Length));
        let large = upload(vec![Ok(b"cdefg")], None, 4);
        assert_eq!(large.drain().await, Err(Cut::TooLarge { limit: 4 }));
        let gone = upload(
            vec![Ok(b"cd"), Err(Stalled::Body("reset".into()))],
            None,
            100,
        );
        assert_eq!(gone.drain().await, Err(Cut::Failed));
        let slow = upload(vec![Err(Stalled::Stalled)], None, 100);
        assert_eq!(slow.drain().await, Err(Cut::Stalled));
    }
}
