//! Traces (docs/behaviour.md §20): a server span per request, a child span per store
//! call and per upstream call, W3C `traceparent` / `tracestate` in and out, exported
//! over OTLP by a thread of their own (`export.rs`).
//!
//! Built on the OpenTelemetry API directly, not through `tracing`: the configuration in
//! force holds an `Option<Arc<Telemetry>>`, and with no exporter the handler takes the
//! untraced path on that one branch, so no span, context or attribute is ever made.
//! With one, the request's work runs inside an OpenTelemetry [`Context`] that holds its
//! server span and the tracer ([`Traced`]); the store decorator and the upstream client
//! find both there ([`child`], [`upstream`]), without a parameter threaded through every
//! call between them.

mod export;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, Span};

use crate::config::OtlpConfig;
use crate::metrics::{Outcome, SpanDrops};

pub use export::TelemetryError;

/// The W3C trace-context headers: replaced on the way upstream when idemgate traces,
/// passed through untouched when it does not, never stored in a record.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// How many exporters exist. While none does, the store decorator and the upstream
/// client find out with one load, without looking at the context.
static EXPORTERS: AtomicUsize = AtomicUsize::new(0);

fn tracing_anywhere() -> bool {
    EXPORTERS.load(Ordering::Relaxed) != 0
}

/// An exporter in force: the tracer spans are made with, and the thread that sends them.
#[derive(Debug)]
pub struct Telemetry {
    config: OtlpConfig,
    tracer: SdkTracer,
    /// Kept so that spans are flushed when the last holder goes (a reload, the end).
    provider: SdkTracerProvider,
    exporter: export::Exporter,
}

/// What a traced request's context carries besides its server span: how its child
/// spans are made.
#[derive(Debug)]
struct Traced(SdkTracer);

impl Telemetry {
    /// Starts the exporter's thread; spans it cannot deliver are counted in `drops`.
    pub fn start(config: &OtlpConfig, drops: SpanDrops) -> Result<Telemetry, TelemetryError> {
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        let (queue, exporter) = export::start(config, resource.clone(), drops)?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            // A request that arrives with a sampling decision keeps it, so that a trace
            // is whole or absent; `sample_ratio` decides for the traces idemgate starts.
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("idemgate");
        EXPORTERS.fetch_add(1, Ordering::Relaxed);
        Ok(Telemetry {
            config: config.clone(),
            tracer,
            provider,
            exporter,
        })
    }

    /// The configuration it was started with: a reload that keeps it keeps the exporter.
    pub fn config(&self) -> &OtlpConfig {
        &self.config
    }

    /// Sends what is queued and stops the exporter, waiting at most `timeout`: at exit.
    /// Whether all of it was sent (or dropped) in time.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        let _ = self.provider.force_flush();
        self.exporter.stop(timeout)
    }

    /// The context a request's work runs in: its server span, child of the request's
    /// `traceparent` when it has a valid one, with the request's method and path.
    ///
    /// A trace the sampler leaves out still has its span (its context names the trace to
    /// the upstream), but no attribute is made for it: the sampler (ratio and parent
    /// based) does not read them.
    pub fn server(&self, method: &Method, path: &str, headers: &HeaderMap) -> Context {
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let mut span = self
            .tracer
            .span_builder(method.as_str().to_owned())
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &parent);
        if span.is_recording() {
            span.set_attributes([
                KeyValue::new("http.request.method", method.as_str().to_owned()),
                KeyValue::new("url.path", path.to_owned()),
            ]);
        }
        parent
            .with_span(span)
            .with_value(Traced(self.tracer.clone()))
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        EXPORTERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a request ended, for its server span.
#[derive(Debug, Clone)]
pub struct Answered {
    pub status: StatusCode,
    pub outcome: Outcome,
    /// Whether the answer carries `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// The record's id (`key_prefix` + hex), when the request was addressed one.
    pub record_id: Option<String>,
}

/// Ends the server span of `cx` with the answer's attributes; the `idempotency.*` ones
/// only for a request the guard handled (any outcome but `passthrough`).
pub fn end_server(cx: &Context, answered: Answered) {
    let span = cx.span();
    if !span.is_recording() {
        span.end();
        return;
    }
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(answered.status.as_u16()),
    ));
    if answered.outcome != Outcome::Passthrough {
        span.set_attribute(KeyValue::new(
            "idempotency.outcome",
            answered.outcome.as_str(),
        ));
        span.set_attribute(KeyValue::new("idempotency.replayed", answered.replayed));
        if let Some(id) = answered.record_id {
            span.set_attribute(KeyValue::new("idempotency.record_id", id));
        }
    }
    // A server span is in error for a 5xx only (HTTP semantic conventions).
    if answered.status.is_server_error() {
        span.set_status(Status::error(""));
    }
    span.end();
}

/// A store call's span under the current request's server span, or `None` outside a
/// traced request (no exporter, a background task, the admin listener) and in a trace
/// the sampler left out: then nothing is made. Under the parent-based sampler a child
/// of a span left out is left out too, and a store call's span names nothing to anyone.
pub fn child(name: &'static str, kind: SpanKind) -> Option<Box<Span>> {
    span_under_request(name, kind, false)
}

/// A span under the current request's server span, when there is one; with `always`, in
/// a trace left out too (not recorded, but its context is sent on).
///
/// Boxed: it is held across the call it times, and inline its few hundred bytes would
/// be in every store call's and upstream call's future, traced or not.
fn span_under_request(name: &'static str, kind: SpanKind, always: bool) -> Option<Box<Span>> {
    if !tracing_anywhere() {
        return None;
    }
    Context::map_current(|cx| {
        let Traced(tracer) = cx.get::<Traced>()?;
        if !always && !cx.span().is_recording() {
            return None;
        }
        Some(Box::new(
            tracer
                .span_builder(name)
                .with_kind(kind)
                .start_with_context(tracer, cx),
        ))
    })
}

/// Adds an event (a wait, a take-over) to the current request's server span; the
/// attributes are made only when there is one.
pub fn event(name: &'static str, attributes: impl FnOnce() -> Vec<KeyValue>) {
    if !tracing_anywhere() {
        return;
    }
    Context::map_current(|cx| {
        if cx.get::<Traced>().is_some() && cx.span().is_recording() {
            cx.span().add_event(name, attributes());
        }
    });
}

/// The current context, when it is a traced request's: for work that leaves the
/// request's future (an exchange that goes on after its client left).
pub fn current() -> Option<Context> {
    if !tracing_anywhere() {
        return None;
    }
    Context::map_current(|cx| cx.get::<Traced>().is_some().then(|| cx.clone()))
}

/// The `url.path` an upstream call's span shows in place of its request's own, set on
/// the request as an extension: a reconcile lookup's path holds the raw key, which no
/// span carries, so it is shown with `{key}` in its place (docs/behaviour.md §25).
#[derive(Debug, Clone)]
pub struct ShownPath(pub String);

/// The span of a call to the upstream, when the request is traced: the request's own
/// `traceparent` and `tracestate` are replaced by this span's. Traced or not, an empty
/// `tracestate` is not forwarded (docs/behaviour.md §25).
pub fn upstream<B>(request: &mut Request<B>) -> Option<Box<Span>> {
    drop_empty_tracestate(request.headers_mut());
    // Made in a trace left out too: the upstream is told the trace and that it is not
    // sampled, under this span's id.
    let mut span = span_under_request("upstream", SpanKind::Client, true)?;
    if span.is_recording() {
        let path = match request.extensions().get::<ShownPath>() {
            Some(ShownPath(shown)) => shown.clone(),
            None => request.uri().path().to_owned(),
        };
        span.set_attributes([
            KeyValue::new("http.request.method", request.method().as_str().to_owned()),
            KeyValue::new(
                "server.address",
                request.uri().host().unwrap_or_default().to_owned(),
            ),
            KeyValue::new("url.path", path),
        ]);
    }
    let headers = request.headers_mut();
    headers.remove(&TRACEPARENT);
    headers.remove(&TRACESTATE);
    let cx = Context::new().with_remote_span_context(span.span_context().clone());
    TraceContextPropagator::new().inject_context(&cx, &mut HeadersMut(headers));
    Some(span)
}

/// Removes the `tracestate` lines that hold no list member (empty, or only spaces and
/// commas): they carry no vendor's state, and some servers refuse a trace context
/// that has one. The lines with members go on as they came.
fn drop_empty_tracestate(headers: &mut HeaderMap) {
    // The common case, none or all with members: looked at, nothing moved.
    if !headers.get_all(&TRACESTATE).iter().any(empty_tracestate) {
        return;
    }
    let kept: Vec<HeaderValue> = headers
        .get_all(&TRACESTATE)
        .iter()
        .filter(|value| !empty_tracestate(value))
        .cloned()
        .collect();
    headers.remove(&TRACESTATE);
    for value in kept {
        headers.append(&TRACESTATE, value);
    }
}

/// Whether a `tracestate` value holds no list member (W3C Trace Context: members are
/// separated by commas, with optional spaces and tabs around them).
fn empty_tracestate(value: &HeaderValue) -> bool {
    value
        .as_bytes()
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b','))
}

/// Ends an upstream call's span with its status, or in error with why it failed.
pub fn upstream_ended(mut span: Box<Span>, answered: Result<StatusCode, String>) {
    if !span.is_recording() {
        span.end();
        return;
    }
    match answered {
        Ok(status) => {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status.as_u16()),
            ));
            if status.is_server_error() {
                span.set_status(Status::error(""));
            }
        }
        Err(why) => span.set_status(Status::error(why)),
    }
    span.end();
}

/// A store call's span, in error when the call failed.
pub fn store_ended<T, E: std::fmt::Display>(mut span: Box<Span>, result: &Result<T, E>) {
    if let Err(err) = result {
        span.set_status(Status::error(err.to_string()));
    }
    span.end();
}

/// Reads trace-context headers for the propagator.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    /// The first line of `key`; for `tracestate`, the first that has members, so that
    /// an empty line before one with members does not hide it.
    fn get(&self, key: &str) -> Option<&str> {
        let value = if key == TRACESTATE.as_str() {
            self.0
                .get_all(key)
                .iter()
                .find(|value| !empty_tracestate(value))?
        } else {
            self.0.get(key)?
        };
        value.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Writes trace-context headers for the propagator.
struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    /// An empty value is not written: the propagator sets `tracestate` even when the
    /// span's trace state is empty (docs/behaviour.md §25).
    fn set(&mut self, key: &str, value: String) {
        if value.is_empty() {
            return;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
