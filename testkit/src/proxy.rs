//! A TCP proxy that delays everything flowing from the upstream (the apiserver) back to the client
//! (consistd), and optionally what flows to the upstream too, by adjustable amounts, preserving order: the
//! slow network of the Kopf seed, for real TLS connections to the real apiserver. It counts the
//! connections it accepted, so a test can tell a request that opened one.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    task::JoinHandle,
    time::Instant,
};

/// A running delay proxy; stops when dropped.
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    /// Delay of what the upstream sends, in milliseconds.
    delay_ms: Arc<AtomicU64>,
    /// Delay of what the client sends, in milliseconds.
    up_delay_ms: Arc<AtomicU64>,
    /// Connections accepted so far.
    accepted: Arc<AtomicU64>,
    /// Bytes the upstream sent through the proxy so far: what crossed the wire toward the client.
    down_bytes: Arc<AtomicU64>,
    /// While true, new connections are closed at once.
    blocked: Arc<AtomicBool>,
    /// Bumped to cut every open connection.
    cuts: Arc<tokio::sync::watch::Sender<u64>>,
    /// While true, nothing read from a client goes on to the upstream (it waits, in order).
    holding: Arc<tokio::sync::watch::Sender<bool>>,
    task: JoinHandle<()>,
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DelayProxy {
    /// Listens on a free 127.0.0.1 port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind proxy: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("proxy address: {e}"));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let up_delay_ms = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let down_bytes = Arc::new(AtomicU64::new(0));
        let blocked = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(tokio::sync::watch::channel(0).0);
        let holding = Arc::new(tokio::sync::watch::channel(false).0);
        let (delay, block, cut, hold) = (delay_ms.clone(), blocked.clone(), cuts.clone(), holding.clone());
        let (up_delay, count, down_count) = (up_delay_ms.clone(), accepted.clone(), down_bytes.clone());
        let task = tokio::spawn(async move {
            loop {
                let client = match listener.accept().await {
                    Ok((client, _)) => client,
                    // A connection reset before it was accepted (Linux passes its error to accept), or no
                    // file descriptor free for a moment: the proxy goes on, as a network does. Ending here
                    // closed the listener, and every later connection was refused for good.
                    Err(error) => {
                        eprintln!("proxy: accept failed, going on: {error}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if block.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                count.fetch_add(1, Ordering::SeqCst);
                let mut cut = cut.subscribe();
                let delays = Delays { down: delay.clone(), up: up_delay.clone(), down_bytes: down_count.clone() };
                let relay = relay(client, upstream, delays, hold.subscribe());
                tokio::spawn(async move {
                    tokio::select! {
                        () = relay => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self { addr, delay_ms, up_delay_ms, accepted, down_bytes, blocked, cuts, holding, task }
    }

    /// While `held`, every connection stays open but nothing the client sends reaches the upstream: a
    /// congested or paused link. Released, what was held goes on in order.
    pub fn hold(&self, held: bool) {
        self.holding.send_replace(held);
    }

    /// Closes every open connection and, while `blocked`, every new one: the daemon loses the apiserver.
    pub fn cut(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::SeqCst);
        if blocked {
            self.cuts.send_modify(|n| *n += 1);
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Delays bytes read from the upstream from now on by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(millis(delay), Ordering::SeqCst);
    }

    /// Delays bytes read from the client (on their way to the upstream) from now on by `delay`: with
    /// [`DelayProxy::set_delay`], a link slow both ways.
    pub fn set_delay_to_upstream(&self, delay: Duration) {
        self.up_delay_ms.store(millis(delay), Ordering::SeqCst);
    }

    /// Bytes the upstream has sent through the proxy so far, as they crossed the wire (TLS included).
    pub fn bytes_down(&self) -> u64 {
        self.down_bytes.load(Ordering::SeqCst)
    }

    /// How many connections the proxy has accepted (and relayed) so far.
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

fn millis(delay: Duration) -> u64 {
    u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)
}

/// The two directions' delays, in milliseconds, read as each chunk arrives.
struct Delays {
    /// Upstream to client.
    down: Arc<AtomicU64>,
    /// Client to upstream.
    up: Arc<AtomicU64>,
    /// Counts the bytes from upstream to client.
    down_bytes: Arc<AtomicU64>,
}

async fn relay(client: TcpStream, upstream: SocketAddr, delays: Delays, holding: tokio::sync::watch::Receiver<bool>) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    // Each chunk goes on as soon as it is released, as on a wire: with Nagle's algorithm the proxy itself
    // would hold a small write (an HTTP/2 frame) until the previous one is acknowledged, up to the
    // receiver's 40 ms delayed ACK, which neither end sees on a real link (both set TCP_NODELAY).
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Client to upstream: each chunk released `up` after it was read, in order, and not while held. The
    // copying tasks end with this function even when it is cut off (dropped), so a cut closes both
    // directions of both sockets.
    let (up_tx, up_rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let up_reader = AbortOnDrop(tokio::spawn(read_timed(client_read, delays.up, up_tx, None)));
    let up = AbortOnDrop(tokio::spawn(write_released(up_rx, server_write, Some(holding))));
    // Upstream to client: each chunk released `down` after it was read, in order.
    let (tx, rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = AbortOnDrop(tokio::spawn(read_timed(server_read, delays.down, tx, Some(delays.down_bytes))));
    write_released(rx, client_write, None).await;
    drop((up_reader, up, reader));
}

/// Reads chunks from `from` and sends each with the moment it may go on: `delay_ms` after it was read;
/// adds each chunk's length to `counted`.
async fn read_timed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    delay_ms: Arc<AtomicU64>,
    to: mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    counted: Option<Arc<AtomicU64>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(counted) = &counted {
                    counted.fetch_add(n as u64, Ordering::SeqCst);
                }
                let release = Instant::now() + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
                if to.send((release, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
}

/// Writes each chunk to `to` at its release moment, in order, and never while `holding` says held; shuts
/// `to` down when the chunks end.
async fn write_released(
    mut chunks: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut holding: Option<tokio::sync::watch::Receiver<bool>>,
) {
    while let Some((release, chunk)) = chunks.recv().await {
        tokio::time::sleep_until(release).await;
        if let Some(holding) = &mut holding
            && holding.wait_for(|held| !*held).await.is_err()
        {
            break;
        }
        if to.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Aborts the task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
