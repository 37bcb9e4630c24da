//! Filling a server until it refuses writes, the way traffic fills a Redis that runs
//! with `maxmemory` and `noeviction`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;

use super::{CLI_TIMEOUT, RedisServer, blocking, resp_command};

impl RedisServer {
    /// Fills the server the way traffic does: `maxmemory-policy noeviction`, `maxmemory`
    /// a little above what it uses now, then filler keys until Redis refuses a write with
    /// `OOM`. The limit is then lowered a little more, so that freeing a client buffer
    /// does not let writes in again, and a fresh write is checked to be refused. Returns
    /// how many filler keys fitted. Reads are still answered.
    pub async fn fill(&self) -> u64 {
        self.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        let limit = (self.used_memory() + FILL_HEADROOM).to_string();
        self.cli(&["CONFIG", "SET", "maxmemory", &limit]);
        let (port, password) = (self.port, self.config.password.clone());
        if password.is_some() {
            self.own_auths.fetch_add(2, Ordering::SeqCst);
        }
        let fillers = blocking(move || fill_until_refused(port, password.as_deref())).await;
        let limit = self
            .used_memory()
            .saturating_sub(FILL_HEADROOM)
            .max(1)
            .to_string();
        self.cli(&["CONFIG", "SET", "maxmemory", &limit]);
        let (port, password) = (self.port, self.config.password.clone());
        let probe = blocking(move || {
            let mut conn = RawConn::open(port, password.as_deref());
            conn.ask(&["SET", "idemgate-test-filler:probe", "x"])
        })
        .await;
        assert!(probe.starts_with("-OOM"), "a write after filling: {probe}");
        fillers
    }

    fn used_memory(&self) -> u64 {
        let info = self.cli(&["INFO", "memory"]);
        info.lines()
            .find_map(|line| line.trim().strip_prefix("used_memory:"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no used_memory in {info}"))
    }
}

/// Room left above `used_memory` before `fill` starts writing: a few dozen filler keys.
const FILL_HEADROOM: u64 = 64 * 1024;
/// Size of one filler value.
const FILLER_BYTES: usize = 4 * 1024;
/// A server that takes this many filler keys is not enforcing `maxmemory`.
const MAX_FILLERS: u64 = 10_000;

/// Writes filler keys over one raw connection until a write is refused with `OOM`.
fn fill_until_refused(port: u16, password: Option<&str>) -> u64 {
    let mut conn = RawConn::open(port, password);
    let value = "x".repeat(FILLER_BYTES);
    for n in 0..MAX_FILLERS {
        let key = format!("idemgate-test-filler:{n}");
        match conn.ask(&["SET", &key, &value]) {
            ok if ok == "+OK" => {}
            oom if oom.starts_with("-OOM") => return n,
            other => panic!("filler write answered {other}"),
        }
    }
    panic!("redis took {MAX_FILLERS} filler keys of {FILLER_BYTES} bytes without refusing one")
}

/// A blocking RESP connection for commands whose reply is one line (`+OK`, `-ERR ...`),
/// error replies included, which `redis-cli -e` would turn into a panic.
struct RawConn(TcpStream);

impl RawConn {
    fn open(port: u16, password: Option<&str>) -> RawConn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(CLI_TIMEOUT))
            .expect("read timeout");
        let mut conn = RawConn(stream);
        if let Some(password) = password {
            assert_eq!(conn.ask(&["AUTH", password]), "+OK");
        }
        conn
    }

    fn ask(&mut self, args: &[&str]) -> String {
        self.0.write_all(&resp_command(args)).expect("send");
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            let n = self.0.read(&mut byte).expect("read reply");
            assert!(n > 0, "redis closed the connection");
            line.push(byte[0]);
        }
        String::from_utf8_lossy(&line).trim_end().to_owned()
    }
}
