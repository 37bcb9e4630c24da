//! Between a span's end and the collector (docs/behaviour.md §20).
//!
//! A request that ends a span only offers it to a bounded queue ([`Queue`], the SDK's
//! span processor): it never waits, and a span the queue has no room for is dropped and
//! counted. Nor does it wake anyone: the queue is read every [`FLUSH_EVERY`], or when it
//! is half full, by a thread of its own with its own runtime (a reader woken for every
//! span cost a thread switch per span: a third of what tracing added to a first
//! execution, BENCHMARKS.md, issue 31), which sends batches through the OTLP exporter (hyper for `http/protobuf`, tonic for `grpc`), so
//! that a slow or absent collector costs the workers nothing. A batch the collector
//! refuses, or that cannot reach it, is dropped and counted too; the drops are logged
//! at `warn` at most once a minute.
//!
//! The SDK's own batch processor is not used: its drops are not counted anywhere a
//! metric can read, and its HTTP export would need a runtime on its plain thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_otlp::tonic_types::metadata::MetadataMap;
use opentelemetry_otlp::{
    Protocol, SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter as _, SpanProcessor};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::config::{OtlpConfig, OtlpProtocol};
use crate::metrics::SpanDrops;

/// Spans waiting for the exporter; past it, spans are dropped.
const QUEUE: usize = 2048;
/// Spans per export request, at most.
const BATCH: usize = 512;
/// How often the queue is read when it is less than half full.
const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// One export, its retries included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Drops are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Why the exporter did not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry.otlp: {0}")]
    Build(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("cannot start the trace exporter's thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the trace exporter's thread ended before it started")]
    Gone,
}

/// The span processor: offers each ended (sampled) span to the queue, never waiting.
#[derive(Debug)]
pub(super) struct Queue {
    spans: mpsc::Sender<SpanData>,
    /// Wakes the exporter's thread early, once the queue is half full.
    half_full: Arc<Notify>,
    dropped: Arc<Dropped>,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        match self.spans.try_send(span) {
            Ok(()) => {
                if self.spans.capacity() <= QUEUE / 2 {
                    self.half_full.notify_one();
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped
                    .count(1, "the export queue is full (the collector is slow)");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.dropped.count(1, "the exporter has stopped");
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// The queue closes when the processor is dropped with its provider; the thread then
    /// sends what is left and ends.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The exporter's thread, seen from the proxy.
#[derive(Debug)]
pub(super) struct Exporter {
    stop: CancellationToken,
    done: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Exporter {
    /// Asks the thread to send what is queued and end; waits at most `timeout`.
    /// Whether it ended in time (or had already).
    pub(super) fn stop(&self, timeout: Duration) -> bool {
        self.stop.cancel();
        let done = self.done.lock().map(|mut done| done.take()).ok().flatten();
        match done {
            Some(done) => !matches!(
                done.recv_timeout(timeout),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            ),
            None => true,
        }
    }
}

/// Drops, counted and logged.
#[derive(Debug)]
struct Dropped {
    drops: SpanDrops,
    endpoint: String,
    /// Since the last `warn`.
    unreported: AtomicU64,
    /// Milliseconds after `epoch` before which no `warn` is written.
    quiet_until_ms: AtomicU64,
    epoch: Instant,
}

impl Dropped {
    fn count(&self, spans: u64, why: &str) {
        self.drops.add(spans);
        self.unreported.fetch_add(spans, Ordering::Relaxed);
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let quiet = self.quiet_until_ms.load(Ordering::Relaxed);
        if now < quiet {
            return;
        }
        let next = now.saturating_add(u64::try_from(WARN_EVERY.as_millis()).unwrap_or(0));
        // One of the threads that see the minute over writes the line.
        if self
            .quiet_until_ms
            .compare_exchange(quiet, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let dropped = self.unreported.swap(0, Ordering::Relaxed);
            tracing::warn!(
                dropped,
                endpoint = %self.endpoint,
                reason = why,
                "traces: spans dropped (counted in idemgate_trace_spans_dropped_total); \
                 requests are not affected"
            );
        }
    }
}

/// Builds the exporter on a thread of its own and starts sending from the queue.
pub(super) fn start(
    config: &OtlpConfig,
    resource: Resource,
    drops: SpanDrops,
) -> Result<(Queue, Exporter), TelemetryError> {
    let (spans, queued) = mpsc::channel(QUEUE);
    let half_full = Arc::new(Notify::new());
    let dropped = Arc::new(Dropped {
        drops,
        endpoint: config.traces_url(),
        unreported: AtomicU64::new(0),
        quiet_until_ms: AtomicU64::new(0),
        epoch: Instant::now(),
    });
    let stop = CancellationToken::new();
    let (built, was_built) = std::sync::mpsc::channel();
    let (finished, done) = std::sync::mpsc::channel();
    let thread = {
        let (config, stop, dropped) = (config.clone(), stop.clone(), Arc::clone(&dropped));
        let half_full = Arc::clone(&half_full);
        move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = built.send(Err(TelemetryError::Thread(err)));
                    return;
                }
            };
            runtime.block_on(async move {
                // tonic's channel is made on the runtime that drives it.
                let mut exporter = match exporter(&config) {
                    Ok(exporter) => exporter,
                    Err(err) => {
                        let _ = built.send(Err(err));
                        return;
                    }
                };
                exporter.set_resource(&resource);
                let _ = built.send(Ok(()));
                send(&exporter, queued, &half_full, &stop, &dropped).await;
                let _ = exporter.shutdown();
            });
            drop(runtime);
            crate::logs::flush();
            let _ = finished.send(());
        }
    };
    std::thread::Builder::new()
        .name("otlp-export".to_owned())
        .spawn(thread)
        .map_err(TelemetryError::Thread)?;
    was_built.recv().map_err(|_| TelemetryError::Gone)??;
    Ok((
        Queue {
            spans,
            half_full,
            dropped,
        },
        Exporter {
            stop,
            done: std::sync::Mutex::new(Some(done)),
        },
    ))
}

/// The OTLP exporter `config` names.
fn exporter(config: &OtlpConfig) -> Result<SpanExporter, TelemetryError> {
    let url = config.traces_url();
    let exporter = match config.protocol {
        OtlpProtocol::HttpProtobuf => {
            let headers: HashMap<String, String> = config
                .headers
                .iter()
                .map(|(name, value)| {
                    let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                    (name.as_str().to_owned(), value)
                })
                .collect();
            SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url)
                .with_timeout(EXPORT_TIMEOUT)
                .with_headers(headers)
                .build()?
        }
        OtlpProtocol::Grpc => {
            let mut headers = http::HeaderMap::new();
            for (name, value) in &config.headers {
                headers.append(name.clone(), value.clone());
            }
            SpanExporter::builder()
                .with_tonic()
                .with_protocol(Protocol::Grpc)
                .with_endpoint(url)
                .with_timeout(EXPORT_TIMEOUT)
                .with_metadata(MetadataMap::from_headers(headers))
                .build()?
        }
    };
    Ok(exporter)
}

/// Sends batches until the queue closes (the provider was dropped) or `stop`, then what
/// is left. The queue is only ever read with `try_recv`: a receiver waiting in `recv`
/// would be woken by every span sent.
async fn send(
    exporter: &SpanExporter,
    mut queued: mpsc::Receiver<SpanData>,
    half_full: &Notify,
    stop: &CancellationToken,
    dropped: &Dropped,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let stopping = tokio::select! {
            biased;
            () = stop.cancelled() => true,
            () = half_full.notified() => false,
            () = tokio::time::sleep(FLUSH_EVERY) => false,
        };
        if stopping || !drain(exporter, &mut queued, &mut batch, dropped).await {
            break;
        }
    }
    drain(exporter, &mut queued, &mut batch, dropped).await;
}

/// Exports what is queued, a batch at a time; `false` once the queue has closed.
async fn drain(
    exporter: &SpanExporter,
    queued: &mut mpsc::Receiver<SpanData>,
    batch: &mut Vec<SpanData>,
    dropped: &Dropped,
) -> bool {
    loop {
        let open = loop {
            if batch.len() == BATCH {
                break true;
            }
            match queued.try_recv() {
                Ok(span) => batch.push(span),
                Err(mpsc::error::TryRecvError::Empty) => break true,
                Err(mpsc::error::TryRecvError::Disconnected) => break false,
            }
        };
        let full = batch.len() == BATCH;
        if !batch.is_empty() {
            export(exporter, batch, dropped).await;
        }
        if !open || !full {
            return open;
        }
    }
}

/// One export of `batch`, emptied; what does not arrive is counted as dropped.
async fn export(exporter: &SpanExporter, batch: &mut Vec<SpanData>, dropped: &Dropped) {
    let spans = std::mem::replace(batch, Vec::with_capacity(BATCH));
    let count = spans.len() as u64;
    // The exporter's own timeout bounds each attempt and its retries; this bounds the
    // whole, whatever the transport does.
    match tokio::time::timeout(EXPORT_TIMEOUT * 2, exporter.export(spans)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => dropped.count(count, &err.to_string()),
        Err(_) => dropped.count(count, "the collector did not answer in time"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn drops_are_all_counted_and_reported_at_most_once_a_minute() {
        let metrics = Metrics::new();
        let dropped = Dropped {
            drops: metrics.span_drops(),
            endpoint: "http://127.0.0.1:4318/v1/traces".to_owned(),
            unreported: AtomicU64::new(0),
            quiet_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        };
        dropped.count(3, "refused");
        // Reported at once: nothing left to report, and quiet for a minute.
        assert_eq!(dropped.unreported.load(Ordering::Relaxed), 0);
        let quiet = dropped.quiet_until_ms.load(Ordering::Relaxed);
        assert!(quiet >= 60_000, "{quiet}");
        dropped.count(2, "refused");
        dropped.count(1, "full");
        // Counted, not reported within the minute.
        assert_eq!(metrics.spans_dropped(), 6);
        assert_eq!(dropped.unreported.load(Ordering::Relaxed), 3);
        assert_eq!(dropped.quiet_until_ms.load(Ordering::Relaxed), quiet);
        // A minute later, the next drop reports all that were not.
        dropped.quiet_until_ms.store(0, Ordering::Relaxed);
        dropped.count(1, "refused");
        assert_eq!(dropped.unreported.load(Ordering::Relaxed), 0);
        assert_eq!(metrics.spans_dropped(), 7);
        assert!(dropped.quiet_until_ms.load(Ordering::Relaxed) >= 60_000);
    }
}
