//! The work queue as state without I/O, client-go's workqueue semantics per key: one pending entry
//! however many changes arrive, never two leases out for one key, a change during a lease queues one more
//! pass after it, retries spaced by the limiter (changes during a backoff neither shorten it nor count as
//! failures), and keys of initial lists behind live changes; among live keys, a higher priority first
//! (controller-runtime 0.23's priority queue), each priority in arrival order. Time is handed in, so tests
//! drive it. A
//! sharded queue's key carries its state (failures and backoff, requeue time, terminal error) to the pod
//! its slot moves to.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::limiter::{Limiter, RetryPolicy};
use crate::watch::object::ObjKey;

/// Where a change comes from, which decides its place in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A live watch event: handed out first.
    Live,
    /// An initial list (or a resync's snapshot): waits behind live changes.
    Initial,
}

/// How the app ended a lease.
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    /// Reconciled: failures forgotten; a change during the lease queues one more pass.
    Done,
    /// Hand it out again after this long, or sooner on a change.
    Requeue(std::time::Duration),
    /// Failed: again after the backoff, which changes do not shorten.
    Retry(String),
    /// Failed for good: not again until a change.
    Terminal(String),
}

/// Why a key is queued but not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// A REQUEUE: a change makes it ready at once.
    Requeue,
    /// A RETRY's backoff: changes leave it waiting.
    Retry,
}

/// Where a key is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Nothing to do: not queued, not leased.
    Idle,
    /// In a ready line.
    Ready(Origin),
    /// Taken from a ready line but not granted yet: the grant waits until the watch has caught up with
    /// the pod's writes (see `gate`). Still queued: changes do not add it again.
    Held,
    /// Waiting for its time.
    Waiting(Instant, Wait),
    /// Leased to the app.
    Leased,
}

/// Per-key state.
#[derive(Debug)]
struct KeyState {
    place: Place,
    /// A change arrived while leased: one more pass after the lease, at the highest priority of those
    /// changes.
    dirty: Option<i32>,
    /// The priority of its pending pass: the live line it is in, or the one its wait ends in.
    priority: i32,
    /// RETRYs in a row; reset by DONE and REQUEUE.
    failures: u32,
    /// The last RETRY's or TERMINAL's error, shown with the next pass and by `consistd status`.
    last_error: Option<String>,
    /// When it became ready (for the queue-latency histogram).
    ready_since: Option<Instant>,
    /// When the current lease was granted.
    leased_at: Option<Instant>,
}

impl KeyState {
    fn new() -> Self {
        Self {
            place: Place::Idle,
            dirty: None,
            priority: 0,
            failures: 0,
            last_error: None,
            ready_since: None,
            leased_at: None,
        }
    }
}

/// What the queue counts, read by metrics and `consistd status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Keys ready or held for consistency: client-go's depth.
    pub depth: usize,
    /// Keys waiting for a REQUEUE's or RETRY's time.
    pub waiting: usize,
    /// Keys leased.
    pub leased: usize,
}

/// A pass handed out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Granted {
    /// How long the key was ready before it was granted.
    pub queued_for: std::time::Duration,
    /// 1, or n for the nth pass in a row after a RETRY.
    pub attempt: u32,
    /// The error the previous pass ended with, after a RETRY.
    pub last_error: Option<String>,
}

/// A lease ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finished {
    /// How long the lease was held.
    pub worked_for: std::time::Duration,
    /// Whether the key was queued for a retry.
    pub retried: bool,
}

/// A key's state as it moves to another pod with its slot: what it waits for, and its failures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// The key's namespace.
    pub namespace: String,
    /// The key's name.
    pub name: String,
    /// Whether it needs a pass, or waits, and until when.
    pub place: CarriedPlace,
    /// RETRYs in a row.
    pub failures: u32,
    /// The last RETRY's or TERMINAL's error.
    pub last_error: Option<String>,
    /// The priority of its pending pass (absent from a pod that did not know priorities: 0).
    #[serde(default)]
    pub priority: i32,
}

/// Where a carried key is: its waits as wall-clock times (milliseconds since the Unix epoch), for another
/// machine's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CarriedPlace {
    /// Nothing to do (a TERMINAL key waiting for a change, or a failure count alone).
    Idle,
    /// It needs a pass.
    Ready,
    /// A RETRY's backoff, until then; changes leave it waiting.
    Retry(u64),
    /// A REQUEUE, until then; a change makes it ready at once.
    Requeue(u64),
}

pub(crate) fn wall_ms(at: Instant, now: Instant, wall: SystemTime) -> u64 {
    let at = if at >= now { wall + (at - now) } else { wall.checked_sub(now - at).unwrap_or(wall) };
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn instant_of(ms: u64, now: Instant, wall: SystemTime) -> Instant {
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    match at.duration_since(wall) {
        Ok(ahead) => now + ahead,
        Err(_) => now,
    }
}

/// The queue.
#[derive(Debug)]
pub(crate) struct Queue {
    keys: HashMap<ObjKey, KeyState>,
    /// Keys of live changes by priority, each line in arrival order; the highest is handed out first.
    live: BTreeMap<i32, VecDeque<ObjKey>>,
    initial: VecDeque<ObjKey>,
    /// Waiting keys by their time (a key's entry is removed when it leaves the wait).
    timers: BTreeSet<(Instant, ObjKey)>,
    limiter: Limiter,
    /// Keys added to a ready line (client-go's adds).
    adds: u64,
}

impl Queue {
    /// An empty queue retrying with `policy`.
    pub(crate) fn new(policy: RetryPolicy, now: Instant) -> Self {
        Self {
            keys: HashMap::new(),
            live: BTreeMap::new(),
            initial: VecDeque::new(),
            timers: BTreeSet::new(),
            limiter: Limiter::new(policy, now),
            adds: 0,
        }
    }

    /// Keys added to a ready line so far.
    pub(crate) fn adds(&self) -> u64 {
        self.adds
    }

    /// How many keys are where.
    pub(crate) fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for state in self.keys.values() {
            match state.place {
                Place::Ready(_) | Place::Held => counts.depth += 1,
                Place::Waiting(..) => counts.waiting += 1,
                Place::Leased => counts.leased += 1,
                Place::Idle => {}
            }
        }
        counts
    }

    /// Keys the queue knows (each costs its entry until forgotten).
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The key's object changed: queue it unless it is queued already; during a lease, one more pass
    /// after it; during a RETRY's backoff, nothing (the backoff stands). At priority 0.
    pub(crate) fn changed(&mut self, key: &ObjKey, origin: Origin, now: Instant) {
        self.changed_at(key, origin, 0, now);
    }

    /// [`Queue::changed`], the pass it queues at `priority` (a queued key's priority only rises).
    pub(crate) fn changed_at(&mut self, key: &ObjKey, origin: Origin, priority: i32, now: Instant) {
        let state = self.keys.entry(key.clone()).or_insert_with(KeyState::new);
        match state.place {
            Place::Leased => state.dirty = Some(state.dirty.map_or(priority, |p| p.max(priority))),
            Place::Ready(Origin::Initial) if origin == Origin::Live => {
                // A live change overtakes the initial list.
                self.initial.retain(|k| k != key);
                state.place = Place::Idle;
                self.make_ready(key, Origin::Live, priority, now);
            }
            Place::Ready(Origin::Live) if priority > state.priority => {
                // A change of a higher priority moves the key up to its line.
                let from = state.priority;
                state.priority = priority;
                if let Some(line) = self.live.get_mut(&from) {
                    line.retain(|k| k != key);
                }
                self.live.entry(priority).or_default().push_back(key.clone());
            }
            Place::Held | Place::Waiting(_, Wait::Retry) => state.priority = state.priority.max(priority),
            Place::Ready(_) => {}
            Place::Waiting(at, Wait::Requeue) => {
                let priority = state.priority.max(priority);
                self.timers.remove(&(at, key.clone()));
                self.make_ready(key, origin, priority, now);
            }
            Place::Idle => self.make_ready(key, origin, priority, now),
        }
    }

    fn make_ready(&mut self, key: &ObjKey, origin: Origin, priority: i32, now: Instant) {
        let Some(state) = self.keys.get_mut(key) else { return };
        state.place = Place::Ready(origin);
        state.priority = priority;
        state.ready_since = Some(now);
        self.adds += 1;
        match origin {
            Origin::Live => self.live.entry(priority).or_default().push_back(key.clone()),
            Origin::Initial => self.initial.push_back(key.clone()),
        }
    }

    /// Moves keys whose wait is over to the live line; returns when the next wait ends.
    pub(crate) fn tick(&mut self, now: Instant) -> Option<Instant> {
        while let Some((at, key)) = self.timers.first().cloned() {
            if at > now {
                return Some(at);
            }
            self.timers.pop_first();
            if let Some(state) = self.keys.get(&key)
                && matches!(state.place, Place::Waiting(t, _) if t == at)
            {
                self.make_ready(&key, Origin::Live, state.priority, now);
            }
        }
        None
    }

    /// The next ready key, live ones first (the highest priority first), now held until [`Queue::grant`]
    /// or [`Queue::hold`]'s caller grants it.
    pub(crate) fn pop(&mut self) -> Option<ObjKey> {
        let live = loop {
            let Some(mut line) = self.live.last_entry() else { break None };
            if let Some(key) = line.get_mut().pop_front() {
                break Some(key);
            }
            line.remove();
        };
        let key = live.or_else(|| self.initial.pop_front())?;
        if let Some(state) = self.keys.get_mut(&key) {
            state.place = Place::Held;
        }
        Some(key)
    }

    /// Whether `key` is known: queued, waiting, leased, or idle after a pass.
    pub(crate) fn holds(&self, key: &ObjKey) -> bool {
        self.keys.contains_key(key)
    }

    /// Whether `key` is leased out.
    pub(crate) fn is_leased(&self, key: &ObjKey) -> bool {
        self.keys.get(key).is_some_and(|s| s.place == Place::Leased)
    }

    /// Leases a held key.
    pub(crate) fn grant(&mut self, key: &ObjKey, now: Instant) -> Option<Granted> {
        let state = self.keys.get_mut(key)?;
        if state.place != Place::Held {
            return None;
        }
        state.place = Place::Leased;
        state.dirty = None;
        state.leased_at = Some(now);
        let queued_for = state.ready_since.take().map(|t| now.saturating_duration_since(t)).unwrap_or_default();
        Some(Granted { queued_for, attempt: state.failures + 1, last_error: state.last_error.clone() })
    }

    /// A held key goes back to the front of the live line (no free lease, or the election was lost).
    pub(crate) fn unpop(&mut self, key: &ObjKey) {
        if let Some(state) = self.keys.get_mut(key)
            && state.place == Place::Held
        {
            state.place = Place::Ready(Origin::Live);
            self.live.entry(state.priority).or_default().push_front(key.clone());
        }
    }

    /// Ends a lease with the app's outcome; the pass it queues (a REQUEUE's, a RETRY's, one for a change
    /// during the lease) goes at `priority`, or at that change's priority if higher.
    pub(crate) fn complete(
        &mut self,
        key: &ObjKey,
        outcome: Completion,
        priority: i32,
        now: Instant,
    ) -> Option<Finished> {
        let state = self.keys.get_mut(key)?;
        if state.place != Place::Leased {
            return None;
        }
        let worked_for = state.leased_at.take().map(|t| now.saturating_duration_since(t)).unwrap_or_default();
        let dirty = state.dirty.take().map(|p| p.max(priority));
        state.priority = priority;
        let mut retried = false;
        match outcome {
            Completion::Done => {
                state.failures = 0;
                state.last_error = None;
                state.place = Place::Idle;
                if let Some(priority) = dirty {
                    self.make_ready(key, Origin::Live, priority, now);
                }
            }
            Completion::Requeue(after) => {
                state.failures = 0;
                state.last_error = None;
                if let Some(priority) = dirty {
                    state.place = Place::Idle;
                    self.make_ready(key, Origin::Live, priority, now);
                } else {
                    self.wait(key, now + after, Wait::Requeue);
                }
            }
            Completion::Retry(error) => {
                state.failures = state.failures.saturating_add(1);
                state.last_error = Some(error);
                state.priority = dirty.unwrap_or(priority);
                let failures = state.failures;
                let at = self.limiter.retry_at(failures, now);
                self.wait(key, at, Wait::Retry);
                retried = true;
            }
            Completion::Terminal(error) => {
                state.failures = 0;
                state.last_error = Some(error);
                state.place = Place::Idle;
                if let Some(priority) = dirty {
                    self.make_ready(key, Origin::Live, priority, now);
                }
            }
        }
        Some(Finished { worked_for, retried })
    }

    /// A lease ends without an outcome (its stream went away, it timed out, the election was lost): the
    /// key is queued again at once, as a change would.
    pub(crate) fn release(&mut self, key: &ObjKey, now: Instant) {
        let Some(state) = self.keys.get_mut(key) else { return };
        if state.place != Place::Leased {
            return;
        }
        let priority = state.dirty.take().map_or(state.priority, |p| p.max(state.priority));
        state.leased_at = None;
        state.place = Place::Idle;
        self.make_ready(key, Origin::Live, priority, now);
    }

    fn wait(&mut self, key: &ObjKey, at: Instant, why: Wait) {
        if let Some(state) = self.keys.get_mut(key) {
            state.place = Place::Waiting(at, why);
            self.timers.insert((at, key.clone()));
        }
    }

    /// Queues every idle key behind live changes, as an initial list does (for an app attaching to a
    /// queue its last app left: a restarted app sees every object once). Keys waiting for a retry's or a
    /// requeue's time keep it; queued keys keep their place.
    pub(crate) fn relist(&mut self, now: Instant) {
        let idle: Vec<ObjKey> =
            self.keys.iter().filter(|(_, s)| s.place == Place::Idle).map(|(k, _)| k.clone()).collect();
        for key in idle {
            self.make_ready(&key, Origin::Initial, 0, now);
        }
    }

    /// Every key the queue knows.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &ObjKey> {
        self.keys.keys()
    }

    /// What `key` carries to the pod its slot moves to (at `now`, on `wall`'s clock); None when it carries
    /// nothing (idle, no failures) or is leased (a slot moves only once its leases ended).
    pub(crate) fn carry(&self, key: &ObjKey, now: Instant, wall: SystemTime) -> Option<Carried> {
        let state = self.keys.get(key)?;
        let place = match state.place {
            Place::Leased => return None,
            Place::Idle if state.failures == 0 && state.last_error.is_none() => return None,
            Place::Idle => CarriedPlace::Idle,
            Place::Ready(_) | Place::Held => CarriedPlace::Ready,
            Place::Waiting(at, Wait::Retry) => CarriedPlace::Retry(wall_ms(at, now, wall)),
            Place::Waiting(at, Wait::Requeue) => CarriedPlace::Requeue(wall_ms(at, now, wall)),
        };
        Some(Carried {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            place,
            failures: state.failures,
            last_error: state.last_error.clone(),
            priority: state.priority,
        })
    }

    /// Takes `key` over from the pod its slot came from: its state becomes what it carried (None: idle,
    /// no failures), then, if it `changed` after the other pod's last look, the change is applied as a
    /// live one. A leased key is left alone.
    pub(crate) fn take_over(
        &mut self,
        key: &ObjKey,
        carried: Option<&Carried>,
        changed: bool,
        (now, wall): (Instant, SystemTime),
    ) {
        let state = self.keys.entry(key.clone()).or_insert_with(KeyState::new);
        match state.place {
            Place::Leased => return,
            Place::Ready(Origin::Live) => {
                if let Some(line) = self.live.get_mut(&state.priority) {
                    line.retain(|k| k != key);
                }
            }
            Place::Ready(Origin::Initial) => self.initial.retain(|k| k != key),
            Place::Waiting(at, _) => {
                self.timers.remove(&(at, key.clone()));
            }
            Place::Idle | Place::Held => {}
        }
        let Some(state) = self.keys.get_mut(key) else { return };
        state.place = Place::Idle;
        state.ready_since = None;
        state.failures = carried.map_or(0, |c| c.failures);
        state.last_error = carried.and_then(|c| c.last_error.clone());
        state.priority = carried.map_or(0, |c| c.priority);
        let priority = state.priority;
        match carried.map(|c| c.place) {
            None | Some(CarriedPlace::Idle) => {}
            Some(CarriedPlace::Ready) => self.make_ready(key, Origin::Live, priority, now),
            Some(CarriedPlace::Retry(ms)) => self.wait(key, instant_of(ms, now, wall), Wait::Retry),
            Some(CarriedPlace::Requeue(ms)) => self.wait(key, instant_of(ms, now, wall), Wait::Requeue),
        }
        if changed {
            self.changed(key, Origin::Live, now);
        }
    }

    /// Starts `key` afresh: its slot came to this pod with nothing handed on (a new ring, or an owner that
    /// was lost), so what this queue held for it from an earlier tenure is stale and the last owner's state
    /// is unknown. Unless already queued or leased, it is handed out once, behind live changes, as a new
    /// queue's list would be, counting no failures.
    pub(crate) fn restart(&mut self, key: &ObjKey, now: Instant) {
        let Some(state) = self.keys.get_mut(key) else { return };
        match state.place {
            Place::Held => self.unpop(key),
            Place::Ready(_) | Place::Leased => {}
            Place::Idle | Place::Waiting(..) => {
                if let Place::Waiting(at, _) = state.place {
                    self.timers.remove(&(at, key.clone()));
                }
                state.place = Place::Idle;
                state.failures = 0;
                state.last_error = None;
                self.make_ready(key, Origin::Initial, 0, now);
            }
        }
    }

    /// When `key` waits for a REQUEUE's time, that time and the pass's priority.
    pub(crate) fn requeued(&self, key: &ObjKey) -> Option<(Instant, i32)> {
        self.keys.get(key).and_then(|s| match s.place {
            Place::Waiting(at, Wait::Requeue) => Some((at, s.priority)),
            _ => None,
        })
    }

    /// The error `key` ended TERMINAL with, while it waits for a change.
    pub(crate) fn terminal(&self, key: &ObjKey) -> Option<&str> {
        self.keys.get(key).filter(|s| s.place == Place::Idle && s.failures == 0).and_then(|s| s.last_error.as_deref())
    }

    /// Puts `key` back where a kept timer says it was before the daemon restarted: waiting for a REQUEUE's
    /// time `Some((at, priority))`, or TERMINAL with `Err(error)`. Only a key that is new, idle or queued
    /// from a list takes it; a live change or a lease stands.
    pub(crate) fn restore(&mut self, key: &ObjKey, to: Result<(Instant, i32), String>) {
        let state = self.keys.entry(key.clone()).or_insert_with(KeyState::new);
        match state.place {
            Place::Idle => {}
            Place::Ready(Origin::Initial) => self.initial.retain(|k| k != key),
            Place::Ready(Origin::Live) | Place::Held | Place::Leased | Place::Waiting(..) => return,
        }
        let Some(state) = self.keys.get_mut(key) else { return };
        state.place = Place::Idle;
        state.ready_since = None;
        match to {
            Ok((at, priority)) => {
                state.priority = priority;
                self.wait(key, at, Wait::Requeue);
            }
            Err(error) => state.last_error = Some(error),
        }
    }

    /// Forgets an idle key (a deleted object handed out and done); a key still queued or leased stays.
    pub(crate) fn forget(&mut self, key: &ObjKey) {
        if self.keys.get(key).is_some_and(|s| s.place == Place::Idle) {
            self.keys.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(name: &str) -> ObjKey {
        ObjKey { namespace: "ns".into(), name: name.into() }
    }

    fn queue(now: Instant) -> Queue {
        Queue::new(RetryPolicy::default(), now)
    }

    /// Pops and grants the next key.
    fn take(q: &mut Queue, now: Instant) -> Option<(ObjKey, Granted)> {
        let k = q.pop()?;
        let g = q.grant(&k, now).expect("a popped key is granted");
        Some((k, g))
    }

    #[test]
    fn a_key_carries_its_backoff_requeue_and_terminal_error_to_the_pod_its_slot_moves_to() {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let mut giver = queue(now);
        for name in ["failing", "later", "terminal", "done", "pending"] {
            giver.changed(&key(name), Origin::Live, now);
        }
        while let Some((k, _)) = take(&mut giver, now) {
            let outcome = match k.name.as_str() {
                "failing" => Completion::Retry("boom".into()),
                "later" => Completion::Requeue(Duration::from_secs(3600)),
                "terminal" => Completion::Terminal("bad spec".into()),
                _ => Completion::Done,
            };
            giver.complete(&k, outcome, 0, now).expect("leased");
        }
        giver.changed(&key("pending"), Origin::Live, now);
        let carried: Vec<Carried> = giver.keys().filter_map(|k| giver.carry(k, now, wall)).collect();
        let by_name = |name: &str| carried.iter().find(|c| c.name == name).cloned();
        assert_eq!(by_name("done"), None, "an idle key without failures carries nothing");
        assert!(matches!(by_name("failing").map(|c| (c.place, c.failures)), Some((CarriedPlace::Retry(_), 1))));
        assert!(matches!(by_name("later").map(|c| c.place), Some(CarriedPlace::Requeue(_))));
        assert_eq!(
            by_name("terminal").map(|c| (c.place, c.last_error)),
            Some((CarriedPlace::Idle, Some("bad spec".into())))
        );
        assert_eq!(by_name("pending").map(|c| c.place), Some(CarriedPlace::Ready));

        // Another pod, a second later by its clocks, had every key queued from its own list.
        let (then, wall_then) = (now + Duration::from_secs(1), wall + Duration::from_secs(1));
        let mut taker = queue(then);
        for name in ["failing", "later", "terminal", "done", "pending"] {
            taker.changed(&key(name), Origin::Initial, then);
        }
        for name in ["failing", "later", "terminal", "done", "pending"] {
            let c = by_name(name);
            taker.take_over(&key(name), c.as_ref(), false, (then, wall_then));
        }
        let order: Vec<(String, u32)> =
            std::iter::from_fn(|| take(&mut taker, then).map(|(k, g)| (k.name, g.attempt))).collect();
        assert_eq!(order, [("pending".to_owned(), 1)], "only the pending key is handed out at once");
        // The requeue of an hour stands (an hour less the second that passed); the retry waits its backoff.
        let requeued = taker.timers.iter().find(|(_, k)| k.name == "later").map(|(at, _)| *at).expect("waits");
        assert!(requeued > then + Duration::from_secs(3590), "{:?}", requeued - then);
        // The retry's 5 ms backoff is over by now: it comes next, as its second attempt.
        taker.tick(then);
        assert_eq!(take(&mut taker, then).map(|(k, g)| (k.name, g.attempt)), Some(("failing".into(), 2)));
        assert!(take(&mut taker, then).is_none(), "the terminal and the done key wait for a change");
        // A change after the giver's last look still queues the terminal key, and once only.
        let mut changed = queue(then);
        changed.take_over(&key("terminal"), by_name("terminal").as_ref(), true, (then, wall_then));
        assert_eq!(
            take(&mut changed, then).map(|(k, g)| (k.name, g.last_error)),
            Some(("terminal".into(), Some("bad spec".into())))
        );
    }

    fn names(q: &mut Queue, now: Instant) -> Vec<String> {
        std::iter::from_fn(|| take(q, now).map(|(k, _)| k.name)).collect()
    }

    #[test]
    fn a_higher_priority_goes_first_each_in_arrival_order_and_initial_lists_stay_behind_every_live_change() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed_at(&key("listed"), Origin::Initial, 9, now);
        q.changed_at(&key("a0"), Origin::Live, 0, now);
        q.changed_at(&key("low"), Origin::Live, -1, now);
        q.changed_at(&key("b5"), Origin::Live, 5, now);
        q.changed_at(&key("c0"), Origin::Live, 0, now);
        q.changed_at(&key("d5"), Origin::Live, 5, now);
        assert_eq!(names(&mut q, now), ["b5", "d5", "a0", "c0", "low", "listed"]);
    }

    #[test]
    fn a_queued_key_rises_to_a_higher_priority_and_never_falls() {
        let now = Instant::now();
        let mut q = queue(now);
        for name in ["a", "b", "c"] {
            q.changed(&key(name), Origin::Live, now);
        }
        q.changed_at(&key("c"), Origin::Live, 3, now);
        q.changed_at(&key("c"), Origin::Live, -3, now);
        q.changed_at(&key("a"), Origin::Live, -3, now);
        assert_eq!(names(&mut q, now), ["c", "a", "b"], "one entry each, c raised, none lowered");
        assert!(q.pop().is_none());
    }

    #[test]
    fn a_completions_priority_goes_with_the_pass_it_queues_or_a_changes_if_higher() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("a"), Origin::Live, now);
        let (a, _) = take(&mut q, now).expect("a");
        q.complete(&a, Completion::Requeue(Duration::from_millis(10)), 7, now).expect("leased");
        q.changed(&key("b"), Origin::Live, now);
        let later = now + Duration::from_millis(10);
        q.tick(later);
        assert_eq!(names(&mut q, later), ["a", "b"], "the requeue at 7 goes before b at 0");
        // During a lease, a change at 4: the pass after it goes at 4 though the completion says 1.
        for name in ["a", "b"] {
            q.complete(&key(name), Completion::Done, 0, later).expect("leased");
        }
        q.changed(&a, Origin::Live, later);
        let (a, _) = take(&mut q, later).expect("a");
        q.changed_at(&a, Origin::Live, 4, later);
        q.changed_at(&key("c"), Origin::Live, 2, later);
        q.complete(&a, Completion::Done, 1, later).expect("leased");
        assert_eq!(names(&mut q, later), ["a", "c"]);
    }

    #[test]
    fn a_restored_timer_takes_a_listed_or_new_key_and_a_live_change_overtakes_it() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("listed"), Origin::Initial, now);
        q.changed(&key("live"), Origin::Live, now);
        let hour = now + Duration::from_secs(3600);
        for name in ["listed", "live", "new"] {
            q.restore(&key(name), Ok((hour, 2)));
        }
        q.restore(&key("failed"), Err("bad spec".into()));
        assert_eq!(names(&mut q, now), ["live"], "only the live change is handed out");
        assert_eq!(q.requeued(&key("listed")), Some((hour, 2)));
        assert_eq!(q.requeued(&key("new")), Some((hour, 2)));
        assert_eq!(q.terminal(&key("failed")), Some("bad spec"));
        q.changed(&key("new"), Origin::Live, now);
        q.changed(&key("failed"), Origin::Live, now);
        assert_eq!(names(&mut q, now), ["new", "failed"], "a change ends a requeue's wait and a terminal mark");
        q.tick(hour);
        assert_eq!(names(&mut q, hour), ["listed"]);
    }

    #[test]
    fn many_changes_make_one_pending_entry() {
        let now = Instant::now();
        let mut q = queue(now);
        for _ in 0..5 {
            q.changed(&key("a"), Origin::Live, now);
        }
        assert_eq!(q.counts().depth, 1);
        assert_eq!(q.adds(), 1);
        assert!(take(&mut q, now).is_some());
        assert!(q.pop().is_none(), "one entry, one pass");
    }

    #[test]
    fn a_leased_key_is_never_handed_out_again_until_completed_and_a_change_during_it_gives_one_more_pass() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("a"), Origin::Live, now);
        let (a, _) = take(&mut q, now).expect("granted");
        for _ in 0..3 {
            q.changed(&a, Origin::Live, now);
        }
        assert!(q.pop().is_none(), "never two leases out for one key");
        assert_eq!(q.counts(), Counts { depth: 0, waiting: 0, leased: 1 });
        q.complete(&a, Completion::Done, 0, now).expect("leased");
        assert_eq!(take(&mut q, now).map(|(k, _)| k), Some(a.clone()), "one more pass after the lease");
        q.complete(&a, Completion::Done, 0, now).expect("leased");
        assert!(q.pop().is_none(), "and only one");
    }

    #[test]
    fn the_initial_list_waits_behind_live_changes() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("i1"), Origin::Initial, now);
        q.changed(&key("i2"), Origin::Initial, now);
        q.changed(&key("live"), Origin::Live, now);
        q.changed(&key("i2"), Origin::Live, now); // a live change overtakes the list
        let order: Vec<String> = std::iter::from_fn(|| take(&mut q, now).map(|(k, _)| k.name)).collect();
        assert_eq!(order, ["live", "i2", "i1"]);
    }

    #[test]
    fn a_relist_queues_idle_keys_behind_live_changes_and_leaves_waiting_ones_waiting() {
        let now = Instant::now();
        let mut q = queue(now);
        for name in ["done", "failing", "live"] {
            q.changed(&key(name), Origin::Initial, now);
        }
        while let Some((k, _)) = take(&mut q, now) {
            let outcome = if k.name == "failing" { Completion::Retry("no".into()) } else { Completion::Done };
            q.complete(&k, outcome, 0, now).expect("leased");
        }
        q.changed(&key("live"), Origin::Live, now);
        q.relist(now);
        let order: Vec<String> = std::iter::from_fn(|| take(&mut q, now).map(|(k, _)| k.name)).collect();
        assert_eq!(order, ["live", "done"], "the retrying key keeps its backoff; the idle one comes after live");
    }

    #[test]
    fn a_retry_waits_its_backoff_and_changes_neither_shorten_it_nor_count_as_failures() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("a"), Origin::Live, now);
        let (a, g) = take(&mut q, now).expect("granted");
        assert_eq!(g.attempt, 1);
        q.complete(&a, Completion::Retry("boom".into()), 0, now).expect("leased");
        // Changes during the backoff.
        q.changed(&a, Origin::Live, now);
        q.changed(&a, Origin::Live, now + Duration::from_millis(1));
        assert!(q.pop().is_none(), "an event must not shorten the backoff");
        assert_eq!(q.tick(now + Duration::from_millis(4)), Some(now + Duration::from_millis(5)));
        assert!(q.pop().is_none());
        q.tick(now + Duration::from_millis(5));
        let (_, g) = take(&mut q, now + Duration::from_millis(5)).expect("ready after 5 ms");
        assert_eq!(g.attempt, 2, "the changes did not count as failures");
        assert_eq!(g.last_error.as_deref(), Some("boom"));
        // The second failure doubles the delay.
        let t = now + Duration::from_millis(5);
        q.complete(&a, Completion::Retry("again".into()), 0, t).expect("leased");
        q.tick(t + Duration::from_millis(9));
        assert!(q.pop().is_none(), "10 ms the second time");
        q.tick(t + Duration::from_millis(10));
        let (_, g) = take(&mut q, t + Duration::from_millis(10)).expect("ready");
        assert_eq!(g.attempt, 3);
        q.complete(&a, Completion::Done, 0, t).expect("leased");
        q.changed(&a, Origin::Live, t);
        assert_eq!(take(&mut q, t).expect("granted").1.attempt, 1, "done forgets the failures");
    }

    #[test]
    fn a_requeue_comes_back_after_its_delay_or_at_once_on_a_change() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("a"), Origin::Live, now);
        let (a, _) = take(&mut q, now).expect("granted");
        q.complete(&a, Completion::Requeue(Duration::from_secs(30)), 0, now).expect("leased");
        assert_eq!(q.counts().waiting, 1);
        assert_eq!(q.tick(now), Some(now + Duration::from_secs(30)));
        q.tick(now + Duration::from_secs(30));
        let (a, _) = take(&mut q, now + Duration::from_secs(30)).expect("after 30 s");
        q.complete(&a, Completion::Requeue(Duration::from_secs(30)), 0, now).expect("leased");
        q.changed(&a, Origin::Live, now);
        assert!(take(&mut q, now).is_some(), "a change does not wait for a requeue");
    }

    #[test]
    fn a_terminal_failure_waits_for_a_change() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("a"), Origin::Live, now);
        let (a, _) = take(&mut q, now).expect("granted");
        q.complete(&a, Completion::Terminal("bad spec".into()), 0, now).expect("leased");
        assert_eq!(q.tick(now + Duration::from_secs(3600)), None);
        assert!(q.pop().is_none());
        q.changed(&a, Origin::Live, now);
        let (_, g) = take(&mut q, now).expect("a change brings it back");
        assert_eq!((g.attempt, g.last_error.as_deref()), (1, Some("bad spec")));
    }

    #[test]
    fn a_released_lease_is_queued_again_and_its_late_completion_is_refused() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("a"), Origin::Live, now);
        let (a, _) = take(&mut q, now).expect("granted");
        q.release(&a, now);
        assert!(q.complete(&a, Completion::Done, 0, now).is_none(), "not leased any more");
        assert!(take(&mut q, now).is_some(), "handed out again");
    }

    #[test]
    fn a_held_key_takes_no_second_entry_and_unpop_puts_it_first() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("a"), Origin::Live, now);
        q.changed(&key("b"), Origin::Live, now);
        let a = q.pop().expect("a");
        q.changed(&a, Origin::Live, now);
        assert_eq!(q.counts().depth, 2, "held counts as queued, once");
        q.unpop(&a);
        assert_eq!(q.pop(), Some(a));
    }

    #[test]
    fn only_idle_keys_are_forgotten() {
        let now = Instant::now();
        let mut q = queue(now);
        q.changed(&key("a"), Origin::Live, now);
        q.forget(&key("a"));
        assert_eq!(q.len(), 1, "still queued");
        let (a, _) = take(&mut q, now).expect("granted");
        q.complete(&a, Completion::Done, 0, now).expect("leased");
        q.forget(&a);
        assert_eq!(q.len(), 0);
    }
}
