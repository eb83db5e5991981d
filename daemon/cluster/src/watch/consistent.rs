//! CONSISTENT delivery: per object, only states consistent with this pod's own writes, each
//! (uid, resourceVersion) at most once. States that predate a pending own write are held; the write's
//! own state releases them (dropped as superseded); a DELETE is never held; at the deadline the latest
//! held state is delivered marked timed out. A subscriber that fell behind gets, instead of
//! RESYNC_REQUIRED, the difference between what it was told and the current state: latest state per
//! object, and a DELETE for every object that vanished.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use tokio::time::Instant;

use super::{
    expectations::{Expectations, Locator},
    object::Obj,
    shared::{Change, Item},
    sleep_until,
    subscription::Subscription,
};

/// How an object state relates to this pod's own writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// No own write is pending.
    Consistent,
    /// An own write is pending and this state predates it.
    AwaitingOwnWrite,
    /// Exactly the state an own write produced.
    OwnWrite,
    /// An own write was not seen in time; this is the latest state.
    TimedOut,
}

/// What happened to an object, as told to a CONSISTENT subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An object this subscriber was not told of yet, whatever the upstream event was.
    Added,
    /// A newer state of an object this subscriber knows.
    Modified,
    /// The object was deleted, or vanished while the subscriber was behind; never held.
    Deleted,
}

/// One delivery to a CONSISTENT subscriber.
#[derive(Debug)]
pub enum Delivery {
    /// A state of one object, or its deletion.
    Object {
        /// Added, modified or deleted, relative to what this subscriber was told before.
        kind: Kind,
        /// The object as the apiserver sent it; for a delete, its last known state.
        obj: Arc<Obj>,
        /// The position it was delivered at (for the cursor); `None` inside a snapshot.
        seq: Option<u64>,
        /// Its relation to the pod's own writes.
        consistency: Consistency,
        /// When the daemon received this state from the apiserver, if it came live (not in a snapshot).
        received: Option<Instant>,
        /// The state of the object the watch saw directly before this one ([`super::shared::Entry::previous`]).
        previous: Option<Box<str>>,
    },
    /// The initial state is complete.
    Synced(u64),
    /// The subscriber's resume cursor could not be resumed from: a fresh snapshot and SYNCED follow,
    /// and the subscriber must reconcile its own state against them.
    ResyncRequired,
}

/// Classifies the state `obj` of resource `plural` at position `pos` of watch `incarnation` against
/// the pod's writes, with the deadline to hold it until when it predates a pending one.
pub fn classify(
    expectations: &Expectations,
    incarnation: u64,
    plural: &str,
    obj: &Obj,
    pos: u64,
) -> (Consistency, Option<Instant>) {
    let now = Instant::now();
    let pending = |deadline: Instant| {
        if now < deadline { (Consistency::AwaitingOwnWrite, Some(deadline)) } else { (Consistency::TimedOut, None) }
    };
    // A write still in flight: whatever arrives now predates its result.
    if let Some(deadline) = expectations.in_flight(&Locator::new(plural, obj.namespace(), obj.name())) {
        return pending(deadline);
    }
    let Some(e) = expectations.get(obj.uid()) else { return (Consistency::Consistent, None) };
    match e.seen.get(&incarnation) {
        Some(&at) if pos == at => (Consistency::OwnWrite, None),
        Some(&at) if pos > at => (Consistency::Consistent, None),
        // Before the write's position, or the write not seen yet.
        _ => pending(e.deadline),
    }
}

#[derive(Debug)]
struct HeldState {
    obj: Arc<Obj>,
    /// Its position, to classify it again when expectations change.
    pos: u64,
    /// Its cursor position (`None` inside a snapshot).
    seq: Option<u64>,
    deadline: Instant,
    received: Option<Instant>,
    previous: Option<Box<str>>,
}

/// A subscription filtered for CONSISTENT delivery.
#[derive(Debug)]
pub struct ConsistentSubscription {
    sub: Subscription,
    filter: Filter,
    changes: tokio::sync::watch::Receiver<u64>,
}

/// The CONSISTENT rules over a stream of items from one watch incarnation.
#[derive(Debug)]
struct Filter {
    incarnation: u64,
    plural: String,
    expectations: Expectations,
    held: HashMap<String, HeldState>,
    /// The last state delivered per uid: deduplication, and the base for coalescing after a resync.
    delivered: HashMap<String, Arc<Obj>>,
    out: std::collections::VecDeque<Delivery>,
    /// Objects of a snapshot being collected after the subscriber fell behind.
    resync: Option<Vec<Arc<Obj>>>,
    /// Position of the last item processed.
    last_seq: u64,
    /// Whether any item was processed: a resync before that answers the subscriber's resume cursor.
    started: bool,
}

impl ConsistentSubscription {
    /// Filters `sub` against the pod's own writes in `expectations`.
    pub fn new(sub: Subscription, expectations: Expectations) -> Self {
        let changes = expectations.subscribe();
        let filter = Filter::new(sub.incarnation(), sub.resource_plural().to_owned(), expectations);
        Self { sub, filter, changes }
    }

    /// The watch incarnation, for cursors.
    pub fn incarnation(&self) -> u64 {
        self.sub.incarnation()
    }

    /// Why the watch ended, once [`ConsistentSubscription::next`] returned None ([`Subscription::ended`]).
    pub fn ended(&self) -> Option<super::budget::Exhausted> {
        self.sub.ended()
    }

    /// The next delivery; `None` when the watch stopped.
    pub async fn next(&mut self) -> Option<Delivery> {
        loop {
            if let Some(d) = self.filter.out.pop_front() {
                return Some(d);
            }
            let deadline = self.filter.next_deadline();
            let holding = deadline.is_some();
            tokio::select! {
                item = self.sub.next() => {
                    let received = self.sub.live_received();
                    self.filter.process(item?, received);
                }
                () = sleep_until(deadline) => self.filter.reevaluate(),
                // A write answered or seen: held states may be released.
                Ok(()) = self.changes.changed(), if holding => self.filter.reevaluate(),
            }
        }
    }
}

impl Filter {
    fn new(incarnation: u64, plural: String, expectations: Expectations) -> Self {
        Self {
            incarnation,
            plural,
            expectations,
            held: HashMap::new(),
            delivered: HashMap::new(),
            out: Default::default(),
            resync: None,
            last_seq: 0,
            started: false,
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.held.values().map(|h| h.deadline).min()
    }

    /// Takes the next item, `received` from the apiserver at that instant if it came live.
    fn process(&mut self, item: Item, received: Option<Instant>) {
        let first = !std::mem::replace(&mut self.started, true);
        match item {
            // A cursor this watch cannot resume from: this filter never saw what the subscriber holds, so
            // the subscriber is told and gets a plain snapshot (then SYNCED) to reconcile against.
            Item::ResyncRequired if first => self.out.push_back(Delivery::ResyncRequired),
            // Fell behind mid-stream: this filter knows what it delivered, so it sends the difference.
            Item::ResyncRequired => self.resync = Some(Vec::new()),
            Item::Snapshot(obj, at) => match &mut self.resync {
                Some(objects) => objects.push(obj),
                None => {
                    self.last_seq = at;
                    self.offer(obj, at, None, None, None);
                }
            },
            Item::Synced(seq) => {
                self.last_seq = seq;
                match self.resync.take() {
                    Some(objects) => self.coalesce(objects, seq),
                    None => self.out.push_back(Delivery::Synced(seq)),
                }
            }
            Item::Entry(entry) => {
                self.last_seq = entry.seq;
                match &entry.change {
                    Change::Added(obj) | Change::Modified(obj) => {
                        self.offer(obj.clone(), entry.seq, Some(entry.seq), received, entry.previous.clone())
                    }
                    Change::Deleted(obj) => self.delete(obj.clone(), Some(entry.seq), received),
                    Change::Synced => {
                        // Objects that arrived before the initial list completed were offered already.
                        self.out.push_back(Delivery::Synced(entry.seq));
                    }
                    // States, not events, are delivered here: the difference that follows is what counts.
                    Change::Relisted => {}
                }
            }
        }
    }

    /// A state at position `pos`: held while it predates a pending own write, else delivered once.
    fn offer(
        &mut self,
        obj: Arc<Obj>,
        pos: u64,
        seq: Option<u64>,
        received: Option<Instant>,
        previous: Option<Box<str>>,
    ) {
        let (consistency, deadline) = classify(&self.expectations, self.incarnation, &self.plural, &obj, pos);
        tracing::debug!(uid = %obj.uid(), resource_version = %obj.resource_version(), pos, ?consistency, held = deadline.is_some(), "consistent: offered");
        if let Some(deadline) = deadline {
            self.held.insert(obj.uid().to_owned(), HeldState { obj, pos, seq, deadline, received, previous });
            return;
        }
        // The state that ends a wait supersedes what was held.
        self.held.remove(obj.uid());
        self.deliver(obj, seq, consistency, received, previous);
    }

    fn deliver(
        &mut self,
        obj: Arc<Obj>,
        seq: Option<u64>,
        consistency: Consistency,
        received: Option<Instant>,
        previous: Option<Box<str>>,
    ) {
        let kind = match self.delivered.get(obj.uid()) {
            Some(prev) if prev.resource_version() == obj.resource_version() => return,
            Some(_) => Kind::Modified,
            None => Kind::Added,
        };
        self.delivered.insert(obj.uid().to_owned(), obj.clone());
        self.out.push_back(Delivery::Object { kind, obj, seq, consistency, received, previous });
    }

    /// Delivers a delete at once (deletes are never held), forgetting what was held or delivered for the object.
    fn delete(&mut self, obj: Arc<Obj>, seq: Option<u64>, received: Option<Instant>) {
        self.held.remove(obj.uid());
        self.delivered.remove(obj.uid());
        let consistency = Consistency::Consistent;
        self.out.push_back(Delivery::Object { kind: Kind::Deleted, obj, seq, consistency, received, previous: None });
    }

    /// Classifies every held state again (a write was answered or seen, or a deadline passed):
    /// released ones are delivered, as the own write, as consistent, or marked timed out.
    fn reevaluate(&mut self) {
        let held: Vec<(String, HeldState)> = self.held.drain().collect();
        for (uid, held) in held {
            let (consistency, deadline) =
                classify(&self.expectations, self.incarnation, &self.plural, &held.obj, held.pos);
            match deadline {
                Some(deadline) => {
                    self.held.insert(uid, HeldState { deadline, ..held });
                }
                None => {
                    if consistency == Consistency::TimedOut {
                        tracing::warn!(uid = %uid, resource_version = %held.obj.resource_version(), "own write not seen before consistency.timeout; delivering the latest state");
                    }
                    let seq = held.seq.or(Some(self.last_seq));
                    self.deliver(held.obj, seq, consistency, held.received, held.previous);
                }
            }
        }
    }

    /// After falling behind: deliver the difference between what this subscriber was told and `objects`.
    fn coalesce(&mut self, objects: Vec<Arc<Obj>>, seq: u64) {
        let present: HashSet<&str> = objects.iter().map(|o| o.uid()).collect();
        let vanished: Vec<Arc<Obj>> = self.delivered.values().filter(|o| !present.contains(o.uid())).cloned().collect();
        for obj in vanished {
            self.delete(obj, Some(seq), None);
        }
        self.held.retain(|uid, _| present.contains(uid.as_str()));
        for obj in objects {
            self.offer(obj, seq, Some(seq), None, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn classification_follows_the_writes_position() {
        let e = Expectations::default();
        let o = obj("u", "10");
        let c = |inc, pos| classify(&e, inc, "configmaps", &o, pos).0;
        assert_eq!(c(1, 5), Consistency::Consistent, "no write");
        let flight = e.begin(Locator::new("configmaps", "ns", "n-u"), Duration::from_secs(5));
        assert_eq!(c(1, 5), Consistency::AwaitingOwnWrite, "a write in flight");
        e.expect("u", "10", Locator::new("configmaps", "ns", "n-u"), Duration::from_secs(5));
        drop(flight);
        assert_eq!(c(1, 5), Consistency::AwaitingOwnWrite, "not seen yet");
        e.seen(1, "u", "10", 7);
        assert_eq!(c(1, 6), Consistency::AwaitingOwnWrite, "before the write's position");
        assert_eq!(c(1, 7), Consistency::OwnWrite);
        assert_eq!(c(1, 8), Consistency::Consistent, "after it");
        assert_eq!(c(2, 8), Consistency::AwaitingOwnWrite, "another watch has not seen it");
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(c(2, 8), Consistency::TimedOut, "past the deadline nothing is held");
    }

    const INC: u64 = 9;

    fn obj(uid: &str, rv: &str) -> Arc<Obj> {
        Arc::new(Obj::new(uid, "ns", &format!("n-{uid}"), rv, Vec::new()))
    }

    fn entry(seq: u64, change: Change) -> Item {
        Item::Entry(Arc::new(super::super::shared::Entry {
            seq,
            change,
            received: Instant::now(),
            listed: false,
            previous: None,
        }))
    }

    fn drain(f: &mut Filter) -> Vec<String> {
        f.out
            .drain(..)
            .map(|d| match d {
                Delivery::Synced(_) => "SYNCED".to_owned(),
                Delivery::ResyncRequired => "RESYNC_REQUIRED".to_owned(),
                Delivery::Object { kind, obj, consistency, .. } => {
                    format!("{kind:?} {} {} {consistency:?}", obj.uid(), obj.resource_version())
                }
            })
            .collect()
    }

    /// The seed's timeline: a third party's change (v2) arrives after our patch was answered (v3) but
    /// before the watch shows v3. The subscriber must see v3 once and never v2.
    #[tokio::test(start_paused = true)]
    async fn a_state_before_the_own_write_is_held_and_dropped_when_the_write_arrives() {
        let e = Expectations::default();
        let mut f = Filter::new(INC, "configmaps".into(), e.clone());
        f.process(entry(1, Change::Added(obj("u", "1"))), None);
        f.process(entry(2, Change::Synced), None);
        assert_eq!(drain(&mut f), ["Added u 1 Consistent", "SYNCED"]);

        e.expect("u", "3", Locator::new("configmaps", "ns", "n-u"), Duration::from_secs(5));
        f.process(entry(3, Change::Modified(obj("u", "2"))), None);
        assert!(drain(&mut f).is_empty(), "v2 predates our write: held");
        e.seen(INC, "u", "3", 4);
        f.process(entry(4, Change::Modified(obj("u", "3"))), None);
        assert_eq!(drain(&mut f), ["Modified u 3 OwnWrite"]);
        assert!(f.held.is_empty(), "the held state was dropped as superseded");
        f.process(entry(5, Change::Modified(obj("u", "4"))), None);
        assert_eq!(drain(&mut f), ["Modified u 4 Consistent"], "later changes flow again");
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_deadline_the_latest_held_state_is_delivered_marked_timed_out() {
        let e = Expectations::default();
        let mut f = Filter::new(INC, "configmaps".into(), e.clone());
        e.expect("u", "9", Locator::new("configmaps", "ns", "n-u"), Duration::from_secs(5));
        f.process(entry(1, Change::Added(obj("u", "1"))), None);
        f.process(entry(2, Change::Modified(obj("u", "2"))), None);
        assert!(drain(&mut f).is_empty());
        tokio::time::advance(Duration::from_secs(4)).await;
        f.reevaluate();
        assert!(drain(&mut f).is_empty(), "not yet");
        tokio::time::advance(Duration::from_secs(2)).await;
        f.reevaluate();
        assert_eq!(drain(&mut f), ["Added u 2 TimedOut"], "only the latest held state");
    }

    /// The seed's timeline with the write's response delayed as much as the watch: the third party's
    /// state arrives while our write is in flight, the written state may arrive before the response.
    #[tokio::test(start_paused = true)]
    async fn states_arriving_while_the_write_is_in_flight_are_held_until_it_is_answered() {
        let e = Expectations::default();
        let mut f = Filter::new(INC, "configmaps".into(), e.clone());
        f.process(entry(1, Change::Added(obj("u", "1"))), None);
        drain(&mut f);
        let flight = e.begin(Locator::new("configmaps", "ns", "n-u"), Duration::from_secs(5));
        f.process(entry(2, Change::Modified(obj("u", "2"))), None);
        f.process(entry(3, Change::Modified(obj("u", "3"))), None);
        assert!(drain(&mut f).is_empty(), "nothing is delivered while the write is in flight");
        e.expect("u", "3", Locator::new("configmaps", "ns", "n-u"), Duration::from_secs(5));
        e.seen(INC, "u", "3", 3);
        drop(flight);
        f.reevaluate();
        assert_eq!(drain(&mut f), ["Modified u 3 OwnWrite"], "v2 never delivered");
    }

    #[tokio::test(start_paused = true)]
    async fn deletes_are_never_held_and_each_version_is_delivered_once() {
        let e = Expectations::default();
        let mut f = Filter::new(INC, "configmaps".into(), e.clone());
        f.process(entry(1, Change::Added(obj("u", "1"))), None);
        f.process(Item::Snapshot(obj("u", "1"), 1), None);
        assert_eq!(drain(&mut f), ["Added u 1 Consistent"], "the same version twice is delivered once");
        e.expect("u", "5", Locator::new("configmaps", "ns", "n-u"), Duration::from_secs(5));
        f.process(entry(2, Change::Modified(obj("u", "2"))), None);
        f.process(entry(3, Change::Deleted(obj("u", "3"))), None);
        assert_eq!(drain(&mut f), ["Deleted u 3 Consistent"]);
        assert!(f.held.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_own_write_seen_before_its_response_does_not_hold_later_states() {
        let e = Expectations::default();
        let mut f = Filter::new(INC, "configmaps".into(), e.clone());
        f.process(entry(1, Change::Added(obj("u", "3"))), None);
        // The response arrives after the watch already delivered v3 at position 1.
        e.expect("u", "3", Locator::new("configmaps", "ns", "n-u"), Duration::from_secs(5));
        e.seen(INC, "u", "3", 1);
        f.process(entry(2, Change::Modified(obj("u", "4"))), None);
        assert_eq!(drain(&mut f), ["Added u 3 Consistent", "Modified u 4 Consistent"]);
    }

    #[tokio::test(start_paused = true)]
    async fn after_falling_behind_the_subscriber_gets_the_difference_with_every_delete() {
        let mut f = Filter::new(INC, "configmaps".into(), Expectations::default());
        for (seq, uid) in [(1, "a"), (2, "b"), (3, "c")] {
            f.process(entry(seq, Change::Added(obj(uid, "1"))), None);
        }
        drain(&mut f);
        f.process(Item::ResyncRequired, None);
        f.process(Item::Snapshot(obj("a", "1"), 9), None);
        f.process(Item::Snapshot(obj("b", "7"), 9), None);
        f.process(Item::Snapshot(obj("d", "1"), 9), None);
        f.process(Item::Synced(9), None);
        let mut got = drain(&mut f);
        got.sort();
        assert_eq!(got, ["Added d 1 Consistent", "Deleted c 1 Consistent", "Modified b 7 Consistent"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cursor_that_cannot_be_resumed_is_answered_with_resync_required_then_a_snapshot() {
        let mut f = Filter::new(INC, "configmaps".into(), Expectations::default());
        f.process(Item::ResyncRequired, None);
        f.process(Item::Snapshot(obj("a", "1"), 9), None);
        f.process(Item::Synced(9), None);
        assert_eq!(drain(&mut f), ["RESYNC_REQUIRED", "Added a 1 Consistent", "SYNCED"]);
    }
}
