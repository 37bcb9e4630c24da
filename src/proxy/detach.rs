//! Work that must finish even if the request that started it is dropped.
//!
//! A client that disconnects makes hyper drop the request's future. The forward and the
//! recording must still run to the end (docs/behaviour.md §4), so they are wrapped in
//! [`Detached`]: it runs as part of the request's own task, and only if it is dropped
//! unfinished does it hand the rest to a new task. Spawning every exchange up front would
//! cost a task hand-off and a worker wake-up per request, on the hot path.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::task::TaskTracker;

/// A future that finishes on its own task if dropped before it is done.
pub(crate) struct Detached<F: Future<Output: Send> + Send + 'static> {
    work: Option<Pin<Box<F>>>,
    tasks: TaskTracker,
}

impl<F: Future<Output: Send> + Send + 'static> Detached<F> {
    /// `tasks` is what shutdown waits for; a detached remainder joins it.
    pub(crate) fn new(work: F, tasks: TaskTracker) -> Self {
        Self {
            work: Some(Box::pin(work)),
            tasks,
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Future for Detached<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Polling a finished future is a caller's bug; say so instead of hanging.
        let work = self
            .work
            .as_mut()
            .expect("Detached polled after it completed");
        let out = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(out)
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for Detached<F> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else { return };
        // Dropped outside a runtime (process teardown): nothing can finish it anyway.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.tasks.spawn(async move {
                let _ = work.await;
            });
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> std::fmt::Debug for Detached<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached")
            .field("running", &self.work.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn finishes_inline_when_awaited() {
        let tasks = TaskTracker::new();
        assert_eq!(Detached::new(async { 7 }, tasks.clone()).await, 7);
        assert!(tasks.is_empty(), "nothing was spawned");
    }

    #[tokio::test]
    async fn finishes_on_its_own_when_dropped_midway() {
        let tasks = TaskTracker::new();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let mut work = Box::pin(Detached::new(
            async move {
                let _ = wait.await;
                flag.store(true, Ordering::SeqCst);
            },
            tasks.clone(),
        ));
        // Started, then abandoned, as when a client disconnects.
        assert!(futures_poll_once(work.as_mut()).await.is_pending());
        drop(work);
        assert_eq!(tasks.len(), 1);
        go.send(()).expect("the detached remainder still listens");
        tasks.close();
        tasks.wait().await;
        assert!(done.load(Ordering::SeqCst));
    }

    #[tokio::test]
    #[should_panic(expected = "polled after it completed")]
    async fn polling_after_completion_is_loud() {
        let mut work = Box::pin(Detached::new(async { 7 }, TaskTracker::new()));
        assert_eq!(futures_poll_once(work.as_mut()).await, Poll::Ready(7));
        let _ = futures_poll_once(work.as_mut()).await;
    }

    async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Poll<F::Output> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut f).poll(cx))).await
    }
}
