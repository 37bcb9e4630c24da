//! Which worker thread the caller runs on, and what each worker owns.
//!
//! The binary serves with `workers` threads, each a single-threaded runtime with its own
//! listener socket (`cli.rs`). Connections whose I/O is driven by a task (the upstream
//! pool's connections, a Redis multiplexed connection) belong to the runtime that
//! spawned that task: a request on another worker that borrowed one would hand every
//! byte across threads and wake the other worker twice per call. So those are kept
//! [`PerWorker`], and a request takes the one of the worker it runs on.
//!
//! Outside a worker thread (the tests' runtimes, a blocking helper) the index is 0.

use std::cell::Cell;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as worker `index`; called once as a worker thread starts.
pub fn enter(index: usize) {
    INDEX.with(|cell| cell.set(index));
}

/// The worker the calling thread is, or 0 outside the workers.
pub fn index() -> usize {
    INDEX.with(Cell::get)
}

/// One `T` per worker, each used only from its own worker (but for the first, which
/// also serves callers outside the workers).
#[derive(Debug, Clone)]
pub struct PerWorker<T> {
    items: Box<[T]>,
}

impl<T> PerWorker<T> {
    /// `count` items (at least one), the `i`-th made by `make(i)`.
    pub fn new(count: usize, make: impl FnMut(usize) -> T) -> Self {
        let items: Box<[T]> = (0..count.max(1)).map(make).collect();
        Self { items }
    }

    /// As [`PerWorker::new`], but the first error stops it.
    pub fn try_new<E>(count: usize, make: impl FnMut(usize) -> Result<T, E>) -> Result<Self, E> {
        let items = (0..count.max(1))
            .map(make)
            .collect::<Result<Box<[T]>, E>>()?;
        Ok(Self { items })
    }

    /// The calling worker's item.
    pub fn get(&self) -> &T {
        &self.items[index() % self.items.len()]
    }

    /// The first worker's item: for what must be one across workers (a subscription
    /// that a later call on another worker undoes).
    pub fn first(&self) -> &T {
        &self.items[0]
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_takes_its_own_item() {
        let items = PerWorker::new(3, |i| i * 10);
        assert_eq!(*items.get(), 0, "outside a worker: the first");
        let seen = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|i| {
                    let items = &items;
                    s.spawn(move || {
                        enter(i);
                        *items.get()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("worker thread"))
                .collect::<Vec<_>>()
        });
        // More workers than items wraps around rather than panicking.
        assert_eq!(seen, vec![0, 10, 20, 0]);
        assert_eq!(*items.first(), 0);
        assert_eq!(PerWorker::new(0, |i| i).len(), 1, "never empty");
    }
}
