//! What a client sent to Redis, as Redis saw it: `MONITOR` marks commands that Lua
//! scripts ran with `lua]`, so the round trips idemgate made can be counted exactly.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A `MONITOR` connection to one redis-server (no password).
pub struct Monitor {
    port: u16,
    feed: BufReader<TcpStream>,
    marks: u64,
}

impl Monitor {
    pub async fn start(port: u16) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect monitor");
        stream
            .write_all(b"MONITOR\r\n")
            .await
            .expect("send MONITOR");
        let mut feed = BufReader::new(stream);
        let mut ok = String::new();
        feed.read_line(&mut ok).await.expect("MONITOR reply");
        assert_eq!(ok.trim_end(), "+OK", "MONITOR refused");
        Monitor {
            port,
            feed,
            marks: 0,
        }
    }

    /// The next command a client sent (those scripts ran excluded), as its words, e.g.
    /// `["UNSUBSCRIBE", "channel"]`. Waits for it, up to 10 s.
    pub async fn next_command(&mut self) -> Vec<String> {
        loop {
            let line = self.next_line().await;
            if line.contains(" lua]") {
                continue;
            }
            // +<time> [<db> <addr>] "COMMAND" "arg" ...: the words are every other piece.
            let mut words: Vec<String> = line
                .split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            if let Some(name) = words.first_mut() {
                *name = name.to_ascii_uppercase();
                return words;
            }
        }
    }

    /// The next line of the feed, waited for up to 10 s.
    async fn next_line(&mut self) -> String {
        let mut line = String::new();
        let n = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            self.feed.read_line(&mut line),
        )
        .await
        .expect("monitor feed")
        .expect("read monitor feed");
        assert!(n > 0, "monitor connection closed");
        line
    }

    /// The commands clients sent since the last call (those scripts ran excluded), e.g.
    /// `["SET", "EVALSHA"]`. Synchronised by a marker command sent afterwards: Redis
    /// feeds monitors in the order it runs commands.
    pub async fn sent(&mut self) -> Vec<String> {
        self.marks += 1;
        let mark = format!("idemgate-monitor-mark-{}", self.marks);
        let mut other = TcpStream::connect(("127.0.0.1", self.port))
            .await
            .expect("connect");
        other
            .write_all(format!("*2\r\n$4\r\nECHO\r\n${}\r\n{mark}\r\n", mark.len()).as_bytes())
            .await
            .expect("send ECHO");
        let mut reply = [0u8; 64];
        let _ = other.read(&mut reply).await.expect("ECHO reply");
        let mut commands = Vec::new();
        loop {
            let line = self.next_line().await;
            if line.contains(&mark) {
                return commands;
            }
            if line.contains(" lua]") {
                continue;
            }
            // +<time> [<db> <addr>] "COMMAND" "arg" ...
            if let Some(name) = line.split('"').nth(1) {
                commands.push(name.to_ascii_uppercase());
            }
        }
    }
}
