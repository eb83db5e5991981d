//! A Unix-socket proxy between an app and its sidecar whose connections can all be cut at once: the
//! app's view of a sidecar connection lost mid-stream, with the daemon itself still running.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use tempfile::TempDir;
use tokio::{
    net::{UnixListener, UnixStream},
    task::JoinHandle,
};

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct UnixProxy {
    path: PathBuf,
    cuts: Arc<tokio::sync::watch::Sender<u64>>,
    task: JoinHandle<()>,
    _dir: TempDir,
}

impl Drop for UnixProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl UnixProxy {
    /// Listens on a socket of its own and forwards every connection to `upstream`.
    pub fn start(upstream: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("create proxy dir: {e}"));
        let path = dir.path().join("proxy.sock");
        let listener = UnixListener::bind(&path).unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
        let cuts = Arc::new(tokio::sync::watch::channel(0).0);
        let (cut, upstream) = (cuts.clone(), upstream.to_owned());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut cut = cut.subscribe();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = UnixStream::connect(&upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self { path, cuts, task, _dir: dir }
    }

    /// Where apps connect.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes every open connection (new ones are forwarded again).
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}
