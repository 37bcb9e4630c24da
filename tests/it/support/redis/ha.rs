//! Redis high availability for the tests (docs/behaviour.md §14): replicas, Sentinel
//! processes (`redis-server sentinel.conf --sentinel`) and a cluster with a replica per
//! master, all on free 127.0.0.1 ports and killed when dropped, like every
//! [`RedisServer`].

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{
    NEXT_DIR, NodeConfig, PORT_ATTEMPTS, READY_TIMEOUT, RedisCluster, RedisServer, Server,
    StartError, blocking, free_ports, spawn_and_wait,
};

/// The name the test sentinels monitor their master under.
pub const MASTER_NAME: &str = "mymaster";

/// How the test sentinels judge a master: down after this long without an answer...
const DOWN_AFTER_MS: u64 = 500;
/// ...and a failover that did not finish in this long is tried again (the default is
/// 3 minutes). Also how long a sentinel leaves a replica's configuration alone.
const FAILOVER_TIMEOUT_MS: u64 = 5_000;

impl RedisServer {
    /// A replica of the server listening on `master_port` (the master itself, or a relay
    /// in front of it), with the password of `master` if it has one. Returns once its
    /// link to the master is up.
    pub async fn start_replica_of(master: &RedisServer, master_port: u16) -> RedisServer {
        // The first sync would otherwise wait 5 s for more replicas to share it.
        master.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        let port = master_port.to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", port.as_str()];
        if let Some(password) = master.password() {
            args.extend(["--masterauth", password, "--requirepass", password]);
        }
        let replica = RedisServer::start_on(master.server(), &args).await;
        replica
            .wait_info("replication", "master_link_status:up")
            .await;
        // WAIT counts a replica only once the master streams commands to it, which
        // Redis 7 starts at the replica's first acknowledgement, up to a second after the
        // sync: wait until a write arrives.
        let online = format!("port={},state=online", replica.port);
        master.wait_info("replication", &online).await;
        const PROBE: &str = "idemgate-test:replication-probe";
        master.cli(&["SET", PROBE, "1"]);
        let deadline = Instant::now() + READY_TIMEOUT;
        while replica.cli(&["EXISTS", PROBE]) != "1" {
            assert!(
                Instant::now() < deadline,
                "no replication within {READY_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        master.cli(&["DEL", PROBE]);
        replica
    }

    /// Whether one line of `INFO section` is, or contains, `line` now.
    pub fn info_has(&self, section: &str, line: &str) -> bool {
        let info = self.cli(&["INFO", section]);
        info.lines().any(|l| l.trim() == line || l.contains(line))
    }

    /// Polls `INFO section` until one of its lines is, or contains, `line`.
    pub async fn wait_info(&self, section: &str, line: &str) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let info = self.cli(&["INFO", section]);
            if info.lines().any(|l| l.trim() == line || l.contains(line)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "port {}: no '{line}' in INFO {section} after {READY_TIMEOUT:?}:\n{info}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `master` or `slave`, from `ROLE`.
    pub fn role(&self) -> String {
        self.cli(&["ROLE"])
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }
}

/// Three sentinels watching one master as [`MASTER_NAME`], quorum 2.
#[derive(Debug)]
pub struct Sentinels {
    pub nodes: Vec<RedisServer>,
}

impl Sentinels {
    /// Starts three sentinels on `master` and returns once each of them knows the other
    /// two and `replicas` replicas: a failover can then happen.
    /// The sentinels are the master's own server (`redis-server` or `valkey-server`)
    /// run with `--sentinel`.
    pub async fn start(master: &RedisServer, replicas: usize) -> Sentinels {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let (port, password) = (master.port, master.password().map(str::to_owned));
            let server = master.server();
            nodes.push(blocking(move || launch_sentinel(server, port, password.as_deref())).await);
        }
        let sentinels = Sentinels { nodes };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ready = sentinels.nodes.iter().all(|s| {
                let master = s.cli(&["SENTINEL", "MASTER", MASTER_NAME]);
                field(&master, "num-other-sentinels") == Some(2)
                    && field(&master, "num-slaves") == Some(replicas as u64)
            });
            if ready {
                return sentinels;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not find each other and {replicas} replicas in {READY_TIMEOUT:?}:\n{}",
                sentinels.nodes[0].cli(&["SENTINEL", "MASTER", MASTER_NAME])
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `redis://127.0.0.1:PORT` of each sentinel, with `user_info@` if given.
    pub fn urls(&self, user_info: &str) -> Vec<String> {
        self.nodes
            .iter()
            .map(|s| format!("redis://{user_info}127.0.0.1:{}", s.port))
            .collect()
    }

    /// The port of the master the sentinels name now (each asked in turn).
    pub fn master_port(&self) -> Option<u16> {
        self.nodes.iter().find_map(|s| {
            let reply = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
            reply.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// Waits until every sentinel names the server on `port` as the master, which then
    /// answers `ROLE` as one.
    pub async fn wait_master(&self, port: u16, server: &RedisServer) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let all = self.nodes.iter().all(|s| {
                let reply = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
                reply.lines().nth(1).map(str::trim) == Some(port.to_string().as_str())
            });
            if all && server.role() == "master" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no failover to port {port} within 30 s; sentinel says {:?}",
                self.master_port()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A `name value` pair of a flat `SENTINEL MASTER` reply as redis-cli prints it, one
/// word a line.
fn field(reply: &str, name: &str) -> Option<u64> {
    let mut lines = reply.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line == name {
            return lines.next()?.parse().ok();
        }
    }
    None
}

static SENTINEL_CONF: AtomicU64 = AtomicU64::new(0);

/// One sentinel on a free port, its configuration file (which it rewrites) in its dir.
fn launch_sentinel(server: Server, master_port: u16, password: Option<&str>) -> RedisServer {
    let mut last = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let (port, _) = free_ports(false);
        let n = NEXT_DIR.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!(
            "idemgate-sentinel-{}-{n}-{port}",
            std::process::id()
        ));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let conf = dir.join(format!(
            "sentinel-{}.conf",
            SENTINEL_CONF.fetch_add(1, Ordering::SeqCst)
        ));
        let mut text = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
        );
        if let Some(password) = password {
            // The master's password, and the same one for the sentinel itself.
            text.push_str(&format!(
                "sentinel auth-pass {MASTER_NAME} {password}\nrequirepass {password}\n"
            ));
        }
        fs::write(&conf, text).unwrap_or_else(|e| panic!("write {}: {e}", conf.display()));
        let mut server = RedisServer {
            port,
            config: NodeConfig {
                server,
                port,
                bus_port: None,
                dir,
                password: password.map(str::to_owned),
                extra: Vec::new(),
                sentinel_conf: Some(conf),
            },
            child: None,
            own_auths: AtomicU64::new(0),
        };
        match spawn_and_wait(&server.config) {
            Ok((child, own_auths)) => {
                server.child = Some(child);
                server.own_auths.store(own_auths, Ordering::SeqCst);
                return server;
            }
            Err(StartError::AddrInUse(log)) => last = log,
            Err(StartError::Failed(log)) => panic!("sentinel did not start on {port}:\n{log}"),
        }
    }
    panic!("no free port for a sentinel in {PORT_ATTEMPTS} attempts; last log:\n{last}")
}

impl RedisCluster {
    /// Three masters with a replica each (`--cluster-replicas 1`), ready once every node
    /// reports `cluster_state:ok` and every replica's link is up.
    pub async fn start_with_replicas() -> RedisCluster {
        let server = Server::from_env();
        let cluster = blocking(move || RedisCluster::create(&[server; 6], 1)).await;
        for node in &cluster.nodes {
            if node.role() == "slave" {
                node.wait_info("replication", "master_link_status:up").await;
            }
        }
        cluster
    }

    /// Which master owns which slots, and its replica, as indexes into `nodes`, from one
    /// `CLUSTER NODES`.
    pub fn shards(&self) -> Shards {
        let nodes = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        let lines: Vec<Vec<&str>> = nodes
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let index_of = |words: &[&str]| -> usize {
            let addr = words[1].split('@').next().expect("address");
            let port: u16 = addr
                .rsplit(':')
                .next()
                .expect("port")
                .parse()
                .expect("port");
            self.nodes
                .iter()
                .position(|n| n.port == port)
                .expect("a node of this cluster")
        };
        let mut ranges = Vec::new();
        for master in lines.iter().filter(|w| w[2].contains("master")) {
            let replica = lines
                .iter()
                .find(|w| w[2].contains("slave") && w[3] == master[0])
                .map(|w| index_of(w));
            for range in master.iter().skip(8) {
                let (from, to) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(from), Ok(to)) = (from.parse::<u16>(), to.parse::<u16>()) {
                    ranges.push((from..=to, index_of(master), replica));
                }
            }
        }
        Shards(ranges)
    }
}

/// Slot ranges with their master and replica (indexes into the cluster's `nodes`).
#[derive(Debug)]
pub struct Shards(Vec<(std::ops::RangeInclusive<u16>, usize, Option<usize>)>);

impl Shards {
    /// The master owning `slot`, and its replica.
    pub fn of(&self, slot: u16) -> (usize, Option<usize>) {
        let (_, master, replica) = self
            .0
            .iter()
            .find(|(range, _, _)| range.contains(&slot))
            .expect("a master owns every slot");
        (*master, *replica)
    }
}

/// `CLUSTER KEYSLOT`, as idemgate computes it for its fencing.
pub fn key_slot(key: &str) -> u16 {
    idemgate::store::key_slot(key.as_bytes())
}
