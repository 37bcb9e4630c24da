//! Allocation counts for the benchmark's account of a request (feature `alloc-stats`):
//! the allocator behind a counting wrapper, and the totals as two counters of `/metrics`,
//! read by the harness before and after a run (BENCHMARKS.md, "The account of a
//! request"). The counting is an atomic add per call, so this is a build to count with,
//! not to time: without the feature, the binary's allocator is mimalloc alone
//! (src/main.rs). The wrapper's constructor is `const` only around the system allocator
//! (on stable Rust), so this build allocates from glibc: the calls and bytes a request
//! asks for are the same whichever allocator serves them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use stats_alloc::StatsAlloc;

#[global_allocator]
static ALLOCATOR: StatsAlloc<std::alloc::System> = StatsAlloc::system();

/// The totals since the process started, rendered on each scrape.
#[derive(Debug)]
pub(crate) struct AllocCounters;

impl Collector for AllocCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = ALLOCATOR.stats();
        // A reallocation is a call to the allocator too, and its growth is new bytes.
        let calls = stats.allocations + stats.reallocations;
        let bytes = stats.bytes_allocated + stats.bytes_reallocated.max(0).unsigned_abs();
        for (name, help, value) in [
            (
                "idemgate_alloc_calls",
                "Allocations and reallocations since start (build feature alloc-stats)",
                calls,
            ),
            (
                "idemgate_alloc_bytes",
                "Bytes allocated since start, reallocations' growth included (build feature alloc-stats)",
                bytes,
            ),
        ] {
            let counter = ConstCounter::new(value as u64);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}
