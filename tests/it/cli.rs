//! The `idemgate` binary from the outside (docs/behaviour.md §1 and §8): `--check`, the
//! config file and its environment variable, `--upstream`/`--listen`, and SIGTERM.

use crate::support;

use std::net::TcpListener;

use support::bin::{Finished, Running, TempConfig, idemgate, run};
use support::{TestClient, Upstream};

/// The smallest valid file; the upstream is never contacted by `--check`.
const MINIMAL: &str = "upstream:\n  url: http://127.0.0.1:9\n";

/// A config file in front of `upstream` whose admin server is off, so that concurrent
/// tests never compete for the default admin port 127.0.0.1:9901.
fn serving_config(upstream: &Upstream) -> TempConfig {
    TempConfig::new(&format!(
        "upstream:\n  url: {}\nadmin:\n  listen: null\n",
        upstream.url()
    ))
}

/// `idemgate --config FILE --check`.
async fn check(file: &TempConfig) -> Finished {
    run(idemgate().arg("--config").arg(file.path()).arg("--check")).await
}

#[tokio::test]
async fn check_prints_the_effective_config_with_defaults_and_binds_nothing() {
    // Both addresses are held by this test: a `--check` that tried to bind would fail.
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let held_admin = TcpListener::bind("127.0.0.1:0").expect("bind");
    let listen = held.local_addr().expect("addr");
    let admin = held_admin.local_addr().expect("addr");
    let file = TempConfig::new(&format!(
        "{MINIMAL}listen: {listen}\nadmin:\n  listen: {admin}\nroutes:\n  - path: /charges\n    ttl: 48h\n"
    ));

    // `run` also fails the test if the process is still running (serving) after 10 s.
    let out = check(&file).await;

    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let yaml = &out.stdout;
    for line in [
        &format!("listen: {listen}"),
        "  url: http://127.0.0.1:9",
        "  kind: memory",
        "  ttl: 24h",
        "  lease: 10s",
        "  on_concurrent: reject",
        "  on_unknown_outcome: record",
        "  max_request_body: 1MiB",
        "- path: /charges",
        "  ttl: 48h",
        &format!("  listen: {admin}"),
        "shutdown_timeout: 30s",
    ] {
        assert!(
            yaml.lines().any(|l| l == line),
            "no line {line:?} in:\n{yaml}"
        );
    }
    let parsed: serde_json::Value = serde_saphyr::from_str(yaml).expect("--check prints YAML");
    assert_eq!(parsed["idempotency"]["ttl"], "24h", "{yaml}");
}

#[tokio::test]
async fn check_output_is_a_config_file_that_checks_to_itself() {
    let file = TempConfig::new(MINIMAL);
    let first = check(&file).await;
    assert_eq!(first.code(), Some(0), "stderr: {}", first.stderr);

    let printed = TempConfig::new(&first.stdout);
    let second = check(&printed).await;
    assert_eq!(second.code(), Some(0), "stderr: {}", second.stderr);
    assert_eq!(second.stdout, first.stdout);
}

/// A `${` in a value (here from a variable) is printed `$${`, so the output still checks
/// to itself, with no variable set (docs/behaviour.md §15).
#[tokio::test]
async fn check_output_keeps_a_dollar_brace_from_the_environment() {
    let file = TempConfig::new(&format!(
        "{MINIMAL}store:\n  key_prefix: ${{IDEMGATE_TEST_PREFIX}}\n"
    ));
    let first = run(idemgate()
        .env("IDEMGATE_TEST_PREFIX", "app${TENANT}$x")
        .arg("--config")
        .arg(file.path())
        .arg("--check"))
    .await;
    assert_eq!(first.code(), Some(0), "stderr: {}", first.stderr);
    assert!(
        first.stdout.contains("key_prefix: app$${TENANT}$x"),
        "{}",
        first.stdout
    );

    let printed = TempConfig::new(&first.stdout);
    let second = check(&printed).await;
    assert_eq!(second.code(), Some(0), "stderr: {}", second.stderr);
    assert_eq!(second.stdout, first.stdout);
}

/// `--check` prints secrets as `***` and says so at the top; its output does not start a
/// server (here: does not check) until they are filled in. A server started from it
/// used to accept `Bearer ***`.
#[tokio::test]
async fn check_output_with_a_token_is_refused_until_the_token_is_filled_in() {
    let file = TempConfig::new(&format!("{MINIMAL}admin:\n  token: tok-3f9a\n"));
    let first = check(&file).await;
    assert_eq!(first.code(), Some(0), "stderr: {}", first.stderr);
    assert!(first.stdout.starts_with("# "), "{}", first.stdout);
    assert!(!first.stdout.contains("tok-3f9a"), "{}", first.stdout);

    let printed = TempConfig::new(&first.stdout);
    let second = check(&printed).await;
    assert_eq!(second.code(), Some(1), "stdout: {}", second.stdout);
    assert!(second.stderr.contains("admin.token: "), "{}", second.stderr);

    let filled = TempConfig::new(&first.stdout.replace("'***'", "tok-3f9a"));
    let third = check(&filled).await;
    assert_eq!(third.code(), Some(0), "stderr: {}", third.stderr);
    assert_eq!(third.stdout, first.stdout);
}

/// `telemetry.otlp` (docs/behaviour.md §20) as `--check` shows it, its header values
/// masked, and a bad value refused naming the key, by `--check` and at start-up alike.
#[tokio::test]
async fn check_shows_the_trace_exporter_and_refuses_a_bad_one() {
    let file = TempConfig::new(&format!(
        "{MINIMAL}telemetry:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    \
         protocol: grpc\n    headers:\n      x-api-key: k-77e1\n"
    ));
    let out = check(&file).await;
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    for line in [
        "telemetry:",
        "  otlp:",
        "    endpoint: http://127.0.0.1:4317/",
        "    protocol: grpc",
        "    service_name: idemgate",
        "    sample_ratio: 1.0",
        "      x-api-key: '***'",
        "#   telemetry.otlp.headers.x-api-key",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == line),
            "{line}:\n{}",
            out.stdout
        );
    }
    assert!(!out.stdout.contains("k-77e1"), "{}", out.stdout);

    let bad = TempConfig::new(&format!(
        "{MINIMAL}telemetry:\n  otlp:\n    endpoint: https://collector:4318\n"
    ));
    let refused = check(&bad).await;
    assert_eq!(refused.code(), Some(1), "stdout: {}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("telemetry.otlp.endpoint: 'https://collector:4318': https is not supported"),
        "{}",
        refused.stderr
    );
    let started = run(idemgate().arg("--config").arg(bad.path())).await;
    assert_eq!(started.code(), Some(1), "stdout: {}", started.stdout);
    assert!(
        started.stderr.contains("telemetry.otlp.endpoint: "),
        "{}",
        started.stderr
    );
}

/// `--check` says what a Basic principal is made of (docs/behaviour.md §25): without
/// `replay_authorization`, the user name and a hash of the password; a route that
/// inherits it is not repeated, and the output still checks to itself.
#[tokio::test]
async fn check_says_a_basic_principal_is_the_user_and_a_hash_of_the_password() {
    let file = TempConfig::new(&format!(
        "{MINIMAL}idempotency:\n  scope_principal: {{basic: true}}\nroutes:\n  - path: /a\n  \
         - path: /b\n    scope_principal: {{trusted_header: x-user}}\n"
    ));
    let out = check(&file).await;
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().take(2).collect();
    assert_eq!(
        lines,
        [
            "# idempotency: scope_principal basic: the principal is the user name and a \
             SHA-256 of the password",
            "#   (no replay_authorization checks the password before a replay; a new \
             password is a new scope).",
        ],
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("# routes["), "{}", out.stdout);
    let printed = TempConfig::new(&out.stdout);
    let again = check(&printed).await;
    assert_eq!(again.code(), Some(0), "stderr: {}", again.stderr);
    assert_eq!(again.stdout, out.stdout);
}

#[tokio::test]
async fn check_rejects_an_invalid_file_with_exit_1_naming_the_field() {
    let cases = [
        ("bogus: 1\n", "bogus: unknown field 'bogus'"),
        ("idempotency:\n  ttl: 10q\n", "idempotency.ttl: "),
        ("idempotency:\n  lease: 10\n", "idempotency.lease: "),
        (
            "store:\n  kind: mysql\n",
            "store.kind: unknown variant 'mysql', expected one of memory, file, redis, postgres",
        ),
        (
            "routes:\n  - path: /a\n  - path: /b\n    wait_timeout: soon\n",
            "routes[1].wait_timeout: ",
        ),
    ];
    for (extra, expected) in cases {
        let file = TempConfig::new(&format!("{MINIMAL}{extra}"));
        let out = check(&file).await;
        assert_eq!(out.code(), Some(1), "{extra:?}: stderr: {}", out.stderr);
        assert!(
            out.stderr.contains(expected),
            "{extra:?}: stderr does not name the field ({expected:?}): {}",
            out.stderr
        );
        assert!(
            out.stdout.is_empty(),
            "{extra:?}: an invalid file prints no config: {}",
            out.stdout
        );
    }
}

#[tokio::test]
async fn check_on_a_missing_file_exits_1_naming_the_file() {
    let file = TempConfig::new(MINIMAL);
    let path = file.path().to_owned();
    drop(file); // removes it

    let out = run(idemgate().arg("--config").arg(&path).arg("--check")).await;

    assert_eq!(out.code(), Some(1), "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains(&*path.to_string_lossy()),
        "stderr does not name the file: {}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

#[tokio::test]
async fn no_config_at_all_exits_1_and_says_how_to_give_one() {
    let out = run(idemgate().arg("--check")).await;

    assert_eq!(out.code(), Some(1), "stderr: {}", out.stderr);
    for hint in ["--config", "IDEMGATE_CONFIG", "--upstream"] {
        assert!(out.stderr.contains(hint), "no {hint} in: {}", out.stderr);
    }
}

#[tokio::test]
async fn idemgate_config_names_the_file_like_config_does() {
    let file = TempConfig::new(&format!("{MINIMAL}idempotency:\n  ttl: 7h\n"));

    let out = run(idemgate()
        .env("IDEMGATE_CONFIG", file.path())
        .arg("--check"))
    .await;

    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    assert!(
        out.stdout.lines().any(|l| l == "  ttl: 7h"),
        "the file's ttl is not in:\n{}",
        out.stdout
    );

    let bad = TempConfig::new("store:\n  kind: mysql\n");
    let out = run(idemgate().env("IDEMGATE_CONFIG", bad.path()).arg("--check")).await;
    assert_eq!(out.code(), Some(1), "stderr: {}", out.stderr);
}

#[tokio::test]
async fn upstream_and_listen_serve_a_replay_then_sigterm_exits_0() {
    let upstream = Upstream::start().await;
    // No file: the memory store and every default (docs/behaviour.md §1).
    let mut proxy = Running::start(&["--upstream", &upstream.url()]).await;
    let client = TestClient::new(proxy.addr);

    let first = client
        .post("/charges", "cli-key-1", r#"{"amount":5}"#)
        .await;
    let again = client
        .post("/charges", "cli-key-1", r#"{"amount":5}"#)
        .await;

    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed());
    assert_eq!(again.status, 201, "{}", again.text());
    assert!(again.replayed(), "the retry is not marked as a replay");
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.count(), 1, "the upstream executed the retry");

    proxy.terminate().await;
    let status = proxy.wait_exit().await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", proxy.stderr());
}

#[tokio::test]
async fn sigterm_lets_a_request_held_at_the_upstream_finish_then_exits_0() {
    let upstream = Upstream::start().await;
    let file = serving_config(&upstream);
    let config = file.path().to_str().expect("temp paths are UTF-8 here");
    let mut proxy = Running::start(&["--config", config]).await;
    let client = TestClient::new(proxy.addr);
    let held = tokio::spawn(async move { client.post("/gate", "cli-held", "{}").await });
    tokio::time::timeout(support::bin::LIMIT, upstream.wait_for(1))
        .await
        .expect("the request reached the upstream");

    proxy.terminate().await;
    // New connections are refused at once; that is also how we know the signal landed.
    proxy.wait_refusing().await;
    assert!(
        !proxy.has_exited(),
        "idemgate exited with a request in flight:\n{}",
        proxy.stderr()
    );
    upstream.open_gate();

    let resp = tokio::time::timeout(support::bin::LIMIT, held)
        .await
        .expect("the held request finished")
        .expect("client task");
    assert_eq!(resp.status, 201, "{}", resp.text());
    assert!(!resp.replayed());
    let status = proxy.wait_exit().await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", proxy.stderr());
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn upstream_with_an_explicit_config_is_a_contradiction_but_the_env_yields() {
    let file = TempConfig::new(MINIMAL);
    let out = run(idemgate().arg("--config").arg(file.path()).args([
        "--upstream",
        "http://127.0.0.1:7",
        "--check",
    ]))
    .await;
    assert_eq!(out.code(), Some(1), "stderr: {}", out.stderr);
    assert!(out.stderr.contains("not both"), "{}", out.stderr);

    let out = run(idemgate().env("IDEMGATE_CONFIG", file.path()).args([
        "--upstream",
        "http://127.0.0.1:7",
        "--check",
    ]))
    .await;
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    assert!(
        out.stdout.contains("url: http://127.0.0.1:7"),
        "{}",
        out.stdout
    );
}

#[tokio::test]
async fn a_request_still_held_when_shutdown_timeout_passes_makes_the_exit_code_1() {
    let upstream = Upstream::start().await;
    let file = TempConfig::new(&format!(
        "upstream:\n  url: {}\nadmin:\n  listen: null\nshutdown_timeout: 300ms\n",
        upstream.url()
    ));
    let config = file.path().to_str().expect("temp paths are UTF-8 here");
    let mut proxy = Running::start(&["--config", config]).await;
    let client = TestClient::new(proxy.addr);
    let _held = client.spawn_post("/gate", "cli-abandoned", "{}");
    tokio::time::timeout(support::bin::LIMIT, upstream.wait_for(1))
        .await
        .expect("the request reached the upstream");

    proxy.terminate().await;
    // The gate never opens: the in-flight request outlives shutdown_timeout.
    let status = proxy.wait_exit().await;
    assert_eq!(status.code(), Some(1), "stderr:\n{}", proxy.stderr());
    assert!(
        proxy.stderr().contains("shutdown_timeout"),
        "{}",
        proxy.stderr()
    );
}

/// A SIGHUP reload that changes where records are addressed is applied, logged at `warn`
/// naming the policy, and counted in `idemgate_reload_address_changes_total`.
#[tokio::test]
async fn sighup_that_moves_addresses_is_logged_naming_the_policies_and_counted() {
    let upstream = Upstream::start().await;
    let admin = TcpListener::bind("127.0.0.1:0").expect("bind");
    let admin_addr = admin.local_addr().expect("addr");
    drop(admin);
    let before = format!(
        "upstream:\n  url: {}\nadmin:\n  listen: {admin_addr}\nroutes:\n  - path: /charges\n    ttl: 1h\n",
        upstream.url()
    );
    let file = TempConfig::new(&before);
    let config = file.path().to_str().expect("utf-8 path");
    let mut proxy = Running::start(&["--config", config]).await;
    let admin = TestClient::new(admin_addr);

    std::fs::write(
        file.path(),
        before.replace("ttl: 1h", "key_from: [{query: id}]"),
    )
    .expect("write");
    proxy.signal("HUP").await;
    await_reloads(&admin, "ok", &proxy).await;
    let metrics = admin.send("GET", "/metrics", &[], "").await.text();
    assert!(
        metrics.contains("idemgate_reload_address_changes_total 1"),
        "{metrics}"
    );
    proxy.terminate().await;
    assert!(proxy.wait_exit().await.success(), "{}", proxy.stderr());
    let log = proxy.stderr();
    let line = log
        .lines()
        .find(|line| line.contains("record addresses"))
        .unwrap_or_else(|| panic!("no warning in:\n{log}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("routes[0] (/charges)"), "{line}");
    assert!(
        !line.contains("idempotency,"),
        "only the route moved: {line}"
    );
}

/// Polls `/metrics` until `idemgate_config_reloads_total{result}` is 1, for at most
/// [`support::bin::LIMIT`].
async fn await_reloads(admin: &TestClient, result: &str, proxy: &Running) {
    let line = format!("idemgate_config_reloads_total{{result=\"{result}\"}} ");
    let deadline = tokio::time::Instant::now() + support::bin::LIMIT;
    loop {
        let text = admin.send("GET", "/metrics", &[], "").await.text();
        let count = text
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.trim().parse::<u64>().ok());
        if count == Some(1) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {result} reload counted:\n{}",
            proxy.stderr()
        );
        tokio::task::yield_now().await;
    }
}

/// SIGHUP re-reads the file (docs/behaviour.md §14); a good one applies to new requests
/// without a restart or a dropped connection, a bad one is logged naming the field and
/// counted.
#[tokio::test]
async fn sighup_reloads_the_file_and_a_bad_one_changes_nothing() {
    let upstream = Upstream::start().await;
    let admin = TcpListener::bind("127.0.0.1:0").expect("bind");
    let admin_addr = admin.local_addr().expect("addr");
    drop(admin);
    let strict = format!(
        "upstream:\n  url: {}\nadmin:\n  listen: {admin_addr}\nroutes:\n  - path: /charges\n    required: true\n",
        upstream.url()
    );
    let file = TempConfig::new(&strict);
    let config = file.path().to_str().expect("utf-8 path");
    let mut proxy = Running::start(&["--config", config]).await;
    let client = TestClient::new(proxy.addr);
    let admin = TestClient::new(admin_addr);
    let keyless = |c: TestClient| async move {
        c.send(
            "POST",
            "/charges",
            &[("content-type", "application/json")],
            "{}",
        )
        .await
        .status
    };
    assert_eq!(keyless(client.clone()).await, 400);

    std::fs::write(
        file.path(),
        strict.replace("required: true", "required: false"),
    )
    .expect("write");
    proxy.signal("HUP").await;
    await_reloads(&admin, "ok", &proxy).await;
    assert_eq!(
        keyless(client.clone()).await,
        201,
        "applied to new requests"
    );

    std::fs::write(file.path(), "upstream:\n  url: 7\n").expect("write");
    proxy.signal("HUP").await;
    await_reloads(&admin, "error", &proxy).await;
    assert_eq!(
        keyless(client.clone()).await,
        201,
        "the running configuration stays"
    );
    assert!(
        proxy.stderr().contains("upstream.url"),
        "{}",
        proxy.stderr()
    );
    proxy.terminate().await;
    assert!(proxy.wait_exit().await.success(), "{}", proxy.stderr());
}

#[tokio::test]
async fn a_port_in_use_is_one_plain_line_in_either_log_format() {
    // Held by this test for as long as the binary tries it.
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = held.local_addr().expect("addr");
    for format in ["text", "json"] {
        let file = TempConfig::new(&format!(
            "{MINIMAL}listen: {addr}\nadmin:\n  listen: null\nlog:\n  format: {format}\n"
        ));
        let out = run(idemgate().arg("--config").arg(file.path())).await;
        assert_eq!(out.code(), Some(1), "stderr: {}", out.stderr);
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{format}: {}", out.stderr);
        assert!(
            lines[0].starts_with("idemgate: "),
            "{format}: {}",
            out.stderr
        );
        assert!(
            lines[0].contains(&addr.to_string()),
            "names the address: {}",
            out.stderr
        );
    }
}
