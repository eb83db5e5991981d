//! Claims a Unix socket path safely: a live daemon's socket is never taken over, a dead daemon's stale
//! socket is replaced, and the socket gets the configured mode and group.
//!
//! Ownership is an exclusive lock on `<socket>.lock`, held for the daemon's life and released by the
//! kernel when the process dies, however it dies. The lock file is never deleted: deleting it would let
//! a second daemon lock a new file while the first still holds the old one.

use std::{
    fs::{File, OpenOptions, Permissions},
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
};

use tokio::net::UnixListener;

/// Why a socket could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Another live process serves this path.
    #[error("socket {path} is in use by a running consistd ({reason}); refusing to take it over")]
    InUse {
        /// The socket path another process serves.
        path: PathBuf,
        /// What gave it away: its lock file is held, or the socket accepts connections.
        reason: &'static str,
    },
    /// Something that is not a socket sits at the path.
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket {
        /// The path, which holds a file, directory or other non-socket.
        path: PathBuf,
    },
    /// A filesystem call failed: creating the directory, locking, binding, setting mode or group, or
    /// removing a stale socket.
    #[error("{op} {path}")]
    Io {
        /// The step, e.g. "bind socket"; the message reads `<op> <path>`.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

/// A claimed socket: removes the socket file when dropped, then releases the lock.
#[derive(Debug)]
pub struct SocketGuard {
    path: PathBuf,
    // Declared after `path` only for clarity; the socket is removed in `drop` before this closes.
    _lock: File,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(%error, path = %self.path.display(), "could not remove socket on shutdown");
        }
    }
}

/// Claims `path`, binds a listener on it, and sets its permission bits and group.
pub fn bind(path: &Path, mode: u32, group_id: Option<u32>) -> Result<(UnixListener, SocketGuard), SocketError> {
    let io_err = |op, source| SocketError::Io { op, path: path.to_owned(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io_err("create socket directory for", e))?;
    }

    let lock_path = lock_path(path);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| SocketError::Io { op: "open lock file", path: lock_path.clone(), source: e })?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(SocketError::InUse { path: path.to_owned(), reason: "its lock file is held" });
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(SocketError::Io { op: "lock", path: lock_path, source: e });
        }
    }

    remove_if_stale(path)?;
    let listener = UnixListener::bind(path).map_err(|e| io_err("bind socket", e))?;
    // From here on the guard removes the socket if a later step fails.
    let guard = SocketGuard { path: path.to_owned(), _lock: lock };
    std::fs::set_permissions(path, Permissions::from_mode(mode)).map_err(|e| io_err("set mode of socket", e))?;
    if let Some(gid) = group_id {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| io_err("set group of socket", e))?;
    }
    Ok((listener, guard))
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Removes a socket file nobody accepts on (left by a daemon that died); refuses a live one.
fn remove_if_stale(path: &Path) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(SocketError::Io { op: "inspect", path: path.to_owned(), source: e }),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket { path: path.to_owned() });
    }
    match std::os::unix::net::UnixStream::connect(path) {
        // Someone accepts on it even though our lock was free (another program, or a daemon whose lock
        // file was deleted by hand): never steal it.
        Ok(_) => Err(SocketError::InUse { path: path.to_owned(), reason: "it accepts connections" }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "replacing stale socket left by a stopped daemon");
            std::fs::remove_file(path).map_err(|e| SocketError::Io {
                op: "remove stale socket",
                path: path.to_owned(),
                source: e,
            })
        }
        Err(e) => Err(SocketError::Io { op: "probe existing socket", path: path.to_owned(), source: e }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binds_with_the_requested_mode_and_removes_the_socket_on_drop() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sub/c.sock");
        let (_listener, guard) = bind(&path, 0o660, None).expect("bind a fresh path");
        let mode = std::fs::metadata(&path).expect("socket exists").permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        drop(guard);
        assert!(!path.exists(), "socket removed on drop");
        assert!(lock_path(&path).exists(), "lock file stays");
    }

    #[tokio::test]
    async fn a_held_socket_is_never_taken_over() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.sock");
        let (_listener, _guard) = bind(&path, 0o660, None).expect("first bind");
        let err = bind(&path, 0o660, None).expect_err("second bind must fail");
        assert!(matches!(err, SocketError::InUse { .. }), "{err}");
        assert!(path.exists(), "the live socket is untouched");
    }

    #[tokio::test]
    async fn a_listening_socket_without_lock_is_not_stolen() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.sock");
        let _other = std::os::unix::net::UnixListener::bind(&path).expect("other program binds");
        let err = bind(&path, 0o660, None).expect_err("must not steal");
        assert!(err.to_string().contains("accepts connections"), "{err}");
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind then close"));
        assert!(path.exists(), "closing a listener leaves its file behind");
        let (listener, _guard) = bind(&path, 0o660, None).expect("stale socket replaced");
        let client = tokio::net::UnixStream::connect(&path);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        accepted.expect("accept");
        connected.expect("connect");
    }

    #[tokio::test]
    async fn a_regular_file_is_not_replaced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.sock");
        std::fs::write(&path, "precious").expect("write file");
        let err = bind(&path, 0o660, None).expect_err("must refuse");
        assert!(matches!(err, SocketError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).expect("file still there"), "precious");
    }
}
