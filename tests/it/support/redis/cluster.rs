//! Redis Cluster for the tests: masters (and replicas, `ha.rs`) of real servers, joined
//! as `redis-cli --cluster create` joins them.

use std::time::{Duration, Instant};

use super::{READY_TIMEOUT, RedisServer, Server};
use crate::support::commands::blocking;

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16384;
/// How long a cluster join waits for a handshake before sending `CLUSTER MEET` again.
const MEET_AGAIN: Duration = Duration::from_secs(1);

/// Three masters with all slots assigned.
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Three masters joined as `redis-cli --cluster create` joins them, ready once every node reports
    /// `cluster_state:ok`. The setup's own commands stay in the counters: compare deltas.
    pub async fn start() -> RedisCluster {
        let server = Server::from_env();
        blocking(move || RedisCluster::create(&[server; 3], 0)).await
    }

    /// One master per entry of `servers`, each running that server: a fleet in the
    /// middle of a rolling upgrade when they differ.
    pub async fn start_of(servers: &[Server]) -> RedisCluster {
        let servers = servers.to_vec();
        blocking(move || RedisCluster::create(&servers, 0)).await
    }

    /// A node per entry of `servers`, joined with `replicas` replicas per master.
    pub(super) fn create(servers: &[Server], replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = servers
            .iter()
            .map(|&server| RedisServer::launch(server, &[], true))
            .collect();
        let cluster = RedisCluster { nodes };
        cluster.join(replicas);
        cluster.wait_ok();
        cluster
    }

    /// What `redis-cli --cluster create` does, with the first `len / (replicas + 1)` nodes
    /// as masters and the rest as their replicas in order, except that `CLUSTER MEET` is
    /// sent again while a node does not know them all. A handshake not finished within
    /// the node timeout (2 s here) is dropped, which a loaded machine causes (a node not
    /// scheduled for 2 s), and redis-cli then waits forever for a cluster that never
    /// joins.
    fn join(&self, replicas: usize) {
        let masters = self.nodes.len() / (replicas + 1);
        for (i, node) in self.nodes.iter().enumerate() {
            // Distinct epochs up front, as redis-cli assigns them: no collisions to settle.
            node.cli(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
            if i < masters {
                let from = (i * SLOTS / masters).to_string();
                let to = ((i + 1) * SLOTS / masters - 1).to_string();
                node.cli(&["CLUSTER", "ADDSLOTSRANGE", &from, &to]);
            }
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut next_meet = Instant::now();
        loop {
            // `cluster_known_nodes` counts handshakes under way too: count finished ones.
            let strangers: Vec<&RedisServer> = self
                .nodes
                .iter()
                .filter(|node| {
                    let nodes = node.cli(&["CLUSTER", "NODES"]);
                    let met = nodes
                        .lines()
                        .filter(|l| {
                            let flags = l.split_whitespace().nth(2).unwrap_or("handshake");
                            !flags.split(',').any(|f| f == "handshake" || f == "noaddr")
                        })
                        .count();
                    met < self.nodes.len()
                })
                .collect();
            if strangers.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                let node = strangers[0];
                panic!(
                    "cluster nodes did not meet within {READY_TIMEOUT:?}; node {}:\n{}\nlog:\n{}",
                    node.port,
                    node.cli(&["CLUSTER", "NODES"]),
                    node.config.read_log()
                );
            }
            if Instant::now() >= next_meet {
                // A handshake under way makes MEET answer OK and change nothing, and a
                // node already known is recognised when its handshake answers.
                for node in &strangers {
                    for other in self.nodes.iter().filter(|o| o.port != node.port) {
                        let port = other.port.to_string();
                        let bus = other
                            .config
                            .bus_port
                            .expect("a cluster node has a bus port");
                        node.cli(&["CLUSTER", "MEET", "127.0.0.1", &port, &bus.to_string()]);
                    }
                }
                next_meet = Instant::now() + MEET_AGAIN;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for (i, replica) in self.nodes.iter().enumerate().skip(masters) {
            let master = self.nodes[(i - masters) % masters].cli(&["CLUSTER", "MYID"]);
            replica.cli(&["CLUSTER", "REPLICATE", &master]);
        }
    }

    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("redis://127.0.0.1:{}", node.port))
            .collect()
    }

    pub fn total_calls(&self) -> u64 {
        self.nodes.iter().map(RedisServer::total_calls).sum()
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pending: Vec<&RedisServer> = self.nodes.iter().collect();
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            pending.retain(|node| {
                let info = node.cli(&["CLUSTER", "INFO"]);
                let ok = ["cluster_state:ok", "cluster_slots_ok:16384", known.as_str()];
                !ok.iter()
                    .all(|want| info.lines().any(|l| l.trim() == *want))
            });
            let Some(node) = pending.first() else { return };
            if Instant::now() > deadline {
                panic!(
                    "cluster not ok after {READY_TIMEOUT:?}; node {}:\n{}\nlog:\n{}",
                    node.port,
                    node.cli(&["CLUSTER", "INFO"]),
                    node.config.read_log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
