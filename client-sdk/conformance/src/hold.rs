//! A Unix-socket proxy between an agent and its sidecar that can hold back what the sidecar sends on the
//! streams already open, while new calls pass: a watch's next event delayed past the answer of a write made
//! after it, on one connection. That is the moment the own-write rule exists for (a state of the watch
//! still on its way when the app's own write returns), made to last as long as a test needs.
//!
//! It reads the HTTP/2 frames gRPC sends in the clear over the socket, without changing a byte: from the
//! app, the ids of the streams it opens (HEADERS frames); from the sidecar, which stream each frame
//! belongs to. While holding, the sidecar's DATA frames of every stream the app had opened when the hold
//! began wait in the proxy, in order, and everything else goes on; released, they follow in order. A
//! header block of a held stream (its trailers: the stream ends) would have to pass the held DATA, and
//! header blocks share one compression state, so from such a frame on the connection is held whole.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU32, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{
        UnixListener, UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::watch,
    task::JoinHandle,
};

/// What an HTTP/2 client sends first, before any frame (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Every frame starts with a header of this many bytes: length (24 bits), type, flags, stream id (31 bits).
const FRAME_HEADER: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct HoldProxy {
    path: PathBuf,
    /// Each connection's newest stream id the app opened, for the marks of a hold.
    connections: Arc<Mutex<Vec<Arc<Connection>>>>,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// What the proxy knows of one connection.
#[derive(Debug)]
struct Connection {
    /// The largest stream id the app has opened on it.
    opened: AtomicU32,
    /// While nonzero, the sidecar's DATA frames of streams up to this id are held; 0: nothing is.
    mark: watch::Sender<u32>,
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HoldProxy {
    /// Listens on a socket of its own and forwards every connection to `upstream`.
    pub fn start(upstream: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("create proxy dir: {e}"));
        let path = dir.path().join("hold.sock");
        let listener = UnixListener::bind(&path).unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
        let connections: Arc<Mutex<Vec<Arc<Connection>>>> = Arc::default();
        let (known, upstream) = (connections.clone(), upstream.to_owned());
        let task = tokio::spawn(async move {
            while let Ok((app, _)) = listener.accept().await {
                let Ok(sidecar) = UnixStream::connect(&upstream).await else { continue };
                let connection = Arc::new(Connection { opened: AtomicU32::new(0), mark: watch::channel(0).0 });
                known.lock().unwrap_or_else(PoisonError::into_inner).push(connection.clone());
                let (app_read, app_write) = app.into_split();
                let (sidecar_read, sidecar_write) = sidecar.into_split();
                let up = tokio::spawn(app_to_sidecar(app_read, sidecar_write, connection.clone()));
                tokio::spawn(async move {
                    sidecar_to_app(sidecar_read, app_write, connection).await;
                    up.abort();
                });
            }
        });
        Self { path, connections, task, _dir: dir }
    }

    /// Where the agent connects.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// From now on, until [`HoldProxy::release`], what the sidecar sends on the streams open now waits in
    /// the proxy; calls made from now on pass.
    pub fn hold(&self) {
        for connection in self.connections.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let opened = connection.opened.load(Ordering::SeqCst);
            connection.mark.send_replace(opened);
        }
    }

    /// Sends on everything held, in order, and holds nothing more.
    pub fn release(&self) {
        for connection in self.connections.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            connection.mark.send_replace(0);
        }
    }
}

/// The frame header at the start of `bytes`: (length of the payload, type, stream id).
fn frame_header(bytes: &[u8]) -> (usize, u8, u32) {
    let length = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
    let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
    (length, bytes[3], stream)
}

/// Copies the app's bytes to the sidecar as they come, noting the id of each stream it opens.
async fn app_to_sidecar(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, connection: Arc<Connection>) {
    let mut buf = vec![0u8; 64 * 1024];
    // What has been read but not parsed yet: the preface, then frames.
    let mut unparsed: Vec<u8> = Vec::new();
    let mut preface_left = PREFACE.len();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        unparsed.extend_from_slice(&buf[..n]);
        let skip = preface_left.min(unparsed.len());
        unparsed.drain(..skip);
        preface_left -= skip;
        while unparsed.len() >= FRAME_HEADER {
            let (length, kind, stream) = frame_header(&unparsed);
            if unparsed.len() < FRAME_HEADER + length {
                break;
            }
            if kind == HEADERS {
                connection.opened.fetch_max(stream, Ordering::SeqCst);
            }
            unparsed.drain(..FRAME_HEADER + length);
        }
    }
}

/// Copies the sidecar's frames to the app, holding those of the streams a hold covers.
async fn sidecar_to_app(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, connection: Arc<Connection>) {
    let mut marks = connection.mark.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    let mut unparsed: Vec<u8> = Vec::new();
    // Frames waiting for the release, in order; the streams they belong to; whether everything waits.
    let mut held: Vec<u8> = Vec::new();
    let mut held_streams: Vec<u32> = Vec::new();
    let mut held_whole = false;
    loop {
        tokio::select! {
            read = from.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                unparsed.extend_from_slice(&buf[..n]);
                let mark = *marks.borrow_and_update();
                // Released since the last frames: what was held goes first (the change is seen here, not below).
                let mut pass: Vec<u8> = Vec::new();
                if mark == 0 {
                    pass = std::mem::take(&mut held);
                    held_streams.clear();
                    held_whole = false;
                }
                while unparsed.len() >= FRAME_HEADER {
                    let (length, kind, stream) = frame_header(&unparsed);
                    if unparsed.len() < FRAME_HEADER + length {
                        break;
                    }
                    let frame: Vec<u8> = unparsed.drain(..FRAME_HEADER + length).collect();
                    let covered = mark != 0 && stream != 0 && stream <= mark;
                    let of_held = held_streams.contains(&stream);
                    if held_whole || (covered && kind == DATA) || of_held {
                        if of_held && matches!(kind, HEADERS | CONTINUATION | PUSH_PROMISE) {
                            held_whole = true;
                        }
                        if !held_streams.contains(&stream) {
                            held_streams.push(stream);
                        }
                        held.extend_from_slice(&frame);
                    } else {
                        pass.extend_from_slice(&frame);
                    }
                }
                if !pass.is_empty() && to.write_all(&pass).await.is_err() {
                    return;
                }
            }
            changed = marks.changed() => {
                if changed.is_err() {
                    return;
                }
                if *marks.borrow_and_update() == 0 {
                    held_streams.clear();
                    held_whole = false;
                    if !held.is_empty() && to.write_all(&std::mem::take(&mut held)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
