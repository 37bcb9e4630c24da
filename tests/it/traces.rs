//! Traces (docs/behaviour.md §20), against a real OTLP receiver (`support/otlp.rs`): the
//! spans of a request and their attributes, the trace carried from the client through
//! idemgate to the upstream, a replay's span, trace headers untouched with no exporter,
//! a collector that is down or slow, gRPC, and a reload that starts the exporter.

use crate::support;

use std::time::Duration;

use idemgate::config::Config;
use idemgate::proxy::reload::reload;
use support::bin::{Running, TempConfig, free_port};
use support::otlp::{Attr, GotSpan, Receiver};
use support::{Proxy, Resp, TestClient, Upstream};

const JSON: (&str, &str) = ("content-type", "application/json");
/// The client's trace, and its span that idemgate's server span is a child of.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// A client's trace that it marks not sampled.
const DECLINED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// POSTs `{}` to `/charges` with `key`, in the client's trace `parent`.
async fn charge(client: &TestClient, key: &str, parent: &str) -> Resp {
    client
        .send(
            "POST",
            "/charges",
            &[("idempotency-key", key), JSON, ("traceparent", parent)],
            "{}",
        )
        .await
}

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// A proxy in front of `up` exporting to `endpoint` over `protocol`.
async fn traced_proxy(up: &Upstream, endpoint: &str, protocol: &str) -> Proxy {
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\ntelemetry:\n  otlp:\n    endpoint: {endpoint}\n    \
         protocol: {protocol}\n    service_name: payments-gate\n    headers:\n      \
         x-tenant: acme\n"
    );
    Proxy::start(&yaml, up).await
}

fn str_attr(span: &GotSpan, key: &str) -> String {
    match span.attr(key) {
        Some(Attr::Str(s)) => s.clone(),
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

/// The trace-context fields of a `traceparent`: trace id, parent span id, flags.
fn fields(traceparent: &str) -> (String, String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

#[tokio::test]
async fn a_guarded_request_is_a_server_span_with_store_and_upstream_children_in_the_clients_trace()
{
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let proxy = traced_proxy(&up, &collector.url(), "http/protobuf").await;
    let parent = traceparent(TRACE, CLIENT_SPAN);
    let answer = proxy
        .client()
        .send(
            "POST",
            "/charges",
            &[
                ("idempotency-key", "k1"),
                JSON,
                ("traceparent", &parent),
                ("tracestate", "vendor=opaque"),
            ],
            "{}",
        )
        .await;
    assert_eq!(answer.status, 201);

    let server = collector.span(TRACE, "POST").await;
    let claim = collector.span(TRACE, "store.claim").await;
    let complete = collector.span(TRACE, "store.complete").await;
    let upstream = collector.span(TRACE, "upstream").await;
    assert_eq!(
        server.parent_span_id, CLIENT_SPAN,
        "the client's span is the parent"
    );
    assert_eq!(server.kind, 2, "a server span");
    assert_eq!(str_attr(&server, "http.request.method"), "POST");
    assert_eq!(str_attr(&server, "url.path"), "/charges");
    assert_eq!(
        server.attr("http.response.status_code"),
        Some(&Attr::Int(201))
    );
    assert_eq!(str_attr(&server, "idempotency.outcome"), "forwarded");
    assert_eq!(
        server.attr("idempotency.replayed"),
        Some(&Attr::Bool(false))
    );
    assert_eq!(
        str_attr(&server, "idempotency.record_id"),
        proxy.record_id("/charges", "k1")
    );
    assert_eq!(server.service, "payments-gate");
    assert_eq!(server.transport, "http");
    assert_eq!(server.headers["x-tenant"], "acme", "the configured headers");
    for child in [&claim, &complete, &upstream] {
        assert_eq!(
            child.parent_span_id, server.span_id,
            "{} under the server span",
            child.name
        );
    }
    assert_eq!(upstream.kind, 3, "a client span");
    assert_eq!(
        upstream.attr("http.response.status_code"),
        Some(&Attr::Int(201))
    );

    // The upstream was called under the upstream call's span, in the client's trace,
    // with the client's tracestate.
    let seen = up.seen();
    let sent = seen[0].headers["traceparent"].to_str().expect("ascii");
    let (trace, parent_span, flags) = fields(sent);
    assert_eq!(
        (trace.as_str(), parent_span.as_str(), flags.as_str()),
        (TRACE, upstream.span_id.as_str(), "01")
    );
    assert_eq!(seen[0].headers["tracestate"], "vendor=opaque");
    proxy.stop().await;
}

#[tokio::test]
async fn a_replay_is_traced_as_replayed_and_never_carries_the_first_requests_trace_headers() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let proxy = traced_proxy(&up, &collector.url(), "http/protobuf").await;
    let c = proxy.client();
    let first_parent = traceparent(TRACE, CLIENT_SPAN);
    let first = charge(&c, "k2", &first_parent).await;
    // The upstream echoes the trace context it was called under.
    assert!(
        first.headers.contains_key("traceparent"),
        "{:?}",
        first.headers
    );

    let retry_trace = "0af7651916cd43dd8448eb211c80319c";
    let retry_parent = traceparent(retry_trace, "b7ad6b7169203331");
    let retry = charge(&c, "k2", &retry_parent).await;
    assert!(retry.replayed());
    assert_eq!(up.count(), 1, "a replay goes nowhere upstream");
    assert!(
        !retry.headers.contains_key("traceparent") && !retry.headers.contains_key("tracestate"),
        "the first request's trace context is not replayed: {:?}",
        retry.headers
    );

    let replay = collector.span(retry_trace, "POST").await;
    assert_eq!(replay.parent_span_id, "b7ad6b7169203331");
    assert_eq!(str_attr(&replay, "idempotency.outcome"), "replayed");
    assert_eq!(replay.attr("idempotency.replayed"), Some(&Attr::Bool(true)));
    assert_eq!(
        str_attr(&replay, "idempotency.record_id"),
        proxy.record_id("/charges", "k2")
    );
    let claim = collector.span(retry_trace, "store.claim").await;
    assert_eq!(claim.parent_span_id, replay.span_id);
    assert!(
        !collector
            .spans()
            .iter()
            .any(|s| s.trace_id == retry_trace && s.name == "upstream"),
        "no upstream call in the replay's trace"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn passed_through_requests_get_a_server_span_without_idempotency_attributes() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let proxy = traced_proxy(&up, &collector.url(), "http/protobuf").await;
    let answer = proxy.client().send("GET", "/status/503", &[], "").await;
    assert_eq!(answer.status, 503);
    collector
        .wait_until("a GET span", |r| r.spans().iter().any(|s| s.name == "GET"))
        .await;
    let spans = collector.spans();
    let server = spans.iter().find(|s| s.name == "GET").expect("server span");
    assert_eq!(server.parent_span_id, "", "no traceparent: a root span");
    assert_eq!(
        server.attr("http.response.status_code"),
        Some(&Attr::Int(503))
    );
    assert_eq!(server.status, 2, "a 5xx is an error");
    assert!(
        server
            .attributes
            .keys()
            .all(|k| !k.starts_with("idempotency.")),
        "{:?}",
        server.attributes
    );
    let upstream = collector.span(&server.trace_id, "upstream").await;
    assert_eq!(upstream.parent_span_id, server.span_id);
    let sent = up.seen()[0].headers["traceparent"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert_eq!(fields(&sent).1, upstream.span_id);
    proxy.stop().await;
}

#[tokio::test]
async fn without_an_exporter_trace_headers_pass_through_unchanged() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(support::BASIC, &up).await;
    let parent = traceparent(TRACE, CLIENT_SPAN);
    for (method, key) in [("POST", Some("k3")), ("GET", None)] {
        let mut headers = vec![
            JSON,
            ("traceparent", parent.as_str()),
            ("tracestate", "vendor=opaque"),
        ];
        if let Some(key) = key {
            headers.push(("idempotency-key", key));
        }
        proxy
            .client()
            .send(method, "/charges", &headers, "{}")
            .await;
    }
    for seen in up.seen() {
        assert_eq!(
            seen.headers["traceparent"],
            parent.as_str(),
            "{}",
            seen.method
        );
        assert_eq!(seen.headers["tracestate"], "vendor=opaque");
    }
    assert_eq!(up.count(), 2);
    // The metric is there all the same.
    assert!(
        proxy
            .state
            .metrics
            .render()
            .contains("idemgate_trace_spans_dropped_total 0"),
        "{}",
        proxy.state.metrics.render()
    );
    proxy.stop().await;
}

/// An empty `tracestate` carries no vendor's state, and some servers refuse the trace
/// context that holds one: it is not forwarded (docs/behaviour.md §25), neither when it
/// passes through (no exporter) nor when idemgate writes the upstream call's context
/// (an exporter), which had sent an empty one for every request that brought none.
/// A `tracestate` line with members still goes, beside an empty one.
#[tokio::test]
async fn an_empty_tracestate_is_never_forwarded() {
    let parent = traceparent(TRACE, CLIENT_SPAN);
    let collector = Receiver::start().await;
    for traced in [false, true] {
        let up = Upstream::start().await;
        let proxy = if traced {
            traced_proxy(&up, &collector.url(), "http/protobuf").await
        } else {
            Proxy::start(support::BASIC, &up).await
        };
        // The key, the client's `tracestate` lines, and those the upstream gets.
        let cases: [(&str, &[&str], &[&str]); 4] = [
            ("k-empty", &[""], &[]),
            ("k-commas", &[" , ,"], &[]),
            ("k-absent", &[], &[]),
            ("k-beside", &["", "vendor=opaque"], &["vendor=opaque"]),
        ];
        for (key, states, members) in cases {
            for (method, key) in [("POST", Some(key)), ("GET", None)] {
                let mut headers = vec![JSON, ("traceparent", parent.as_str())];
                headers.extend(states.iter().map(|state| ("tracestate", *state)));
                headers.extend(key.map(|key| ("idempotency-key", key)));
                let answer = proxy
                    .client()
                    .send(method, "/charges", &headers, "{}")
                    .await;
                assert!(
                    answer.status.is_success(),
                    "{method} {states:?}: {answer:?}"
                );
                let seen = up.seen().pop().expect("forwarded");
                let sent: Vec<&str> = seen
                    .headers
                    .get_all("tracestate")
                    .iter()
                    .map(|v| v.to_str().expect("ascii"))
                    .collect();
                assert_eq!(
                    sent, members,
                    "traced: {traced}, {method} with tracestate {states:?}"
                );
                assert!(seen.headers.contains_key("traceparent"), "{method}");
            }
        }
        proxy.stop().await;
    }
}

#[tokio::test]
async fn a_collector_that_is_down_costs_requests_nothing_and_its_drops_are_counted() {
    let up = Upstream::start().await;
    // A port nobody listens on.
    let closed = format!("http://127.0.0.1:{}", support::bin::free_port());
    let proxy = traced_proxy(&up, &closed, "http/protobuf").await;
    let c = proxy.client();
    for i in 0..5 {
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            c.post("/charges", &format!("down-{i}"), "{}"),
        )
        .await
        .expect("a request is not held by the exporter");
        assert_eq!(answer.status, 201);
    }
    // Five server spans, and each one's claim, complete and upstream spans.
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        proxy.state.metrics.wait_until(|m| m.spans_dropped() >= 20),
    )
    .await
    .expect("the spans that could not be sent are counted as dropped");
    let rendered = proxy.state.metrics.render();
    let line = rendered
        .lines()
        .find(|l| l.starts_with("idemgate_trace_spans_dropped_total "))
        .expect("on /metrics");
    assert_eq!(line, "idemgate_trace_spans_dropped_total 20");
    proxy.stop().await;
}

#[tokio::test]
async fn a_slow_collector_does_not_hold_requests_and_gets_the_spans_later() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    collector.hold();
    let proxy = traced_proxy(&up, &collector.url(), "http/protobuf").await;
    let c = proxy.client();
    assert_eq!(c.post("/charges", "slow-1", "{}").await.status, 201);
    // The first export is in the collector's hands, unanswered.
    collector
        .wait_until("an export", |r| r.exports() >= 1)
        .await;
    for i in 2..=4 {
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            c.post("/charges", &format!("slow-{i}"), "{}"),
        )
        .await
        .expect("a request does not wait for the collector");
        assert_eq!(answer.status, 201);
    }
    assert!(collector.spans().is_empty(), "nothing was answered yet");
    collector.release();
    collector
        .wait_until("four server spans", |r| {
            r.spans().iter().filter(|s| s.name == "POST").count() == 4
        })
        .await;
    assert_eq!(proxy.state.metrics.spans_dropped(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn spans_reach_a_grpc_collector() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let proxy = traced_proxy(&up, &collector.url(), "grpc").await;
    let parent = traceparent(TRACE, CLIENT_SPAN);
    let answer = charge(&proxy.client(), "g1", &parent).await;
    assert_eq!(answer.status, 201);
    let server = collector.span(TRACE, "POST").await;
    assert_eq!(server.transport, "grpc");
    assert_eq!(server.headers["x-tenant"], "acme", "headers go as metadata");
    assert_eq!(str_attr(&server, "idempotency.outcome"), "forwarded");
    let upstream = collector.span(TRACE, "upstream").await;
    assert_eq!(upstream.parent_span_id, server.span_id);
    proxy.stop().await;
}

#[tokio::test]
async fn a_reload_starts_the_exporter_and_one_without_telemetry_stops_tracing() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let plain = format!("upstream:\n  url: {}\n", up.url());
    let file = TempConfig::new(&plain);
    let proxy = Proxy::with_config(Config::from_file(file.path()).expect("valid")).await;
    let c = proxy.client();
    let parent = traceparent(TRACE, CLIENT_SPAN);
    let traced = [JSON, ("traceparent", parent.as_str())];

    std::fs::write(
        file.path(),
        format!(
            "{plain}telemetry:\n  otlp:\n    endpoint: {}\n",
            collector.url()
        ),
    )
    .expect("rewrite");
    reload(&proxy.state, file.path(), None, &|_| Ok(())).expect("reloads");
    c.send("GET", "/after-reload", &traced, "").await;
    let server = collector.span(TRACE, "GET").await;
    assert_eq!(str_attr(&server, "url.path"), "/after-reload");
    assert_eq!(server.service, "idemgate", "the default service_name");

    std::fs::write(file.path(), &plain).expect("rewrite");
    reload(&proxy.state, file.path(), None, &|_| Ok(())).expect("reloads");
    c.send("GET", "/untraced", &traced, "").await;
    let last = up.seen().pop().expect("forwarded");
    assert_eq!(last.path_and_query, "/untraced");
    assert_eq!(
        last.headers["traceparent"],
        parent.as_str(),
        "untouched again"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn sample_ratio_decides_for_new_traces_and_a_sampled_parent_is_kept() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\ntelemetry:\n  otlp:\n    endpoint: {}\n    \
         sample_ratio: 0\n",
        collector.url()
    );
    let proxy = Proxy::start(&yaml, &up).await;
    let c = proxy.client();
    // A trace that starts here is not recorded, but the upstream still gets a
    // traceparent, marked not sampled.
    c.send("GET", "/unsampled", &[], "").await;
    let sent = up.seen()[0].headers["traceparent"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let (unsampled, _, flags) = fields(&sent);
    assert_eq!(flags, "00");
    // A client's trace marked not sampled stays so, on a guarded request too (its store
    // calls make no span): the upstream is told that trace under idemgate's own span,
    // still not sampled.
    let declined = format!("00-{DECLINED_TRACE}-{CLIENT_SPAN}-00");
    assert_eq!(charge(&c, "declined", &declined).await.status, 201);
    let (trace, span, flags) = fields(up.seen()[1].headers["traceparent"].to_str().expect("ascii"));
    assert_eq!((trace.as_str(), flags.as_str()), (DECLINED_TRACE, "00"));
    assert_ne!(span, CLIENT_SPAN, "the upstream call's own span is named");
    // A client's sampled trace is kept whatever the ratio; its spans come after any of
    // the first request's would have.
    let parent = traceparent(TRACE, CLIENT_SPAN);
    c.send("GET", "/sampled", &[("traceparent", &parent)], "")
        .await;
    collector.span(TRACE, "upstream").await;
    let server = collector.span(TRACE, "GET").await;
    assert_eq!(str_attr(&server, "url.path"), "/sampled");
    assert!(
        collector
            .spans()
            .iter()
            .all(|s| s.trace_id != unsampled && s.trace_id != DECLINED_TRACE),
        "nothing of the unsampled traces is exported"
    );
    assert_eq!(
        fields(up.seen()[2].headers["traceparent"].to_str().expect("ascii")).2,
        "01"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn a_duplicate_that_waits_shows_its_wait_and_replays() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nidempotency:\n  on_concurrent: wait\n\
         telemetry:\n  otlp:\n    endpoint: {}\n",
        collector.url()
    );
    let proxy = Proxy::start(&yaml, &up).await;
    let c = proxy.client();
    // The first is held at the upstream's gate; the duplicate waits for it.
    let first = c.spawn_post("/gate/charges", "w1", "{}");
    up.wait_for(1).await;
    let parent = traceparent(TRACE, CLIENT_SPAN);
    let duplicate = {
        let (c, parent) = (c.clone(), parent.clone());
        tokio::spawn(async move {
            c.send(
                "POST",
                "/gate/charges",
                &[("idempotency-key", "w1"), JSON, ("traceparent", &parent)],
                "{}",
            )
            .await
        })
    };
    proxy.state.metrics.wait_until(|m| m.waiting() == 1).await;
    up.open_gate();
    assert_eq!(first.await.expect("first").status, 201);
    assert!(duplicate.await.expect("duplicate").replayed());

    let server = collector.span(TRACE, "POST").await;
    assert!(
        server.events.iter().any(|e| e == "idempotency.wait"),
        "{:?}",
        server.events
    );
    assert_eq!(str_attr(&server, "idempotency.outcome"), "replayed");
    let watch = collector.span(TRACE, "store.watch").await;
    assert_eq!(watch.parent_span_id, server.span_id);
    assert_eq!(up.count(), 1);
    proxy.stop().await;
}

/// `idemgate_trace_spans_dropped_total` on the admin listener `admin`.
async fn dropped_on(admin: &TestClient) -> u64 {
    let metrics = admin.send("GET", "/metrics", &[], "").await.text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("idemgate_trace_spans_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the counter is on /metrics")
}

/// Polls `/metrics` (every 20 ms, 30 s at most) until `dropped` spans were counted.
async fn wait_dropped(admin: &TestClient, dropped: u64) {
    let wait = async {
        while dropped_on(admin).await < dropped {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .unwrap_or_else(|_| panic!("{dropped} spans never counted as dropped"));
}

#[tokio::test]
async fn the_binary_sends_what_is_queued_before_it_exits() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    // Each export is held until released: the process must still be there to finish it.
    collector.hold();
    let file = TempConfig::new(&format!(
        "upstream:\n  url: {}\nadmin:\n  listen: null\ntelemetry:\n  otlp:\n    \
         endpoint: {}\n",
        up.url(),
        collector.url()
    ));
    let path = file.path().to_str().expect("utf-8 path");
    let mut running = Running::start(&["--config", path]).await;
    let parent = traceparent(TRACE, CLIENT_SPAN);
    let answer = charge(&TestClient::new(running.addr), "exit", &parent).await;
    assert_eq!(answer.status, 201);
    running.terminate().await;
    collector
        .wait_until("an export", |r| r.exports() >= 1)
        .await;
    assert!(
        !running.has_exited(),
        "idemgate exited with its export unanswered:\n{}",
        running.stderr()
    );
    collector.release();
    assert!(running.wait_exit().await.success(), "{}", running.stderr());
    assert!(
        running
            .stderr()
            .contains("traces: the spans queued at shutdown went out"),
        "{}",
        running.stderr()
    );
    let names: Vec<String> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == TRACE)
        .map(|s| s.name)
        .collect();
    for name in ["POST", "store.claim", "store.complete", "upstream"] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} was sent before exit: {names:?}"
        );
    }
}

#[tokio::test]
async fn drops_are_logged_at_warn_once_a_minute_however_many() {
    let up = Upstream::start().await;
    let admin_port = free_port();
    let file = TempConfig::new(&format!(
        "upstream:\n  url: {}\nadmin:\n  listen: 127.0.0.1:{admin_port}\ntelemetry:\n  \
         otlp:\n    endpoint: http://127.0.0.1:{}\n",
        up.url(),
        free_port()
    ));
    let path = file.path().to_str().expect("utf-8 path");
    let mut running = Running::start(&["--config", path]).await;
    let client = TestClient::new(running.addr);
    let admin = TestClient::new(std::net::SocketAddr::from(([127, 0, 0, 1], admin_port)));
    // Two batches, each refused: a server span and its upstream span each.
    for (round, path) in ["/first", "/second"].into_iter().enumerate() {
        assert_eq!(client.send("GET", path, &[], "").await.status, 201);
        wait_dropped(&admin, 2 * (round as u64 + 1)).await;
    }
    running.terminate().await;
    assert!(running.wait_exit().await.success());
    let stderr = running.stderr();
    let warned = stderr
        .lines()
        .filter(|l| l.contains("traces: spans dropped"))
        .collect::<Vec<_>>();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].contains("WARN"), "{}", warned[0]);
}

#[tokio::test]
async fn a_take_over_of_a_crashed_owners_claim_is_an_event_and_a_store_span() {
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let proxy = traced_proxy(&up, &collector.url(), "http/protobuf").await;
    support::crashed_owner(&proxy, "/charges", "t1").await;
    let parent = traceparent(TRACE, CLIENT_SPAN);
    let answer = charge(&proxy.client(), "t1", &parent).await;
    // Under `on_unknown_outcome: record`, the crashed owner's unknown outcome is the key's.
    assert_eq!(answer.problem(), "outcome-unknown");
    assert_eq!(up.count(), 0);
    let server = collector.span(TRACE, "POST").await;
    assert!(
        server.events.iter().any(|e| e == "idempotency.take_over"),
        "{:?}",
        server.events
    );
    assert_eq!(str_attr(&server, "idempotency.outcome"), "outcome_unknown");
    let take_over = collector.span(TRACE, "store.take_over").await;
    assert_eq!(take_over.parent_span_id, server.span_id);
    let complete = collector.span(TRACE, "store.complete").await;
    assert_eq!(complete.parent_span_id, server.span_id);
    proxy.stop().await;
}

/// A reconcile lookup's path holds the raw key (docs/behaviour.md §18); its span and
/// every log line carry that path with `{key}` in the key's place (§25), the record id
/// naming the key. The binary, logging at `trace`, exporting to a real collector.
#[tokio::test]
async fn a_reconcile_lookup_is_traced_and_logged_with_key_in_place_of_the_raw_key() {
    const RAW_KEY: &str = "order-5f1e-raw-key-d41c";
    const LOOKUP_TRACE: &str = "5c8e2e6a0f9d4b1a8c3e7f2a9b0d1e4f";
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let file = TempConfig::new(&format!(
        "upstream:\n  url: {}\nadmin:\n  listen: null\nlog:\n  level: trace\ntelemetry:\n  \
         otlp:\n    endpoint: {}\nroutes:\n  - path: /reset\n    reconcile: {{path: \
         '/lookup/{{key}}', attempts: 1}}\n",
        up.url(),
        collector.url()
    ));
    let path = file.path().to_str().expect("utf-8 path");
    let mut running = Running::start(&["--config", path]).await;
    let parent = traceparent(LOOKUP_TRACE, CLIENT_SPAN);
    // `/reset` drops the connection: the outcome is unknown, and the lookup settles it.
    let answer = TestClient::new(running.addr)
        .send(
            "POST",
            "/reset",
            &[("idempotency-key", RAW_KEY), JSON, ("traceparent", &parent)],
            "{}",
        )
        .await;
    assert_eq!(answer.status, 201, "{}", answer.text());
    assert_eq!(answer.headers["idempotency-reconciled"], "true");
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].path_and_query,
        format!("/lookup/{RAW_KEY}"),
        "the upstream is asked with the key"
    );

    let of_trace = |r: &Receiver| -> Vec<GotSpan> {
        r.spans()
            .into_iter()
            .filter(|s| s.trace_id == LOOKUP_TRACE)
            .collect()
    };
    collector
        .wait_until("the server span and both upstream calls", |r| {
            let spans = of_trace(r);
            spans.iter().filter(|s| s.name == "upstream").count() == 2
                && spans.iter().any(|s| s.name == "POST")
        })
        .await;
    let spans = of_trace(&collector);
    let lookup = spans
        .iter()
        .find(|s| {
            s.name == "upstream" && s.attr("http.request.method") == Some(&Attr::Str("GET".into()))
        })
        .expect("the lookup's span");
    assert_eq!(str_attr(lookup, "url.path"), "/lookup/{key}");
    for span in &spans {
        for (name, value) in &span.attributes {
            assert!(
                !format!("{value:?}").contains(RAW_KEY),
                "{}: {name} = {value:?}",
                span.name
            );
        }
    }

    running.terminate().await;
    assert!(running.wait_exit().await.success(), "{}", running.stderr());
    let log = running.stderr();
    assert!(log.contains("reconcile"), "the lookup is logged:\n{log}");
    assert!(!log.contains(RAW_KEY), "the raw key in the log:\n{log}");
}

/// docs/behaviour.md §22: the store's calls are spans on PostgreSQL as on every store,
/// under the request's server span.
#[tokio::test]
async fn on_postgres_the_store_calls_are_children_of_the_request() {
    let server = support::postgres::PgServer::start().await;
    let up = Upstream::start().await;
    let collector = Receiver::start().await;
    let yaml = format!(
        "upstream:\n  url: {{upstream}}\nstore:\n  kind: postgres\n  url: {}\n\
         telemetry:\n  otlp:\n    endpoint: {}\n    protocol: http/protobuf\n",
        server.url(),
        collector.url()
    );
    let proxy = Proxy::postgres(&yaml, &up).await;
    let parent = traceparent(TRACE, CLIENT_SPAN);
    let headers = [
        ("idempotency-key", "pg-1"),
        JSON,
        ("traceparent", parent.as_str()),
    ];
    let answer = proxy
        .client()
        .send("POST", "/charges", &headers, "{}")
        .await;
    assert_eq!(answer.status, 201);
    let request = collector.span(TRACE, "POST").await;
    for name in ["store.claim", "store.complete"] {
        let span = collector.span(TRACE, name).await;
        assert_eq!(span.parent_span_id, request.span_id, "{name}");
    }
    assert_eq!(str_attr(&request, "idempotency.outcome"), "forwarded");
    proxy.stop().await;
}
