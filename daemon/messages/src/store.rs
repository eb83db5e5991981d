//! The durable message store: one redb file on the pod's emptyDir, written by one thread that commits
//! every write queued meanwhile in a single fsync'd transaction (group commit), so many concurrent sends
//! share one disk flush and a write is durable when its future resolves. After an I/O error (a full disk,
//! a failed fsync) the file is opened again, so the store recovers once the disk does, without a restart.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, RwLock},
    thread,
    time::Duration,
};

use redb::{Database, Durability, ReadTransaction, ReadableDatabase, TableDefinition, WriteTransaction};
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

mod timers;

pub use timers::StoredTimers;

/// The file inside the store directory.
pub(crate) const FILE_NAME: &str = "consistd.redb";

/// Counters that must never go back, by name (`outbox.next_sequence`, `inbox.next_id`): each part keeps
/// its own key in this one table.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The key in [`META`] the writability check writes when nothing else was committed for a while.
const CHECK_KEY: &str = "health.checked";

/// Writes one commit takes at most, so a flood of writes still gets flushed in bounded batches.
const MAX_BATCH: usize = 4096;
/// redb's page cache. Its default, 1 GiB, would let the cache alone outgrow the sidecar's memory limit
/// (128 MiB by default) as messages are written; the store is read back in full only at start.
const CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Opens (creating if needed) the store file with its cache bounded.
fn open_database(path: &Path) -> Result<Database, redb::DatabaseError> {
    Database::builder().set_cache_size(CACHE_BYTES).create(path)
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory could not be created.
    #[error("create store directory {path}")]
    CreateDir {
        /// The `store.dir` directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// redb refused the file (corrupt, or another daemon has it open).
    #[error("open message store {path}")]
    Open {
        /// The store file, `<store.dir>/consistd.redb`.
        path: PathBuf,
        /// redb's error.
        #[source]
        source: redb::DatabaseError,
    },
    /// The store's writer thread could not be started. (Reading the stored messages back fails later,
    /// as `RunError::Load`.)
    #[error("load message store {path}")]
    Load {
        /// The store file, `<store.dir>/consistd.redb`.
        path: PathBuf,
        /// Why the thread could not be spawned.
        #[source]
        source: StoreError,
    },
}

/// Why a read or write failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The transaction failed; nothing of it was stored.
    #[error("message store: {op}")]
    Failed {
        /// The operation, e.g. "store outbox message"; the message is "message store: <op>".
        op: &'static str,
        /// redb's error.
        #[source]
        source: Arc<redb::Error>,
    },
    /// The writer thread is gone (the daemon is stopping).
    #[error("the message store is closed")]
    Closed,
    /// An I/O error closed the file; the writer opens it again with its next write.
    #[error("{op}: the message store is closed after an I/O error until it can be opened again")]
    Reopening {
        /// The operation that found it closed.
        op: &'static str,
    },
}

impl StoreError {
    fn failed(op: &'static str, source: impl Into<redb::Error>) -> Self {
        Self::Failed { op, source: Arc::new(source.into()) }
    }
}

/// Applies one write inside the batch's transaction.
type Apply = Box<dyn FnOnce(&WriteTransaction) -> Result<(), redb::Error> + Send>;
/// Told the batch's commit result.
type Complete = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// One queued write: applied inside the batch's transaction, then told the batch's commit result.
struct Job {
    apply: Apply,
    complete: Complete,
}

/// A handle to the store; clones share the same file and writer thread.
#[derive(Clone)]
pub struct Store {
    db: Arc<File>,
    writes: mpsc::UnboundedSender<Job>,
    commits: Arc<Mutex<Commits>>,
}

/// How the latest commits went, for readiness: the store is writable unless its newest outcome is a
/// failure.
#[derive(Debug, Default)]
struct Commits {
    /// When a commit last succeeded.
    succeeded: Option<Instant>,
    /// When a commit last failed (for a check that got no answer: when it was queued), and why.
    failed: Option<(Instant, String)>,
}

impl Commits {
    fn record(commits: &Mutex<Commits>, at: Instant, result: Result<(), String>) {
        let mut c = commits.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(()) => c.succeeded = Some(c.succeeded.map_or(at, |s| s.max(at))),
            Err(why) => c.failed = Some((at, why)),
        }
    }
}

/// The open database, dropped after an I/O error and opened again: redb refuses every later operation on a
/// handle that saw one ("Previous I/O error occurred. Please close and re-open the database").
struct File {
    path: PathBuf,
    /// None from an I/O error until the file is opened again.
    open: RwLock<Option<Arc<Database>>>,
}

impl File {
    fn get(&self, op: &'static str) -> Result<Arc<Database>, StoreError> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        open.clone().ok_or(StoreError::Reopening { op })
    }

    /// Lets go of the file after an I/O error (the writer's handle; readers let go of theirs as they end).
    fn close(&self) {
        self.open.write().unwrap_or_else(PoisonError::into_inner).take();
    }

    /// The open database, opening the file again if it was closed. Fails while the disk still fails, or while a reader still
    /// holds the old handle (redb allows one open handle on a file); the next write tries again.
    fn reopen(&self) -> Result<Arc<Database>, StoreError> {
        let mut open = self.open.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(db) = &*open {
            return Ok(db.clone());
        }
        let db = Arc::new(
            open_database(&self.path)
                .map_err(|e| StoreError::failed("open the message store again after an I/O error", e))?,
        );
        *open = Some(db.clone());
        tracing::info!(path = %self.path.display(), "the message store is open again after an I/O error");
        Ok(db)
    }
}

/// Whether a failure came from the disk: the file must be closed and opened again.
fn io_failure(error: &StoreError) -> bool {
    matches!(error, StoreError::Failed { source, .. } if matches!(**source, redb::Error::Io(_) | redb::Error::PreviousIo))
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) `<dir>/consistd.redb` and starts the writer thread. redb locks the
    /// file, so a second daemon on the same directory is refused.
    pub fn open(dir: &Path) -> Result<Self, OpenError> {
        std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir { path: dir.to_owned(), source })?;
        let path = dir.join(FILE_NAME);
        let db = Arc::new(open_database(&path).map_err(|source| OpenError::Open { path: path.clone(), source })?);
        let db = Arc::new(File { path: path.clone(), open: RwLock::new(Some(db)) });
        let (writes, queue) = mpsc::unbounded_channel();
        let writer_db = db.clone();
        let commits = Arc::new(Mutex::new(Commits::default()));
        let writer_commits = commits.clone();
        thread::Builder::new()
            .name("consistd-store".to_owned())
            .spawn(move || write_loop(&writer_db, queue, &writer_commits))
            .map_err(|e| OpenError::Load { path, source: StoreError::failed("start the store writer", e) })?;
        Ok(Self { db, writes, commits })
    }

    /// Whether the store takes writes: yes until a commit fails, and again once one succeeds after
    /// that; the error says why not.
    pub fn writable(&self) -> Result<(), String> {
        let c = self.commits.lock().unwrap_or_else(PoisonError::into_inner);
        match (&c.failed, c.succeeded) {
            (Some((failed, why)), succeeded) if succeeded.is_none_or(|s| s < *failed) => Err(why.clone()),
            _ => Ok(()),
        }
    }

    /// Until `shutdown`: whenever nothing was committed for `interval`, commits a small record to show the
    /// store still takes writes; one not committed within `timeout` marks the store not writable until a
    /// commit succeeds.
    pub async fn check(self, interval: Duration, timeout: Duration, shutdown: CancellationToken) {
        loop {
            let last = self.commits.lock().unwrap_or_else(PoisonError::into_inner).succeeded;
            let due = last.map_or_else(Instant::now, |at| at + interval);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(due) => {}
            }
            let quiet = self.commits.lock().unwrap_or_else(PoisonError::into_inner).succeeded;
            if quiet.is_some_and(|at| at + interval > Instant::now()) {
                continue;
            }
            let started = Instant::now();
            let now = to_millis(std::time::SystemTime::now());
            let write = self.write("check that the message store is writable", move |txn| {
                txn.open_table(META)?.insert(CHECK_KEY, now)?;
                Ok(())
            });
            let failure = match tokio::time::timeout(timeout, write).await {
                // The writer recorded the commit's outcome, success or failure.
                Ok(Ok(()) | Err(StoreError::Failed { .. })) => None,
                Ok(Err(error)) => Some(consistd_core::error::chain(&error)),
                Err(_) => Some(format!("a write queued {timeout:?} ago is not committed yet")),
            };
            if let Some(why) = failure {
                Commits::record(&self.commits, started, Err(why));
            }
            if let Err(error) = self.writable() {
                tracing::warn!(%error, "the message store is not writable");
                // Check again soon, so the store is known writable again as soon as it is.
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(interval.min(Duration::from_secs(1))) => {}
                }
            }
        }
    }

    /// Queues `f` for the next batch's write transaction at once (writes are applied in the order they
    /// are queued); the future resolves with its value once that transaction is durably committed. If
    /// any write of the batch fails, the whole batch is rolled back.
    pub(crate) fn write<T, F>(&self, op: &'static str, f: F) -> impl Future<Output = Result<T, StoreError>> + use<T, F>
    where
        T: Send + 'static,
        F: FnOnce(&WriteTransaction) -> Result<T, redb::Error> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let submitted = self.submit(op, f, move |r| {
            let _ = reply.send(r);
        });
        async move {
            submitted?;
            answer.await.map_err(|_| StoreError::Closed)?
        }
    }

    /// Queues `f` for the next batch without waiting; a failure is logged. For writes whose loss a
    /// later retry repairs (deleting what was ACKed).
    pub(crate) fn write_detached<F>(&self, op: &'static str, f: F)
    where
        F: FnOnce(&WriteTransaction) -> Result<(), redb::Error> + Send + 'static,
    {
        let submitted = self.submit(op, f, move |r: Result<(), StoreError>| {
            if let Err(error) = r {
                tracing::warn!(error = %consistd_core::error::chain(&error), "message store write failed");
            }
        });
        if let Err(error) = submitted {
            tracing::warn!(error = %consistd_core::error::chain(&error), op, "message store write not queued");
        }
    }

    fn submit<T, F, D>(&self, op: &'static str, f: F, done: D) -> Result<(), StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&WriteTransaction) -> Result<T, redb::Error> + Send + 'static,
        D: FnOnce(Result<T, StoreError>) + Send + 'static,
    {
        // The value travels from the transaction to the answer, which is given only after the commit.
        let value = Arc::new(std::sync::Mutex::new(None));
        let slot = value.clone();
        let job = Job {
            apply: Box::new(move |txn| {
                let v = f(txn)?;
                *slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(v);
                Ok(())
            }),
            complete: Box::new(move |committed| {
                let v = value.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
                done(match (committed, v) {
                    (Ok(()), Some(v)) => Ok(v),
                    (Err(StoreError::Failed { source, .. }), _) => Err(StoreError::Failed { op, source }),
                    (Err(e), _) => Err(e),
                    (Ok(()), None) => Err(StoreError::Closed),
                })
            }),
        };
        self.writes.send(job).map_err(|_| StoreError::Closed)
    }

    /// Runs `f` on a snapshot of the last committed state.
    pub(crate) fn read<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let txn = self.db.get(op)?.begin_read().map_err(|e| StoreError::failed(op, e))?;
        f(&txn).map_err(|e| StoreError::failed(op, e))
    }
}

/// Takes every queued write, applies them in one transaction, commits it durably, answers each. After a
/// failure from the disk the file is closed, and opened again before the next batch.
fn write_loop(file: &File, mut queue: mpsc::UnboundedReceiver<Job>, commits: &Mutex<Commits>) {
    while let Some(first) = queue.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut completions = Vec::with_capacity(batch.len());
        let result = match file.reopen() {
            Ok(db) => commit_batch(&db, batch, &mut completions),
            Err(error) => {
                completions.extend(batch.into_iter().map(|job| job.complete));
                Err(error)
            }
        };
        if let Err(error) = &result
            && io_failure(error)
        {
            tracing::warn!(error = %consistd_core::error::chain(error), "the message store failed on the disk; closing it to open it again");
            file.close();
        }
        Commits::record(commits, Instant::now(), result.clone().map_err(|e| consistd_core::error::chain(&e)));
        for complete in completions {
            complete(result.clone());
        }
    }
}

/// Applies and commits a batch; every job's completion is moved to `completions` whatever happens.
fn commit_batch(db: &Database, batch: Vec<Job>, completions: &mut Vec<Complete>) -> Result<(), StoreError> {
    let mut applies = Vec::with_capacity(batch.len());
    for job in batch {
        applies.push(job.apply);
        completions.push(job.complete);
    }
    let mut txn = db.begin_write().map_err(|e| StoreError::failed("begin a store transaction", e))?;
    txn.set_durability(Durability::Immediate).map_err(|e| StoreError::failed("set store durability", e))?;
    for apply in applies {
        // On error the transaction is dropped, which rolls the whole batch back.
        apply(&txn).map_err(|e| StoreError::failed("write to the message store", e))?;
    }
    txn.commit().map_err(|e| StoreError::failed("commit to the message store", e))
}

/// A wall-clock time as stored: milliseconds since the Unix epoch (0 for times before it).
pub(crate) fn to_millis(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The inverse of [`to_millis`].
pub(crate) fn from_millis(ms: u64) -> std::time::SystemTime {
    std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms)
}

/// Opens the store in `dir` once an earlier handle on it (its writer thread, tasks still finishing) has
/// let go of the file.
#[cfg(test)]
pub(crate) async fn open_when_free(dir: &Path) -> Store {
    for _ in 0..200 {
        if let Ok(store) = Store::open(dir) {
            return store;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the store in {} was not released within 2 s", dir.display())
}

#[cfg(test)]
mod tests {
    use redb::{ReadableTableMetadata, TableDefinition};

    use super::*;

    const T: TableDefinition<u64, u64> = TableDefinition::new("test");

    #[tokio::test]
    async fn concurrent_writes_are_durable_and_survive_reopening() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).expect("open");
        let writes = (0..200u64).map(|i| {
            let store = store.clone();
            consistd_testkit::spawn(async move {
                store
                    .write("put", move |txn| {
                        txn.open_table(T)?.insert(i, i * 2)?;
                        Ok(i)
                    })
                    .await
            })
        });
        for (i, w) in writes.enumerate() {
            assert_eq!(w.await.expect("join").expect("write"), i as u64);
        }
        drop(store);
        // The writer thread lets go of the file once every handle is gone.
        let store = open_when_free(dir.path()).await;
        let n = store.read("count", |txn| Ok(txn.open_table(T)?.len()?)).expect("read");
        assert_eq!(n, 200);
        let v = store.read("get", |txn| Ok(txn.open_table(T)?.get(7)?.map(|g| g.value()))).expect("read");
        assert_eq!(v, Some(14));
    }

    #[tokio::test]
    async fn a_failing_write_rolls_back_its_batch_and_names_the_operation() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).expect("open");
        let err = store
            .write("write a broken thing", |_txn| -> Result<(), redb::Error> {
                Err(redb::Error::Corrupted("test".into()))
            })
            .await
            .expect_err("fails");
        assert_eq!(err.to_string(), "message store: write a broken thing", "the cause is left to source()");
        let chain = consistd_core::error::chain(&err);
        assert!(
            chain.starts_with("message store: write a broken thing: ") && chain.matches("test").count() == 1,
            "{chain}"
        );
    }

    #[tokio::test]
    async fn the_store_is_not_writable_after_a_failed_commit_until_one_succeeds() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).expect("open");
        assert_eq!(store.writable(), Ok(()), "nothing failed yet");
        let broken = store.write("write a broken thing", |_txn| -> Result<(), redb::Error> {
            Err(redb::Error::Corrupted("disk says no".into()))
        });
        broken.await.expect_err("fails");
        let why = store.writable().expect_err("the newest commit failed");
        assert!(why.contains("disk says no"), "{why}");
        store.write("put", |txn| Ok(txn.open_table(T)?.insert(1, 1).map(|_| ())?)).await.expect("write");
        assert_eq!(store.writable(), Ok(()));
    }

    #[tokio::test]
    async fn the_check_commits_a_record_when_nothing_else_did() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).expect("open");
        let stop = CancellationToken::new();
        let check = consistd_testkit::spawn(store.clone().check(
            Duration::from_millis(100),
            Duration::from_secs(5),
            stop.clone(),
        ));
        let mut checked = None;
        for _ in 0..100 {
            checked = store
                .read("read", |txn| match txn.open_table(META) {
                    Ok(t) => Ok(t.get(CHECK_KEY)?.map(|g| g.value())),
                    Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
                    Err(e) => Err(e.into()),
                })
                .expect("read");
            if checked.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(checked.is_some(), "the check wrote its record");
        assert_eq!(store.writable(), Ok(()));
        stop.cancel();
        check.await.expect("check ends with shutdown");
    }
}
