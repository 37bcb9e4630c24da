//! An OpenTelemetry collector stand-in on 127.0.0.1:0: it decodes the
//! `ExportTraceServiceRequest`s idemgate sends, over OTLP/HTTP (`POST /v1/traces`,
//! protobuf) and OTLP/gRPC (plain HTTP/2), and keeps their spans for the test to read.
//! [`Receiver::hold`] makes it a slow collector: each export waits, unanswered, until
//! the test calls [`Receiver::release`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

/// The gRPC method of OTLP trace export.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// One span as the collector received it.
#[derive(Debug, Clone)]
pub struct GotSpan {
    pub name: String,
    /// Hex, as in a `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `SpanKind` as OTLP numbers it: 2 server, 3 client, 1 internal.
    pub kind: i32,
    pub attributes: HashMap<String, Attr>,
    pub events: Vec<String>,
    /// The `service.name` of its resource.
    pub service: String,
    /// OTLP status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    /// How the export came: `http` or `grpc`, and its headers.
    pub transport: &'static str,
    pub headers: HeaderMap,
}

impl GotSpan {
    pub fn attr(&self, key: &str) -> Option<&Attr> {
        self.attributes.get(key)
    }
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Str(String),
    Bool(bool),
    Int(i64),
    Other(String),
}

struct Shared {
    spans: Mutex<Vec<GotSpan>>,
    changed: Notify,
    /// Exports that arrived (answered or held).
    exports: Mutex<usize>,
    held: Mutex<bool>,
    gate: Semaphore,
}

pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            spans: Mutex::default(),
            changed: Notify::new(),
            exports: Mutex::new(0),
            held: Mutex::new(false),
            gate: Semaphore::new(0),
        });
        let task = super::serve_each(listener, Arc::clone(&shared), |shared, req| async move {
            Ok::<_, Infallible>(receive(&shared, req).await)
        });
        Receiver { addr, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<GotSpan> {
        self.shared.spans.lock().expect("lock").clone()
    }

    pub fn exports(&self) -> usize {
        *self.shared.exports.lock().expect("lock")
    }

    /// From now on each export waits for [`Receiver::release`].
    pub fn hold(&self) {
        *self.shared.held.lock().expect("lock") = true;
    }

    /// Answers every held export, and those to come.
    pub fn release(&self) {
        *self.shared.held.lock().expect("lock") = false;
        self.shared.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    /// Waits (10 s at most) until `cond` holds of what arrived, and returns it.
    pub async fn wait_until(&self, what: &str, cond: impl Fn(&Receiver) -> bool) {
        let wait = async {
            loop {
                let changed = self.shared.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if cond(self) {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("the collector never got {what}: {:#?}", self.spans()));
    }

    /// Waits until a span named `name` of trace `trace_id` arrived, and returns it.
    pub async fn span(&self, trace_id: &str, name: &str) -> GotSpan {
        let find = |r: &Receiver| {
            r.spans()
                .into_iter()
                .find(|s| s.trace_id == trace_id && s.name == name)
        };
        self.wait_until(&format!("span {name} of trace {trace_id}"), |r| {
            find(r).is_some()
        })
        .await;
        find(self).expect("found")
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(shared: &Shared, req: Request<Incoming>) -> Response<BoxBody<Bytes, Infallible>> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return status(StatusCode::BAD_REQUEST);
    };
    *shared.exports.lock().expect("lock") += 1;
    shared.changed.notify_waiters();
    let held = *shared.held.lock().expect("lock");
    if held {
        let _ = shared
            .gate
            .acquire()
            .await
            .map(tokio::sync::SemaphorePermit::forget);
    }
    let (transport, message) = match parts.uri.path() {
        "/v1/traces" => ("http", &body[..]),
        // A gRPC message: a compression flag, a 4-byte length, then the protobuf.
        GRPC_EXPORT if body.len() >= 5 && body[0] == 0 => ("grpc", &body[5..]),
        _ => return status(StatusCode::NOT_FOUND),
    };
    let Ok(request) = ExportTraceServiceRequest::decode(message) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let got = spans_of(&request, transport, &parts.headers);
    shared.spans.lock().expect("lock").extend(got);
    shared.changed.notify_waiters();
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    if transport == "grpc" {
        let mut framed = vec![0u8];
        framed.extend_from_slice(&u32::try_from(answer.len()).expect("small").to_be_bytes());
        framed.extend_from_slice(&answer);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body = Full::new(Bytes::from(framed))
            .with_trailers(async move { Some(Ok(trailers)) })
            .boxed();
        return Response::builder()
            .header("content-type", "application/grpc")
            .body(body)
            .expect("response");
    }
    Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(answer)).boxed())
        .expect("response")
}

fn status(status: StatusCode) -> Response<BoxBody<Bytes, Infallible>> {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()).boxed())
        .expect("response")
}

fn spans_of(
    request: &ExportTraceServiceRequest,
    transport: &'static str,
    headers: &HeaderMap,
) -> Vec<GotSpan> {
    let mut got = Vec::new();
    for resource_spans in &request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .map(|kv| attr(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .map_or_else(String::new, |a| match a {
                Attr::Str(s) => s,
                other => format!("{other:?}"),
            });
        for scope in &resource_spans.scope_spans {
            for span in &scope.spans {
                got.push(GotSpan {
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| {
                            (
                                kv.key.clone(),
                                attr(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                            )
                        })
                        .collect(),
                    events: span.events.iter().map(|e| e.name.clone()).collect(),
                    service: service.clone(),
                    status: span.status.as_ref().map_or(0, |s| s.code),
                    transport,
                    headers: headers.clone(),
                });
            }
        }
    }
    got
}

fn attr(value: Option<&Value>) -> Attr {
    match value {
        Some(Value::StringValue(s)) => Attr::Str(s.clone()),
        Some(Value::BoolValue(b)) => Attr::Bool(*b),
        Some(Value::IntValue(n)) => Attr::Int(*n),
        other => Attr::Other(format!("{other:?}")),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
