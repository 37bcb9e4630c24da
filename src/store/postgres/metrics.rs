//! The PostgreSQL store's own metrics (docs/behaviour.md §22):
//! `idemgate_store_pool_connections{state="idle|busy"}`, read from the pool on each
//! scrape, and `idemgate_store_expired`, the rows the sweep deleted.

use deadpool_postgres::Pool;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

#[derive(Debug)]
pub(super) struct PoolMetrics {
    pool: Pool,
    expired: Counter,
}

impl PoolMetrics {
    pub(super) fn new(pool: Pool) -> Self {
        Self {
            pool,
            expired: Counter::default(),
        }
    }

    pub(super) fn swept(&self, rows: u64) {
        self.expired.inc_by(rows);
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "idemgate_store_expired",
            "Expired rows deleted by the postgres store's background sweep",
            self.expired.clone(),
        );
        registry.register_collector(Box::new(Connections(self.pool.clone())));
    }
}

/// The pool's connections by state, as the pool counts them at the scrape.
#[derive(Debug)]
struct Connections(Pool);

impl Collector for Connections {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let status = self.0.status();
        let idle = status.available;
        let busy = status.size.saturating_sub(status.available);
        let gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        let mut family = encoder.encode_descriptor(
            "idemgate_store_pool_connections",
            "Connections of the postgres store's pool, by state",
            None,
            gauge(0).metric_type(),
        )?;
        for (state, n) in [("idle", idle), ("busy", busy)] {
            gauge(n).encode(family.encode_family(&[("state", state)])?)?;
        }
        Ok(())
    }
}
