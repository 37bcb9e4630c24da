//! The stores a scale run fails over (docs/behaviour.md §14, §22), on real processes on
//! free 127.0.0.1 ports: what idemgate's `store` section says for each, how its master
//! or primary is killed (`kill -9`), and how it comes back (a replica promoted, the old
//! node back as a replica of the new one).

use crate::support;

use std::time::{Duration, Instant};

use support::fault::{Fault, Relay};
use support::postgres::PgServer;
use support::redis::ha::{MASTER_NAME, Sentinels};
use support::redis::{RedisCluster, RedisServer};

use super::Settings;
use support::chaos::XorShift;

/// How long a promotion, or the old node's return as a replica, may take.
const RECOVERY_LIMIT: Duration = Duration::from_secs(60);
/// Between probes of a failover's progress; it never decides an outcome.
const POLL: Duration = Duration::from_millis(20);
/// The sentinels' `failover-timeout`, set lower than the harness's: a sentinel starts no
/// failover of the same master within twice this of the last one.
const SENTINEL_FAILOVER_TIMEOUT_MS: u64 = 2_000;
/// The sentinels' `down-after-milliseconds`, longer than the other tests' 500 ms: on a
/// loaded 2-core machine a master can go half a second unanswered, and the sentinels
/// then fail over on their own in the middle of a run (seen in CI-sized runs). Each
/// kill's window is about this much longer.
const SENTINEL_DOWN_AFTER_MS: u64 = 1_500;
/// How late a PostgreSQL standby gets the WAL, as across zones (the lag of
/// postgres_failover.rs). Redis replicas get theirs unhindered: the sentinels and the
/// cluster would point them back at the master's own address.
pub(super) const PG_REPLICATION_LAG: Duration = Duration::from_millis(20);

/// Which store a run fails over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Cluster,
    Sentinel,
    Postgres,
}

impl Kind {
    pub(super) fn parse(name: &str) -> Kind {
        match name {
            "cluster" => Kind::Cluster,
            "sentinel" => Kind::Sentinel,
            "postgres" => Kind::Postgres,
            other => panic!("no topology {other:?}: cluster, sentinel or postgres"),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Cluster => "cluster",
            Kind::Sentinel => "sentinel",
            Kind::Postgres => "postgres",
        }
    }
}

/// A running store with its replicas.
pub(super) enum Topology {
    /// Three masters with a replica each; `victim` is the killed master and its replica.
    Cluster {
        cluster: RedisCluster,
        victim: Option<(usize, usize)>,
    },
    /// A master (`nodes[master]`), two replicas, three sentinels.
    Sentinel {
        nodes: Vec<RedisServer>,
        sentinels: Sentinels,
        master: usize,
        last_kill: Option<Instant>,
    },
    /// A primary (`nodes[primary]`) and a standby, synchronous or not, that streams
    /// through `link`, which delays the WAL by [`PG_REPLICATION_LAG`].
    Postgres {
        nodes: Box<[PgServer; 2]>,
        primary: usize,
        sync: bool,
        link: Relay,
    },
}

impl Topology {
    pub(super) async fn start(settings: &Settings) -> Topology {
        match settings.kind {
            Kind::Cluster => {
                let cluster = RedisCluster::start_with_replicas().await;
                // The other shards serve while one fails over.
                for node in &cluster.nodes {
                    node.cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
                }
                Topology::Cluster {
                    cluster,
                    victim: None,
                }
            }
            Kind::Sentinel => {
                let master = RedisServer::start().await;
                let one = RedisServer::start_replica_of(&master, master.port).await;
                let two = RedisServer::start_replica_of(&master, master.port).await;
                let sentinels = Sentinels::start(&master, 2).await;
                let timeout = SENTINEL_FAILOVER_TIMEOUT_MS.to_string();
                let down_after = SENTINEL_DOWN_AFTER_MS.to_string();
                for s in &sentinels.nodes {
                    s.cli(&[
                        "SENTINEL",
                        "SET",
                        MASTER_NAME,
                        "failover-timeout",
                        &timeout,
                        "down-after-milliseconds",
                        &down_after,
                    ]);
                }
                Topology::Sentinel {
                    nodes: vec![master, one, two],
                    sentinels,
                    master: 0,
                    last_kill: None,
                }
            }
            Kind::Postgres => {
                // A promotion that comes while the standby waits to retry its primary
                // would wait out the default 5 s (see postgres_failover.rs).
                let primary = PgServer::builder()
                    .conf("wal_retrieve_retry_interval = '100ms'")
                    .start()
                    .await;
                let standby = primary.standby(!settings.async_standby).await;
                let link = Relay::start(([127, 0, 0, 1], primary.port).into()).await;
                standby.stream_through(&primary, link.addr.port()).await;
                link.set(Fault::Delay(PG_REPLICATION_LAG));
                Topology::Postgres {
                    nodes: Box::new([primary, standby]),
                    primary: 0,
                    sync: !settings.async_standby,
                    link,
                }
            }
        }
    }

    /// idemgate's `store` section for this topology.
    pub(super) fn store_yaml(&self, min_replicas: u32) -> String {
        let common = "  timeout: 500ms\n";
        match self {
            Topology::Cluster { cluster, .. } => format!(
                "store:\n  kind: redis\n  cluster: true\n  urls: [{}]\n  min_replicas: {min_replicas}\n{common}",
                cluster.seed_urls().join(", ")
            ),
            Topology::Sentinel { sentinels, .. } => format!(
                "store:\n  kind: redis\n  min_replicas: {min_replicas}\n  sentinel:\n    master_name: {MASTER_NAME}\n    urls: [{}]\n{common}",
                sentinels.urls("").join(", ")
            ),
            Topology::Postgres { nodes, .. } => format!(
                "store:\n  kind: postgres\n  url: postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write\n{common}",
                nodes[0].port, nodes[1].port
            ),
        }
    }

    /// Kills the current master or primary with SIGKILL (for PostgreSQL, with every
    /// backend: the host goes). Returns when it did, and what it killed.
    pub(super) async fn kill(&mut self, rng: &mut XorShift) -> (Instant, String) {
        match self {
            Topology::Cluster { cluster, victim } => {
                let masters: Vec<usize> = (0..cluster.nodes.len())
                    .filter(|&i| role(&cluster.nodes[i]) == "master")
                    .collect();
                let killed = masters[rng.below(masters.len() as u64) as usize];
                let replica = replica_of(cluster, killed);
                cluster.nodes[killed].kill();
                let at = Instant::now();
                *victim = Some((killed, replica));
                (
                    at,
                    format!(
                        "cluster master :{} (replica :{})",
                        cluster.nodes[killed].port, cluster.nodes[replica].port
                    ),
                )
            }
            Topology::Sentinel {
                nodes,
                master,
                last_kill,
                ..
            } => {
                // A sentinel refuses a second failover of the same master sooner.
                let spacing = Duration::from_millis(2 * SENTINEL_FAILOVER_TIMEOUT_MS + 500);
                if let Some(last) = *last_kill {
                    let ready = last + spacing;
                    if let Some(left) = ready.checked_duration_since(Instant::now()) {
                        tokio::time::sleep(left).await;
                    }
                }
                nodes[*master].kill();
                let at = Instant::now();
                *last_kill = Some(at);
                (at, format!("sentinel master :{}", nodes[*master].port))
            }
            Topology::Postgres {
                nodes,
                primary,
                link,
                ..
            } => {
                // The WAL the link still carries goes with the host.
                link.reset_all();
                link.set(Fault::Reset);
                nodes[*primary].kill_host();
                (
                    Instant::now(),
                    format!("postgres primary :{}", nodes[*primary].port),
                )
            }
        }
    }

    /// Waits for the promotion, then brings the killed node back as a replica of the new
    /// master and waits until it replicates. Returns when the new master was seen.
    #[expect(
        clippy::print_stderr,
        reason = "a failover the run did not cause, in the test's output"
    )]
    pub(super) async fn recover(&mut self) -> Instant {
        let deadline = Instant::now() + RECOVERY_LIMIT;
        match self {
            Topology::Cluster { cluster, victim } => {
                let (killed, replica) = victim.take().expect("kill before recover");
                loop {
                    let node = &cluster.nodes[replica];
                    if role(node) == "master" && cluster_ok(node) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "no promotion in the cluster");
                    tokio::time::sleep(POLL).await;
                }
                let promoted = Instant::now();
                // Its nodes.conf is kept: it rejoins, learns its slots moved, and follows.
                cluster.nodes[killed].restart().await;
                wait_replicating(&cluster.nodes[killed], deadline).await;
                promoted
            }
            Topology::Sentinel {
                nodes,
                sentinels,
                master,
                ..
            } => {
                let old = *master;
                let new = loop {
                    let named = sentinels.master_port();
                    let found = nodes.iter().position(|n| Some(n.port) == named);
                    if let Some(new) = found.filter(|&i| i != old)
                        && role(&nodes[new]) == "master"
                    {
                        break new;
                    }
                    assert!(Instant::now() < deadline, "no promotion by the sentinels");
                    tokio::time::sleep(POLL).await;
                };
                let promoted = Instant::now();
                // Back only once every sentinel names the new master: an empty old master
                // back during the failover may be kept as the master (no persistence),
                // and every replica then copies its empty data set.
                sentinels.wait_master(nodes[new].port, &nodes[new]).await;
                nodes[old].restart().await;
                // Back as a replica of the master the sentinels name now, until that master
                // has both replicas. The master is read again each time round: on a loaded
                // machine the sentinels may fail over again meanwhile (seen: the promoted
                // one demoted in turn while the old one came back), and a REPLICAOF to the
                // one before would then fight them to the deadline.
                let mut asked: Option<(u16, Instant)> = None;
                let mut reported = None;
                let current = loop {
                    let named = sentinels.master_port();
                    let found = nodes
                        .iter()
                        .position(|n| Some(n.port) == named)
                        .filter(|&i| i != old && role(&nodes[i]) == "master");
                    if let Some(current) = found {
                        if current != new && reported != Some(current) {
                            eprintln!(
                                "the sentinels failed over again on their own: :{} to :{}",
                                nodes[new].port, nodes[current].port
                            );
                            reported = Some(current);
                        }
                        let port = nodes[current].port;
                        let following = info_field(&nodes[old], "replication", "master_port")
                            == Some(port.to_string())
                            && info_has(&nodes[old], "replication", "master_link_status:up");
                        if following
                            && info_has(&nodes[current], "replication", "connected_slaves:2")
                        {
                            break current;
                        }
                        // A sentinel finishing the failover may turn it back into a master:
                        // asked again every 3 s until its link is up (as failover.rs does).
                        let due = asked.is_none_or(|(to, at)| {
                            to != port || at.elapsed() > Duration::from_secs(3)
                        });
                        if !following && due {
                            nodes[old].try_cli(&["REPLICAOF", "127.0.0.1", &port.to_string()]);
                            asked = Some((port, Instant::now()));
                        }
                    }
                    assert!(
                        Instant::now() < deadline,
                        "the old master :{} and the third node never both followed the master the sentinels name (:{:?})\nits INFO replication:\n{}\nthe others':\n{}",
                        nodes[old].port,
                        named,
                        nodes[old]
                            .try_cli(&["INFO", "replication"])
                            .unwrap_or_default(),
                        nodes
                            .iter()
                            .enumerate()
                            .filter(|&(i, _)| i != old)
                            .map(|(_, n)| format!(
                                ":{}\n{}",
                                n.port,
                                n.try_cli(&["INFO", "replication"]).unwrap_or_default()
                            ))
                            .collect::<Vec<_>>()
                            .join("\n")
                    );
                    tokio::time::sleep(POLL).await;
                };
                *master = current;
                promoted
            }
            Topology::Postgres {
                nodes,
                primary,
                sync,
                link,
            } => {
                let (old, new) = (*primary, 1 - *primary);
                nodes[new].promote().await;
                let promoted = Instant::now();
                *link = Relay::start(([127, 0, 0, 1], nodes[new].port).into()).await;
                nodes[old]
                    .rebuild_as_standby_of(&nodes[new], link.addr.port(), *sync)
                    .await;
                link.set(Fault::Delay(PG_REPLICATION_LAG));
                *primary = new;
                promoted
            }
        }
    }
}

/// The index of the replica that follows `master` in the cluster.
fn replica_of(cluster: &RedisCluster, master: usize) -> usize {
    let nodes = cluster.nodes[master].cli(&["CLUSTER", "NODES"]);
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let me = lines
        .iter()
        .find(|w| w[2].contains("myself"))
        .expect("a myself line")[0];
    let replica = lines
        .iter()
        .find(|w| w[2].contains("slave") && w[3] == me)
        .expect("the master has a replica");
    let port: u16 = replica[1]
        .split('@')
        .next()
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .expect("a replica's port");
    cluster
        .nodes
        .iter()
        .position(|n| n.port == port)
        .expect("a node of this cluster")
}

async fn wait_replicating(node: &RedisServer, deadline: Instant) {
    while !(role(node) == "slave" && info_has(node, "replication", "master_link_status:up")) {
        assert!(
            Instant::now() < deadline,
            "port {} did not come back as a replica",
            node.port
        );
        tokio::time::sleep(POLL).await;
    }
}

/// `master` or `slave` from `ROLE`; empty when the server did not answer. The probes
/// of a failover are repeated, and a sentinel closes clients' connections to the
/// servers it reconfigures, so a failed one is no error.
fn role(node: &RedisServer) -> String {
    let reply = node.try_cli(&["ROLE"]).unwrap_or_default();
    reply.lines().next().unwrap_or_default().to_owned()
}

/// Whether a line of `INFO section` is, or contains, `line` now.
fn info_has(node: &RedisServer, section: &str, line: &str) -> bool {
    let info = node.try_cli(&["INFO", section]).unwrap_or_default();
    info.lines().any(|l| l.trim() == line || l.contains(line))
}

/// The value of `field` in `INFO section` now.
fn info_field(node: &RedisServer, section: &str, field: &str) -> Option<String> {
    let info = node.try_cli(&["INFO", section])?;
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
        .map(str::to_owned)
}

/// `CLUSTER INFO` says `cluster_state:ok`.
fn cluster_ok(node: &RedisServer) -> bool {
    let info = node.try_cli(&["CLUSTER", "INFO"]).unwrap_or_default();
    info.lines().any(|l| l.trim() == "cluster_state:ok")
}
