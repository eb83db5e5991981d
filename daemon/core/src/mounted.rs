//! Files mounted from ConfigMaps and Secrets change in place: kubelet's atomic writer swaps the volume's
//! `..data` link, which a watch on the file itself would miss. [`Changes`] watches the files' directories
//! (inotify, through notify) and reports a settled change, or, at the latest, a periodic recheck.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::sync::mpsc;

/// How long after a change in a directory it is reported: writers replace several files.
const SETTLE: Duration = Duration::from_millis(200);
/// How often a change is reported anyway, in case one was missed (or inotify is unavailable).
const RECHECK: Duration = Duration::from_secs(60);

/// Reports when mounted files may have changed.
#[derive(Debug)]
pub struct Changes {
    events: mpsc::UnboundedReceiver<()>,
    recheck: tokio::time::Interval,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl Changes {
    /// Watches the directories of `files`; `what` names them in the warning when they cannot be watched.
    pub fn watch(files: &[&Path], what: &str) -> Self {
        let (tx, events) = mpsc::unbounded_channel();
        let dirs: BTreeSet<PathBuf> = files
            .iter()
            .map(|f| f.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_owned())
            .collect();
        let watcher = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
            let _ = tx.send(());
        })
        .and_then(|mut watcher| {
            for dir in &dirs {
                notify::Watcher::watch(&mut watcher, dir, notify::RecursiveMode::NonRecursive)?;
            }
            Ok(watcher)
        });
        let watcher = match watcher {
            Ok(watcher) => Some(watcher),
            Err(error) => {
                tracing::warn!(%error, "cannot watch the directories of {what}; reading them every minute");
                None
            }
        };
        let start = tokio::time::Instant::now() + RECHECK;
        Self { events, recheck: tokio::time::interval_at(start, RECHECK), _watcher: watcher }
    }

    /// Returns once a change in the directories has settled, or the recheck period passed.
    pub async fn next(&mut self) {
        tokio::select! {
            Some(()) = self.events.recv() => {
                tokio::time::sleep(SETTLE).await;
                while self.events.try_recv().is_ok() {}
            }
            _ = self.recheck.tick() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use consistd_testkit::tls::SecretVolume;

    use super::*;

    #[tokio::test]
    async fn an_atomic_writer_swap_is_reported() {
        let dir = tempfile::tempdir().expect("temp dir");
        let volume = SecretVolume::new(dir.path(), &[("consistd.yaml", "a: 1\n")]);
        let file = volume.path("consistd.yaml");
        let mut changes = Changes::watch(&[&file], "the test file");
        volume.update(&[("consistd.yaml", "a: 2\n")]);
        tokio::time::timeout(Duration::from_secs(5), changes.next()).await.expect("the swap is reported");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "a: 2\n");
    }
}
