//! Making a connection when the URL names several hosts (docs/behaviour.md §22
//! "Failover"): each host is tried under a time limit of its own, the one that last
//! answered first.
//!
//! tokio-postgres tries the hosts in turn, but its `connect_timeout` covers only the
//! socket's connect: a host that accepts and then never answers the start-up (a paused
//! machine, a hung postmaster) holds the whole attempt, and the pool's own limit
//! (`store.timeout`) ends it before the next host is tried, on every attempt. So the
//! pool's connector here gives each host an equal share of that limit, and starts
//! from the host that last made a connection, so that after a failover every new
//! connection goes first to the new primary.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_postgres::Connect;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The pool's connector: one configuration per host of the URL.
pub(super) struct HostByHost {
    hosts: Vec<Config>,
    tls: MakeRustlsConnect,
    per_host: Duration,
    /// The index of the host that last made a connection.
    last_good: AtomicUsize,
}

impl HostByHost {
    /// `url` as tokio-postgres reads it; `settings` applied to each host's
    /// configuration; `budget` shared among the hosts.
    pub(super) fn new(
        url: &str,
        settings: impl Fn(&mut Config),
        tls: MakeRustlsConnect,
        budget: Duration,
    ) -> Result<Self, tokio_postgres::Error> {
        let hosts = split_hosts(url)
            .iter()
            .map(|one| {
                let mut config: Config = one.parse()?;
                settings(&mut config);
                Ok(config)
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
        let share = u32::try_from(hosts.len().max(1)).unwrap_or(u32::MAX);
        Ok(Self {
            per_host: budget / share,
            hosts,
            tls,
            last_good: AtomicUsize::new(0),
        })
    }
}

type Connected = Result<(Client, JoinHandle<()>), tokio_postgres::Error>;

impl Connect for HostByHost {
    fn connect(&self, _: &Config) -> Pin<Box<dyn Future<Output = Connected> + Send + '_>> {
        Box::pin(async move {
            let n = self.hosts.len();
            let first = self.last_good.load(Ordering::Relaxed);
            let mut failed = None;
            for i in (0..n).map(|k| (first + k) % n) {
                let attempt = self.hosts[i].connect(self.tls.clone());
                match tokio::time::timeout(self.per_host, attempt).await {
                    Ok(Ok((client, connection))) => {
                        self.last_good.store(i, Ordering::Relaxed);
                        let task = tokio::spawn(async move {
                            if let Err(err) = connection.await {
                                tracing::debug!(error = %err, "postgres store: a connection ended");
                            }
                        });
                        return Ok((client, task));
                    }
                    Ok(Err(err)) => failed = Some(err),
                    // Silent: the next host.
                    Err(_) => {}
                }
            }
            match failed {
                Some(err) => Err(err),
                // Every host was silent: the pool's limit, which it is about to reach,
                // answers for them.
                None => std::future::pending().await,
            }
        })
    }
}

/// `postgres://user@h1:5432,h2:5433/db?x` as one URL per host, the rest kept: `[
/// postgres://user@h1:5432/db?x, postgres://user@h2:5433/db?x ]`. A URL of one host
/// is itself.
fn split_hosts(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_owned()];
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    hosts
        .split(',')
        .map(|host| format!("{scheme}://{userinfo}{host}{tail}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_keeps_the_rest_of_the_url() {
        assert_eq!(
            split_hosts(
                "postgres://u:p@db1:5432,db2:5433,[::1]:5434/app?target_session_attrs=read-write"
            ),
            [
                "postgres://u:p@db1:5432/app?target_session_attrs=read-write",
                "postgres://u:p@db2:5433/app?target_session_attrs=read-write",
                "postgres://u:p@[::1]:5434/app?target_session_attrs=read-write",
            ]
        );
        assert_eq!(split_hosts("postgres://db1/app"), ["postgres://db1/app"]);
        assert_eq!(
            split_hosts("postgresql://h1,h2?sslmode=disable"),
            [
                "postgresql://h1?sslmode=disable",
                "postgresql://h2?sslmode=disable"
            ]
        );
    }
}
