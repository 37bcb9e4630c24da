//! A layer around a real store with one operation that stops answering, the way a Redis
//! call does that was written and whose reply never came (or that never got written).
//! Every other operation is the inner store's own.

use std::future::Future;

use idemgate::metrics::StoreOp;
use idemgate::store::{Around, Layered, StoreError};

/// When the stalled operation stops answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Before it reaches the store: nothing is written.
    Before,
    /// After the store applied it: written, but the caller never hears so.
    After,
}

#[derive(Debug)]
pub struct Stall {
    op: StoreOp,
    when: When,
}

/// The inner store, with `op` stalled.
pub type Stalling<S> = Layered<S, Stall>;

pub fn stalling<S: idemgate::store::Store>(inner: S, op: StoreOp, when: When) -> Stalling<S> {
    Layered::new(std::sync::Arc::new(inner), Stall { op, when })
}

impl Around for Stall {
    async fn around<T: Send>(
        &self,
        op: StoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        if op != self.op {
            return call.await;
        }
        if self.when == When::After {
            let _ = call.await;
        }
        std::future::pending().await
    }
}
