//! A TCP proxy that delays everything flowing from the upstream (the apiserver) back to the client
//! (consistd) by an adjustable amount, preserving order: the slow network of the Kopf seed, for real
//! TLS connections to the real apiserver.

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
    delay_ms: Arc<AtomicU64>,
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
        let blocked = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(tokio::sync::watch::channel(0).0);
        let holding = Arc::new(tokio::sync::watch::channel(false).0);
        let (delay, block, cut, hold) = (delay_ms.clone(), blocked.clone(), cuts.clone(), holding.clone());
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
                let mut cut = cut.subscribe();
                let relay = relay(client, upstream, delay.clone(), hold.subscribe());
                tokio::spawn(async move {
                    tokio::select! {
                        () = relay => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self { addr, delay_ms, blocked, cuts, holding, task }
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
        self.delay_ms.store(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), Ordering::SeqCst);
    }
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    mut holding: tokio::sync::watch::Receiver<bool>,
) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Client to upstream: at once unless held. The copying tasks end with this function even when it is
    // cut off (dropped), so a cut closes both directions of both sockets.
    let up = AbortOnDrop(tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if holding.wait_for(|held| !*held).await.is_err() || server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    }));
    // Upstream to client: each chunk released `delay` after it was read, in order.
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = AbortOnDrop(tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let release = Instant::now() + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
                    if tx.send((release, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    }));
    while let Some((release, chunk)) = rx.recv().await {
        tokio::time::sleep_until(release).await;
        if client_write.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let _ = client_write.shutdown().await;
    drop((up, reader));
}

/// Aborts the task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
