//! The newest state per object of a CONSISTENT watch, handed to the app's workers when they ask, with the
//! own-write rule applied at that moment: the way to consume a watch whose handler is slow
//! ([`Client::subscribe_latest`]).
//!
//! An app that reads a watch into a buffer of its own (the newest state per object) while a worker per
//! object handles one state at a time takes each state twice: when its reader takes it from the watch, and
//! when its worker takes it from the buffer. The SDK's watch applies the own-write rule at the first take;
//! a state taken while the worker was still writing then waits in the buffer, and the worker, once its
//! write returned, handles a state older than it (issue 46, item 5: one value executed twice in 56). Here
//! the buffer is the SDK's, and the rule is applied when a worker is handed a state.

use std::{
    collections::{HashMap, HashSet, VecDeque, hash_map::Entry},
    fmt,
    ops::Deref,
    pin::pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use futures::{Stream, StreamExt as _};
use tokio::{sync::Notify, task::JoinHandle};

use crate::{
    Client, Error,
    own_writes::OwnWrites,
    proto::{Consistency, DeliveryMode, EventType, KubeObject},
    watch::{Event, Watch, predates_own_write},
};

/// An object's key: its namespace (empty when cluster-scoped) and name.
type Key = (String, String);

/// The newest state of each object of a CONSISTENT watch, for workers that ask for the next one when they are
/// ready ([`Latest::next`]). Cheap to clone: clones share the states and the reader; the watch ends when the
/// last clone is dropped.
///
/// * **One pending state per object.** A task of the SDK's reads the watch continuously and keeps, per
///   object (namespace and name), only the newest state not yet handed out: a DELETED replaces whatever
///   waited, and so does a later state (a re-created object's ADDED replaces its deletion). That is the
///   bound: one event per object, plus the identity (namespace, name, uid, resourceVersion) of each object
///   the watch says exists, to tell deletions after a resync.
/// * **Pulled, never pushed.** A worker asks for the next object's newest state; a slow worker never holds
///   up the reader, and is never handed a state that waited in a queue while a newer one came.
/// * **The own-write rule where the worker takes it.** An ADDED or MODIFIED state older than a write this
///   client (or a clone) made and saw return is dropped when it would be handed out, however long it
///   waited: a worker is never handed a state that predates its own write (the write's own state follows).
/// * **A worker's own write is not handed back.** A state that this client's own write made directly on
///   the state the workers last had of the object (its [`Event::previous_resource_version`] is that state,
///   and its resourceVersion is the one the client's latest write to it returned) is not handed out: the
///   worker that wrote it has it, and nothing else happened in between. A state that follows another
///   writer's state, one with no previous state (from a list or a resync) and one made by more than one
///   write since the last hand-out are handed out as any other.
/// * **One worker per object at a time.** An object handed out is in progress until its [`Taken`] is
///   dropped (or [`Taken::done`]); newer states wait meanwhile and are handed out after. So any number of
///   workers can share one `Latest`, each on a different object.
/// * **Markers.** SYNCED and RESYNC_REQUIRED are not handed out. After RESYNC_REQUIRED (the watch could not
///   resume), every object of the fresh snapshot is handed out again, and at its SYNCED each object the
///   watch said existed but the snapshot does not hold is handed out as DELETED, its object carrying only
///   its identity (the JSON holds `metadata` with name, namespace, uid and resourceVersion).
/// * **Errors.** An error that ends the watch (anything but a lost connection, which the watch resumes
///   from) is returned by every [`Latest::next`] from then on, at once; states still pending are dropped.
pub struct Latest {
    shared: Arc<Shared>,
    /// The reader's task, aborted when the last clone goes.
    _reader: Arc<Reader>,
}

/// The state handed to a worker: the object's newest event when it was handed out. The object stays in
/// progress (no other worker is handed it) until this is dropped.
pub struct Taken {
    /// The event: ADDED, MODIFIED or DELETED.
    pub event: Event,
    key: Key,
    shared: Arc<Shared>,
}

/// What the reader and the workers share.
struct Shared {
    state: Mutex<State>,
    /// Wakes the workers waiting in `next` when a state becomes ready, an object is done or the watch failed.
    changed: Notify,
    /// The client's record of its writes: the own-write rule at the hand-out.
    writes: Arc<OwnWrites>,
}

/// The books. A key is in `ready` exactly when it has a pending state and is not taken.
#[derive(Default)]
struct State {
    /// The newest state of each object not handed out yet.
    pending: HashMap<Key, Event>,
    /// Keys with a pending state and no worker, oldest first: the order they are handed out in.
    ready: VecDeque<Key>,
    /// Keys a worker holds.
    taken: HashSet<Key>,
    /// Per key, the uid and resourceVersion of the last state handed out (or passed over as the workers'
    /// own write): what a state the client's write made must follow to be passed over. A DELETED forgets it.
    seen: HashMap<Key, (String, String)>,
    /// The identity of each object the watch says exists (json left empty): what a resync's snapshot is
    /// checked against.
    live: HashMap<Key, KubeObject>,
    /// Since RESYNC_REQUIRED and until its SYNCED, the keys the fresh snapshot held.
    resync: Option<HashSet<Key>>,
    /// The error that ended the watch.
    failed: Option<tonic::Status>,
}

/// Aborts the reader's task when dropped.
struct Reader(JoinHandle<()>);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Client {
    /// The newest state per object of `watch` (always in CONSISTENT mode, whatever mode it names), handed to
    /// workers as they ask: see [`Latest`]. The way to consume a CONSISTENT watch when the handler is slow:
    /// a worker never handles a state older than its own write, and never an object another worker holds.
    /// Starts a task on the current Tokio runtime that reads the watch until the last clone is dropped.
    ///
    /// ```no_run
    /// # async fn demo(client: consistd_client::Client) -> Result<(), consistd_client::Error> {
    /// use consistd_client::Watch;
    /// let latest = client.subscribe_latest(Watch::new("configmaps").namespace("default"));
    /// for _ in 0..4 {
    ///     let latest = latest.clone();
    ///     tokio::spawn(async move {
    ///         while let Ok(taken) = latest.next().await {
    ///             // taken.event: the object's newest state; no other worker has this object meanwhile
    ///         } // dropping `taken` hands the object on
    ///     });
    /// }
    /// # Ok(()) }
    /// ```
    pub fn subscribe_latest(&self, watch: Watch) -> Latest {
        // The rule is applied where a worker takes a state; the reader must see every state to keep its books.
        let events = self.events(watch.mode(DeliveryMode::Consistent), false);
        Latest::reading(events, self.writes.clone())
    }
}

impl Latest {
    /// A `Latest` fed by `events`, judged against `writes`.
    fn reading(events: impl Stream<Item = Result<Event, Error>> + Send + 'static, writes: Arc<OwnWrites>) -> Self {
        let shared = Arc::new(Shared { state: Mutex::default(), changed: Notify::new(), writes });
        let reader = tokio::spawn(read(events, shared.clone()));
        Self { shared, _reader: Arc::new(Reader(reader)) }
    }

    /// Waits for the next object with a pending state that no worker holds, and hands its newest state out
    /// (dropping, at this moment, a state older than this client's own write to it). Returns the error that
    /// ended the watch once it ended. Cancel-safe: a call dropped while waiting takes nothing.
    pub async fn next(&self) -> Result<Taken, Error> {
        loop {
            let mut notified = pin!(self.shared.changed.notified());
            // Registered before the books are read, so a change made after the read wakes this call.
            notified.as_mut().enable();
            {
                let mut state = self.shared.lock();
                if let Some(failed) = &state.failed {
                    return Err(Error::Status(failed.clone()));
                }
                if let Some((key, event)) = state.hand_out(&self.shared.writes) {
                    return Ok(Taken { event, key, shared: self.shared.clone() });
                }
            }
            notified.await;
        }
    }

    /// How many objects have a state waiting (held by a worker or not).
    pub fn pending(&self) -> usize {
        self.shared.lock().pending.len()
    }
}

impl Clone for Latest {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone(), _reader: self._reader.clone() }
    }
}

impl fmt::Debug for Latest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Latest")
            .field("pending", &state.pending.len())
            .field("taken", &state.taken.len())
            .field("failed", &state.failed)
            .finish_non_exhaustive()
    }
}

impl Taken {
    /// The object's namespace; empty when cluster-scoped.
    pub fn namespace(&self) -> &str {
        &self.key.0
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.key.1
    }

    /// Ends the work on this object: a state that came meanwhile is handed out next. Dropping does the same.
    pub fn done(self) {}
}

impl Deref for Taken {
    type Target = Event;

    fn deref(&self) -> &Event {
        &self.event
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.taken.remove(&self.key);
        if state.pending.contains_key(&self.key) {
            state.ready.push_back(self.key.clone());
        }
        drop(state);
        self.shared.changed.notify_waiters();
    }
}

impl fmt::Debug for Taken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Taken").field("event", &self.event).finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The reader: every event of the watch into the books, until the watch fails.
async fn read(events: impl Stream<Item = Result<Event, Error>>, shared: Arc<Shared>) {
    let mut events = pin!(events);
    loop {
        let next = events.next().await;
        let ended = !matches!(next, Some(Ok(_)));
        {
            let mut state = shared.lock();
            match next {
                Some(Ok(event)) => state.arrived(event),
                Some(Err(Error::Status(status))) => state.fail(status),
                Some(Err(other)) => state.fail(tonic::Status::unknown(other.to_string())),
                None => state.fail(tonic::Status::cancelled("the watch ended")),
            }
        }
        shared.changed.notify_waiters();
        if ended {
            return;
        }
    }
}

impl State {
    /// Takes in one event of the watch.
    fn arrived(&mut self, event: Event) {
        match event.kind {
            EventType::ResyncRequired => self.resync = Some(HashSet::new()),
            EventType::Synced => {
                let Some(seen) = self.resync.take() else { return };
                let gone: Vec<Key> = self.live.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                for key in gone {
                    if let Some(identity) = self.live.remove(&key) {
                        self.put(key, deleted(identity, &event.cursor));
                    }
                }
            }
            EventType::Added | EventType::Modified | EventType::Deleted => {
                let Some(object) = &event.object else { return };
                let key = (object.namespace.clone(), object.name.clone());
                if event.kind == EventType::Deleted {
                    self.live.remove(&key);
                    self.seen.remove(&key);
                } else {
                    let identity = KubeObject { json: Default::default(), ..object.clone() };
                    self.live.insert(key.clone(), identity);
                    if let Some(seen) = &mut self.resync {
                        seen.insert(key.clone());
                    }
                }
                self.put(key, event);
            }
            EventType::Unspecified => {}
        }
    }

    /// Makes `event` the key's pending state, replacing an older one; the key becomes ready unless it
    /// already was or a worker holds it.
    fn put(&mut self, key: Key, event: Event) {
        match self.pending.entry(key) {
            Entry::Occupied(mut waiting) => {
                waiting.insert(event);
            }
            Entry::Vacant(slot) => {
                if !self.taken.contains(slot.key()) {
                    self.ready.push_back(slot.key().clone());
                }
                slot.insert(event);
            }
        }
    }

    /// The next ready key and its state, now taken. Passed over here: a state older than the client's own
    /// write (the own-write rule at the take), and the state the client's own write made directly on the
    /// last one handed out (see [`Latest`]).
    fn hand_out(&mut self, writes: &OwnWrites) -> Option<(Key, Event)> {
        while let Some(key) = self.ready.pop_front() {
            let Some(event) = self.pending.remove(&key) else { continue };
            if predates_own_write(&event, writes) {
                continue; // its own write's state follows on the watch
            }
            let own = self.own_write_on_seen(&key, &event, writes);
            match &event.object {
                Some(object) if event.kind != EventType::Deleted => {
                    self.seen.insert(key.clone(), (object.uid.clone(), object.resource_version.clone()));
                }
                _ => {
                    self.seen.remove(&key);
                }
            }
            if own {
                continue;
            }
            self.taken.insert(key.clone());
            return Some((key, event));
        }
        None
    }

    /// Whether `event` is the state the client's own write made directly on the last state of `key` handed
    /// out: the same object, following that state, at the version the client's latest write returned.
    fn own_write_on_seen(&self, key: &Key, event: &Event, writes: &OwnWrites) -> bool {
        let (Some(object), Some((uid, version))) = (&event.object, self.seen.get(key)) else { return false };
        event.kind == EventType::Modified
            && object.uid == *uid
            && !event.previous_resource_version.is_empty()
            && event.previous_resource_version == *version
            && writes.wrote(object)
    }

    fn fail(&mut self, status: tonic::Status) {
        self.failed = Some(status);
        self.pending.clear();
        self.ready.clear();
        self.seen.clear();
    }
}

/// The DELETED event of an object a resync's snapshot no longer holds: its identity, and as JSON its metadata.
fn deleted(mut identity: KubeObject, cursor: &str) -> Event {
    let mut metadata = serde_json::json!({
        "name": identity.name,
        "uid": identity.uid,
        "resourceVersion": identity.resource_version,
    });
    if !identity.namespace.is_empty() {
        metadata["namespace"] = identity.namespace.clone().into();
    }
    identity.json = serde_json::json!({ "metadata": metadata }).to_string().into_bytes().into();
    Event {
        kind: EventType::Deleted,
        object: Some(identity),
        cursor: cursor.to_owned(),
        consistency: Consistency::Unspecified,
        predates_own_write: false,
        previous_resource_version: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::channel::mpsc;

    use super::*;

    type Feed = mpsc::UnboundedSender<Result<Event, Error>>;

    fn latest() -> (Latest, Feed, Arc<OwnWrites>) {
        let (feed, events) = mpsc::unbounded();
        let writes = Arc::new(OwnWrites::default());
        (Latest::reading(events, writes.clone()), feed, writes)
    }

    fn object(name: &str, rv: &str) -> KubeObject {
        KubeObject {
            uid: format!("uid-{name}"),
            namespace: "ns".into(),
            name: name.into(),
            resource_version: rv.into(),
            json: b"{}".to_vec().into(),
        }
    }

    fn event(kind: EventType, name: &str, rv: &str) -> Event {
        Event {
            kind,
            object: Some(object(name, rv)),
            cursor: format!("c{rv}"),
            consistency: Consistency::Consistent,
            predates_own_write: false,
            previous_resource_version: String::new(),
        }
    }

    fn marker(kind: EventType) -> Event {
        Event {
            kind,
            object: None,
            cursor: String::new(),
            consistency: Consistency::Unspecified,
            predates_own_write: false,
            previous_resource_version: String::new(),
        }
    }

    fn send(feed: &Feed, event: Event) {
        feed.unbounded_send(Ok(event)).expect("the reader runs");
    }

    /// Lets the reader take in what was fed.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    async fn next(latest: &Latest) -> Taken {
        tokio::time::timeout(Duration::from_secs(5), latest.next()).await.expect("in time").expect("a state")
    }

    async fn nothing_ready(latest: &Latest) {
        let waited = tokio::time::timeout(Duration::from_millis(50), latest.next()).await;
        assert!(waited.is_err(), "handed out {:?}", waited.map(|t| t.map(|t| t.event.clone())));
    }

    fn seen(taken: &Taken) -> (EventType, String, String) {
        let o = taken.object.as_ref().expect("an object");
        (taken.kind, o.name.clone(), o.resource_version.clone())
    }

    #[tokio::test]
    async fn only_the_newest_state_of_each_object_is_handed_out_in_the_order_objects_became_ready() {
        let (latest, feed, _) = latest();
        send(&feed, event(EventType::Added, "a", "1"));
        send(&feed, event(EventType::Added, "b", "2"));
        send(&feed, marker(EventType::Synced));
        send(&feed, event(EventType::Modified, "a", "3"));
        send(&feed, event(EventType::Modified, "a", "4"));
        settle().await;
        assert_eq!(latest.pending(), 2);
        assert_eq!(seen(&next(&latest).await), (EventType::Modified, "a".into(), "4".into()));
        assert_eq!(seen(&next(&latest).await), (EventType::Added, "b".into(), "2".into()));
        nothing_ready(&latest).await;
    }

    #[tokio::test]
    async fn an_object_a_worker_holds_is_handed_to_no_other_until_it_is_done_then_its_newest_state_is() {
        let (latest, feed, _) = latest();
        send(&feed, event(EventType::Added, "a", "1"));
        let held = next(&latest).await;
        send(&feed, event(EventType::Modified, "a", "2"));
        send(&feed, event(EventType::Modified, "a", "3"));
        settle().await;
        nothing_ready(&latest).await;
        // Another object is handed out meanwhile.
        send(&feed, event(EventType::Added, "b", "4"));
        assert_eq!(seen(&next(&latest).await).1, "b");
        let waiting = tokio::spawn({
            let latest = latest.clone();
            async move { latest.next().await.map(|t| seen(&t)) }
        });
        settle().await;
        assert!(!waiting.is_finished(), "a was handed out while held");
        held.done();
        let after = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("in time").expect("task");
        assert_eq!(after.expect("a state"), (EventType::Modified, "a".into(), "3".into()));
    }

    #[tokio::test]
    async fn a_state_older_than_an_own_write_that_returned_while_it_waited_is_dropped_when_handed_out() {
        let (latest, feed, writes) = latest();
        send(&feed, event(EventType::Added, "a", "1"));
        let held = next(&latest).await;
        // Another writer's state arrives while the worker writes; the worker's write returns version 3.
        send(&feed, event(EventType::Modified, "a", "2"));
        settle().await;
        writes.record(&object("a", "3"));
        held.done();
        nothing_ready(&latest).await;
        assert_eq!(latest.pending(), 0, "the older state was dropped");
        // The write's own state is handed out.
        send(&feed, event(EventType::Modified, "a", "3"));
        assert_eq!(seen(&next(&latest).await), (EventType::Modified, "a".into(), "3".into()));
    }

    /// A MODIFIED of `name` at `rv` that directly follows the state at `previous`.
    fn following(name: &str, rv: &str, previous: &str) -> Event {
        Event { previous_resource_version: previous.into(), ..event(EventType::Modified, name, rv) }
    }

    #[tokio::test]
    async fn the_state_a_workers_own_write_made_on_the_state_it_had_is_not_handed_back() {
        let (latest, feed, writes) = latest();
        send(&feed, event(EventType::Added, "a", "1"));
        let held = next(&latest).await;
        writes.record(&object("a", "2"));
        held.done();
        send(&feed, following("a", "2", "1"));
        settle().await;
        nothing_ready(&latest).await;
        // Another writer's change on it is handed out; a worker's write on that one again is not.
        send(&feed, following("a", "3", "2"));
        let held = next(&latest).await;
        assert_eq!(seen(&held), (EventType::Modified, "a".into(), "3".into()));
        writes.record(&object("a", "4"));
        held.done();
        send(&feed, following("a", "4", "3"));
        settle().await;
        nothing_ready(&latest).await;
        assert_eq!(latest.pending(), 0);
    }

    #[tokio::test]
    async fn an_own_write_on_a_state_no_worker_had_or_on_an_unknown_one_is_handed_out() {
        let (latest, feed, writes) = latest();
        send(&feed, event(EventType::Added, "a", "1"));
        next(&latest).await.done();
        // Another writer's state (2) came between the state handed out and the client's write (3).
        writes.record(&object("a", "3"));
        send(&feed, following("a", "3", "2"));
        assert_eq!(seen(&next(&latest).await), (EventType::Modified, "a".into(), "3".into()));
        // A state from a list names no previous one: what came between is unknown.
        writes.record(&object("a", "4"));
        send(&feed, event(EventType::Modified, "a", "4"));
        assert_eq!(seen(&next(&latest).await), (EventType::Modified, "a".into(), "4".into()));
        // Not the client's latest write: it wrote again since (its own state follows).
        writes.record(&object("a", "6"));
        send(&feed, following("a", "5", "4"));
        settle().await;
        nothing_ready(&latest).await; // 5 predates the write of 6
        send(&feed, following("a", "6", "5"));
        assert_eq!(seen(&next(&latest).await), (EventType::Modified, "a".into(), "6".into()), "5 was never handed out");
    }

    #[tokio::test]
    async fn a_deletion_forgets_the_state_handed_out() {
        let (latest, feed, _) = latest();
        send(&feed, event(EventType::Added, "a", "1"));
        send(&feed, event(EventType::Added, "b", "2"));
        next(&latest).await.done();
        next(&latest).await.done();
        assert_eq!(latest.shared.lock().seen.len(), 2);
        send(&feed, event(EventType::Deleted, "a", "3"));
        assert_eq!(seen(&next(&latest).await).0, EventType::Deleted);
        assert_eq!(latest.shared.lock().seen.len(), 1, "what is kept is bounded by the objects that exist");
    }

    #[tokio::test]
    async fn a_deletion_replaces_the_waiting_state_and_is_handed_out_whatever_the_own_writes() {
        let (latest, feed, writes) = latest();
        send(&feed, event(EventType::Added, "a", "1"));
        let held = next(&latest).await;
        send(&feed, event(EventType::Modified, "a", "2"));
        send(&feed, event(EventType::Deleted, "a", "2"));
        settle().await;
        writes.record(&object("a", "9"));
        held.done();
        assert_eq!(seen(&next(&latest).await), (EventType::Deleted, "a".into(), "2".into()));
    }

    #[tokio::test]
    async fn after_a_resync_objects_missing_from_the_snapshot_are_handed_out_deleted() {
        let (latest, feed, _) = latest();
        for (name, rv) in [("a", "1"), ("b", "2"), ("c", "3")] {
            send(&feed, event(EventType::Added, name, rv));
        }
        send(&feed, marker(EventType::Synced));
        for _ in 0..3 {
            next(&latest).await.done();
        }
        send(&feed, event(EventType::Deleted, "c", "4"));
        next(&latest).await.done();
        // The watch could not resume: a fresh snapshot without b.
        send(&feed, marker(EventType::ResyncRequired));
        send(&feed, event(EventType::Added, "a", "1"));
        settle().await;
        assert_eq!(seen(&next(&latest).await), (EventType::Added, "a".into(), "1".into()), "a is handed out again");
        nothing_ready(&latest).await;
        send(&feed, marker(EventType::Synced));
        let gone = next(&latest).await;
        assert_eq!(seen(&gone), (EventType::Deleted, "b".into(), "2".into()));
        let json: serde_json::Value =
            serde_json::from_slice(&gone.object.as_ref().expect("object").json).expect("json");
        assert_eq!(json["metadata"]["uid"], "uid-b");
        assert_eq!(json["metadata"]["namespace"], "ns");
        nothing_ready(&latest).await;
    }

    #[tokio::test]
    async fn the_error_that_ends_the_watch_reaches_every_worker_that_asks() {
        let (latest, feed, _) = latest();
        send(&feed, event(EventType::Added, "a", "1"));
        let waiting = tokio::spawn({
            let latest = latest.clone();
            async move {
                let _held = latest.next().await;
                latest.next().await
            }
        });
        settle().await;
        feed.unbounded_send(Err(Error::Status(tonic::Status::not_found("no such resource")))).expect("reader");
        let failed = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("in time").expect("task");
        let Err(Error::Status(status)) = failed else { panic!("no error: {failed:?}") };
        assert_eq!(status.code(), tonic::Code::NotFound);
        let Err(Error::Status(again)) = latest.next().await else { panic!("the error is kept") };
        assert_eq!(again.message(), "no such resource");
    }

    #[tokio::test]
    async fn the_reader_stops_when_the_last_clone_is_dropped() {
        let (latest, feed, _) = latest();
        let clone = latest.clone();
        drop(latest);
        settle().await;
        assert!(!feed.is_closed(), "a clone still reads");
        drop(clone);
        settle().await;
        assert!(feed.is_closed(), "the reader still runs");
    }
}
