//! A fault relay: a TCP proxy on 127.0.0.1:0 placed between idemgate and a target (the
//! test upstream or a redis-server), whose behaviour a test switches at run time to cut,
//! stall, slow down or reset the connections idemgate depends on.
//!
//! The fault in force when a connection is accepted decides `Reset`, `Hang` (never
//! connect to the target) and `CutAfter` for that connection. `Delay`, `Hang` and
//! `Blackhole` are also looked up again for every chunk, so they reach connections that
//! are already open (a pooled upstream connection, Redis's one multiplexed connection);
//! switching back to `Pass` releases delayed chunks at once.
//!
//! Everything is bounded: connections, chunk size, chunks queued per direction, and the
//! time to connect to the target. Dropping the relay aborts every task it started.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Connections open at once; one more is reset on accept.
const MAX_CONNECTIONS: usize = 256;
/// Largest chunk read in one go.
const CHUNK: usize = 16 * 1024;
/// Chunks queued per direction (only `Delay` and a slow reader queue any).
const QUEUE: usize = 64;
/// How long the relay tries to reach the target before resetting the client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the relay does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways untouched.
    Pass,
    /// Hold each chunk going towards the client this long after it arrived.
    Delay(Duration),
    /// Accept, swallow the client's bytes, never answer (and never reach the target).
    Hang,
    /// Reset the client connection as soon as it is accepted.
    Reset,
    /// The target's host is gone without a word (a partition, a machine lost): the open
    /// connections pass nothing more either way and are never closed, as `Hang`; new
    /// ones are refused, as `Reset`.
    Blackhole,
    /// Forward, but after this many bytes from the target towards the client, reset both
    /// sides.
    CutAfter(usize),
}

#[derive(Debug)]
struct Shared {
    fault: watch::Sender<Fault>,
    /// Bumped by `reset_all`; every connection task watches it.
    resets: watch::Sender<u64>,
    accepted: AtomicUsize,
    /// Connections accepted before the last `reset_all`.
    reset_below: AtomicUsize,
    /// Sequence numbers of the connections still open.
    open: watch::Sender<BTreeSet<usize>>,
}

/// A running relay in front of one target.
#[derive(Debug)]
pub struct Relay {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    /// The accept loop; it owns the connection tasks, so aborting it ends them all.
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on 127.0.0.1:0 and relays every connection to `target`, with `Fault::Pass`.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let shared = Arc::new(Shared {
            fault: watch::Sender::new(Fault::Pass),
            resets: watch::Sender::new(0),
            accepted: AtomicUsize::new(0),
            reset_below: AtomicUsize::new(0),
            open: watch::Sender::new(BTreeSet::new()),
        });
        let task = tokio::spawn(accept_loop(listener, target, Arc::clone(&shared)));
        Relay { addr, shared, task }
    }

    /// Applies to new connections, and as `Delay`/`Hang`/`Pass` to the open ones.
    pub fn set(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// Resets (RST) every open connection, both sides. The connection tasks do it as soon
    /// as they run; `wait_reset` resolves once they all have.
    pub fn reset_all(&self) {
        let below = self.shared.accepted.load(Ordering::SeqCst);
        self.shared.reset_below.store(below, Ordering::SeqCst);
        self.shared
            .resets
            .send_modify(|generation| *generation += 1);
    }

    /// Resolves once every connection open at the last `reset_all` is gone. New ones (a
    /// client reconnecting at once) do not hold it up.
    pub async fn wait_reset(&self) {
        let below = self.shared.reset_below.load(Ordering::SeqCst);
        let mut open = self.shared.open.subscribe();
        open.wait_for(|open| open.range(..below).next().is_none())
            .await
            .expect("the relay owns the sender");
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Resolves once exactly `n` connections are open.
    pub async fn wait_open(&self, n: usize) {
        let mut open = self.shared.open.subscribe();
        open.wait_for(|open| open.len() == n)
            .await
            .expect("the relay owns the sender");
    }

    /// Connections open right now.
    pub fn open(&self) -> usize {
        self.shared.open.borrow().len()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops and waits until the listener is closed: nothing listens on `addr` afterwards.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // Out of descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        // Subscribed before the connection is counted, so a `reset_all` that counts it
        // is also seen by it.
        let resets = shared.resets.subscribe();
        let id = shared.accepted.fetch_add(1, Ordering::SeqCst);
        if conns.len() >= MAX_CONNECTIONS {
            rst(client);
            continue;
        }
        let fault = *shared.fault.borrow();
        shared.open.send_modify(|open| {
            open.insert(id);
        });
        let guard = OpenGuard {
            shared: Arc::clone(&shared),
            id,
        };
        let shared = Arc::clone(&shared);
        conns.spawn(async move {
            let _open = guard;
            relay_connection(client, target, fault, &shared, resets).await;
        });
    }
}

/// Marks a connection closed however its task ends, aborts included.
struct OpenGuard {
    shared: Arc<Shared>,
    id: usize,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.shared.open.send_modify(|open| {
            open.remove(&self.id);
        });
    }
}

/// Closes with an RST instead of a FIN.
fn rst(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// How one direction of a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// The sender closed its side; the close was passed on.
    Eof,
    /// `CutAfter` reached its count.
    Cut,
    /// A read or write failed (typically a reset): passed on as a reset.
    Failed,
}

async fn relay_connection(
    mut client: TcpStream,
    target: SocketAddr,
    fault: Fault,
    shared: &Shared,
    mut resets: watch::Receiver<u64>,
) {
    match fault {
        Fault::Reset | Fault::Blackhole => return rst(client),
        Fault::Hang => {
            let mut sink = [0u8; CHUNK];
            loop {
                tokio::select! {
                    read = client.read(&mut sink) => match read {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    },
                    _ = resets.changed() => return rst(client),
                }
            }
        }
        Fault::Pass | Fault::Delay(_) | Fault::CutAfter(_) => {}
    }
    let mut target = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(_)) | Err(_) => return rst(client),
    };
    let _ = client.set_nodelay(true);
    let _ = target.set_nodelay(true);
    let budget = match fault {
        Fault::CutAfter(n) => Some(n),
        _ => None,
    };
    let reset = {
        let (client_read, client_write) = client.split();
        let (target_read, target_write) = target.split();
        let up = forward(
            client_read,
            target_write,
            shared.fault.subscribe(),
            false,
            None,
        );
        let down = forward(
            target_read,
            client_write,
            shared.fault.subscribe(),
            true,
            budget,
        );
        both_ways(up, down, &mut resets).await
    };
    if reset {
        rst(client);
        rst(target);
    }
}

/// Runs both directions until both closed (false) or one must reset the pair (true).
async fn both_ways(
    up: impl Future<Output = Flow>,
    down: impl Future<Output = Flow>,
    resets: &mut watch::Receiver<u64>,
) -> bool {
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        let flow = tokio::select! {
            biased;
            _ = resets.changed() => return true,
            flow = &mut up, if !up_done => {
                up_done = true;
                flow
            }
            flow = &mut down, if !down_done => {
                down_done = true;
                flow
            }
        };
        if flow != Flow::Eof {
            return true;
        }
    }
    false
}

/// Copies one direction chunk by chunk, applying the live fault to each chunk. The reader
/// stamps each chunk on arrival, so `Delay` is a latency, not a throughput limit.
async fn forward<R, W>(
    mut from: R,
    mut to: W,
    mut fault: watch::Receiver<Fault>,
    towards_client: bool,
    mut budget: Option<usize>,
) -> Flow
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let read = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf).await {
                Ok(0) => return Flow::Eof,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                        return Flow::Failed;
                    }
                }
                Err(_) => return Flow::Failed,
            }
        }
    };
    let write = async move {
        while let Some((arrived, chunk)) = rx.recv().await {
            if !hold(&mut fault, arrived, towards_client).await {
                continue;
            }
            let chunk = match budget.as_mut() {
                Some(left) if chunk.len() >= *left => {
                    let _ = to.write_all(&chunk[..*left]).await;
                    let _ = to.flush().await;
                    return Flow::Cut;
                }
                Some(left) => {
                    *left -= chunk.len();
                    chunk
                }
                None => chunk,
            };
            if to.write_all(&chunk).await.is_err() {
                return Flow::Failed;
            }
        }
        // The reader saw EOF: pass the close on.
        let _ = to.shutdown().await;
        Flow::Eof
    };
    tokio::pin!(read, write);
    let mut reading = true;
    loop {
        tokio::select! {
            flow = &mut read, if reading => {
                if flow != Flow::Eof {
                    return flow;
                }
                // Let the writer drain what was read, then close.
                reading = false;
            }
            flow = &mut write => return flow,
        }
    }
}

/// Waits as long as the current fault says; false when the chunk is to be swallowed.
/// Changing the fault meanwhile takes effect at once.
async fn hold(fault: &mut watch::Receiver<Fault>, arrived: Instant, towards_client: bool) -> bool {
    loop {
        let current = *fault.borrow_and_update();
        match current {
            Fault::Hang | Fault::Blackhole => return false,
            Fault::Delay(delay) if towards_client => {
                tokio::select! {
                    () = tokio::time::sleep_until(arrived + delay) => return true,
                    changed = fault.changed() => {
                        if changed.is_err() {
                            return true;
                        }
                    }
                }
            }
            Fault::Pass | Fault::Delay(_) | Fault::Reset | Fault::CutAfter(_) => return true,
        }
    }
}
