//! One upstream watch shared by every subscriber of the same query: the cache of current objects, a
//! bounded history for resuming, and the fan-out to subscriber queues that never waits on a subscriber.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use consistd_observe::metrics::{Metrics, WatchLabel};
use futures::{StreamExt, stream::BoxStream};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Cursor, WatchKey,
    bookmarks::is_marker,
    budget::{Budget, Exhausted, gauge},
    cache::ObjectCache,
    expectations::Expectations,
    object::{Obj, ObjKey, RawObject},
};

/// What happened to the watched set, in apiserver order.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// An object not cached before (also a recreated one: a name reused with a new uid).
    Added(Arc<Obj>),
    /// A new resourceVersion of a cached object with the same uid.
    Modified(Arc<Obj>),
    /// An object is gone (its last known state).
    Deleted(Arc<Obj>),
    /// The initial list is complete.
    Synced,
    /// The watch listed again (its resume was refused: 410 Gone). The changes that follow it are the
    /// difference between the cache and the new list, not the events that made it: what happened in
    /// between was never seen. State subscribers take the difference; a subscriber that wants every event
    /// resyncs instead ([`super::Subscription`]).
    Relisted,
}

/// A change with its position in the watch's history.
#[derive(Debug, PartialEq)]
pub struct Entry {
    /// Position: strictly increasing per watch incarnation.
    pub seq: u64,
    /// The change at that position: ADDED, MODIFIED, DELETED, or SYNCED after the first list.
    pub change: Change,
    /// When the daemon received it from the apiserver.
    pub received: Instant,
    /// Whether it came from a list (the first, or a relist's difference) rather than a watch event: the
    /// writes between the object's state before and this one were never seen, so it may stand for several.
    pub listed: bool,
    /// For a MODIFIED from a watch event: the resourceVersion the cache held of the object just before it,
    /// the state this one directly follows (no write to the object came between them).
    pub previous: Option<Box<str>>,
}

/// What a subscriber is handed when it joins.
#[derive(Debug)]
pub(crate) struct Joined {
    /// Delivered first: a snapshot (objects then, if synced, the SYNCED position) or the history to replay.
    pub initial: Vec<Item>,
    /// Live entries after `initial`.
    pub live: mpsc::Receiver<Arc<Entry>>,
    /// Set when this subscriber fell behind and was cut off; it must resync.
    pub overflowed: Arc<AtomicBool>,
    /// Set when the watch's first list completed after this subscriber joined: it was sent nothing yet
    /// and is cut off so that it joins again and takes the list from the history, instead of as a burst
    /// of entries larger than its queue (which would cut it off mid-list and make it resync).
    pub first_list_done: Arc<AtomicBool>,
}

/// One thing delivered to a subscriber.
#[derive(Debug)]
pub enum Item {
    /// The subscriber's cursor is too old or from another incarnation, or it fell behind: a snapshot follows.
    ResyncRequired,
    /// An object of a snapshot taken at a position (no cursor: resuming mid-snapshot is not possible).
    Snapshot(Arc<Obj>, u64),
    /// The snapshot is complete; the cursor is this position.
    Synced(u64),
    /// A change from the history or live.
    Entry(Arc<Entry>),
}

/// Sizes that bound a watch's memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Entries one subscriber may have queued before it is cut off and must resync.
    pub queue: usize,
    /// Entries kept for resuming from a cursor (`watch.history`); 0 keeps none.
    pub history: usize,
}

/// What bounds a watch's objects in bytes.
#[derive(Debug, Clone)]
pub(crate) struct Budgeted {
    /// The budget every watch of the daemon charges its objects to.
    pub budget: Arc<Budget>,
    /// Whether the daemon's own work (an election, a group, a Service's endpoints) needs this watch: its
    /// objects are counted but never refused, so no app's watch can starve an election.
    pub own: bool,
}

/// How far back a new write's version is looked for among recent entries: the watch event often
/// arrives before the write's own response.
const RECENT_SCAN: usize = 1024;

/// One upstream watch and its subscribers.
/// The upstream watch's events, its objects shaped by the watch's view.
pub(crate) type Upstream = BoxStream<'static, Result<watcher::Event<RawObject>, watcher::Error>>;

#[derive(Debug)]
pub(crate) struct SharedWatch {
    /// Random per incarnation, so a cursor from an earlier watch of the same query is recognised.
    pub incarnation: u64,
    /// What is watched: the resolved resource, namespace and selectors; identical queries share it.
    pub key: WatchKey,
    /// The labels of its per-watch metrics, made once from `key`.
    label: WatchLabel,
    limits: Limits,
    budget: Arc<Budget>,
    /// Set once the daemon's own work joined ([`Budgeted::own`]); never cleared.
    own: AtomicBool,
    expectations: Expectations,
    state: Mutex<WatchState>,
    stop: CancellationToken,
    /// The largest resourceVersion (as an integer) the cache reflects: where the apiserver guarantees
    /// comparable versions, every change up to it has been applied. Raised while the state's lock is held,
    /// so a reader that sees it and then reads the cache sees the cache at least that new.
    high_water: AtomicU64,
}

#[derive(Debug, Default)]
struct WatchState {
    objects: ObjectCache,
    /// What the cached objects are charged to the budget (the per-watch metric).
    bytes: u64,
    /// Objects of a list in progress (initial, or a relist after 410 Gone), and when it started.
    relist: Option<(Instant, ObjectCache)>,
    /// Set when the list in progress passed the budget: its objects are dropped and only counted, so the
    /// refusal names all the list needed; the watch ends when the list does.
    refused: Option<Exhausted>,
    /// Why the watch ended for its subscribers, if the budget ended it.
    ended: Option<Exhausted>,
    synced: bool,
    seq: u64,
    history: VecDeque<Arc<Entry>>,
    subscribers: Vec<SubscriberQueue>,
    stopped: bool,
}

#[derive(Debug)]
struct SubscriberQueue {
    tx: mpsc::Sender<Arc<Entry>>,
    overflowed: Arc<AtomicBool>,
    first_list_done: Arc<AtomicBool>,
}

impl SharedWatch {
    /// A watch for `key` that has not started yet (see [`SharedWatch::run`]); it stops on
    /// [`stop`](Self::stop) or when `stopping` is cancelled (the daemon stops).
    pub(crate) fn new(
        key: WatchKey,
        limits: Limits,
        budgeted: Budgeted,
        expectations: Expectations,
        stopping: &CancellationToken,
    ) -> Arc<Self> {
        let label = key.label();
        Arc::new(Self {
            incarnation: rand::random(),
            key,
            label,
            limits,
            budget: budgeted.budget,
            own: AtomicBool::new(budgeted.own),
            expectations,
            state: Mutex::new(WatchState::default()),
            stop: stopping.child_token(),
            high_water: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, WatchState> {
        // Every update leaves the state whole before it can panic, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the upstream watch; subscribers' streams end.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// Returns once the watch is stopped (by [`SharedWatch::stop`] or the daemon's shutdown).
    pub(crate) async fn stopped(&self) {
        self.stop.cancelled().await;
    }

    /// Marks the watch as needed by the daemon's own work: from now on its objects are never refused.
    pub(crate) fn mark_own(&self) {
        self.own.store(true, Ordering::Release);
    }

    /// Why the budget ended this watch, if it did: its subscribers' streams end with this.
    pub(crate) fn ended(&self) -> Option<Exhausted> {
        self.lock().ended.clone()
    }

    /// Whether the budget ended this watch, or refused the list it is reading (it ends when the list does).
    pub(crate) fn refused(&self) -> bool {
        let state = self.lock();
        state.ended.is_some() || state.refused.is_some()
    }

    /// The bytes its cached objects are charged.
    pub(crate) fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// The labels of its per-watch metrics.
    pub(crate) fn label(&self) -> &WatchLabel {
        &self.label
    }

    /// Joins a subscriber: from `cursor` when the history still covers it, else from a snapshot.
    pub(crate) fn join(&self, cursor: Option<Cursor>) -> Joined {
        let mut state = self.lock();
        let (tx, live) = mpsc::channel(self.limits.queue);
        let overflowed = Arc::new(AtomicBool::new(false));
        let first_list_done = Arc::new(AtomicBool::new(false));
        let mut initial = Vec::new();
        match cursor {
            Some(cursor) if self.can_resume(&state, cursor) => {
                initial.extend(state.history.iter().filter(|e| e.seq > cursor.seq).cloned().map(Item::Entry));
            }
            other => {
                if other.is_some() {
                    initial.push(Item::ResyncRequired);
                }
                let at = state.seq;
                initial.extend(state.objects.values().cloned().map(|o| Item::Snapshot(o, at)));
                if state.synced {
                    initial.push(Item::Synced(state.seq));
                }
            }
        }
        if !state.stopped {
            state.subscribers.push(SubscriberQueue {
                tx,
                overflowed: overflowed.clone(),
                first_list_done: first_list_done.clone(),
            });
        }
        Joined { initial, live, overflowed, first_list_done }
    }

    /// Joins again a subscriber cut off when the first list completed (it was sent nothing): the list's
    /// entries from the history, each with its cursor as if it had been live, or, when the history no
    /// longer holds them all, the current snapshot (no RESYNC_REQUIRED: it had nothing to reconcile).
    pub(crate) fn rejoin_after_first_list(&self) -> Joined {
        let mut joined = self.join(Some(Cursor { incarnation: self.incarnation, seq: 0 }));
        if matches!(joined.initial.first(), Some(Item::ResyncRequired)) {
            joined.initial.remove(0);
        }
        joined
    }

    fn can_resume(&self, state: &WatchState, cursor: Cursor) -> bool {
        let oldest_needed = cursor.seq + 1;
        cursor.incarnation == self.incarnation
            && cursor.seq <= state.seq
            && (cursor.seq == state.seq || state.history.front().is_some_and(|e| e.seq <= oldest_needed))
    }

    /// A write of this pod produced `obj`: if this watch already delivered that version (its event
    /// can arrive before the write's response), record where.
    pub(crate) fn note_write(&self, obj: &Obj) {
        let state = self.lock();
        let found = state.history.iter().rev().take(RECENT_SCAN).find_map(|e| match &e.change {
            Change::Added(o) | Change::Modified(o) | Change::Deleted(o) if o.same_version(obj) => Some(e.seq),
            _ => None,
        });
        let found = found.or_else(|| state.objects.at(obj).filter(|o| o.same_version(obj)).map(|_| state.seq));
        tracing::debug!(uid = %obj.uid(), resource_version = %obj.resource_version(), ?found, "own write noted");
        if let Some(seq) = found {
            self.expectations.seen(self.incarnation, obj.uid(), obj.resource_version(), seq);
        }
    }

    /// The cached object at `key`, once the initial list is complete.
    pub(crate) fn get(&self, key: &ObjKey) -> Option<Option<Arc<Obj>>> {
        let state = self.lock();
        state.synced.then(|| state.objects.get(key).cloned())
    }

    /// Every cached object (in namespace `namespace` unless empty) and the position they reflect,
    /// once the initial list is complete.
    pub(crate) fn list(&self, namespace: &str) -> Option<(Vec<Arc<Obj>>, u64)> {
        let state = self.lock();
        let objects = state.objects.values().filter(|o| namespace.is_empty() || o.namespace() == namespace).cloned();
        state.synced.then(|| (objects.collect(), state.seq))
    }

    /// The largest resourceVersion the cache reflects (0 before any, or when versions are not integers).
    pub(crate) fn high_water(&self) -> u64 {
        self.high_water.load(Ordering::Acquire)
    }

    /// Whether this watch shows the pod's write in `expectations` that gave `uid` version `version`: its
    /// high-water mark reached it where versions compare (`comparable`), else it delivered exactly that
    /// version (or the write is forgotten, or a newer write replaced it, which is waited for on its own).
    pub(crate) fn shows(&self, expectations: &Expectations, comparable: bool, uid: &str, version: &str) -> bool {
        if comparable && let Ok(version) = version.parse::<u64>() {
            return self.high_water() >= version;
        }
        match expectations.get(uid) {
            Some(e) if e.resource_version == version => e.seen.contains_key(&self.incarnation),
            _ => true,
        }
    }

    fn raise_high_water(&self, obj: &Obj) {
        if let Ok(version) = obj.resource_version().parse::<u64>() {
            self.high_water.fetch_max(version, Ordering::AcqRel);
        }
    }

    /// Whether the initial list is complete.
    pub(crate) fn is_synced(&self) -> bool {
        self.lock().synced
    }

    /// Runs the upstream watch until [`SharedWatch::stop`]: kube-runtime's watcher with bookmarks and
    /// backoff with jitter, applying each event to the cache and fanning it out.
    pub(crate) async fn run(self: Arc<Self>, upstream: Upstream, metrics: Metrics) {
        let mut events = std::pin::pin!(upstream.default_backoff());
        loop {
            let event = tokio::select! {
                () = self.stop.cancelled() => break,
                event = events.next() => event,
            };
            match event {
                Some(Ok(event)) => {
                    metrics.watch_events.inc();
                    self.apply(event, &metrics);
                }
                Some(Err(error)) => {
                    metrics.watch_upstream_errors.inc();
                    tracing::warn!(%error, resource = %self.key.resource.plural, namespace = %self.key.namespace, "upstream watch failed; retrying with backoff");
                }
                None => break,
            }
        }
        let mut state = self.lock();
        state.stopped = true;
        // Dropping the senders ends every subscriber's live stream.
        state.subscribers.clear();
        drop(state);
        metrics.watch_bytes.remove(&self.label);
        metrics.watch_resource_version.remove(&self.label);
    }

    /// Applies one watcher event: cache first, then history and subscribers.
    pub(crate) fn apply(&self, event: watcher::Event<RawObject>, metrics: &Metrics) {
        let mut state = self.lock();
        let state = &mut *state;
        if state.ended.is_some() {
            return;
        }
        let mut changes = Vec::new();
        let mut previous: Option<Box<str>> = None;
        match event {
            watcher::Event::Init => {
                state.relist = Some((Instant::now(), ObjectCache::default()));
                state.refused = None;
            }
            // A bookmark's marker during a list stands for no object, and a list's position counts once it is
            // through (see `super::bookmarks`).
            watcher::Event::InitApply(raw) if is_marker(kube::Resource::meta(&raw)) => return,
            watcher::Event::InitApply(raw) => {
                let obj = Obj::from(raw);
                if let Some(refused) = &mut state.refused {
                    refused.needed += obj.cost();
                    return;
                }
                // An object the cache holds in this version is held once, not charged again.
                let cached = state.objects.at(&obj).filter(|o| o.same_version(&obj)).cloned();
                let obj = match cached {
                    Some(cached) => cached,
                    None => match self.charge(state, obj) {
                        Ok(obj) => obj,
                        Err(refused) => {
                            // Drop what the list holds so far; count the rest, to name all it needed.
                            state.relist = None;
                            state.refused = Some(refused);
                            return;
                        }
                    },
                };
                state.relist.get_or_insert_with(|| (Instant::now(), ObjectCache::default())).1.insert(obj);
            }
            watcher::Event::InitDone => {
                if let Some(refused) = state.refused.take() {
                    self.end(state, refused, metrics);
                    return;
                }
                let (started, listed) = state.relist.take().unwrap_or_else(|| (Instant::now(), ObjectCache::default()));
                diff(&state.objects, &listed, &mut changes);
                let listed_uids: Vec<String> = listed.values().map(|o| o.uid().to_owned()).collect();
                for obj in listed.values() {
                    self.raise_high_water(obj);
                }
                state.objects = listed;
                state.bytes = state.objects.values().map(|o| o.charged()).sum();
                metrics.watch_bytes.get_or_create(&self.label).set(gauge(state.bytes));
                let first = !state.synced;
                state.synced = true;
                if first {
                    // Nothing was published before the first list: whoever joined meanwhile joins again
                    // and replays the list from the history (dropping the senders ends their live streams).
                    for slot in state.subscribers.drain(..) {
                        slot.first_list_done.store(true, Ordering::Release);
                    }
                } else {
                    state.publish(Change::Relisted, false, None, self, metrics);
                }
                for change in changes {
                    state.publish(change, true, None, self, metrics);
                }
                if first {
                    state.publish(Change::Synced, false, None, self, metrics);
                }
                // A list that started after a write includes it: from here on it is met.
                for uid in listed_uids {
                    self.expectations.listed(self.incarnation, &uid, started, state.seq);
                }
                return;
            }
            // A bookmark: every change up to its version has been delivered, so the cache shows them all. Whoever
            // waits for a write this watch may never show (the gate) looks again.
            watcher::Event::Apply(raw) if is_marker(kube::Resource::meta(&raw)) => {
                if state.synced {
                    self.raise_high_water(&Obj::from(raw));
                    metrics.watch_bookmarks.inc();
                    metrics.watch_resource_version.get_or_create(&self.label).set(gauge(self.high_water()));
                    self.expectations.notify();
                }
                return;
            }
            watcher::Event::Apply(raw) => {
                let obj = Obj::from(raw);
                self.raise_high_water(&obj);
                if state.objects.at(&obj).is_some_and(|o| o.same_version(&obj)) {
                    return;
                }
                let obj = match self.charge(state, obj) {
                    Ok(obj) => obj,
                    Err(refused) => return self.end(state, refused, metrics),
                };
                state.bytes += obj.charged();
                match state.objects.insert(obj.clone()) {
                    None => changes.push(Change::Added(obj)),
                    Some(old) => {
                        state.bytes -= old.charged();
                        if old.uid() != obj.uid() {
                            changes.push(Change::Deleted(old));
                            changes.push(Change::Added(obj));
                        } else {
                            previous = Some(old.resource_version().into());
                            changes.push(Change::Modified(obj));
                        }
                    }
                }
            }
            watcher::Event::Delete(raw) => {
                // Its last state is held in the history and the queues: counted, never refused (it frees
                // the cached one).
                let mut obj = Obj::from(raw);
                obj.charge(&self.budget);
                let obj = Arc::new(obj);
                if let Some(old) = state.objects.remove(&obj) {
                    state.bytes -= old.charged();
                }
                self.raise_high_water(&obj);
                changes.push(Change::Deleted(obj));
            }
        }
        metrics.watch_bytes.get_or_create(&self.label).set(gauge(state.bytes));
        metrics.watch_resource_version.get_or_create(&self.label).set(gauge(self.high_water()));
        for change in changes {
            // Only a MODIFIED follows a state of the same object.
            let previous = if matches!(change, Change::Modified(_)) { previous.take() } else { None };
            state.publish(change, false, previous, self, metrics);
        }
    }

    /// Charges `obj` to the budget. A charge that would pass it (unless the daemon's own work needs the
    /// watch) first drops this watch's history, oldest first, since resuming from a cursor is only a
    /// convenience; refused once nothing more can be dropped.
    fn charge(&self, state: &mut WatchState, mut obj: Obj) -> Result<Arc<Obj>, Exhausted> {
        if self.own.load(Ordering::Acquire) {
            obj.charge(&self.budget);
        } else {
            while let Err(refused) = obj.try_charge(&self.budget) {
                if state.history.pop_front().is_none() {
                    return Err(refused);
                }
            }
        }
        Ok(Arc::new(obj))
    }

    /// Ends the watch because the budget refused it: its objects are dropped, its subscribers' streams end
    /// (they see `refused`), and whoever joins before the hub lets it go is told the same at once.
    fn end(&self, state: &mut WatchState, refused: Exhausted, metrics: &Metrics) {
        tracing::warn!(resource = %self.key.resource.plural, namespace = %self.key.namespace, label_selector = %self.key.label_selector, field_selector = %self.key.field_selector, limit = refused.limit, used = refused.used, needed = refused.needed, "watch ended: it would pass the memory budget (watch.maxCacheBytes)");
        metrics.watch_exhausted.inc();
        metrics.watch_bytes.remove(&self.label);
        metrics.watch_resource_version.remove(&self.label);
        *state = WatchState { ended: Some(refused), stopped: true, seq: state.seq, ..WatchState::default() };
        self.stop.cancel();
    }
}

impl WatchState {
    /// Publishes `change` (`listed`: from a list, see [`Entry::listed`]; `previous`: see [`Entry::previous`])
    /// to the history and every subscriber.
    fn publish(
        &mut self,
        change: Change,
        listed: bool,
        previous: Option<Box<str>>,
        watch: &SharedWatch,
        metrics: &Metrics,
    ) {
        self.seq += 1;
        if let Change::Added(o) | Change::Modified(o) | Change::Deleted(o) = &change {
            watch.expectations.seen(watch.incarnation, o.uid(), o.resource_version(), self.seq);
        }
        let entry = Arc::new(Entry { seq: self.seq, change, received: Instant::now(), listed, previous });
        let history = watch.limits.history;
        if history > 0 {
            if self.history.len() == history {
                self.history.pop_front();
            }
            self.history.push_back(entry.clone());
        }
        self.subscribers.retain(|slot| match slot.tx.try_send(entry.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Never wait on a slow subscriber: cut it off; it resyncs from a snapshot.
                slot.overflowed.store(true, Ordering::Release);
                metrics.watch_resyncs.inc();
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }
}

/// Changes that take the cache from `old` to `new`: ADDED for new objects, MODIFIED for changed ones,
/// DELETED for vanished ones (and for a same-named object with a new uid, DELETED then ADDED), nothing
/// for unchanged ones.
/// The changes from `old` to `new`, in resourceVersion order (a deletion at the gone object's last one): a
/// subscriber that has taken in some of them has taken in every change up to the newest it took in.
fn diff(old: &ObjectCache, new: &ObjectCache, changes: &mut Vec<Change>) {
    let from = changes.len();
    for obj in old.values() {
        if new.at(obj).is_none() {
            changes.push(Change::Deleted(obj.clone()));
        }
    }
    for obj in new.values() {
        match old.at(obj) {
            None => changes.push(Change::Added(obj.clone())),
            Some(prev) if prev.resource_version() == obj.resource_version() => {}
            Some(prev) if prev.uid() != obj.uid() => {
                changes.push(Change::Deleted(prev.clone()));
                changes.push(Change::Added(obj.clone()));
            }
            Some(_) => changes.push(Change::Modified(obj.clone())),
        }
    }
    changes[from..].sort_by_key(|change| match change {
        Change::Added(o) | Change::Modified(o) | Change::Deleted(o) => o.resource_version().parse::<u64>().ok(),
        _ => None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::resolve::ResourceId;

    fn raw(name: &str, uid: &str, rv: &str) -> RawObject {
        let json =
            format!(r#"{{"metadata":{{"name":"{name}","namespace":"ns","uid":"{uid}","resourceVersion":"{rv}"}}}}"#);
        serde_json::from_str(&json).expect("test object decodes")
    }

    fn watch(queue: usize, history: usize) -> Arc<SharedWatch> {
        budgeted_watch(queue, history, Budgeted { budget: Budget::new(u64::MAX), own: false })
    }

    fn budgeted_watch(queue: usize, history: usize, budgeted: Budgeted) -> Arc<SharedWatch> {
        let key = WatchKey {
            resource: ResourceId {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
            },
            namespace: "ns".into(),
            label_selector: String::new(),
            field_selector: String::new(),
            view: super::super::view::ObjectView::default(),
            shard: None,
        };
        SharedWatch::new(key, Limits { queue, history }, budgeted, Expectations::default(), &CancellationToken::new())
    }

    /// An object whose JSON is about `size` bytes.
    fn sized(name: &str, uid: &str, rv: &str, size: usize) -> RawObject {
        let pad = "x".repeat(size);
        let json = format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","uid":"{uid}","resourceVersion":"{rv}"}},"data":{{"k":"{pad}"}}}}"#
        );
        serde_json::from_str(&json).expect("test object decodes")
    }

    fn cost(raw: &RawObject) -> u64 {
        Obj::from(raw.clone()).cost()
    }

    fn list(w: &SharedWatch, m: &Metrics, objs: Vec<RawObject>) {
        w.apply(watcher::Event::Init, m);
        for o in objs {
            w.apply(watcher::Event::InitApply(o), m);
        }
        w.apply(watcher::Event::InitDone, m);
    }

    fn drain(rx: &mut mpsc::Receiver<Arc<Entry>>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            out.push(match &e.change {
                Change::Added(o) => format!("ADDED {} {}", o.name(), o.resource_version()),
                Change::Modified(o) => format!("MODIFIED {} {}", o.name(), o.resource_version()),
                Change::Deleted(o) => format!("DELETED {} {}", o.name(), o.resource_version()),
                Change::Synced => "SYNCED".to_owned(),
                Change::Relisted => "RELISTED".to_owned(),
            });
        }
        out
    }

    #[test]
    fn the_initial_list_is_added_then_synced_and_late_joiners_get_a_snapshot() {
        let (w, m) = (watch(16, 16), Metrics::new());
        let mut early = w.join(None);
        assert!(early.initial.is_empty());
        list(&w, &m, vec![raw("a", "1", "10")]);
        // Watch order for the history; a subscriber that joined before the first list takes it as a
        // snapshot instead (below), so a list longer than its queue does not cut it off.
        assert_eq!(w.lock().history.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        assert!(drain(&mut early.live).is_empty());
        assert!(early.first_list_done.load(Ordering::Acquire), "told to join again");
        assert!(!early.overflowed.load(Ordering::Acquire), "not a resync");

        let late = w.join(None);
        assert!(matches!(late.initial.as_slice(), [Item::Snapshot(o, 2), Item::Synced(2)] if o.name() == "a"));
    }

    #[test]
    fn a_first_list_longer_than_the_queue_does_not_cut_off_an_early_subscriber() {
        let (w, m) = (watch(4, 16), Metrics::new());
        let early = w.join(None);
        list(&w, &m, (0..10).map(|i| raw(&format!("o{i}"), &i.to_string(), "1")).collect());
        assert!(!early.overflowed.load(Ordering::Acquire));
        assert!(early.first_list_done.load(Ordering::Acquire));
        // It gets the list's entries from the history, each with its cursor, as if they had been live.
        let again = w.rejoin_after_first_list();
        assert_eq!(again.initial.iter().filter(|i| matches!(i, Item::Entry(e) if e.seq <= 10)).count(), 10);
        assert!(matches!(again.initial.last(), Some(Item::Entry(e)) if e.change == Change::Synced && e.seq == 11));

        // With a history too short to hold the list, the current snapshot, without RESYNC_REQUIRED.
        let (w, m) = (watch(4, 3), Metrics::new());
        let _early = w.join(None);
        list(&w, &m, (0..10).map(|i| raw(&format!("o{i}"), &i.to_string(), "1")).collect());
        let again = w.rejoin_after_first_list();
        assert_eq!(again.initial.iter().filter(|i| matches!(i, Item::Snapshot(..))).count(), 10);
        assert!(matches!(again.initial.first(), Some(Item::Snapshot(..))));
        assert!(matches!(again.initial.last(), Some(Item::Synced(11))));
    }

    #[test]
    fn a_relist_emits_only_the_differences() {
        let (w, m) = (watch(64, 64), Metrics::new());
        list(
            &w,
            &m,
            vec![raw("same", "1", "1"), raw("changed", "2", "2"), raw("gone", "3", "3"), raw("recreated", "4", "4")],
        );
        let mut sub = w.join(None);
        list(
            &w,
            &m,
            vec![raw("same", "1", "1"), raw("changed", "2", "20"), raw("recreated", "44", "40"), raw("new", "5", "50")],
        );
        let mut got = drain(&mut sub.live);
        assert_eq!(got.remove(0), "RELISTED", "the difference comes marked");
        // In resourceVersion order (a deletion at the object's last): a subscriber that took in some has
        // taken in every change up to the newest it took in (the sharded queue's hand-off cut).
        assert_eq!(
            got,
            ["DELETED gone 3", "DELETED recreated 4", "MODIFIED changed 20", "ADDED recreated 40", "ADDED new 50"]
        );
    }

    #[test]
    fn live_events_and_duplicates() {
        let (w, m) = (watch(16, 16), Metrics::new());
        list(&w, &m, vec![]);
        let mut sub = w.join(None);
        w.apply(watcher::Event::Apply(raw("a", "1", "1")), &m);
        w.apply(watcher::Event::Apply(raw("a", "1", "1")), &m);
        w.apply(watcher::Event::Apply(raw("a", "1", "2")), &m);
        w.apply(watcher::Event::Delete(raw("a", "1", "3")), &m);
        assert_eq!(drain(&mut sub.live), ["ADDED a 1", "MODIFIED a 2", "DELETED a 3"]);
        assert!(w.list("").expect("synced").0.is_empty());
    }

    /// A MODIFIED from a watch event names the state it directly follows; one from a relist's difference, an
    /// ADDED (also a recreation's) and a DELETED name none: what came between was never seen.
    #[test]
    fn a_watch_events_modified_names_the_state_it_follows_and_a_lists_does_not() {
        let (w, m) = (watch(16, 16), Metrics::new());
        list(&w, &m, vec![raw("a", "1", "1")]);
        let mut sub = w.join(None);
        let previous = |rx: &mut mpsc::Receiver<Arc<Entry>>| -> Vec<Option<String>> {
            std::iter::from_fn(|| rx.try_recv().ok()).map(|e| e.previous.as_deref().map(str::to_owned)).collect()
        };
        w.apply(watcher::Event::Apply(raw("a", "1", "2")), &m);
        w.apply(watcher::Event::Apply(raw("a", "1", "3")), &m);
        w.apply(watcher::Event::Apply(raw("a", "9", "4")), &m); // recreated: DELETED then ADDED
        w.apply(watcher::Event::Apply(raw("b", "2", "5")), &m);
        assert_eq!(previous(&mut sub.live), [Some("1".into()), Some("2".into()), None, None, None]);
        list(&w, &m, vec![raw("a", "9", "7"), raw("b", "2", "5")]);
        let listed = previous(&mut sub.live);
        assert_eq!(listed, [None, None], "RELISTED and the MODIFIED of its difference name nothing: {listed:?}");
        w.apply(watcher::Event::Apply(raw("a", "9", "8")), &m);
        assert_eq!(previous(&mut sub.live), [Some("7".into())], "the listed state is the cache's");
    }

    /// A bookmark's marker (see `super::bookmarks`) moves the watch's high-water mark and wakes whoever waits on
    /// the pod's writes; it is no object: the cache, its subscribers and a list in progress never see it.
    #[tokio::test]
    async fn a_bookmark_moves_the_high_water_mark_and_nothing_else() {
        let (w, m) = (watch(16, 16), Metrics::new());
        let marker = |rv: &str| {
            serde_json::from_str::<RawObject>(&format!(r#"{{"metadata":{{"resourceVersion":"{rv}"}}}}"#))
                .expect("marker")
        };
        w.apply(watcher::Event::Init, &m);
        w.apply(watcher::Event::InitApply(raw("a", "1", "5")), &m);
        w.apply(watcher::Event::InitApply(marker("40")), &m);
        w.apply(watcher::Event::InitDone, &m);
        assert_eq!(w.list("").expect("synced").0.len(), 1, "the marker in the list is no object");
        assert_eq!(w.high_water(), 5, "a list's position counts once it is through");
        let mut sub = w.join(None);
        drain(&mut sub.live);
        let mut woken = w.expectations.subscribe();
        woken.borrow_and_update();
        w.apply(watcher::Event::Apply(marker("50")), &m);
        assert_eq!(w.high_water(), 50);
        assert!(woken.has_changed().expect("expectations live"), "waiters on the pod's writes look again");
        assert!(drain(&mut sub.live).is_empty(), "subscribers see nothing");
        assert_eq!(w.list("").expect("synced").0.len(), 1, "the cache holds no marker");
        let shown = m.watch_resource_version.get_or_create(&w.label).get();
        assert_eq!(shown, 50, "the watch's resourceVersion gauge");
    }

    #[test]
    fn a_full_queue_cuts_off_only_that_subscriber() {
        let (w, m) = (watch(2, 16), Metrics::new());
        list(&w, &m, vec![]);
        let mut slow = w.join(None);
        let mut fast = w.join(None);
        for rv in 1..=3 {
            w.apply(watcher::Event::Apply(raw("a", "1", &rv.to_string())), &m);
            assert_eq!(drain(&mut fast.live).len(), 1, "the fast one keeps up");
        }
        assert!(slow.overflowed.load(Ordering::Acquire));
        assert_eq!(drain(&mut slow.live).len(), 2, "what was queued is still delivered");
        assert!(slow.live.try_recv().is_err(), "then the queue is closed");
        assert!(!fast.overflowed.load(Ordering::Acquire));
    }

    #[test]
    fn resume_replays_from_history_or_requires_a_resync() {
        let (w, m) = (watch(16, 3), Metrics::new());
        list(&w, &m, vec![]); // seq 1: SYNCED
        for rv in 1..=5 {
            w.apply(watcher::Event::Apply(raw("a", "1", &rv.to_string())), &m); // seq 2..=6
        }
        let at = |seq| Some(Cursor { incarnation: w.incarnation, seq });
        let replayed = w.join(at(4)).initial;
        let seqs: Vec<u64> = replayed.iter().map(|i| if let Item::Entry(e) = i { e.seq } else { 0 }).collect();
        assert_eq!(seqs, [5, 6]);
        assert!(w.join(at(6)).initial.is_empty(), "up to date: nothing to replay");
        assert!(matches!(w.join(at(1)).initial[0], Item::ResyncRequired), "history no longer covers it");
        let other = Some(Cursor { incarnation: w.incarnation ^ 1, seq: 4 });
        assert!(matches!(w.join(other).initial[0], Item::ResyncRequired), "another incarnation");
        assert!(matches!(w.join(at(99)).initial[0], Item::ResyncRequired), "from the future");
    }

    #[test]
    fn a_first_list_past_the_budget_ends_the_watch_naming_all_it_needed_and_holds_nothing() {
        let budget = Budget::new(10_000);
        budget.try_take(1_000).expect("another watch's objects");
        let w = budgeted_watch(16, 16, Budgeted { budget: budget.clone(), own: false });
        let mut early = w.join(None);
        let objects: Vec<RawObject> = (0..20).map(|i| sized(&format!("o{i}"), &i.to_string(), "1", 1_000)).collect();
        let total: u64 = objects.iter().map(cost).sum();
        let m = Metrics::new();
        list(&w, &m, objects);
        let ended = w.ended().expect("ended by the budget");
        assert_eq!(ended.limit, 10_000);
        assert!(ended.used <= 10_000 && ended.used >= 1_000, "what was in use when refused: {ended:?}");
        assert_eq!(ended.used - 1_000 + ended.needed, total, "the refusal names all the list needed");
        assert_eq!(budget.used(), 1_000, "its objects are given back; the other watch's stay");
        assert!(early.live.try_recv().is_err(), "its subscriber's stream ends");
        assert!(!early.first_list_done.load(Ordering::Acquire) && !early.overflowed.load(Ordering::Acquire));
        let late = w.join(None);
        assert!(late.initial.is_empty(), "a late joiner gets nothing but the end");
        assert_eq!(m.watch_exhausted.get(), 1);
    }

    #[test]
    fn a_watch_that_grows_past_the_budget_drops_its_history_first_then_ends() {
        let a = sized("a", "1", "1", 1_000);
        let per = cost(&a);
        // Room for two versions of the object and a little: the history's old version is dropped first.
        let budget = Budget::new(2 * per + per / 2);
        let (w, m) = (budgeted_watch(16, 16, Budgeted { budget: budget.clone(), own: false }), Metrics::new());
        list(&w, &m, vec![a]);
        let mut sub = w.join(None);
        sub.initial.clear(); // its snapshot taken
        w.apply(watcher::Event::Apply(sized("a", "1", "2", 1_000)), &m);
        // A version a subscriber has not taken yet is held by its queue, and charged as such.
        assert_eq!(drain(&mut sub.live), ["MODIFIED a 2"]);
        w.apply(watcher::Event::Apply(sized("a", "1", "3", 1_000)), &m);
        assert!(w.ended().is_none(), "room made by dropping the history");
        assert_eq!(drain(&mut sub.live), ["MODIFIED a 3"]);
        assert_eq!(w.bytes(), per, "the watch's cache holds one version");
        w.apply(watcher::Event::Apply(sized("b", "2", "4", 2_000)), &m);
        let ended = w.ended().expect("nothing more to drop: ended");
        assert!(ended.needed > per, "{ended:?}");
        assert!(sub.live.try_recv().is_err(), "its subscriber's stream ends");
        assert_eq!(budget.used(), 0, "everything given back");
        w.apply(watcher::Event::Apply(sized("c", "3", "5", 10)), &m);
        assert!(w.list("").is_none(), "an ended watch takes nothing more");
    }

    #[test]
    fn the_daemons_own_watch_is_counted_and_never_refused() {
        let budget = Budget::new(100);
        let (w, m) = (budgeted_watch(16, 16, Budgeted { budget: budget.clone(), own: true }), Metrics::new());
        list(&w, &m, vec![sized("lease", "1", "1", 1_000)]);
        assert!(w.ended().is_none());
        assert!(budget.used() > 1_000, "counted");
    }

    #[test]
    fn a_relist_holds_an_unchanged_object_once() {
        let budget = Budget::new(u64::MAX);
        let (w, m) = (budgeted_watch(16, 0, Budgeted { budget: budget.clone(), own: false }), Metrics::new());
        let objects = || (0..10).map(|i| sized(&format!("o{i}"), &i.to_string(), "1", 1_000)).collect::<Vec<_>>();
        list(&w, &m, objects());
        let once = budget.used();
        list(&w, &m, objects());
        assert_eq!(budget.used(), once, "the same versions are not charged again");
        assert_eq!(w.bytes(), once);
    }
}
