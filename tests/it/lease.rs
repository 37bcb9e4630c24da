//! The lease around an exchange and the orphans of store calls that timed out, on the
//! memory store with one operation made to stop answering (`support::stall`).

use crate::support;

use std::time::{Duration, Instant};

use idemgate::config::Config;
use idemgate::metrics::StoreOp;
use idemgate::store::{MemoryStore, Store};
use support::stall::{Stalling, When, stalling};
use support::{Proxy, Upstream, crashed_owner};

/// A proxy whose store stalls `op`, from YAML with `{upstream}`.
async fn stalling_proxy(
    yaml: &str,
    up: &Upstream,
    op: StoreOp,
    when: When,
) -> Proxy<Stalling<MemoryStore>> {
    let yaml = yaml.replace("{upstream}", &up.url());
    let config = Config::from_yaml_str(&yaml, &|_| None).expect("test config is valid");
    let store = stalling(MemoryStore::new(1000), op, when);
    Proxy::with_store(config, std::sync::Arc::new(store)).await
}

/// Waits for a condition on the metrics, failing the test after 10 s instead of hanging.
async fn eventually<S: Store>(
    proxy: &Proxy<S>,
    what: &str,
    cond: impl Fn(&idemgate::metrics::Metrics) -> bool,
) {
    tokio::time::timeout(
        Duration::from_secs(10),
        proxy.state.metrics.wait_until(cond),
    )
    .await
    .unwrap_or_else(|_| panic!("never happened: {what}"));
}

#[tokio::test]
async fn a_renewal_that_hangs_does_not_hold_back_the_upstream_deadline() {
    let up = Upstream::start().await;
    // A renewal is due after 50 ms; it never answers, and the store's own deadline is
    // far away. The upstream's deadline (300 ms) must still end the exchange on time.
    let proxy = stalling_proxy(
        "upstream:\n  url: {upstream}\n  timeout: 300ms\nstore:\n  timeout: 20s\nidempotency:\n  lease: 150ms\n",
        &up,
        StoreOp::Renew,
        When::Before,
    )
    .await;
    let started = Instant::now();
    let r = proxy.client().post("/hang", "slow", "{}").await;
    let took = started.elapsed();
    assert_eq!(r.status, 504);
    assert_eq!(r.problem(), "outcome-unknown");
    assert!(
        took < Duration::from_secs(5),
        "answered after {took:?}: the renewal held the exchange back"
    );
}

#[tokio::test]
async fn a_take_over_that_timed_out_is_released_under_release() {
    let up = Upstream::start().await;
    let proxy = stalling_proxy(
        "upstream:\n  url: {upstream}\nstore:\n  timeout: 200ms\nidempotency:\n  on_unknown_outcome: release\n",
        &up,
        StoreOp::TakeOver,
        When::After,
    )
    .await;
    crashed_owner(&proxy, "/charges", "orphan").await;
    let c = proxy.client();
    let r = c.post("/charges", "orphan", "{}").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.problem(), "store-unavailable");
    // The take-over was written all the same: its marker is released in the background
    // rather than left to hold the key for a whole lease.
    eventually(&proxy, "the orphaned take-over is released", |m| {
        m.orphans_released() == 1
    })
    .await;
    let r = c.post("/charges", "orphan", "{}").await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(!r.replayed());
    assert_eq!(up.count(), 1);
}

#[tokio::test]
async fn a_take_over_that_timed_out_records_outcome_unknown_under_record() {
    let up = Upstream::start().await;
    let proxy = stalling_proxy(
        "upstream:\n  url: {upstream}\nstore:\n  timeout: 200ms\n",
        &up,
        StoreOp::TakeOver,
        When::After,
    )
    .await;
    crashed_owner(&proxy, "/charges", "orphan").await;
    let c = proxy.client();
    let r = c.post("/charges", "orphan", "{}").await;
    assert_eq!(r.status, 503, "{}", r.text());
    // Never freed: the crashed owner may have executed it. What the take-over was for,
    // recording the unknown outcome, is done in the background.
    eventually(&proxy, "the unknown outcome is recorded", |m| {
        m.late_records() == 1
    })
    .await;
    let r = c.post("/charges", "orphan", "{}").await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.problem(), "outcome-unknown");
    assert!(r.replayed());
    assert_eq!(up.count(), 0, "never a silent second execution");
}

#[tokio::test]
async fn a_claim_that_timed_out_is_released_in_the_background() {
    let up = Upstream::start().await;
    let proxy = stalling_proxy(
        "upstream:\n  url: {upstream}\nstore:\n  timeout: 200ms\n",
        &up,
        StoreOp::Claim,
        When::After,
    )
    .await;
    let r = proxy.client().post("/charges", "orphan", "{}").await;
    assert_eq!(r.status, 503, "{}", r.text());
    eventually(&proxy, "the orphaned claim is released", |m| {
        m.orphans_released() == 1
    })
    .await;
    assert!(proxy.state.store.is_empty());
    assert_eq!(up.count(), 0);
}
