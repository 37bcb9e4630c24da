//! A fake Redis on 127.0.0.1:0: it completes redis-rs's RESP3 handshake the way a real
//! server does (`HELLO 3`, `CLIENT SETINFO`, `SELECT`), tells the version a test chose
//! when asked `INFO`, and answers every other command with the bytes the test chose,
//! e.g. a reply the client cannot read. Dropping it stops it and its connections.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// What `INFO` gets.
#[derive(Debug, Clone, Copy)]
pub enum Info {
    /// A real reply naming this `redis_version`.
    Version(&'static str),
    /// The same bytes as every other command.
    Garbage,
}

#[derive(Debug)]
pub struct FakeRedis {
    pub port: u16,
    received: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl FakeRedis {
    /// Answers `reply` (raw bytes, sent as they are) to every command but the handshake's
    /// and, unless `info` is `Garbage`, `INFO`.
    pub async fn start(info: Info, reply: &'static [u8]) -> FakeRedis {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        let task = tokio::spawn(async move {
            // Dropped with the accept loop: aborts every connection.
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(serve(stream, info, reply, Arc::clone(&log)));
            }
        });
        FakeRedis {
            port,
            received,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The names of the commands received so far, upper case, handshake included.
    pub fn received(&self) -> Vec<String> {
        self.received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(stream: TcpStream, info: Info, reply: &[u8], log: Arc<Mutex<Vec<String>>>) {
    let mut stream = BufReader::new(stream);
    while let Some(command) = read_command(&mut stream).await {
        let name = command.first().cloned().unwrap_or_default();
        log.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name.clone());
        let answer: Vec<u8> = match (name.as_str(), info) {
            ("HELLO", _) => b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n".to_vec(),
            ("CLIENT" | "SELECT", _) => b"+OK\r\n".to_vec(),
            ("INFO", Info::Version(version)) => {
                let text = format!("# Server\r\nredis_version:{version}\r\n");
                format!("${}\r\n{text}\r\n", text.len()).into_bytes()
            }
            _ => reply.to_vec(),
        };
        if stream.get_mut().write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// One command as clients send it, an array of bulk strings; `None` when the client left
/// or sent something else.
async fn read_command(stream: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
    let count: usize = read_header(stream, b'*').await?;
    let mut words = Vec::with_capacity(count);
    for _ in 0..count {
        let len: usize = read_header(stream, b'$').await?;
        let mut word = vec![0; len + 2];
        stream.read_exact(&mut word).await.ok()?;
        word.truncate(len);
        words.push(String::from_utf8_lossy(&word).into_owned());
    }
    if let Some(name) = words.first_mut() {
        *name = name.to_ascii_uppercase();
    }
    Some(words)
}

/// A `<kind><number>\r\n` line.
async fn read_header(stream: &mut BufReader<TcpStream>, kind: u8) -> Option<usize> {
    let mut line = Vec::new();
    stream.read_until(b'\n', &mut line).await.ok()?;
    let number = line.strip_prefix(&[kind])?.strip_suffix(b"\r\n")?;
    std::str::from_utf8(number).ok()?.parse().ok()
}
