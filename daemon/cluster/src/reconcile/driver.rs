//! One queue's task: feeds the queue from its watches (the primary's keys, related objects mapped to
//! theirs; a lease's own writes queue nothing), grants ready keys to the attached streams once the watch has
//! caught up with the pod's writes, takes completions, times leases out, follows the election, keeps the
//! queue's finalizer on its primaries, and lingers after its last stream.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use consistd_core::report::QueueReport;
use consistd_observe::metrics::QueueMetrics;
use futures::{
    FutureExt as _, StreamExt,
    future::BoxFuture,
    stream::{BoxStream, FuturesUnordered, SelectAll},
};
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::{
    DriverCall, Handed, QueueSpec, ReconcileError, Reconciler, Work,
    authority::{Authority, May},
    durable::{Timer, TimerKind},
    filter::ChangeFilter,
    finalizer::{self, FinalizerStep},
    gate::{Gate, Verdict},
    keys::{MapsBy, PrimaryKind, primary_of},
    own::{OwnWrites, WriteResult, version_of},
    queue::{Completion, Origin, Queue, instant_of, wall_ms},
    ring::ShardBy,
    shards::Handoff,
};
use crate::objects::{DEFAULT_FIELD_MANAGER, ObjectRef, PatchKind, Updated};
use crate::watch::{
    ResourceError, Subscription,
    budget::Exhausted,
    object::{Obj, ObjKey},
    resolve::ResourceId,
    shard::ShardSelector,
    shared::{Change, Item, SharedWatch},
    sleep_until,
};

/// How often the depth gauges, lease ages and the status report are brought up to date.
const REPORT_EVERY: Duration = Duration::from_millis(250);

/// After a new share's watch was refused, how long until it is asked for again.
const RESHARD_RETRY: Duration = Duration::from_secs(1);

/// One watch's items, tagged with the watch's index (0: the primary); last, if the memory budget ended the
/// watch, the watch's field and how far past the budget it was.
type Items = BoxStream<'static, (usize, Result<Item, (String, Exhausted)>)>;

/// Items from all of a queue's watches.
type Events = SelectAll<Items>;

/// Watch `index`'s items from `subscription` (`field` names the watch) until `stop`; the daemon stopping,
/// or `stop`, ends them quietly.
fn items(index: usize, field: String, subscription: Subscription, stop: CancellationToken) -> Items {
    futures::stream::unfold(Some(subscription), move |sub| {
        let field = field.clone();
        async move {
            let mut sub = sub?;
            match sub.next().await {
                Some(item) => Some(((index, Ok(item)), Some(sub))),
                None => Some(((index, Err((field, sub.ended()?))), None)),
            }
        }
    })
    .take_until(stop.cancelled_owned())
    .boxed()
}

/// A queue sharded by namespace: the watch of the primary objects of a new share, being subscribed to.
struct Resharing {
    share: ShardSelector,
    subscribed: BoxFuture<'static, Result<Subscription, ResourceError>>,
}

/// Resolves when the new share's subscription is made or refused; never while none is being made.
async fn resubscribed(resharing: &mut Option<Resharing>) -> (ShardSelector, Result<Subscription, ResourceError>) {
    let Some(r) = resharing else { return std::future::pending().await };
    let answer = r.subscribed.as_mut().await;
    let share = r.share.clone();
    *resharing = None;
    (share, answer)
}

/// One of the queue's watches.
#[derive(Debug)]
struct Watched {
    /// Its shared watch: the cache read at grant time, and its high-water mark.
    watch: Arc<SharedWatch>,
    /// How its objects name primaries; None for the primary watch itself.
    maps_by: Option<MapsBy>,
    /// Whether its initial list is through: later changes are live.
    synced: bool,
    /// Keys of a snapshot being received after RESYNC_REQUIRED.
    resync: Option<HashSet<ObjKey>>,
    /// Every object it showed, and the primary each names: a change of the mapping queues the old
    /// primary too, and an object gone during a resync is known.
    known: HashMap<ObjKey, (Arc<Obj>, Option<ObjKey>)>,
    /// The newest resourceVersion among the objects of its items this driver has taken in: every change
    /// of this watch up to it has reached the queue (its cache may be ahead of that). A list's objects come
    /// in no such order, so they count only once the list is through.
    taken_in: u64,
    /// The newest resourceVersion of the list being taken in.
    listing: u64,
}

/// A lease out.
#[derive(Debug)]
struct Lease {
    key: ObjKey,
    stream: u64,
    /// Whether it handed out a deleted primary's last state.
    deleted: bool,
    /// Whether it handed out a key with no primary at all.
    absent: bool,
    term: u64,
    expires: Instant,
    granted: Instant,
    /// The resourceVersion of the object handed out, for a timer the pass's end keeps.
    version: Option<String>,
    /// The uid of the object handed out (empty: none): a finalizer is removed from that object only.
    uid: String,
    /// A finalize pass: DONE removes the queue's finalizer first.
    finalizing: bool,
    /// Its item, while the finalizer is being added before it is handed out.
    adding: Option<Work>,
    /// Whether its DONE waits for the finalizer's removal.
    removing: bool,
}

/// A finalizer write the driver made for a lease, answered.
struct FinalizerWrite {
    lease_id: String,
    /// The key, and the uid of the object written to.
    key: ObjKey,
    uid: String,
    /// The removal a finalize pass's DONE waits for (the completion's answer and its priority); None: the
    /// add before a first pass.
    removal: Option<(Reply, i32)>,
    answer: WriteOutcome,
}

/// Where a completion's answer goes.
type Reply = oneshot::Sender<Result<(), ReconcileError>>;

/// How a finalizer write went.
enum WriteOutcome {
    /// It landed: the object as it left it (and as its fencing stamp did, if one was written first).
    Wrote(Updated),
    /// A removal found the object gone: nothing is left to remove.
    Gone,
    /// It did not land, and why.
    Failed(String),
}

/// A watch event of a leased key waiting for the lease to end (then one more pass, however many) or for
/// its own write's answer to show it was the lease's (then none): the answer may come after its event.
#[derive(Debug)]
struct Deferred {
    /// The state the event showed.
    version: WriteResult,
    /// The watch that showed it, and its resourceVersion as a number.
    at: (usize, Option<u64>),
}

/// The primary resource: what owner references name, and its resource (its plural for own-write locators;
/// the queue's own finalizer writes are waited for on it).
#[derive(Debug, Clone)]
struct Primary {
    kind: PrimaryKind,
    api: ResourceId,
}

/// A stream attached to the queue.
#[derive(Debug)]
struct StreamSlot {
    capacity: usize,
    held: usize,
    items: mpsc::UnboundedSender<Handed>,
}

/// The queue's task.
pub(super) struct Driver {
    reconciler: Arc<Reconciler>,
    spec: QueueSpec,
    /// Who may be handed work, in which term.
    authority: Authority,
    /// Holds keys until the watches show the pod's writes.
    gate: Gate,
    primary_kind: PrimaryKind,
    primary_api: ResourceId,
    watched: Vec<Watched>,
    events: Events,
    queue: Queue,
    streams: BTreeMap<u64, StreamSlot>,
    /// Its last stream left: the next stream to attach is handed every key once more, behind live
    /// changes, as an app (re)starting on an informer would see every object once.
    deserted: bool,
    /// Where the last grant went, so streams take turns.
    last_stream: u64,
    leases: HashMap<String, Lease>,
    expiries: BTreeSet<(Instant, String)>,
    next_lease: u64,
    /// Keys taken from the ready line whose grant waits for the watch, in the order taken.
    held: Vec<ObjKey>,
    /// Deleted primaries' last states, until handed out.
    tombstones: HashMap<ObjKey, Arc<Obj>>,
    /// A sharded queue's keys taken from the ready line whose slot is another member's or moving away,
    /// by slot: still queued (changes do not add them again), handed out once the slot is this member's.
    parked: HashMap<u16, Vec<ObjKey>>,
    /// Slots moving away (and their epochs) the member was told have no lease out.
    drained: BTreeSet<(u16, u64)>,
    /// Slots taken over (and their epochs): their keys are this member's to grant.
    taken: BTreeMap<u16, u64>,
    /// While a relist's deletions are noted: they happened at no version this driver knows.
    relisting: bool,
    /// Keys of slots that are not this member's: per watch, the resourceVersion of the newest change seen
    /// (None: a deletion a relist found, at no known version), so a slot taken over knows which of its
    /// keys changed after its last owner's last look.
    changed_since: HashMap<ObjKey, BTreeMap<usize, Option<u64>>>,
    /// Whether resourceVersions compare on this apiserver.
    comparable: bool,
    /// A queue sharded by namespace: the share of the primary objects its watch holds (the namespaces of
    /// the slots this member owns, moving away or not), and the watch of a new share being made.
    share: Option<ShardSelector>,
    /// The share whose list the primary watch is through: only its keys are granted (the watch's cache
    /// says nothing of a key outside it, and a key of a slot just taken over would be read as absent).
    covered: Option<ShardSelector>,
    resharing: Option<Resharing>,
    /// When a refused new share is asked for again.
    reshard_after: Option<Instant>,
    /// Whether the share to watch may have changed since [`Self::reshard`] last looked: the slots owned
    /// change only with the authority (or at start, or when a refused share is due again), so the share is
    /// not worked out again on every event.
    reshard_due: bool,
    /// Ends the primary watch's items, when a new share's watch replaces it.
    primary_stop: CancellationToken,
    metrics: QueueMetrics,
    last_error: Option<String>,
    adds_reported: u64,
    /// Writes made under leases whose events may still come: such an event queues no pass of its key.
    own: OwnWrites,
    /// The changes of leased keys that wait for their lease to end or their write's answer.
    deferred: HashMap<ObjKey, Vec<Deferred>>,
    /// Timers kept from before the daemon restarted, by key, until the first lists are through (`durable`).
    kept: HashMap<ObjKey, Timer>,
    /// Keys whose kept timer was restored, with its watermark: a related object listed at no later version
    /// is no change since.
    restored: HashMap<ObjKey, u64>,
    /// Keys with a timer in the store, forgotten there once it no longer holds.
    stored: HashSet<ObjKey>,
    /// The queue's finalizer writes in flight.
    writes: FuturesUnordered<BoxFuture<'static, FinalizerWrite>>,
    /// Keys whose finalizer this queue removed after their finalize pass, with the object's uid: that
    /// object's later states and its deletion queue nothing.
    finalized: HashMap<ObjKey, String>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("queue", &self.spec.name).finish_non_exhaustive()
    }
}

impl Driver {
    /// Subscribes to the queue's watches (a refusal names its query); work is handed out under
    /// `authority`.
    pub(super) async fn start(
        reconciler: Arc<Reconciler>,
        spec: QueueSpec,
        comparable: bool,
        authority: Authority,
    ) -> Result<Self, ReconcileError> {
        let resolved =
            reconciler.hub.resolve(&spec.primary.resource).await.map_err(|e| query_error("spec.primary", e.into()))?;
        let primary = Primary {
            kind: PrimaryKind {
                group: resolved.api.group.clone(),
                kind: resolved.api.kind.clone(),
                namespaced: resolved.namespaced,
            },
            api: resolved.api.clone(),
        };
        if spec.shard_by == ShardBy::Namespace && !resolved.namespaced {
            return Err(ReconcileError::InvalidArgument {
                field: "spec.shard_by".into(),
                message: format!(
                    "{} is cluster-scoped: its objects have no namespace to shard by",
                    resolved.api.plural
                ),
            });
        }
        // Sharded by namespace, the primary watch holds the share of the slots owned now.
        let share = spec.shard_by.share(authority.owned().into_keys());
        let mut watches = Vec::new();
        let mut events = Events::new();
        let primary_stop = CancellationToken::new();
        let queries = std::iter::once((&spec.primary, None, "spec.primary".to_owned())).chain(
            spec.related
                .iter()
                .enumerate()
                .map(|(i, r)| (&r.query, Some(r.maps_by.clone()), format!("spec.related[{i}].query"))),
        );
        for (index, (query, maps_by, field)) in queries.enumerate() {
            let mut query = query.to_query();
            if index == 0 {
                query.shard.clone_from(&share);
            }
            let subscription = reconciler.hub.subscribe(query).await.map_err(|e| query_error(&field, e))?;
            watches.push((subscription.watch().clone(), maps_by));
            // Only the primary's watch is ever replaced (by a new share's).
            let stop = if index == 0 { primary_stop.clone() } else { CancellationToken::new() };
            events.push(items(index, field, subscription, stop));
        }
        let mut driver = Self::new(reconciler, spec, comparable, (primary, authority), watches, events);
        driver.share = share;
        driver.primary_stop = primary_stop;
        Ok(driver)
    }

    /// A driver over `watches` (the primary's first, then the related ones with how they name primaries)
    /// whose items arrive on `events`.
    fn new(
        reconciler: Arc<Reconciler>,
        spec: QueueSpec,
        comparable: bool,
        (primary, authority): (Primary, Authority),
        watches: Vec<(Arc<SharedWatch>, Option<MapsBy>)>,
        events: Events,
    ) -> Self {
        // A sharded queue's keys carry their state with their slots; a queue of one daemon keeps it in the store.
        let kept = if spec.sharded { HashMap::new() } else { reconciler.timers.load(&spec.name) };
        let gate = Gate::new(
            watches.iter().map(|(watch, _)| watch.clone()).collect(),
            comparable,
            reconciler.hub.expectations().clone(),
            primary.api.plural.clone(),
        );
        let watched = watches
            .into_iter()
            .map(|(watch, maps_by)| Watched {
                watch,
                maps_by,
                synced: false,
                resync: None,
                known: HashMap::new(),
                taken_in: 0,
                listing: 0,
            })
            .collect();
        let now = Instant::now();
        Self {
            authority,
            gate,
            primary_kind: primary.kind,
            primary_api: primary.api,
            watched,
            events,
            queue: Queue::new(spec.retry, now),
            streams: BTreeMap::new(),
            deserted: false,
            last_stream: 0,
            leases: HashMap::new(),
            expiries: BTreeSet::new(),
            next_lease: 1,
            held: Vec::new(),
            tombstones: HashMap::new(),
            parked: HashMap::new(),
            drained: BTreeSet::new(),
            taken: BTreeMap::new(),
            relisting: false,
            changed_since: HashMap::new(),
            comparable,
            share: None,
            covered: None,
            resharing: None,
            reshard_after: None,
            reshard_due: true,
            primary_stop: CancellationToken::new(),
            metrics: reconciler.metrics.queue(&spec.name),
            last_error: None,
            adds_reported: 0,
            own: OwnWrites::default(),
            deferred: HashMap::new(),
            stored: kept.keys().cloned().collect(),
            kept,
            restored: HashMap::new(),
            writes: FuturesUnordered::new(),
            finalized: HashMap::new(),
            spec,
            reconciler,
        }
    }

    /// Runs until the daemon stops, or the queue lingered `linger` with no stream attached.
    pub(super) async fn run(mut self, mut calls: mpsc::UnboundedReceiver<DriverCall>, report: Arc<Mutex<QueueReport>>) {
        let mut idle_since: Option<Instant> = None;
        let mut next_report = Instant::now();
        // Whether something happened since the last report; while leases are out their ages grow, so the
        // gauges are brought up to date every REPORT_EVERY anyway (client-go: every 500 ms).
        let mut unreported = true;
        let mut changes = self.gate.expectations().subscribe();
        loop {
            let now = Instant::now();
            self.expire(now);
            self.queue.tick(now);
            self.pump(now);
            self.hand_off();
            if self.reshard_after.is_some_and(|at| now >= at) {
                self.reshard_after = None;
                self.reshard_due = true;
            }
            if std::mem::take(&mut self.reshard_due) {
                self.reshard();
            }
            let report_due = unreported || !self.leases.is_empty();
            if report_due && now >= next_report {
                self.report(&report, now);
                next_report = now + REPORT_EVERY;
                unreported = false;
            }
            if self.streams.is_empty() {
                let since = *idle_since.get_or_insert(now);
                if now >= since + self.reconciler.linger {
                    match self.reconciler.retire(&self.spec.name, &mut calls) {
                        Ok(()) => break,
                        Err(pending) => {
                            for call in pending {
                                self.call(call, now);
                            }
                            continue;
                        }
                    }
                }
            } else {
                idle_since = None;
            }
            let wake = [
                self.queue.tick(now),
                self.expiries.first().map(|(at, _)| *at),
                self.gate.deadline(&self.held, now),
                (unreported || !self.leases.is_empty()).then_some(next_report),
                idle_since.map(|since| since + self.reconciler.linger),
                self.reshard_after,
            ]
            .into_iter()
            .flatten()
            .min();
            let holding = !self.held.is_empty() || self.gate.waits_for_lease_writes();
            tokio::select! {
                call = calls.recv() => match call {
                    Some(call) => self.call(call, Instant::now()),
                    None => break,
                },
                event = self.events.next() => match event {
                    Some((index, Ok(item))) => self.event(index, item, Instant::now()),
                    Some((_, Err((field, exhausted)))) => {
                        self.end(&field, &exhausted);
                        break;
                    }
                    // Every watch stopped: the daemon is shutting down.
                    None => break,
                },
                () = self.authority.changed() => self.authority_changed(Instant::now()),
                (share, answer) = resubscribed(&mut self.resharing) => self.reshared(share, answer, Instant::now()),
                changed = changes.changed(), if holding => if changed.is_err() { break },
                Some(written) = self.writes.next(), if !self.writes.is_empty() => self.written(written, Instant::now()),
                () = sleep_until(wake) => {}
            }
            unreported = true;
        }
        self.leave();
        self.reconciler.metrics.forget_queue(&self.spec.name);
    }

    /// One of the queue's watches ended past the memory budget: every stream is told why, naming the
    /// watch's field, and the queue ends with its keys and leases (a stream that attaches again starts it
    /// anew, and its watch lists again).
    fn end(&mut self, field: &str, exhausted: &Exhausted) {
        tracing::warn!(queue = %self.spec.name, field, limit = exhausted.limit, used = exhausted.used, needed = exhausted.needed, "reconcile queue ended: its watch would pass the memory budget (watch.maxCacheBytes)");
        for slot in self.streams.values() {
            let ended = ReconcileError::Exhausted { field: field.to_owned(), source: exhausted.clone() };
            let _ = slot.items.send(Err(ended));
        }
    }

    /// A stream's call.
    fn call(&mut self, call: DriverCall, now: Instant) {
        match call {
            DriverCall::Attach { stream, capacity, items } => {
                if std::mem::take(&mut self.deserted) {
                    self.queue.relist(now);
                }
                self.streams.insert(stream, StreamSlot { capacity, held: 0, items });
            }
            DriverCall::Detach { stream } => {
                self.streams.remove(&stream);
                self.deserted = self.streams.is_empty();
                let gone: Vec<String> =
                    self.leases.iter().filter(|(_, l)| l.stream == stream).map(|(id, _)| id.clone()).collect();
                for id in gone {
                    self.release(&id, now, "its stream ended");
                }
            }
            DriverCall::Complete { stream, lease_id, outcome, priority, reply } => {
                match self.removal(stream, &lease_id, &outcome) {
                    Ok(Some(patch)) => self.write_finalizer(&lease_id, patch, Some((reply, priority))),
                    Ok(None) => {
                        let _ = reply.send(self.complete(stream, &lease_id, (outcome, priority), now));
                    }
                    Err(refused) => {
                        let _ = reply.send(Err(refused));
                    }
                }
            }
            DriverCall::Wrote { lease_id, resource, obj } => self.wrote(&lease_id, &resource, &obj, now),
            DriverCall::Held { lease_id, reply } => {
                let held = self.leases.get(&lease_id).filter(|l| self.authority.holds(&l.key, l.term, now));
                let _ = reply.send(held.map(|l| (l.term, self.authority.claim(&l.key, l.term))));
            }
        }
    }

    /// One item of watch `index`.
    fn event(&mut self, index: usize, item: Item, now: Instant) {
        let Some(w) = self.watched.get_mut(index) else { return };
        let origin = if w.synced { Origin::Live } else { Origin::Initial };
        match item {
            Item::ResyncRequired => w.resync = Some(HashSet::new()),
            Item::Snapshot(obj, _) => self.listed(index, &obj, now),
            Item::Synced(_) => self.synced(index, now),
            Item::Entry(entry) => match &entry.change {
                Change::Synced => self.synced(index, now),
                // A new share's list, joined before it was through, comes as its entries.
                Change::Added(obj) if !w.synced && w.resync.is_some() => self.listed(index, obj, now),
                Change::Added(obj) | Change::Modified(obj) => {
                    self.touch(index, obj, (false, origin, !entry.listed), now);
                }
                Change::Deleted(obj) => self.touch(index, obj, (true, origin, !entry.listed), now),
                // The difference that follows touches every key that changed.
                Change::Relisted => {}
            },
        }
    }

    /// An object of a list of watch `index`: after a resync (or of a new share), a key at the version this
    /// driver took in before is unchanged, and queues nothing.
    fn listed(&mut self, index: usize, obj: &Arc<Obj>, now: Instant) {
        let Some(w) = self.watched.get_mut(index) else { return };
        let key = obj.key();
        let Some(seen) = &mut w.resync else {
            self.touch(index, obj, (false, Origin::Initial, false), now);
            return;
        };
        seen.insert(key.clone());
        let unchanged = w.known.get(&key).is_some_and(|(o, _)| o.resource_version() == obj.resource_version());
        if !unchanged {
            self.touch(index, obj, (false, Origin::Initial, false), now);
        }
    }

    /// A queue sharded by namespace whose slots changed: the watch of the new share's primary objects is
    /// asked for (while this member's hold lasts; the old watch serves until it is made).
    fn reshard(&mut self) {
        if self.spec.shard_by != ShardBy::Namespace || self.authority.term().is_none() {
            return;
        }
        let Some(want) = self.spec.shard_by.share(self.authority.owned().into_keys()) else { return };
        let asked = self.resharing.as_ref().map_or(self.share.as_ref(), |r| Some(&r.share));
        if asked == Some(&want) {
            return;
        }
        tracing::debug!(queue = %self.spec.name, ranges = want.ranges().len(), "watching the primary objects of a new share");
        let hub = self.reconciler.hub.clone();
        let mut query = self.spec.primary.to_query();
        query.shard = Some(want.clone());
        self.resharing =
            Some(Resharing { share: want, subscribed: Box::pin(async move { hub.subscribe(query).await }) });
    }

    /// The watch of a new share was made (or refused: asked again after RESHARD_RETRY): it replaces the
    /// primary watch, its list taken in as a resync's. What the old one showed outside the new share is
    /// forgotten, not deleted: those keys are other members' now.
    fn reshared(&mut self, share: ShardSelector, answer: Result<Subscription, ResourceError>, now: Instant) {
        let subscription = match answer {
            Ok(subscription) => subscription,
            Err(error) => {
                tracing::warn!(queue = %self.spec.name, error = %consistd_core::error::chain(&error), "could not watch the primary objects of a new share; asking again");
                self.reshard_after = Some(now + RESHARD_RETRY);
                return;
            }
        };
        self.reshard_after = None;
        let watch = subscription.watch().clone();
        self.primary_stop.cancel();
        self.primary_stop = CancellationToken::new();
        self.events.push(items(0, "spec.primary".into(), subscription, self.primary_stop.clone()));
        self.gate.replace_primary(watch.clone());
        self.covered = None;
        let Some(w) = self.watched.first_mut() else { return };
        w.watch = watch;
        w.known.retain(|key, _| share.holds(&key.namespace));
        w.synced = false;
        w.resync = Some(HashSet::new());
        w.listing = 0;
        self.share = Some(share);
    }

    /// Watch `index` finished a list: after a resync, what it no longer holds was deleted meanwhile.
    fn synced(&mut self, index: usize, now: Instant) {
        if index == 0 {
            self.covered.clone_from(&self.share);
        }
        let Some(w) = self.watched.get_mut(index) else { return };
        w.synced = true;
        w.taken_in = w.taken_in.max(std::mem::take(&mut w.listing));
        if self.watched.iter().all(|w| w.synced) {
            self.first_lists_through();
        }
        let Some(w) = self.watched.get_mut(index) else { return };
        let Some(seen) = w.resync.take() else { return };
        let gone: Vec<Arc<Obj>> =
            w.known.iter().filter(|(key, _)| !seen.contains(*key)).map(|(_, (obj, _))| obj.clone()).collect();
        for obj in gone {
            // Deleted at no version this driver knows: later than any other member's last look.
            self.relisting = true;
            self.touch(index, &obj, (true, Origin::Live, false), now);
            self.relisting = false;
        }
    }

    /// `obj` of watch `index` changed (or was `deleted`): queue the primary key(s) it concerns. `event`:
    /// it came as a watch event, not from a list, so it shows one write (maybe a lease's own).
    fn touch(&mut self, index: usize, obj: &Arc<Obj>, (deleted, origin, event): (bool, Origin, bool), now: Instant) {
        let filter = self.change_filter(index);
        let version = obj.resource_version().parse::<u64>().unwrap_or(u64::MAX);
        let at = (!self.relisting).then_some(version);
        let one_write = (event && origin == Origin::Live && !self.relisting).then_some(obj.as_ref());
        let key = obj.key();
        let Some(w) = self.watched.get_mut(index) else { return };
        match (self.relisting, origin) {
            // A deletion found by a resync has no version of its own.
            (true, _) => {}
            (false, Origin::Initial) => w.listing = w.listing.max(version),
            (false, Origin::Live) => w.taken_in = w.taken_in.max(version),
        }
        let Some(maps_by) = &w.maps_by else {
            // The primary itself; once this queue removed its finalizer, nothing of that object queues.
            let finalized = self.finalized.get(&key).map(|uid| uid == obj.uid());
            if deleted {
                w.known.remove(&key);
                if finalized == Some(true) {
                    self.forget_finalized(&key);
                    return;
                }
                self.tombstones.insert(key.clone(), obj.clone());
            } else {
                let before = w.known.insert(key.clone(), (obj.clone(), Some(key.clone())));
                self.tombstones.remove(&key);
                match finalized {
                    Some(true) => return,
                    Some(false) => {
                        self.finalized.remove(&key);
                    }
                    None => {}
                }
                if filtered_out(filter, before.as_ref().map(|(o, _)| o), obj) {
                    tracing::trace!(queue = %self.spec.name, namespace = %key.namespace, name = %key.name, resource_version = obj.resource_version(), "a change the queue's filter passes over");
                    return;
                }
            }
            if origin == Origin::Initial && !deleted && self.restore(&key, obj, now) {
                return;
            }
            self.key_changed(&key, (index, at), origin, one_write, now);
            return;
        };
        let named = if deleted { None } else { primary_of(obj, maps_by, &self.primary_kind) };
        let previous = if deleted { w.known.remove(&key) } else { w.known.insert(key, (obj.clone(), named.clone())) };
        if !deleted
            && previous.as_ref().is_some_and(|(_, p)| *p == named)
            && filtered_out(filter, previous.as_ref().map(|(o, _)| o), obj)
        {
            return; // the same primary, and nothing the filter names changed
        }
        let before = previous.and_then(|(_, p)| p).filter(|b| Some(b) != named.as_ref());
        for primary in named.iter().chain(before.iter()) {
            if origin == Origin::Initial && !self.related_changed_since_kept(primary, version) {
                continue;
            }
            self.key_changed(primary, (index, at), origin, one_write, now);
        }
    }

    /// The change filter of watch `index` (0: the primary query, then the related ones in the spec's order).
    fn change_filter(&self, index: usize) -> Option<ChangeFilter> {
        match index.checked_sub(1) {
            None => self.spec.primary.changes,
            Some(related) => self.spec.related.get(related).and_then(|r| r.query.changes),
        }
    }

    /// Puts `key`, listed as `obj` by the primary watch's first list, back where the timer kept before the
    /// daemon restarted says, when the object is the one that pass was handed (else it changed since, and the
    /// timer is forgotten): waiting for its REQUEUE, or TERMINAL (a queue with related queries takes no
    /// TERMINAL mark back: one of their objects deleted meanwhile would not show). Whether it did.
    fn restore(&mut self, key: &ObjKey, obj: &Obj, now: Instant) -> bool {
        let Some(timer) = self.kept.remove(key) else { return false };
        let to = match timer.kind {
            _ if obj.resource_version() != timer.resource_version => None,
            TimerKind::Requeue { at_ms, priority } => Some(Ok((instant_of(at_ms, now, SystemTime::now()), priority))),
            TimerKind::Terminal { error } if self.spec.related.is_empty() => Some(Err(error)),
            TimerKind::Terminal { .. } => None,
        };
        let Some(to) = to else {
            self.forget_timer(key);
            return false;
        };
        tracing::debug!(queue = %self.spec.name, namespace = %key.namespace, name = %key.name, requeue = to.is_ok(), "timer kept from before the restart restored");
        self.queue.restore(key, to);
        self.restored.insert(key.clone(), timer.watermark);
        true
    }

    /// Whether a related object of the first lists, at `version`, is a change of `primary` since the timer
    /// kept for it; a later one forgets that timer.
    fn related_changed_since_kept(&mut self, primary: &ObjKey, version: u64) -> bool {
        if let Some(watermark) = self.restored.get(primary) {
            return version > *watermark;
        }
        if self.kept.get(primary).is_some_and(|t| version > t.watermark) {
            self.kept.remove(primary);
            self.forget_timer(primary);
        }
        true
    }

    /// Every watch's first list is through: a timer kept for a key no list showed (its object went while
    /// the daemon was down) is forgotten.
    fn first_lists_through(&mut self) {
        for key in std::mem::take(&mut self.kept).into_keys() {
            self.forget_timer(&key);
        }
        self.restored.clear();
    }

    /// Keeps in the store what `lease`'s end left its key waiting for (a REQUEUE's time, a TERMINAL
    /// mark), or forgets what was kept. A sharded queue's keys move with their slots instead.
    fn keep_timer(&mut self, lease: &Lease, now: Instant) {
        let key = &lease.key;
        let kind = if let Some((at, priority)) = self.queue.requeued(key) {
            Some(TimerKind::Requeue { at_ms: wall_ms(at, now, SystemTime::now()), priority })
        } else {
            self.queue.terminal(key).map(|error| TimerKind::Terminal { error: error.to_owned() })
        };
        match (kind, &lease.version) {
            (Some(kind), Some(version)) if !self.spec.sharded => {
                let watermark = self.watched.iter().map(|w| w.taken_in).max().unwrap_or(0);
                let timer = Timer { resource_version: version.clone(), watermark, kind };
                self.reconciler.timers.keep(&self.spec.name, key, Some(&timer));
                self.stored.insert(key.clone());
            }
            _ => self.forget_timer(key),
        }
    }

    /// Forgets the timer kept in the store for `key`, if any.
    fn forget_timer(&mut self, key: &ObjKey) {
        if self.stored.remove(key) {
            self.reconciler.timers.keep(&self.spec.name, key, None);
        }
    }

    /// Queues `key` for a change watch `index` brought at resourceVersion `at`, unless the pod that handed
    /// the key's slot on to this one had already taken that change in (its hand-off holds the outcome):
    /// the list a driver starts with brings again what the last owner handled. A watch event showing one
    /// write (`one_write`) that a lease of the key made is no change for the key's next pass; while the
    /// key is leased, such an event waits for the lease's end (or its write's answer) to tell.
    fn key_changed(
        &mut self,
        key: &ObjKey,
        (index, at): (usize, Option<u64>),
        origin: Origin,
        one_write: Option<&Obj>,
        now: Instant,
    ) {
        let handed_on = at.is_some_and(|at| {
            self.authority.handoff(self.slot(key)).is_some_and(|h| {
                !h.overflow && h.cut.as_ref().and_then(|cut| cut.get(index)).is_some_and(|cut| at <= *cut)
            })
        });
        if handed_on {
            return;
        }
        if let Some(obj) = one_write {
            if self.own.made(key, obj) {
                tracing::trace!(queue = %self.spec.name, namespace = %key.namespace, name = %key.name, resource_version = obj.resource_version(), "a lease's own write: no pass for it");
                return;
            }
            if self.queue.is_leased(key) {
                self.deferred
                    .entry(key.clone())
                    .or_default()
                    .push(Deferred { version: version_of(obj), at: (index, at) });
                return;
            }
        }
        self.queue_change(key, (index, at), origin, now);
    }

    /// Queues a change of `key` (during a lease: one more pass after it).
    fn queue_change(&mut self, key: &ObjKey, (index, at): (usize, Option<u64>), origin: Origin, now: Instant) {
        let priority = index.checked_sub(1).and_then(|r| self.spec.related.get(r)).map_or(0, |r| r.priority);
        self.queue.changed_at(key, origin, priority, now);
        self.note_change(key, (index, at), now);
    }

    /// The changes of a lease's key that waited for its end and were not its own writes: each queues (one
    /// more pass, however many).
    fn settle(&mut self, key: &ObjKey, now: Instant) {
        for change in self.deferred.remove(key).unwrap_or_default() {
            self.queue_change(key, change.at, Origin::Live, now);
        }
    }

    /// A change of `key` seen by watch `index` at resourceVersion `at`: noted while its slot is another
    /// member's, for when this member takes the slot over.
    fn note_change(&mut self, key: &ObjKey, (index, at): (usize, Option<u64>), now: Instant) {
        if !self.authority.elsewhere(key, now) {
            return;
        }
        let noted = self.changed_since.entry(key.clone()).or_default().entry(index).or_insert(Some(0));
        *noted = match (*noted, at) {
            (Some(before), Some(at)) => Some(before.max(at)),
            _ => None,
        };
    }

    /// Who may act changed: leases of a term this daemon no longer leads (or, sharded, of a slot it no
    /// longer owns in their epoch) go back to the queue, and parked keys of slots now this member's are
    /// queued again.
    fn authority_changed(&mut self, now: Instant) {
        let stale: Vec<String> = self
            .leases
            .iter()
            .filter(|(_, l)| !self.authority.holds(&l.key, l.term, now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            self.release(&id, now, "the term (or the slot's epoch) it was granted in ended here");
        }
        self.take_over(now);
        self.unpark();
        self.reshard_due = true;
    }

    /// Queues again the keys parked for slots this member may grant from once more in the epoch it
    /// already held them in: a move away that the coordinator called off (its next owner left first).
    fn unpark(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let moving: BTreeSet<u16> = self.authority.moving().into_iter().map(|(slot, _)| slot).collect();
        let owned = self.authority.owned();
        let back: Vec<u16> =
            self.parked.keys().filter(|slot| owned.contains_key(slot) && !moving.contains(slot)).copied().collect();
        for slot in back {
            for key in self.parked.remove(&slot).unwrap_or_default() {
                self.queue.unpop(&key);
            }
        }
    }

    /// Takes over the slots this member was given since it last looked: keys its last owner handed on
    /// carry their state (the rest were idle there), and a key that changed after the last owner's last
    /// look is queued; without a hand-off (a new ring, or an owner whose hold lapsed) every key of the slot
    /// this queue knows is handed out once, as a new queue's list would be.
    fn take_over(&mut self, now: Instant) {
        let owned = self.authority.owned();
        self.taken.retain(|slot, epoch| owned.get(slot) == Some(epoch));
        let new: BTreeMap<u16, u64> = owned.into_iter().filter(|(slot, _)| !self.taken.contains_key(slot)).collect();
        if new.is_empty() {
            return;
        }
        let handoffs: HashMap<u16, Arc<Handoff>> =
            new.keys().filter_map(|slot| self.authority.handoff(*slot).map(|h| (*slot, h))).collect();
        let mut keys: HashMap<u16, Vec<ObjKey>> = HashMap::new();
        for key in self.queue.keys() {
            let slot = self.slot(key);
            if new.contains_key(&slot) {
                keys.entry(slot).or_default().push(key.clone());
            }
        }
        tracing::debug!(queue = %self.spec.name, slots = new.len(), handed_on = handoffs.len(), "slots taken over");
        let wall = SystemTime::now();
        for (slot, epoch) in new {
            self.taken.insert(slot, epoch);
            let parked = self.parked.remove(&slot).unwrap_or_default();
            let Some(handoff) = handoffs.get(&slot) else {
                // Nothing handed on: every key of the slot once, including keys idle (or failing) here
                // from an earlier tenure of it, whose state since is unknown.
                for key in parked.iter().chain(keys.remove(&slot).unwrap_or_default().iter()) {
                    self.changed_since.remove(key);
                    self.queue.restart(key, now);
                }
                continue;
            };
            let by = self.spec.shard_by;
            self.held.retain(|k| by.slot(k) != slot);
            let carried: HashMap<ObjKey, &super::queue::Carried> = handoff
                .keys
                .iter()
                .map(|c| (ObjKey { namespace: c.namespace.clone(), name: c.name.clone() }, c))
                .collect();
            let known = keys.remove(&slot).unwrap_or_default();
            let all: HashSet<ObjKey> = known.into_iter().chain(carried.keys().cloned()).collect();
            for key in all {
                let noted = self.changed_since.remove(&key).unwrap_or_default();
                let changed = match &handoff.cut {
                    _ if handoff.overflow && !carried.contains_key(&key) => true,
                    None => true,
                    Some(cuts) => {
                        noted.iter().any(|(watch, at)| at.is_none_or(|at| at > cuts.get(*watch).copied().unwrap_or(0)))
                    }
                };
                tracing::trace!(queue = %self.spec.name, slot, epoch, name = %key.name, carried = ?carried.get(&key).map(|c| c.place), changed, "key taken over with its slot");
                self.queue.take_over(&key, carried.get(&key).copied(), changed, (now, wall));
            }
        }
    }

    /// A sharded queue's slots moving away with no lease out: the member is told once per epoch, with
    /// their keys' state, and gives them on.
    fn hand_off(&mut self) {
        let moving = self.authority.moving();
        self.drained.retain(|s| moving.contains(s));
        if moving.len() == self.drained.len() {
            return;
        }
        let leased: BTreeSet<u16> = self.leases.values().map(|l| self.slot(&l.key)).collect();
        let new: BTreeSet<(u16, u64)> =
            moving.into_iter().filter(|s| !leased.contains(&s.0) && !self.drained.contains(s)).collect();
        if new.is_empty() {
            return;
        }
        let slots: BTreeSet<u16> = new.iter().map(|(slot, _)| *slot).collect();
        self.metrics.shard_handoffs.inc_by(u64::try_from(slots.len()).unwrap_or(0));
        self.authority.drained(self.handoffs(&slots));
        self.drained.extend(new);
    }

    /// What `slots` carry to their next owners: each key's state, as of the newest change each of the
    /// queue's watches has brought this driver.
    fn handoffs(&self, slots: &BTreeSet<u16>) -> Vec<Handoff> {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let cut = self.comparable.then(|| self.watched.iter().map(|w| w.taken_in).collect::<Vec<u64>>());
        let mut handoffs: BTreeMap<u16, Handoff> = slots
            .iter()
            .map(|slot| (*slot, Handoff { slot: *slot, epoch: 0, cut: cut.clone(), overflow: false, keys: Vec::new() }))
            .collect();
        for key in self.queue.keys() {
            if let Some(h) = handoffs.get_mut(&self.slot(key))
                && let Some(carried) = self.queue.carry(key, now, wall)
            {
                tracing::trace!(queue = %self.spec.name, slot = h.slot, name = %key.name, place = ?carried.place, "key handed on with its slot");
                h.keys.push(carried);
            }
        }
        handoffs.into_values().collect()
    }

    /// The queue ends: a sharded queue's leases go back, and its member leaves, every slot it owns
    /// carrying its keys' state to the next owner.
    fn leave(&mut self) {
        if self.authority.member().is_none() {
            return;
        }
        let now = Instant::now();
        let leased: Vec<String> = self.leases.keys().cloned().collect();
        for id in leased {
            self.release(&id, now, "the queue ended");
        }
        let slots: BTreeSet<u16> = self.authority.owned().into_keys().collect();
        tracing::debug!(queue = %self.spec.name, slots = slots.len(), "queue ended: its member leaves");
        self.metrics.shard_handoffs.inc_by(u64::try_from(slots.len()).unwrap_or(0));
        self.authority.leaving(self.handoffs(&slots));
    }

    /// Whether the primary watch's cache can tell `key`'s state: always, but for a queue sharded by
    /// namespace, whose watch holds only the share it has listed.
    fn covers(&self, key: &ObjKey) -> bool {
        self.spec.shard_by != ShardBy::Namespace || self.covered.as_ref().is_some_and(|s| s.holds(&key.namespace))
    }

    /// The slot of `key` (a sharded queue's).
    fn slot(&self, key: &ObjKey) -> u16 {
        self.spec.shard_by.slot(key)
    }

    /// Keeps a key whose slot is not this member's to grant aside until it is.
    fn park(&mut self, slot: u16, key: ObjKey) {
        self.parked.entry(slot).or_default().push(key);
    }

    /// Grants as many keys as the streams have room for: held keys whose watch caught up first, then
    /// the ready line.
    fn pump(&mut self, now: Instant) {
        if self.authority.term().is_none() {
            return;
        }
        let mut i = 0;
        while i < self.held.len() && self.free_stream().is_some() {
            let key = self.held[i].clone();
            let term = match self.authority.may(&key, now) {
                May::Grant(term) => term,
                May::Park(slot) => {
                    self.held.remove(i);
                    self.park(slot, key);
                    continue;
                }
                May::Nothing => return,
            };
            if !self.covers(&key) {
                i += 1;
                continue;
            }
            match self.gate.check(&key, now) {
                Verdict::Wait(_) => i += 1,
                verdict => {
                    self.held.remove(i);
                    self.grant(&key, verdict == Verdict::TimedOut, term, now);
                }
            }
        }
        while self.free_stream().is_some() {
            let Some(key) = self.queue.pop() else { break };
            let term = match self.authority.may(&key, now) {
                May::Grant(term) => term,
                May::Park(slot) => {
                    self.park(slot, key);
                    continue;
                }
                May::Nothing => {
                    self.queue.unpop(&key);
                    return;
                }
            };
            if !self.covers(&key) {
                tracing::debug!(queue = %self.spec.name, namespace = %key.namespace, name = %key.name, "grant held until the watch of this member's share lists the key's slot");
                self.held.push(key);
                continue;
            }
            match self.gate.check(&key, now) {
                Verdict::Wait(_) => {
                    self.metrics.consistency_holds.inc();
                    tracing::debug!(queue = %self.spec.name, namespace = %key.namespace, name = %key.name, "grant held until the watch shows the pod's writes");
                    self.held.push(key);
                }
                verdict => self.grant(&key, verdict == Verdict::TimedOut, term, now),
            }
        }
    }

    /// The stream to grant to next: the first after the last one that has room.
    fn free_stream(&self) -> Option<u64> {
        // A stream whose app went away takes nothing more, though its Detach has not come yet.
        let has_room =
            |(id, slot): (&u64, &StreamSlot)| (slot.held < slot.capacity && !slot.items.is_closed()).then_some(*id);
        self.streams
            .range(self.last_stream + 1..)
            .find_map(has_room)
            .or_else(|| self.streams.range(..=self.last_stream).find_map(has_room))
    }

    /// Leases `key` to the next stream with room. Under a finalizer, an object that lacks it is handed out
    /// once the finalizer is added (the lease holds the key meanwhile), and one being deleted past its
    /// finalize pass, or gone after it, is not handed out.
    fn grant(&mut self, key: &ObjKey, timed_out: bool, term: u64, now: Instant) {
        let Some(stream) = self.free_stream() else {
            self.queue.unpop(key);
            return;
        };
        let Some(granted) = self.queue.grant(key, now) else { return };
        let current = self.watched.first().and_then(|w| w.watch.get(key)).flatten();
        let (object, deleted) = match current {
            Some(obj) => (Some(obj), false),
            None => match self.tombstones.get(key) {
                Some(last) => (Some(last.clone()), true),
                None => (None, false),
            },
        };
        let step = match (&self.spec.finalizer, &object) {
            (Some(finalizer), Some(obj)) if !deleted => finalizer::step(obj, finalizer),
            _ => FinalizerStep::Pass,
        };
        // Gone after its finalize pass removed the finalizer (its deletion may have come before the removal's
        // answer, while the lease was out).
        let gone_after_finalize = match &object {
            None => self.finalized.contains_key(key),
            Some(last) => deleted && self.finalized.get(key).is_some_and(|uid| uid == last.uid()),
        };
        if step == FinalizerStep::Skip || gone_after_finalize {
            tracing::debug!(queue = %self.spec.name, namespace = %key.namespace, name = %key.name, "nothing handed out: the object is being deleted past its finalize pass, or gone after it");
            self.queue.complete(key, Completion::Done, 0, now);
            if gone_after_finalize {
                self.tombstones.remove(key);
                self.forget_finalized(key);
            }
            return;
        }
        let lease_id = format!("{}.{stream}.{}", self.spec.name, self.next_lease);
        self.next_lease += 1;
        let expires = now + self.spec.lease_timeout;
        let absent = object.is_none();
        let version = object.as_ref().filter(|_| !deleted).map(|o| o.resource_version().to_owned());
        let uid = object.as_ref().map(|o| o.uid().to_owned()).unwrap_or_default();
        let finalizing = step == FinalizerStep::Finalize;
        let work = Work {
            lease_id: lease_id.clone(),
            key: key.clone(),
            object,
            deleted,
            timed_out,
            attempt: granted.attempt,
            term,
            expires_at: SystemTime::now() + self.spec.lease_timeout,
            last_error: granted.last_error,
            finalizing,
        };
        let Some(slot) = self.streams.get_mut(&stream) else { return };
        let (adding, add) = match step {
            // Handed out once the finalizer is on the object.
            FinalizerStep::Add(patch) => (Some(work), Some(patch)),
            _ => {
                if slot.items.send(Ok(work)).is_err() {
                    // The stream is going; its Detach follows. The key goes back at once.
                    self.queue.release(key, now);
                    return;
                }
                (None, None)
            }
        };
        slot.held += 1;
        self.last_stream = stream;
        if timed_out {
            self.metrics.consistency_timeouts.inc();
        }
        self.metrics.queue_duration.observe(granted.queued_for.as_secs_f64());
        self.expiries.insert((expires, lease_id.clone()));
        // The pass a kept timer stood for is out: its end keeps what follows it.
        self.forget_timer(key);
        let lease = Lease {
            key: key.clone(),
            stream,
            deleted,
            absent,
            term,
            expires,
            granted: now,
            version,
            uid,
            finalizing,
            adding,
            removing: false,
        };
        self.leases.insert(lease_id.clone(), lease);
        if let Some(patch) = add {
            self.write_finalizer(&lease_id, patch, None);
        }
    }

    /// Sends the queue's finalizer `patch` for the key of `lease_id`, with the lease's claim as a write the
    /// app made for the lease would carry; the answer comes back to [`Self::written`], with `removal` (a
    /// finalize pass's DONE waiting for it).
    fn write_finalizer(&mut self, lease_id: &str, patch: serde_json::Value, removal: Option<(Reply, i32)>) {
        let Some(lease) = self.leases.get(lease_id) else { return };
        let (key, uid) = (lease.key.clone(), lease.uid.clone());
        let target = ObjectRef {
            resource: self.spec.primary.resource.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            subresource: String::new(),
        };
        let reconciler = self.reconciler.clone();
        let lease_id = lease_id.to_owned();
        let removes = removal.is_some();
        self.writes.push(
            async move {
                let answer = match reconciler.lease_claim(&lease_id).await {
                    Err(refused) => WriteOutcome::Failed(consistd_core::error::chain(&refused)),
                    Ok(leased) => {
                        let claim = leased.claim.as_ref();
                        let patched = reconciler.objects.patch(
                            &target,
                            PatchKind::Json,
                            patch,
                            DEFAULT_FIELD_MANAGER,
                            claim,
                            true,
                        );
                        match patched.await {
                            Ok(updated) => WriteOutcome::Wrote(updated),
                            Err(e) if removes && e.is_not_found() => WriteOutcome::Gone,
                            Err(e) => WriteOutcome::Failed(consistd_core::error::chain(&e)),
                        }
                    }
                };
                FinalizerWrite { lease_id, key, uid, removal, answer }
            }
            .boxed(),
        );
    }

    /// A finalizer write of the queue was answered.
    fn written(&mut self, w: FinalizerWrite, now: Instant) {
        match w.removal {
            None => self.added(&w.lease_id, w.answer, now),
            Some((reply, priority)) => {
                let done = self.removed(&w.lease_id, (&w.key, &w.uid), w.answer, priority, now);
                let _ = reply.send(done);
            }
        }
    }

    /// The finalizer was added (or not) before `lease_id`'s pass: its item goes out with the object as the
    /// write left it; a write that did not land is a RETRY of the key, its error the next item's
    /// `last_error`.
    fn added(&mut self, lease_id: &str, answer: WriteOutcome, now: Instant) {
        let Some(lease) = self.leases.get_mut(lease_id) else { return };
        let Some(mut work) = lease.adding.take() else { return };
        let stream = lease.stream;
        let updated = match answer {
            WriteOutcome::Wrote(updated) => updated,
            WriteOutcome::Gone | WriteOutcome::Failed(_) => {
                let why = match answer {
                    WriteOutcome::Failed(why) => why,
                    _ => "the object is gone".to_owned(),
                };
                let error =
                    format!("adding the finalizer {}: {why}", self.spec.finalizer.as_deref().unwrap_or_default());
                tracing::warn!(queue = %self.spec.name, namespace = %work.key.namespace, name = %work.key.name, error = %error, "finalizer not added: the key is retried");
                let _ = self.complete(stream, lease_id, (Completion::Retry(error), 0), now);
                return;
            }
        };
        lease.version = Some(updated.object.resource_version().to_owned());
        work.object = Some(updated.object.clone());
        self.finalizer_wrote(lease_id, &updated, now);
        let sent = self.streams.get(&stream).is_some_and(|slot| slot.items.send(Ok(work)).is_ok());
        if !sent {
            self.release(lease_id, now, "its stream ended");
        }
    }

    /// A DONE of a finalize pass whose object still carries the queue's finalizer: the patch that removes
    /// it, the lease marked as waiting for it. None: the completion goes ahead at once (any other outcome
    /// or pass, the object gone or without the finalizer, a lease this stream does not hold, which
    /// [`Self::complete`] refuses).
    fn removal(
        &mut self,
        stream: u64,
        lease_id: &str,
        outcome: &Completion,
    ) -> Result<Option<serde_json::Value>, ReconcileError> {
        let Some(finalizer) = self.spec.finalizer.as_deref() else { return Ok(None) };
        if *outcome != Completion::Done {
            return Ok(None);
        }
        let Some(lease) = self.leases.get_mut(lease_id).filter(|l| l.finalizing && l.stream == stream) else {
            return Ok(None);
        };
        if lease.removing {
            return Err(ReconcileError::FailedPrecondition {
                field: "complete.lease_id".into(),
                message: format!("lease {lease_id:?} is being completed already: its finalizer is being removed"),
            });
        }
        let current = self.watched.first().and_then(|w| w.watch.get(&lease.key)).flatten();
        // The object handed out; one created again under the name is not its to touch.
        let patch = current.filter(|o| o.uid() == lease.uid).and_then(|o| finalizer::remove(&o, finalizer));
        lease.removing = patch.is_some();
        Ok(patch)
    }

    /// The finalizer's removal a finalize pass's DONE waited for was answered: removed (or the object gone),
    /// the lease completes DONE and the object's later states queue nothing; not removed, the key is retried
    /// (the finalize pass comes again), its error the next item's `last_error`.
    fn removed(
        &mut self,
        lease_id: &str,
        (key, uid): (&ObjKey, &str),
        answer: WriteOutcome,
        priority: i32,
        now: Instant,
    ) -> Result<(), ReconcileError> {
        if !matches!(answer, WriteOutcome::Failed(_)) {
            self.finalized.insert(key.clone(), uid.to_owned());
        }
        let Some(lease) = self.leases.get(lease_id) else {
            return Err(ReconcileError::FailedPrecondition {
                field: "complete.lease_id".into(),
                message: format!(
                    "lease {lease_id:?} went back to the queue (it timed out, or its term ended) while its finalizer was being removed"
                ),
            });
        };
        let stream = lease.stream;
        let outcome = match answer {
            WriteOutcome::Wrote(updated) => {
                self.finalizer_wrote(lease_id, &updated, now);
                Completion::Done
            }
            WriteOutcome::Gone => Completion::Done,
            WriteOutcome::Failed(why) => {
                let error =
                    format!("removing the finalizer {}: {why}", self.spec.finalizer.as_deref().unwrap_or_default());
                tracing::warn!(queue = %self.spec.name, namespace = %key.namespace, name = %key.name, error = %error, "finalizer not removed: the finalize pass is retried");
                Completion::Retry(error)
            }
        };
        self.complete(stream, lease_id, (outcome, priority), now)
    }

    /// Forgets that `key`'s finalizer was removed, once the key is no longer queued.
    fn forget_finalized(&mut self, key: &ObjKey) {
        self.queue.forget(key);
        if !self.queue.holds(key) {
            self.finalized.remove(key);
        }
    }

    /// A stream completes a lease.
    fn complete(
        &mut self,
        stream: u64,
        lease_id: &str,
        (outcome, priority): (Completion, i32),
        now: Instant,
    ) -> Result<(), ReconcileError> {
        let refused =
            |message: String| ReconcileError::FailedPrecondition { field: "complete.lease_id".into(), message };
        let (queue, granted_to) = parse_lease_id(lease_id).ok_or_else(|| ReconcileError::InvalidArgument {
            field: "complete.lease_id".into(),
            message: format!("{lease_id:?} is not a lease id a WorkItem gave"),
        })?;
        if queue != self.spec.name {
            return Err(refused(format!(
                "lease {lease_id:?} is of queue {queue:?}, not of this stream's queue {:?}",
                self.spec.name
            )));
        }
        if granted_to != stream {
            return Err(refused(format!("lease {lease_id:?} was granted to another stream")));
        }
        let Some(lease) = self.leases.remove(lease_id) else {
            return Err(refused(format!(
                "lease {lease_id:?} is not held: it was completed already, timed out, or went back to the queue when the election's term ended"
            )));
        };
        self.expiries.remove(&(lease.expires, lease_id.to_owned()));
        if let Some(slot) = self.streams.get_mut(&stream) {
            slot.held = slot.held.saturating_sub(1);
        }
        if let Completion::Retry(error) | Completion::Terminal(error) = &outcome {
            self.last_error = Some(format!("{}/{}: {error}", lease.key.namespace, lease.key.name));
        }
        let finishes = matches!(outcome, Completion::Done | Completion::Terminal(_));
        self.settle(&lease.key, now);
        let finished = self.queue.complete(&lease.key, outcome, priority, now);
        self.keep_timer(&lease, now);
        if let Some(finished) = finished {
            self.metrics.work_duration.observe(finished.worked_for.as_secs_f64());
            if finished.retried {
                self.metrics.retries.inc();
            }
        }
        // A deletion handed out and done (or a key with no primary): nothing is left to reconcile.
        let still_absent = self.watched.first().and_then(|w| w.watch.get(&lease.key)).flatten().is_none();
        if finishes && (lease.deleted || lease.absent) && still_absent {
            self.tombstones.remove(&lease.key);
            self.queue.forget(&lease.key);
        }
        Ok(())
    }

    /// A lease ends without an outcome: the key is queued again.
    fn release(&mut self, lease_id: &str, now: Instant, why: &str) {
        let Some(lease) = self.leases.remove(lease_id) else { return };
        tracing::info!(queue = %self.spec.name, lease = %lease_id, namespace = %lease.key.namespace, name = %lease.key.name, why, "lease returned to the queue");
        self.expiries.remove(&(lease.expires, lease_id.to_owned()));
        if let Some(slot) = self.streams.get_mut(&lease.stream) {
            slot.held = slot.held.saturating_sub(1);
        }
        self.settle(&lease.key, now);
        self.queue.release(&lease.key, now);
    }

    /// Returns leases past their timeout to the queue, and forgets own writes whose events are overdue.
    fn expire(&mut self, now: Instant) {
        self.own.forget_due(now);
        while let Some((at, id)) = self.expiries.first().cloned() {
            if at > now {
                break;
            }
            self.release(&id, now, "it timed out");
        }
    }

    /// The queue's finalizer write for `lease_id` landed: every state it left the primary in (its fencing
    /// stamp's too) is the lease's own, as [`Self::wrote`] takes it.
    fn finalizer_wrote(&mut self, lease_id: &str, updated: &Updated, now: Instant) {
        let api = self.primary_api.clone();
        for state in updated.states() {
            self.wrote(lease_id, &api, state, now);
        }
    }

    /// A write made for `lease_id`: the key's next grant waits until the queue's watch of `resource`
    /// that holds the object shows it, and that event queues no pass of the key (nor did it if it came
    /// first, while the lease is out).
    fn wrote(&mut self, lease_id: &str, resource: &ResourceId, obj: &Obj, now: Instant) {
        let Some(lease) = self.leases.get(lease_id) else { return };
        let deadline = now + self.reconciler.consistency_timeout.get();
        let version = version_of(obj);
        if let Some(changes) = self.deferred.get_mut(&lease.key) {
            changes.retain(|c| c.version != version);
        }
        self.own.insert(&lease.key, version, deadline);
        self.gate.wrote(&lease.key, resource, obj, deadline);
    }

    /// Brings the gauges and the status report up to date.
    fn report(&mut self, report: &Mutex<QueueReport>, now: Instant) {
        if self.authority.member().is_some() {
            let owned = self.authority.owned();
            self.metrics.shard_slots.set(i64::try_from(owned.len()).unwrap_or(i64::MAX));
            let keys = self.queue.keys().filter(|k| owned.contains_key(&self.slot(k))).count();
            self.metrics.shard_keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
        }
        let mut counts = self.queue.counts();
        // Keys parked for slots that are other members' are theirs to count.
        counts.depth -= self.parked.values().map(Vec::len).sum::<usize>().min(counts.depth);
        self.metrics.depth.set(i64::try_from(counts.depth).unwrap_or(i64::MAX));
        let adds = self.queue.adds();
        self.metrics.adds.inc_by(adds - self.adds_reported);
        self.adds_reported = adds;
        let ages = self.leases.values().map(|l| now.saturating_duration_since(l.granted).as_secs_f64());
        let (sum, longest) = ages.fold((0.0, 0.0), |(sum, longest): (f64, f64), age| (sum + age, longest.max(age)));
        self.metrics.unfinished_work.set(sum);
        self.metrics.longest_running.set(longest);
        let mut r = report.lock().unwrap_or_else(PoisonError::into_inner);
        *r = QueueReport {
            name: self.spec.name.clone(),
            streams: self.streams.len(),
            depth: counts.depth,
            held: self.held.len(),
            waiting: counts.waiting,
            leased: counts.leased,
            keys: self.queue.len(),
            active: self.authority.term().is_some(),
            last_error: self.last_error.clone(),
            ring: self.authority.member().map(|m| m.report.lock().unwrap_or_else(PoisonError::into_inner).clone()),
        };
    }
}

/// Whether `filter` passes over the change from `before` (the state the queue saw; none: the object is new to
/// it) to `after`.
fn filtered_out(filter: Option<ChangeFilter>, before: Option<&Arc<Obj>>, after: &Obj) -> bool {
    match (filter, before) {
        (Some(filter), Some(before)) => !filter.passes(before, after),
        _ => false,
    }
}

fn query_error(field: &str, source: crate::watch::ResourceError) -> ReconcileError {
    ReconcileError::Query { field: field.to_owned(), source }
}

/// "queue.stream.n" -> (queue, stream).
pub(super) fn parse_lease_id(id: &str) -> Option<(&str, u64)> {
    let mut parts = id.split('.');
    let (queue, stream, n) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || queue.is_empty() {
        return None;
    }
    n.parse::<u64>().ok()?;
    Some((queue, stream.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher;

    use super::*;
    use consistd_core::{config::Live, tasks::Tasks};

    use crate::reconcile::ring::slot_of;

    use crate::{
        leadership::Leadership,
        reconcile::limiter::RetryPolicy,
        watch::{
            Hub, WatchKey,
            expectations::{Expectations, Locator},
            object::RawObject,
            shared::Limits,
        },
    };
    use consistd_observe::metrics::Metrics;

    use crate::reconcile::{
        durable::Timers,
        queue::{Carried, CarriedPlace},
        shards::{Ownership, RingNames, ShardMember},
    };

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[test]
    fn lease_ids_name_their_queue_and_stream() {
        assert_eq!(parse_lease_id("q.7.42"), Some(("q", 7)));
        for bad in ["", "q", "q.7", "q.x.1", "q.7.x", ".7.1", "q.7.1.2"] {
            assert_eq!(parse_lease_id(bad), None, "{bad:?}");
        }
    }

    /// A kube client that is never called: the driver under test is fed by hand.
    fn unused_client() -> kube::Client {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<http_body_util::Full<bytes::Bytes>>, std::io::Error>(std::io::Error::other(
                "no apiserver in unit tests",
            ))
        });
        kube::Client::new(service, "default")
    }

    fn configmaps() -> ResourceId {
        ResourceId { group: String::new(), version: "v1".into(), kind: "ConfigMap".into(), plural: "configmaps".into() }
    }

    fn raw(name: &str, rv: u64, labels: &str) -> RawObject {
        let json = format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","uid":"uid-{name}","resourceVersion":"{rv}","labels":{{{labels}}}}}}}"#
        );
        serde_json::from_str(&json).expect("test object decodes")
    }

    /// A driver of queue "q" over a primary watch of ConfigMaps and one related watch whose objects name
    /// their primary by the label "owner", fed by hand; and its hub's expectations.
    struct Rig {
        driver: Driver,
        primary: Arc<SharedWatch>,
        related: Arc<SharedWatch>,
        expectations: Expectations,
        metrics: Metrics,
        now: Instant,
    }

    impl Rig {
        fn new(comparable: bool) -> Self {
            let mut rig = Self::build(comparable, None);
            rig.list(0, vec![]);
            rig.list(1, vec![]);
            rig
        }

        /// A rig whose queue is sharded, its ownership published by hand; nothing listed yet.
        fn sharded() -> (Self, tokio::sync::watch::Sender<Ownership>) {
            Self::sharded_by(ShardBy::Key)
        }

        fn sharded_by(by: ShardBy) -> (Self, tokio::sync::watch::Sender<Ownership>) {
            let election = crate::leadership::Key { namespace: "ns".into(), name: "e".into() };
            let (member, publish) = ShardMember::by_hand(RingNames::new(&election, "q"));
            let mut rig = Self::build(true, Some(Authority::sharded(member, by)));
            rig.driver.spec.shard_by = by;
            (rig, publish)
        }

        fn build(comparable: bool, sharded: Option<Authority>) -> Self {
            Self::build_with(comparable, sharded, Arc::new(super::super::durable::Volatile))
        }

        fn build_with(comparable: bool, sharded: Option<Authority>, timers: Arc<dyn Timers>) -> Self {
            let metrics = Metrics::new();
            let client = unused_client();
            let tasks = Tasks::new();
            let config = consistd_core::config::WatchConfig::default();
            let hub = Hub::new(client.clone(), config, u64::MAX, metrics.clone(), &tasks);
            let leadership =
                Leadership::new(client.clone(), hub.clone(), "me".into(), "ns".into(), None, metrics.clone(), &tasks);
            let linger = Duration::from_secs(5);
            let timing = (Live::fixed(TIMEOUT), Live::fixed(Duration::from_secs(30)));
            let fencing =
                crate::fencing::Fencing::new(client.clone(), Live::fixed(Default::default()), metrics.clone());
            let objects =
                crate::objects::Objects::new(client.clone(), hub.clone(), Live::fixed(TIMEOUT), fencing, "me");
            let reconciler = Reconciler::new(
                (hub.clone(), objects),
                leadership.clone(),
                metrics.clone(),
                timing,
                linger,
                timers,
                &tasks,
            );
            let expectations = hub.expectations().clone();
            let watch = |label_selector: &str| {
                let key = WatchKey {
                    resource: configmaps(),
                    namespace: "ns".into(),
                    label_selector: label_selector.into(),
                    field_selector: String::new(),
                    view: crate::watch::view::ObjectView::default(),
                    shard: None,
                };
                SharedWatch::new(
                    key,
                    Limits { queue: 64, history: 64 },
                    crate::watch::shared::Budgeted { budget: crate::watch::budget::Budget::new(u64::MAX), own: false },
                    expectations.clone(),
                    &CancellationToken::new(),
                )
            };
            let (primary, related) = (watch(""), watch("owner"));
            let spec = QueueSpec {
                name: "q".into(),
                primary: super::super::ObjectQuery {
                    resource: "configmaps".into(),
                    namespace: "ns".into(),
                    label_selector: String::new(),
                    field_selector: String::new(),
                    view: crate::watch::view::ObjectView::default(),
                    changes: None,
                },
                related: Vec::new(),
                retry: RetryPolicy::default(),
                lease_timeout: Duration::from_secs(60),
                election: None,
                sharded: false,
                shard_by: ShardBy::Key,
                finalizer: None,
            };
            let kind = Primary {
                kind: PrimaryKind { group: String::new(), kind: "ConfigMap".into(), namespaced: true },
                api: configmaps(),
            };
            let watches = vec![(primary.clone(), None), (related.clone(), Some(MapsBy::Label("owner".into())))];
            let authority = sharded.unwrap_or_else(|| Authority::follow(&leadership, None));
            let driver = Driver::new(reconciler, spec, comparable, (kind, authority), watches, Events::new());
            Self { driver, primary, related, expectations, metrics, now: Instant::now() }
        }

        /// Publishes that this member owns `slots` (each in its epoch, none moving) with `handoffs`, and
        /// lets the driver take it in.
        async fn own(
            &mut self,
            publish: &tokio::sync::watch::Sender<Ownership>,
            slots: BTreeMap<u16, (u64, bool)>,
            handoffs: Vec<Handoff>,
        ) {
            publish.send_replace(Ownership {
                until: Some(Instant::now() + Duration::from_secs(60)),
                holding: "h".into(),
                slots,
                handoffs: handoffs.into_iter().map(|h| (h.slot, Arc::new(h))).collect(),
            });
            tokio::time::timeout(TIMEOUT, self.driver.authority.changed()).await.expect("ownership taken in");
            self.driver.authority_changed(self.now);
        }

        fn watch(&self, index: usize) -> Arc<SharedWatch> {
            if index == 0 { self.primary.clone() } else { self.related.clone() }
        }

        /// Watch `index` lists `objects`; the driver is told, as its subscription would tell it.
        fn list(&mut self, index: usize, objects: Vec<RawObject>) {
            let watch = self.watch(index);
            watch.apply(watcher::Event::Init, &self.metrics);
            for o in objects {
                watch.apply(watcher::Event::InitApply(o), &self.metrics);
            }
            watch.apply(watcher::Event::InitDone, &self.metrics);
            let (objects, at) = watch.list("").expect("synced");
            for o in objects {
                self.driver.event(index, Item::Snapshot(o, at), self.now);
            }
            self.driver.event(index, Item::Synced(at), self.now);
        }

        /// A live event on watch `index`: applied to its cache, then the driver is told.
        fn apply(&mut self, index: usize, event: watcher::Event<RawObject>) {
            let watch = self.watch(index);
            let mut joined = watch.join(None);
            watch.apply(event, &self.metrics);
            while let Ok(entry) = joined.live.try_recv() {
                self.driver.event(index, Item::Entry(entry), self.now);
            }
        }

        /// A rig whose primary watch listed `a` at resourceVersion 10, granted to stream 1 (room for one
        /// lease): the rig, the stream's items, and a's work item.
        fn with_a_leased(comparable: bool) -> (Self, mpsc::UnboundedReceiver<Handed>, Work) {
            let mut rig = Self::new(comparable);
            rig.list(0, vec![raw("a", 10, "")]);
            let mut rx = rig.attach(1, 1);
            rig.pump();
            let first = next(&mut rx).expect("a is granted");
            (rig, rx, first)
        }

        fn attach(&mut self, stream: u64, capacity: usize) -> mpsc::UnboundedReceiver<Handed> {
            let (items, rx) = mpsc::unbounded_channel();
            self.driver.call(DriverCall::Attach { stream, capacity, items }, self.now);
            rx
        }

        fn complete(&mut self, stream: u64, lease: &str, outcome: Completion) -> Result<(), ReconcileError> {
            self.driver.complete(stream, lease, (outcome, 0), self.now)
        }

        fn pump(&mut self) {
            self.driver.expire(self.now);
            self.driver.queue.tick(self.now);
            self.driver.pump(self.now);
        }

        /// The pod's own write of `name` returned `rv`, as ObjectsService records it.
        fn own_write(&self, name: &str, rv: u64) {
            self.expectations.expect(
                &format!("uid-{name}"),
                &rv.to_string(),
                Locator::new("configmaps", "ns", name),
                TIMEOUT,
            );
        }
    }

    fn key(name: &str) -> ObjKey {
        ObjKey { namespace: "ns".into(), name: name.into() }
    }

    /// A slot taken over with its keys' state: the list the driver starts with brings again what the last
    /// owner had taken in (not a change: an hour's requeue stands), while a change past the last owner's
    /// cut is handed out.
    #[tokio::test]
    async fn a_list_after_a_take_over_requeues_only_what_changed_past_the_last_owners_cut() {
        let (mut rig, publish) = Rig::sharded();
        let (a, b) = (key("a"), key("b"));
        let wall = SystemTime::now();
        let hour = wall.duration_since(SystemTime::UNIX_EPOCH).expect("after 1970").as_millis() + 3_600_000;
        let later = Carried {
            namespace: "ns".into(),
            name: "a".into(),
            place: CarriedPlace::Requeue(u64::try_from(hour).expect("fits")),
            failures: 0,
            last_error: None,
            priority: 0,
        };
        let handoff =
            |slot: u16, keys: Vec<Carried>| Handoff { slot, epoch: 5, cut: Some(vec![10, 0]), overflow: false, keys };
        let mut handoffs = vec![handoff(slot_of(&a), vec![later])];
        if slot_of(&b) != slot_of(&a) {
            handoffs.push(handoff(slot_of(&b), Vec::new()));
        }
        let slots = handoffs.iter().map(|h| (h.slot, (5, false))).collect();
        rig.own(&publish, slots, handoffs).await;
        rig.list(0, vec![raw("a", 7, ""), raw("b", 12, "")]);
        rig.list(1, vec![]);
        let mut rx = rig.attach(1, 4);
        rig.pump();
        let work = next(&mut rx).expect("b changed past the cut");
        assert_eq!(work.object.as_ref().map(|o| o.key()), Some(b));
        assert!(next(&mut rx).is_none(), "a's requeue was cut short by the list that brought it again");
    }

    /// A slot that comes back with nothing handed on (its owner was lost) hands each of its keys out once,
    /// also a key that was done here in an earlier tenure of the slot.
    /// Sharded by namespace, a slot taken over is granted from only once the watch of the member's share
    /// has listed it: before, a key handed on as pending was granted from a watch that did not hold its
    /// slot, handed out as absent, and its change was lost (one CI run).
    #[tokio::test]
    async fn a_key_of_a_slot_its_share_has_not_listed_yet_is_not_handed_out_as_absent() {
        let (mut rig, publish) = Rig::sharded_by(ShardBy::Namespace);
        let a = key("a");
        let slot = ShardBy::Namespace.slot(&a);
        // The watch holds another slot's share when the slot comes with a as pending.
        rig.driver.share = ShardBy::Namespace.share([slot ^ 1]);
        rig.list(0, vec![]);
        rig.list(1, vec![]);
        let pending = Carried {
            namespace: "ns".into(),
            name: "a".into(),
            place: CarriedPlace::Ready,
            failures: 0,
            last_error: None,
            priority: 0,
        };
        let handoff = Handoff { slot, epoch: 5, cut: Some(vec![10, 0]), overflow: false, keys: vec![pending] };
        rig.own(&publish, BTreeMap::from([(slot, (5, false))]), vec![handoff]).await;
        let mut rx = rig.attach(1, 4);
        rig.pump();
        assert!(next(&mut rx).is_none(), "not handed out before the watch of its share lists its slot");
        // The watch of the share with the slot lists a, at a version the last owner had taken in.
        rig.driver.share = ShardBy::Namespace.share([slot]);
        rig.list(0, vec![raw("a", 9, "")]);
        rig.pump();
        let work = next(&mut rx).expect("handed out once its slot is listed");
        assert_eq!(work.object.as_ref().map(|o| o.resource_version().to_owned()), Some("9".into()), "with its object");
        assert!(next(&mut rx).is_none(), "once");
    }

    #[tokio::test]
    async fn a_slot_back_with_nothing_handed_on_hands_out_a_key_done_here_before() {
        let (mut rig, publish) = Rig::sharded();
        let a = key("a");
        let slot = slot_of(&a);
        rig.own(&publish, BTreeMap::from([(slot, (1, false))]), Vec::new()).await;
        rig.list(0, vec![raw("a", 7, "")]);
        rig.list(1, vec![]);
        let mut rx = rig.attach(1, 4);
        rig.pump();
        let first = next(&mut rx).expect("a handed out");
        rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
        // The slot goes to another member, then comes back without a hand-off.
        rig.own(&publish, BTreeMap::new(), Vec::new()).await;
        rig.own(&publish, BTreeMap::from([(slot, (3, false))]), Vec::new()).await;
        rig.pump();
        let again = next(&mut rx).expect("a handed out again: its state since is unknown");
        assert_eq!(again.attempt, 1, "its failures start afresh");
        assert!(next(&mut rx).is_none(), "once");
    }

    /// A hand-off's cut counts a list's objects only once the list is through: they come in no
    /// resourceVersion order, so a newer one taken in says nothing of an older one still to come.
    #[tokio::test]
    async fn a_hand_off_during_a_list_cuts_only_at_what_is_surely_taken_in() {
        let (mut rig, publish) = Rig::sharded();
        let slots: BTreeSet<u16> = [slot_of(&key("a")), slot_of(&key("b"))].into();
        rig.own(&publish, slots.iter().map(|s| (*s, (1, false))).collect(), Vec::new()).await;
        let watch = rig.watch(0);
        watch.apply(watcher::Event::Init, &rig.metrics);
        for o in [raw("a", 7, ""), raw("b", 12, "")] {
            watch.apply(watcher::Event::InitApply(o), &rig.metrics);
        }
        watch.apply(watcher::Event::InitDone, &rig.metrics);
        let (objects, at) = watch.list("").expect("synced");
        let (b, a): (Vec<_>, Vec<_>) = objects.into_iter().partition(|o| o.key().name == "b");
        rig.driver.event(0, Item::Snapshot(b[0].clone(), at), rig.now);
        let cut = |rig: &Rig| rig.driver.handoffs(&slots)[0].cut.clone();
        assert_eq!(cut(&rig), Some(vec![0, 0]), "mid-list, b at 12 says nothing of a at 7");
        rig.driver.event(0, Item::Snapshot(a[0].clone(), at), rig.now);
        rig.driver.event(0, Item::Synced(at), rig.now);
        assert_eq!(cut(&rig), Some(vec![12, 0]), "the list is through");
        rig.apply(0, watcher::Event::Apply(raw("a", 13, "")));
        assert_eq!(cut(&rig), Some(vec![13, 0]), "a live change, in order");
    }

    /// A key parked while its slot was moving away is handed out here once the move is called off (the
    /// member it was moving to left first), though the slot's epoch did not change.
    #[tokio::test]
    async fn a_key_parked_for_a_move_called_off_is_handed_out_here() {
        let (mut rig, publish) = Rig::sharded();
        let slot = slot_of(&key("a"));
        rig.own(&publish, BTreeMap::from([(slot, (1, true))]), Vec::new()).await;
        rig.list(0, vec![raw("a", 7, "")]);
        rig.list(1, vec![]);
        let mut rx = rig.attach(1, 4);
        rig.pump();
        assert!(next(&mut rx).is_none(), "a moving slot hands out nothing");
        rig.own(&publish, BTreeMap::from([(slot, (1, false))]), Vec::new()).await;
        rig.pump();
        assert!(next(&mut rx).is_some(), "the move was called off: a is this member's to hand out");
    }

    fn version(work: &Work) -> String {
        work.object.as_ref().map(|o| o.resource_version().to_owned()).unwrap_or_default()
    }

    fn next(rx: &mut mpsc::UnboundedReceiver<Handed>) -> Option<Work> {
        rx.try_recv().ok().map(|handed| handed.expect("work, not the queue's end"))
    }

    /// Timers in memory, as a store would keep them.
    #[derive(Debug, Default)]
    struct Kept(Mutex<HashMap<ObjKey, Timer>>);

    impl Timers for Kept {
        fn keep(&self, _: &str, key: &ObjKey, timer: Option<&Timer>) {
            let mut kept = self.0.lock().expect("kept");
            match timer {
                Some(timer) => kept.insert(key.clone(), timer.clone()),
                None => kept.remove(key),
            };
        }

        fn load(&self, _: &str) -> HashMap<ObjKey, Timer> {
            self.0.lock().expect("kept").clone()
        }
    }

    /// After a restart, a REQUEUE kept for a key is taken back when its first lists show nothing changed
    /// since: the primary at the version that pass was handed, and no related object past the watermark.
    /// Otherwise the key is handed out (and the timer forgotten), as is a key of no timer.
    #[tokio::test]
    async fn a_kept_requeue_is_restored_unless_its_object_or_a_related_one_changed_since() {
        let in_an_hour = wall_ms(Instant::now() + Duration::from_secs(3600), Instant::now(), SystemTime::now());
        let timer = |rv: &str| Timer {
            resource_version: rv.into(),
            watermark: 20,
            kind: TimerKind::Requeue { at_ms: in_an_hour, priority: 0 },
        };
        let kept = Arc::new(Kept::default());
        for name in ["same", "related-changed", "changed", "gone"] {
            kept.keep("q", &ObjKey { namespace: "ns".into(), name: name.into() }, Some(&timer("10")));
        }
        let mut rig = Rig::build_with(true, None, kept.clone());
        rig.list(
            0,
            vec![raw("same", 10, ""), raw("related-changed", 10, ""), raw("changed", 11, ""), raw("new", 5, "")],
        );
        rig.list(1, vec![raw("child-1", 15, r#""owner":"same""#), raw("child-2", 25, r#""owner":"related-changed""#)]);
        let mut rx = rig.attach(1, 10);
        rig.pump();
        let mut handed: Vec<String> = std::iter::from_fn(|| next(&mut rx)).map(|w| w.key.name).collect();
        handed.sort();
        assert_eq!(handed, ["changed", "new", "related-changed"], "same waits for its hour");
        let same = ObjKey { namespace: "ns".into(), name: "same".into() };
        assert!(rig.driver.queue.requeued(&same).is_some());
        let left: Vec<String> = kept.load("q").into_keys().map(|k| k.name).collect();
        assert_eq!(left, ["same"], "the others' timers forgotten, the gone one's too");
    }

    /// The Kopf worker's invariant across the process boundary: after the app's own write, the key's
    /// next pass is granted only with a state at least that new, though a third party's change made
    /// during the lease queued it at once.
    fn a_key_is_granted_only_once_its_watch_shows_the_write_its_previous_lease_made(comparable: bool) {
        let (mut rig, mut rx, first) = Rig::with_a_leased(comparable);
        assert_eq!(version(&first), "10");
        // During the lease: a third party's change (queues one more pass), then the app's own write.
        rig.apply(0, watcher::Event::Apply(raw("a", 11, "")));
        rig.own_write("a", 12);
        rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
        rig.pump();
        assert!(next(&mut rx).is_none(), "granted with state 11, older than the app's own write 12");
        assert_eq!(rig.driver.held.len(), 1);
        rig.apply(0, watcher::Event::Apply(raw("a", 12, "")));
        rig.pump();
        let second = next(&mut rx).expect("granted once the watch shows 12");
        assert_eq!(version(&second), "12");
        assert!(!second.timed_out);
        assert_eq!(second.attempt, 1);
    }

    #[tokio::test]
    async fn with_comparable_versions_a_grant_waits_for_the_watch_high_water_mark() {
        a_key_is_granted_only_once_its_watch_shows_the_write_its_previous_lease_made(true);
    }

    #[tokio::test]
    async fn without_comparable_versions_a_grant_waits_for_exactly_the_written_version() {
        a_key_is_granted_only_once_its_watch_shows_the_write_its_previous_lease_made(false);
    }

    /// With a change filter, a change of what it does not name queues nothing, on the primary and on a related
    /// query; one of what it names does, and so does a related object's move to another primary (its old and
    /// new primaries).
    #[tokio::test]
    async fn a_change_the_filter_does_not_name_queues_nothing() {
        let mut rig = Rig::new(true);
        let labels = Some(ChangeFilter { labels: true, ..ChangeFilter::default() });
        rig.driver.spec.primary.changes = labels;
        // The related query compares annotations: a change of its labels but the one mapping it queues nothing.
        let annotations = Some(ChangeFilter { annotations: true, ..ChangeFilter::default() });
        rig.driver.spec.related.push(super::super::Relation {
            query: super::super::ObjectQuery { changes: annotations, ..rig.driver.spec.primary.clone() },
            maps_by: MapsBy::Label("owner".into()),
            priority: 0,
        });
        rig.list(0, vec![raw("a", 10, r#""x":"1""#), raw("b", 11, "")]);
        let mut rx = rig.attach(1, 4);
        let mut pass = |rig: &mut Rig| {
            rig.pump();
            let work = next(&mut rx);
            if let Some(work) = &work {
                rig.complete(1, &work.lease_id, Completion::Done).expect("completed");
            }
            work.map(|w| (w.key.name.clone(), version(&w)))
        };
        assert!(pass(&mut rig).is_some() && pass(&mut rig).is_some() && pass(&mut rig).is_none(), "both listed");

        rig.apply(0, watcher::Event::Apply(raw("a", 12, r#""x":"1""#)));
        assert_eq!(pass(&mut rig), None, "the same labels: no pass");
        rig.apply(0, watcher::Event::Apply(raw("a", 13, r#""x":"2""#)));
        assert_eq!(pass(&mut rig), Some(("a".into(), "13".into())));

        rig.apply(1, watcher::Event::Apply(raw("r", 20, r#""owner":"a""#)));
        assert_eq!(pass(&mut rig).map(|p| p.0), Some("a".into()), "a related object's first state");
        rig.apply(1, watcher::Event::Apply(raw("r", 21, r#""owner":"a""#)));
        assert_eq!(pass(&mut rig), None, "a related object's change of nothing named");
        rig.apply(1, watcher::Event::Apply(raw("r", 22, r#""owner":"a","y":"1""#)));
        assert_eq!(pass(&mut rig), None, "a related object's label, not named");
        rig.apply(1, watcher::Event::Apply(raw("r", 23, r#""owner":"b","y":"1""#)));
        let (first, second) = (pass(&mut rig).map(|p| p.0), pass(&mut rig).map(|p| p.0));
        let mut moved = [first, second];
        moved.sort();
        assert_eq!(moved, [Some("a".into()), Some("b".into())], "moved: the old primary and the new");
    }

    #[tokio::test]
    async fn a_no_op_write_or_a_later_version_never_stalls_a_key_where_versions_compare() {
        let (mut rig, mut rx, first) = Rig::with_a_leased(true);
        // A no-op write answers the version the watch already has; another object's change moves the
        // high-water mark past a write whose own event was coalesced away.
        rig.own_write("a", 10);
        rig.apply(0, watcher::Event::Apply(raw("a", 11, "")));
        rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
        rig.pump();
        assert_eq!(version(&next(&mut rx).expect("not held")), "11");
    }

    /// A lease that wrote its key: the write's event queues no pass, whether it comes after the write's
    /// answer or before it (while the lease is out), and whether the lease is still out or ended.
    #[tokio::test]
    async fn a_write_made_under_a_lease_queues_no_pass_of_its_key() {
        for (event_first, done_first) in [(false, false), (false, true), (true, false)] {
            let case = format!("event first {event_first}, done first {done_first}");
            let (mut rig, mut rx, first) = Rig::with_a_leased(true);
            let written = Obj::from(raw("a", 11, ""));
            if event_first {
                rig.apply(0, watcher::Event::Apply(raw("a", 11, "")));
            }
            rig.driver.wrote(&first.lease_id, &configmaps(), &written, rig.now);
            if done_first {
                rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
            }
            if !event_first {
                rig.apply(0, watcher::Event::Apply(raw("a", 11, "")));
            }
            if !done_first {
                rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
            }
            rig.pump();
            assert!(next(&mut rx).is_none(), "{case}: its own write queued a pass");
            assert_eq!(rig.driver.queue.counts().depth, 0, "{case}");
            // Anyone else's change afterwards still queues one.
            rig.apply(0, watcher::Event::Apply(raw("a", 12, "")));
            rig.pump();
            assert_eq!(version(&next(&mut rx).expect("a change by anyone else")), "12", "{case}");
        }
    }

    /// A third party's change during a lease that also wrote: one more pass, exactly one.
    #[tokio::test]
    async fn a_change_by_anyone_else_during_a_lease_gives_one_more_pass_beside_its_own_write() {
        for third_party_first in [true, false] {
            let (mut rig, mut rx, first) = Rig::with_a_leased(true);
            let (own, theirs) = if third_party_first { (12, 11) } else { (11, 12) };
            rig.apply(0, watcher::Event::Apply(raw("a", 11, "")));
            rig.apply(0, watcher::Event::Apply(raw("a", 12, "")));
            rig.driver.wrote(&first.lease_id, &configmaps(), &Obj::from(raw("a", own, "")), rig.now);
            rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
            rig.pump();
            let again = next(&mut rx).unwrap_or_else(|| panic!("the change at {theirs} was lost"));
            assert_eq!(version(&again), "12");
            rig.complete(1, &again.lease_id, Completion::Done).expect("completed");
            rig.pump();
            assert!(next(&mut rx).is_none(), "one more pass, not one per change");
        }
    }

    /// Where the write's event cannot be told from someone else's change, the pass is queued: an event
    /// whose answer never came (the write failed, or the app ended the lease first), and a relist's
    /// difference showing the written version (the writes before it were never seen one by one).
    #[tokio::test]
    async fn a_change_that_may_hide_anyone_elses_queues_a_pass_though_it_shows_the_leases_write() {
        let (mut rig, mut rx, first) = Rig::with_a_leased(true);
        rig.apply(0, watcher::Event::Apply(raw("a", 11, "")));
        rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
        rig.pump();
        let second = next(&mut rx).expect("no answer named 11 the lease's own");
        assert_eq!(version(&second), "11");
        rig.driver.wrote(&second.lease_id, &configmaps(), &Obj::from(raw("a", 13, "")), rig.now);
        rig.complete(1, &second.lease_id, Completion::Done).expect("completed");
        // The watch's resume is refused: its list shows 13, the write, over a change at 12 never seen.
        rig.apply(0, watcher::Event::Init);
        rig.apply(0, watcher::Event::InitApply(raw("a", 13, "")));
        rig.apply(0, watcher::Event::InitDone);
        rig.pump();
        assert_eq!(version(&next(&mut rx).expect("a relist's difference may hide a change")), "13");
    }

    #[tokio::test]
    async fn a_write_never_shown_is_granted_timed_out_after_the_consistency_timeout() {
        let (mut rig, mut rx, first) = Rig::with_a_leased(true);
        rig.apply(0, watcher::Event::Apply(raw("a", 11, "")));
        rig.own_write("a", 12);
        rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
        rig.pump();
        assert!(next(&mut rx).is_none());
        // The rig's clock started before the write: its deadline is a little after now + TIMEOUT.
        let deadline =
            rig.driver.gate.deadline(&rig.driver.held, rig.now).expect("a held key wakes the driver at its deadline");
        assert!(deadline > rig.now + TIMEOUT && deadline < rig.now + TIMEOUT + Duration::from_secs(1), "{deadline:?}");
        rig.now = deadline;
        rig.pump();
        let late = next(&mut rx).expect("granted at the deadline");
        assert!(late.timed_out, "marked TIMED_OUT");
        assert_eq!(version(&late), "11", "the latest state known");
    }

    #[tokio::test]
    async fn a_grant_waits_for_the_related_watch_to_show_a_write_made_for_the_lease() {
        let (mut rig, mut rx, first) = Rig::with_a_leased(true);
        // The app creates a child named for the lease; its watch has not shown it yet.
        let child = Obj::from(raw("child", 20, r#""owner":"a""#));
        rig.driver.wrote(&first.lease_id, &configmaps(), &child, rig.now);
        rig.apply(0, watcher::Event::Apply(raw("a", 21, "")));
        rig.complete(1, &first.lease_id, Completion::Done).expect("completed");
        rig.pump();
        assert!(next(&mut rx).is_none(), "the related watch has not shown the child yet");
        rig.apply(1, watcher::Event::Apply(raw("child", 20, r#""owner":"a""#)));
        rig.pump();
        assert_eq!(version(&next(&mut rx).expect("granted")), "21");
    }

    #[tokio::test]
    async fn a_write_is_waited_for_only_on_the_watches_that_select_it() {
        let (mut rig, _rx, first) = Rig::with_a_leased(true);
        // The related watch selects `owner` labels; the primary watch (no selector) selects everything,
        // so a child without the label is waited for on the primary watch only.
        let unlabelled = Obj::from(raw("plain", 20, ""));
        rig.driver.wrote(&first.lease_id, &configmaps(), &unlabelled, rig.now);
        let waits: Vec<usize> = rig.driver.gate.written.values().flatten().map(|w| w.watch).collect();
        assert_eq!(waits, [0]);
    }

    #[tokio::test]
    async fn a_related_object_queues_the_primary_it_names_and_the_one_it_named_before() {
        let mut rig = Rig::new(true);
        rig.list(0, vec![raw("a", 10, ""), raw("b", 11, "")]);
        let mut rx = rig.attach(1, 10);
        rig.pump();
        for work in [next(&mut rx).expect("one"), next(&mut rx).expect("two")] {
            rig.complete(1, &work.lease_id, Completion::Done).expect("completed");
        }
        rig.apply(1, watcher::Event::Apply(raw("child", 20, r#""owner":"a""#)));
        rig.pump();
        assert_eq!(next(&mut rx).expect("a").key.name, "a");
        rig.apply(1, watcher::Event::Apply(raw("child", 21, r#""owner":"b""#)));
        rig.pump();
        let mut names: Vec<String> = std::iter::from_fn(|| next(&mut rx).map(|w| w.key.name)).collect();
        names.sort();
        assert_eq!(names, ["b"], "a is still leased: its second pass waits for the lease");
    }

    #[tokio::test]
    async fn two_streams_never_hold_one_key_and_a_leaving_stream_returns_its_leases() {
        let mut rig = Rig::new(true);
        rig.list(0, vec![raw("a", 10, "")]);
        let mut one = rig.attach(1, 5);
        let mut two = rig.attach(2, 5);
        rig.pump();
        let (first, other) = match (next(&mut one), next(&mut two)) {
            (Some(w), None) => (w, 2),
            (None, Some(w)) => (w, 1),
            got => panic!("one lease, once: {got:?}"),
        };
        for rv in 11..15 {
            rig.apply(0, watcher::Event::Apply(raw("a", rv, "")));
            rig.pump();
        }
        assert!(next(&mut one).is_none() && next(&mut two).is_none(), "never two leases out for one key");
        let holder = 3 - other;
        rig.driver.call(DriverCall::Detach { stream: holder }, rig.now);
        rig.pump();
        let rx = if other == 1 { &mut one } else { &mut two };
        let again = next(rx).expect("handed to the other stream");
        assert_eq!(version(&again), "14");
        let refused = rig.complete(holder, &first.lease_id, Completion::Done).expect_err("gone with its stream");
        assert!(matches!(refused, ReconcileError::FailedPrecondition { .. }), "{refused}");
    }

    #[tokio::test]
    async fn completions_of_unknown_foreign_or_malformed_leases_are_refused_naming_the_field() {
        let mut rig = Rig::new(true);
        rig.list(0, vec![raw("a", 10, "")]);
        let mut rx = rig.attach(1, 1);
        let _other = rig.attach(2, 1);
        rig.pump();
        let work = next(&mut rx).expect("granted");
        let cases = [
            (2, work.lease_id.clone(), "another stream"),
            (1, "q.1.999".to_owned(), "is not held"),
            (1, "other.1.1".to_owned(), "of queue \"other\""),
            (1, "garbage".to_owned(), "is not a lease id"),
        ];
        for (stream, lease, why) in cases {
            let refused = rig.complete(stream, &lease, Completion::Done).expect_err("refused");
            assert!(refused.to_string().starts_with("complete.lease_id: "), "{refused}");
            assert!(refused.to_string().contains(why), "{refused}");
        }
        rig.complete(1, &work.lease_id, Completion::Done).expect("the holder completes it");
    }

    #[tokio::test]
    async fn a_lease_past_its_timeout_goes_back_to_the_queue() {
        let mut rig = Rig::new(true);
        rig.list(0, vec![raw("a", 10, "")]);
        let mut rx = rig.attach(1, 1);
        rig.pump();
        let work = next(&mut rx).expect("granted");
        rig.now += Duration::from_secs(61);
        rig.pump();
        let again = next(&mut rx).expect("handed out again");
        assert_ne!(again.lease_id, work.lease_id);
        assert!(rig.complete(1, &work.lease_id, Completion::Done).is_err(), "the timed-out lease is not held");
    }

    #[tokio::test]
    async fn a_list_taken_again_queues_only_the_keys_that_changed_or_went_meanwhile() {
        let mut rig = Rig::new(true);
        rig.list(0, vec![raw("a", 10, ""), raw("b", 11, ""), raw("c", 12, "")]);
        let mut rx = rig.attach(1, 3);
        rig.pump();
        for _ in 0..3 {
            let work = next(&mut rx).expect("granted");
            rig.complete(1, &work.lease_id, Completion::Done).expect("completed");
        }
        // A resync (or a new share's watch) lists again: a as it was, b changed, c gone.
        rig.driver.event(0, Item::ResyncRequired, rig.now);
        let watch = rig.watch(0);
        watch.apply(watcher::Event::Delete(raw("c", 13, "")), &rig.metrics);
        watch.apply(watcher::Event::Apply(raw("b", 14, "")), &rig.metrics);
        let (objects, at) = watch.list("").expect("synced");
        for o in objects {
            rig.driver.event(0, Item::Snapshot(o, at), rig.now);
        }
        rig.driver.event(0, Item::Synced(at), rig.now);
        rig.pump();
        let mut handed: Vec<(String, bool)> =
            std::iter::from_fn(|| next(&mut rx)).map(|w| (w.key.name, w.deleted)).collect();
        handed.sort();
        assert_eq!(handed, [("b".to_owned(), false), ("c".to_owned(), true)], "a, unchanged, queues nothing");
    }

    #[tokio::test]
    async fn a_deleted_primary_is_handed_out_once_with_its_last_state_then_forgotten() {
        let mut rig = Rig::new(true);
        rig.list(0, vec![raw("a", 10, "")]);
        let mut rx = rig.attach(1, 1);
        rig.pump();
        let work = next(&mut rx).expect("granted");
        rig.complete(1, &work.lease_id, Completion::Done).expect("completed");
        rig.apply(0, watcher::Event::Delete(raw("a", 11, "")));
        rig.pump();
        let gone = next(&mut rx).expect("the deletion is handed out");
        assert!(gone.deleted);
        assert_eq!(version(&gone), "11", "its last known state");
        rig.complete(1, &gone.lease_id, Completion::Done).expect("completed");
        rig.pump();
        assert!(next(&mut rx).is_none(), "once");
        assert_eq!(rig.driver.queue.len(), 0, "forgotten");
        assert!(rig.driver.tombstones.is_empty());
    }

    /// A ConfigMap with `finalizers`, being deleted when `deleting`.
    fn marked(name: &str, rv: u64, finalizers: &[&str], deleting: bool) -> RawObject {
        let deletion = if deleting { r#","deletionTimestamp":"2026-12-07T00:00:00Z""# } else { "" };
        let json = format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","uid":"uid-{name}","resourceVersion":"{rv}","finalizers":{}{deletion}}}}}"#,
            serde_json::json!(finalizers)
        );
        serde_json::from_str(&json).expect("test object decodes")
    }

    #[tokio::test]
    async fn under_a_finalizer_a_deleted_object_is_a_finalize_pass_and_one_past_it_is_not_handed_out() {
        const F: &str = "example.com/cleanup";
        let mut rig = Rig::new(true);
        rig.driver.spec.finalizer = Some(F.into());
        rig.list(0, vec![marked("held", 10, &[F], false)]);
        let mut rx = rig.attach(1, 4);
        rig.pump();
        let first = next(&mut rx).expect("granted");
        assert!(!first.finalizing, "it carries the finalizer: an ordinary pass");
        rig.complete(1, &first.lease_id, Completion::Done).expect("completed");

        // Deleted while it carries the finalizer: a finalize pass; another controller's object being deleted
        // without it: nothing handed out.
        rig.apply(0, watcher::Event::Apply(marked("held", 11, &[F, "other/keep"], true)));
        rig.apply(0, watcher::Event::Apply(marked("theirs", 12, &["other/keep"], true)));
        rig.pump();
        let finalize = next(&mut rx).expect("the finalize pass");
        assert_eq!((finalize.key.name.as_str(), finalize.finalizing, finalize.deleted), ("held", true, false));
        assert!(next(&mut rx).is_none(), "an object being deleted without the finalizer is not handed out");
        assert!(!rig.driver.queue.is_leased(&key("theirs")), "and its key is not held");
    }
}
