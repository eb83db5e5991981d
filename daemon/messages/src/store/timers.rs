//! The reconcile queues' timers in the store (`consistd_cluster::reconcile::durable`): each key's REQUEUE
//! time or TERMINAL mark under (queue, namespace, name), as JSON, so a restarted daemon's queues take them
//! back instead of handing every key out again.

use std::collections::HashMap;

use consistd_cluster::{
    reconcile::durable::{Timer, Timers},
    watch::object::ObjKey,
};
use redb::TableDefinition;

use super::Store;

/// (queue, namespace, name) -> the timer as JSON.
const TIMERS: TableDefinition<(&str, &str, &str), &[u8]> = TableDefinition::new("reconcile_timers");

/// The queues' timers, kept in `store`.
#[derive(Clone)]
pub struct StoredTimers {
    store: Store,
}

impl std::fmt::Debug for StoredTimers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredTimers").finish_non_exhaustive()
    }
}

impl StoredTimers {
    /// Timers kept in `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
    }
}

impl Timers for StoredTimers {
    fn keep(&self, queue: &str, key: &ObjKey, timer: Option<&Timer>) {
        let bytes = match timer.map(serde_json::to_vec).transpose() {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(%error, queue, "reconcile timer not kept: it does not encode");
                return;
            }
        };
        let (queue, namespace, name) = (queue.to_owned(), key.namespace.clone(), key.name.clone());
        self.store.write_detached("keep a reconcile timer", move |txn| {
            let mut table = txn.open_table(TIMERS)?;
            let at = (queue.as_str(), namespace.as_str(), name.as_str());
            match &bytes {
                Some(bytes) => {
                    table.insert(at, bytes.as_slice())?;
                }
                None => {
                    table.remove(at)?;
                }
            }
            Ok(())
        });
    }

    fn load(&self, queue: &str) -> HashMap<ObjKey, Timer> {
        let read = self.store.read("load the reconcile timers", |txn| {
            let mut kept = Vec::new();
            let Ok(table) = txn.open_table(TIMERS) else { return Ok(kept) };
            for entry in table.range((queue, "", "")..)? {
                let (k, v) = entry?;
                let (q, namespace, name) = k.value();
                if q != queue {
                    break;
                }
                kept.push((ObjKey { namespace: namespace.to_owned(), name: name.to_owned() }, v.value().to_vec()));
            }
            Ok(kept)
        });
        let kept = read.unwrap_or_else(|error| {
            tracing::warn!(error = %consistd_core::error::chain(&error), queue, "reconcile timers not read: every key is handed out once, as after a first start");
            Vec::new()
        });
        kept.into_iter()
            .filter_map(|(key, bytes)| match serde_json::from_slice(&bytes) {
                Ok(timer) => Some((key, timer)),
                Err(error) => {
                    tracing::warn!(%error, queue, namespace = %key.namespace, name = %key.name, "unreadable reconcile timer ignored");
                    None
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use consistd_cluster::reconcile::durable::TimerKind;

    use super::*;

    fn key(name: &str) -> ObjKey {
        ObjKey { namespace: "ns".into(), name: name.into() }
    }

    #[tokio::test]
    async fn timers_are_kept_per_queue_replaced_forgotten_and_read_back_after_a_reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        let requeue = Timer {
            resource_version: "7".into(),
            watermark: 9,
            kind: TimerKind::Requeue { at_ms: 1_000, priority: 3 },
        };
        let terminal =
            Timer { resource_version: "8".into(), watermark: 9, kind: TimerKind::Terminal { error: "bad".into() } };
        {
            let timers = StoredTimers::new(Store::open(dir.path()).expect("open"));
            timers.keep("q", &key("a"), Some(&requeue));
            timers.keep("q", &key("b"), Some(&requeue));
            timers.keep("q", &key("b"), Some(&terminal));
            timers.keep("q", &key("c"), Some(&requeue));
            timers.keep("q", &key("c"), None);
            timers.keep("other", &key("a"), Some(&terminal));
            timers.keep("q-2", &key("z"), Some(&terminal));
            // Detached writes: one more, waited for, is committed after them.
            timers.store.write("flush", |_| Ok(())).await.expect("flushed");
        }
        let timers = StoredTimers::new(super::super::open_when_free(dir.path()).await);
        let kept = timers.load("q");
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(kept[&key("a")], requeue);
        assert_eq!(kept[&key("b")], terminal, "replaced");
        assert_eq!(timers.load("other")[&key("a")], terminal);
        assert!(timers.load("none").is_empty());
    }
}
