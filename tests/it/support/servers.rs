//! An upstream that reads requests the way real servers do, over a raw socket with an
//! HTTP/1.1 parser of its own (not hyper's): Jetty and Flask decode `%2F` and `%5C` in
//! the path before routing, Tomcat-style servers drop `;parameters` before resolving
//! dot segments (so `/..;/` climbs), and Jetty answers an `Upgrade: h2c` with `101` and
//! speaks HTTP/2 from then on. What it executes is logged under the route it resolved,
//! which is what the guard must have seen.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How the server answers upgrades.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrades {
    /// As Jetty: `101` with `Upgrade: h2c` to a request asking for h2c with
    /// `HTTP2-Settings`, and `101 websocket` to one asking for websocket.
    Honour,
    /// `101` without an `Upgrade` header to every request, whatever it asked for.
    SwitchAlways,
    /// `101` naming `h2c` to a request that asked for websocket.
    SwitchToOther,
}

/// One request the server executed.
#[derive(Debug, Clone)]
pub struct Executed {
    pub method: String,
    /// The request target as it arrived.
    pub target: String,
    /// The path the server routed it to, after its own decoding.
    pub route: String,
    /// Header names, lower-cased, with their values.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[derive(Debug, Default)]
struct Log {
    executed: Vec<Executed>,
    /// `101`s sent.
    switched: usize,
    /// Bytes that arrived on a connection after its `101`: requests the guard never saw.
    tunnelled: Vec<u8>,
}

pub struct RealServer {
    pub addr: SocketAddr,
    log: Arc<Mutex<Log>>,
    changed: Arc<Notify>,
    task: JoinHandle<()>,
}

impl RealServer {
    pub async fn start(upgrades: Upgrades) -> RealServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let log = Arc::new(Mutex::new(Log::default()));
        let changed = Arc::new(Notify::new());
        let (accept_log, accept_changed) = (Arc::clone(&log), Arc::clone(&changed));
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let log = Arc::clone(&accept_log);
                let changed = Arc::clone(&accept_changed);
                connections.spawn(serve(stream, upgrades, log, changed));
            }
        });
        RealServer {
            addr,
            log,
            changed,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn executed(&self) -> Vec<Executed> {
        self.log.lock().expect("lock").executed.clone()
    }

    /// The routes executed, in order.
    pub fn routes(&self) -> Vec<String> {
        self.executed().into_iter().map(|e| e.route).collect()
    }

    pub fn switched(&self) -> usize {
        self.log.lock().expect("lock").switched
    }

    pub fn tunnelled(&self) -> Vec<u8> {
        self.log.lock().expect("lock").tunnelled.clone()
    }

    /// Resolves once `n` requests were executed or `n` bytes tunnelled, whichever the
    /// test waits for.
    pub async fn wait(&self, done: impl Fn(&RealServer) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(self) {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for RealServer {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it ends them all.
        self.task.abort();
    }
}

/// The path as Jetty, Flask and Tomcat route it: `;parameters` dropped from each
/// segment, every escape decoded (`%2F` and `%5C` included), `\` read as `/`, then dot
/// segments resolved.
pub fn route_of(target: &str) -> String {
    let path = target.split('?').next().unwrap_or("");
    let stripped: Vec<&str> = path
        .split('/')
        .map(|s| s.split(';').next().unwrap_or(""))
        .collect();
    let decoded = percent_decode(&stripped.join("/")).replace('\\', "/");
    let mut out: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    format!("/{}", out.join("/"))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).and_then(|b| hex(*b)),
                bytes.get(i + 2).and_then(|b| hex(*b)),
            )
        {
            out.push(u8::try_from(hi * 16 + lo).expect("two hex digits"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Head {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn lists(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }
}

async fn serve(
    mut stream: TcpStream,
    upgrades: Upgrades,
    log: Arc<Mutex<Log>>,
    changed: Arc<Notify>,
) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let Some(head) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        let Some(body) = read_body(&mut stream, &mut buf, &head).await else {
            return;
        };
        let asked_h2c = head.lists("upgrade", "h2c") && head.header("http2-settings").is_some();
        let asked_ws = head.lists("upgrade", "websocket");
        let switch_to = match upgrades {
            Upgrades::Honour if asked_h2c => Some(Some("h2c")),
            Upgrades::Honour if asked_ws => Some(Some("websocket")),
            Upgrades::Honour => None,
            Upgrades::SwitchAlways => Some(None),
            Upgrades::SwitchToOther if asked_ws => Some(Some("h2c")),
            Upgrades::SwitchToOther => None,
        };
        let n = {
            let mut log = log.lock().expect("lock");
            log.executed.push(Executed {
                method: head.method.clone(),
                target: head.target.clone(),
                route: route_of(&head.target),
                headers: head.headers.clone(),
                body,
            });
            log.executed.len()
        };
        changed.notify_waiters();
        if let Some(protocol) = switch_to {
            let upgrade = protocol.map_or_else(String::new, |p| format!("upgrade: {p}\r\n"));
            let answer =
                format!("HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n{upgrade}\r\n");
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            log.lock().expect("lock").switched += 1;
            changed.notify_waiters();
            // From here on the connection is another protocol's: whatever arrives is
            // kept, as the requests it carries would be executed unguarded.
            let mut tunnelled = std::mem::take(&mut buf);
            loop {
                if !tunnelled.is_empty() {
                    log.lock().expect("lock").tunnelled.append(&mut tunnelled);
                    changed.notify_waiters();
                }
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(k) => tunnelled.extend_from_slice(&chunk[..k]),
                }
            }
        }
        let route = route_of(&head.target);
        let body = format!("{{\"execution\":{n},\"route\":\"{route}\"}}");
        let close = head.lists("connection", "close");
        let answer = format!(
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n{body}",
            body.len(),
            if close { "connection: close\r\n" } else { "" }
        );
        if stream.write_all(answer.as_bytes()).await.is_err() || close {
            return;
        }
    }
}

async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Head> {
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if !fill(stream, buf).await {
            return None;
        }
    };
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end + 4);
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let target = first.next()?.to_owned();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Head {
        method,
        target,
        headers,
    })
}

async fn read_body(stream: &mut TcpStream, buf: &mut Vec<u8>, head: &Head) -> Option<Vec<u8>> {
    if head.lists("transfer-encoding", "chunked") {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                    break at;
                }
                if !fill(stream, buf).await {
                    return None;
                }
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            buf.drain(..line_end + 2);
            while buf.len() < size + 2 {
                if !fill(stream, buf).await {
                    return None;
                }
            }
            body.extend_from_slice(&buf[..size]);
            buf.drain(..size + 2);
            if size == 0 {
                return Some(body);
            }
        }
    }
    let length: usize = head
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < length {
        if !fill(stream, buf).await {
            return None;
        }
    }
    Some(buf.drain(..length).collect())
}
