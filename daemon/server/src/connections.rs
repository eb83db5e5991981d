//! Accepts apps' connections on the Unix socket: at most half of the process's file-descriptor limit
//! (so the daemon keeps descriptors for the apiserver, peers and its store), each one past that closed at
//! once so its client is told; and running out of descriptors anyway never turns into a busy accept loop.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use consistd_core::tasks::Tasks;
use futures::FutureExt as _;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{UnixListener, UnixStream},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

/// Connections at most, whatever the descriptor limit.
const MAX_CONNECTIONS: usize = 4096;
/// After an accept error that is not about descriptors, wait this long before accepting again.
const ERROR_PAUSE: Duration = Duration::from_millis(100);
/// A refusal is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// How many app connections the daemon holds at once: half of the soft RLIMIT_NOFILE (read from
/// /proc/self/limits; 1024 when unreadable), at most [`MAX_CONNECTIONS`].
pub(crate) fn limit() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits").ok().and_then(|limits| {
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        line.split_whitespace().nth(3)?.parse::<usize>().ok()
    });
    (soft.unwrap_or(1024) / 2).clamp(1, MAX_CONNECTIONS)
}

/// An accepted app connection; it holds one of the [`limit`] places until it closes.
pub(crate) struct AppConnection {
    stream: UnixStream,
    _place: OwnedSemaphorePermit,
}

/// The connections `listener` accepts, at most `limit` open at once; until the stream is dropped.
pub(crate) fn accept(listener: UnixListener, limit: usize, tasks: &Tasks) -> ReceiverStream<io::Result<AppConnection>> {
    let (tx, rx) = mpsc::channel(16);
    tasks.spawn(async move {
        let places = Arc::new(Semaphore::new(limit));
        // Closed and opened again to accept, and close at once, a connection while out of descriptors.
        let mut reserve = std::fs::File::open("/dev/null").ok();
        let mut logged: Option<Instant> = None;
        let mut refused = |why: &str| {
            if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                tracing::warn!(limit, "app connection refused: {why}");
                logged = Some(Instant::now());
            }
        };
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _)) => match places.clone().try_acquire_owned() {
                    Ok(place) => {
                        if tx.send(Ok(AppConnection { stream, _place: place })).await.is_err() {
                            return;
                        }
                    }
                    // Closed at once: its client sees the connection end and can try again later.
                    Err(_) => refused(&format!("{limit} connections are open (half the descriptor limit)")),
                },
                Err(error) if error.raw_os_error().is_some_and(is_out_of_descriptors) => {
                    refused("the process is out of file descriptors");
                    // The waiting connection stays readable: take it with the reserve descriptor and close
                    // it, rather than accept failing again at once forever.
                    drop(reserve.take());
                    if let Some(Ok((stream, _))) = listener.accept().now_or_never() {
                        drop(stream);
                    }
                    reserve = std::fs::File::open("/dev/null").ok();
                    if reserve.is_none() {
                        tokio::time::sleep(ERROR_PAUSE).await;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting an app connection failed");
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// EMFILE (this process) or ENFILE (the whole system).
fn is_out_of_descriptors(errno: i32) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    errno == EMFILE || errno == ENFILE
}

impl Connected for AppConnection {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for AppConnection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for AppConnection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use tokio::io::AsyncReadExt as _;

    #[test]
    fn the_limit_is_half_the_descriptor_limit() {
        let limit = limit();
        assert!((1..=MAX_CONNECTIONS).contains(&limit), "{limit}");
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_at_once_and_a_closed_one_frees_its_place() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.sock");
        let mut accepted = accept(UnixListener::bind(&path).expect("bind"), 2, &Tasks::new());
        let a = UnixStream::connect(&path).await.expect("a");
        let first = accepted.next().await.expect("a stream").expect("accepted");
        let _b = UnixStream::connect(&path).await.expect("b");
        let _second = accepted.next().await.expect("a stream").expect("accepted");
        let mut c = UnixStream::connect(&path).await.expect("c connects; the daemon closes it");
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), c.read(&mut byte)).await.expect("closed in time");
        assert_eq!(read.expect("read"), 0, "the third connection is closed at once");
        drop((a, first));
        let _d = UnixStream::connect(&path).await.expect("d");
        let fourth = tokio::time::timeout(Duration::from_secs(5), accepted.next()).await.expect("accepted in time");
        assert!(fourth.expect("a stream").is_ok(), "a closed connection's place is free again");
    }
}
