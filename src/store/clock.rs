//! The embedded stores' notion of "now" (docs/behaviour.md §5): injectable, so that
//! tests drive expiry with tokio's paused clock. Shared by the memory and file stores.

use super::api::millis;

/// The store's notion of "now", injectable so tests control time.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// Wall-clock time advanced by tokio's clock, so `tokio::time::pause()` and `advance()`
/// drive expiry in tests.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: tokio::time::Instant,
    base_unix_ms: u64,
}

impl Default for TokioClock {
    fn default() -> Self {
        let base_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, millis);
        Self {
            base: tokio::time::Instant::now(),
            base_unix_ms,
        }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.base_unix_ms + millis(self.base.elapsed())
    }
}
