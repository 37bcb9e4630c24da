//! A real browser against `cors` (docs/behaviour.md §24): headless Chromium loads a page
//! from one origin (a server of this test) that calls a guarded API on another (idemgate,
//! in front of an upstream that does CORS as a legacy app does: its preflights allow
//! `Content-Type` only, or are answered `404`). The page sends a custom header, so every
//! call is preflighted; it posts twice with one key and reads `Idempotent-Replayed` on
//! the second, and posts twice at once to a slow path and reads the `409`'s
//! `Retry-After`. Without the exposed headers the page would read `null`; without the
//! key header allowed, the browser would not send the request at all.
//!
//! The page writes its results into its DOM and posts them back to its own server,
//! where the test reads them; Chromium, in a process group of its own and a temporary
//! profile, is killed when the test ends.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use idemgate::config::Config;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::support::legacy_cors::LegacyCors;
use crate::support::{Proxy, serve_each};

/// Upper bound for Chromium to start, load the page and run its calls.
const LIMIT: Duration = Duration::from_secs(90);

/// The page's server: the page, `/release` (lets the upstream's held requests answer)
/// and `/report` (the page's results).
struct Site {
    page: String,
    upstream: Arc<LegacyCors>,
    report: Mutex<Option<Bytes>>,
    reported: Notify,
}

async fn site(
    site: Arc<Site>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await?.to_bytes();
    let (status, content_type, answer) = match path.as_str() {
        "/" => (StatusCode::OK, "text/html", Bytes::from(site.page.clone())),
        "/release" => {
            site.upstream.open_gate();
            (
                StatusCode::OK,
                "text/plain",
                Bytes::from_static(b"released"),
            )
        }
        "/report" => {
            *site.report.lock().expect("lock") = Some(body);
            site.reported.notify_waiters();
            (StatusCode::OK, "text/plain", Bytes::from_static(b"thanks"))
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", Bytes::new()),
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(answer))
        .expect("response"))
}

/// The page: its calls go to `api`, another origin.
fn page(api: &str) -> String {
    r#"<!doctype html>
<html><body><pre id="out">running</pre>
<script>
const api = "API";
async function post(path, key) {
  const r = await fetch(api + path, {
    method: "POST",
    headers: {"Content-Type": "application/json", "Idempotency-Key": key},
    body: JSON.stringify({item: "book"}),
  });
  return {
    status: r.status,
    replayed: r.headers.get("Idempotent-Replayed"),
    retryAfter: r.headers.get("Retry-After"),
    body: await r.text(),
  };
}
async function run() {
  const results = {};
  try {
    // The upstream's preflight allows Content-Type only: idemgate adds the key header.
    results.first = await post("/orders", "k1");
    results.second = await post("/orders", "k1");
    // The upstream answers preflights 404: idemgate answers them.
    results.legacyFirst = await post("/no-options/orders", "k2");
    results.legacySecond = await post("/no-options/orders", "k2");
    // Two at once: one is held by the upstream, the other answered 409 at once.
    const a = post("/slow/orders", "k3");
    const b = post("/slow/orders", "k3");
    results.busy = await Promise.race([a, b]);
    await fetch("/release");
    results.settled = await Promise.all([a, b]);
  } catch (e) {
    results.error = String(e);
  }
  document.getElementById("out").textContent = JSON.stringify(results);
  await fetch("/report", {method: "POST", body: JSON.stringify(results)});
}
run();
</script></body></html>
"#
    .replace("API", api)
}

/// Chromium in a process group of its own: killed, with its helper processes, on drop.
struct Chromium {
    child: tokio::process::Child,
    _profile: tempfile::TempDir,
    stderr: std::path::PathBuf,
}

impl Chromium {
    fn start(url: &str) -> Chromium {
        let profile = tempfile::tempdir().expect("profile dir");
        let stderr = profile.path().join("stderr.log");
        let log = std::fs::File::create(&stderr).expect("stderr log");
        let child = tokio::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("chromium runs (scripts/test.sh installs the Debian package chromium)");
        Chromium {
            child,
            _profile: profile,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // The renderer and GPU helpers are in the group too.
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
        let _ = self.child.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_on_another_origin_reads_replays_and_retry_after_through_idemgate() {
    let upstream = Arc::new(LegacyCors::start().await);
    // The page's origin: the site's own port.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind site");
    let origin = format!("http://{}", listener.local_addr().expect("addr"));
    let yaml = format!(
        "upstream:\n  url: {}\ncors:\n  allow_origins: [{origin}]\n",
        upstream.url()
    );
    let proxy = Proxy::with_config(Config::from_yaml_str(&yaml, &|_| None).expect("valid")).await;
    let site_state = Arc::new(Site {
        page: page(&format!("http://{}", proxy.addr)),
        upstream: Arc::clone(&upstream),
        report: Mutex::new(None),
        reported: Notify::new(),
    });
    let server = serve_each(listener, Arc::clone(&site_state), site);

    let mut browser = Chromium::start(&format!("{origin}/"));
    let report = async {
        loop {
            let reported = site_state.reported.notified();
            tokio::pin!(reported);
            reported.as_mut().enable();
            if let Some(report) = site_state.report.lock().expect("lock").clone() {
                return report;
            }
            reported.await;
        }
    };
    let report = tokio::select! {
        report = tokio::time::timeout(LIMIT, report) => report.unwrap_or_else(|_| {
            panic!("no report from the page within {LIMIT:?}; chromium said:\n{}", browser.stderr())
        }),
        exited = browser.child.wait() => {
            panic!("chromium exited ({exited:?}) before the page reported:\n{}", browser.stderr())
        }
    };
    drop(browser);
    server.abort();

    let results: Value = serde_json::from_slice(&report).expect("the page posts JSON");
    assert!(results.get("error").is_none(), "{results:#}");
    let execution = |call: &Value| -> i64 {
        let body: Value = serde_json::from_str(call["body"].as_str().expect("body")).expect("json");
        body["execution"].as_i64().expect("execution")
    };
    // A first execution, then its replay, which the page can tell as one.
    assert_eq!(results["first"]["status"], 201, "{results:#}");
    assert_eq!(results["first"]["replayed"], Value::Null, "{results:#}");
    assert_eq!(results["second"]["status"], 201, "{results:#}");
    assert_eq!(results["second"]["replayed"], "true", "{results:#}");
    assert_eq!(execution(&results["first"]), execution(&results["second"]));
    // The same through preflights idemgate answered itself.
    assert_eq!(results["legacyFirst"]["status"], 201, "{results:#}");
    assert_eq!(results["legacySecond"]["replayed"], "true", "{results:#}");
    // The duplicate in flight: 409, and the page reads when to come back.
    assert_eq!(results["busy"]["status"], 409, "{results:#}");
    let retry_after = results["busy"]["retryAfter"]
        .as_str()
        .expect("Retry-After is exposed");
    assert!(
        retry_after.parse::<u64>().is_ok_and(|s| s >= 1),
        "{results:#}"
    );
    let mut settled: Vec<i64> = results["settled"]
        .as_array()
        .expect("settled")
        .iter()
        .map(|call| call["status"].as_i64().expect("status"))
        .collect();
    settled.sort_unstable();
    assert_eq!(settled, [201, 409], "{results:#}");
    assert_eq!(upstream.executions(), 3, "{results:#}");
    assert!(upstream.preflights() >= 2, "{results:#}");
}
