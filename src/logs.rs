//! Where log lines go: stderr, in batches on the worker threads.
//!
//! Writing the access line straight to stderr is one `write` system call per request,
//! which on the pass-through path costs about as much as the proxying itself. A worker
//! thread instead appends its lines to a buffer of its own and writes the buffer when its
//! runtime has nothing left to run ([`flush`] is the runtime's park hook), when the
//! buffer reaches [`LIMIT`], or at once for a line at `warn` or `error`. An idle proxy
//! therefore writes each line as soon as its request is answered; a busy one writes
//! many lines per call. A line is never split: a batch is written whole, under the
//! lock of stderr.
//!
//! Other threads (the tests' runtimes, the file store's writer) write each line at once.

use std::cell::{Cell, RefCell};
use std::io::Write;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// A worker's buffer is written once it holds this much.
pub const LIMIT: usize = 16 * 1024;

thread_local! {
    static BATCHING: Cell<bool> = const { Cell::new(false) };
    static BUFFER: Batch = const { Batch(RefCell::new(Vec::new())) };
}

/// A thread's pending lines; written when the thread ends, too.
struct Batch(RefCell<Vec<u8>>);

impl Batch {
    fn write_out(&self) {
        let Ok(mut pending) = self.0.try_borrow_mut() else {
            return;
        };
        if pending.is_empty() {
            return;
        }
        // Nowhere to report a failure to write the log.
        let _ = std::io::stderr().lock().write_all(&pending);
        pending.clear();
        // A burst must not keep a large buffer for the thread's life.
        if pending.capacity() > 4 * LIMIT {
            pending.shrink_to(LIMIT);
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.write_out();
    }
}

/// Makes the calling thread batch its lines. Only for a thread whose runtime calls
/// [`flush`] before it parks, and that calls it once more when it stops serving.
pub fn batch_on_this_thread() {
    BATCHING.with(|b| b.set(true));
}

/// Writes the calling thread's pending lines.
pub fn flush() {
    let _ = BUFFER.try_with(Batch::write_out);
}

/// The `MakeWriter` of the log layer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { urgent: true }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line {
        Line {
            urgent: *meta.level() <= Level::WARN,
        }
    }
}

/// One event's line, on its way into the thread's batch or straight out.
#[derive(Debug)]
pub struct Line {
    urgent: bool,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !BATCHING.with(Cell::get) {
            return std::io::stderr().lock().write(buf);
        }
        let full = BUFFER
            .try_with(|batch| match batch.0.try_borrow_mut() {
                Ok(mut pending) => {
                    pending.extend_from_slice(buf);
                    Some(pending.len() >= LIMIT)
                }
                Err(_) => None,
            })
            .ok()
            .flatten();
        match full {
            Some(full) => {
                if full {
                    flush();
                }
                Ok(buf.len())
            }
            // The thread is ending, or (never expected) a write from within a write.
            None => std::io::stderr().lock().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.urgent && BATCHING.with(Cell::get) {
            // Earlier lines first, so the order on this thread is kept.
            flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending() -> usize {
        BUFFER.with(|b| b.0.borrow().len())
    }

    #[test]
    fn a_thread_that_batches_keeps_info_lines_until_flushed_or_full() {
        std::thread::spawn(|| {
            let mut line = Stderr.make_writer_for(&INFO_META);
            line.write_all(b"not batched here\n").expect("write");
            drop(line);
            assert_eq!(pending(), 0, "an ordinary thread writes at once");

            batch_on_this_thread();
            let mut line = Stderr.make_writer_for(&INFO_META);
            line.write_all(b"an access line\n").expect("write");
            drop(line);
            assert_eq!(pending(), 15, "kept for the batch");
            flush();
            assert_eq!(pending(), 0, "written by flush");

            let mut line = Stderr.make_writer_for(&INFO_META);
            line.write_all(b"kept\n").expect("write");
            drop(line);
            let mut line = Stderr.make_writer_for(&WARN_META);
            line.write_all(b"a warning\n").expect("write");
            drop(line);
            assert_eq!(pending(), 0, "a warning writes out what came before it too");

            let long = vec![b'x'; LIMIT];
            let mut line = Stderr.make_writer_for(&INFO_META);
            line.write_all(&long).expect("write");
            drop(line);
            assert_eq!(pending(), 0, "a full buffer is written");
        })
        .join()
        .expect("thread");
    }

    struct Callsite;
    impl tracing::callsite::Callsite for Callsite {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            &INFO_META
        }
    }
    static CALLSITE: Callsite = Callsite;
    static INFO_META: Metadata<'static> = tracing::metadata! {
        name: "info",
        target: "idemgate::access",
        level: Level::INFO,
        fields: &[],
        callsite: &CALLSITE,
        kind: tracing::metadata::Kind::EVENT,
    };
    static WARN_META: Metadata<'static> = tracing::metadata! {
        name: "warn",
        target: "idemgate",
        level: Level::WARN,
        fields: &[],
        callsite: &CALLSITE,
        kind: tracing::metadata::Kind::EVENT,
    };
}
