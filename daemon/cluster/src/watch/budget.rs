//! The memory budget in bytes for the objects the daemon holds for its apps' watches: each cached object is
//! charged once while any copy of it lives (the cache, a list in progress, the history, subscriber queues,
//! a consistent subscriber's held states), so the sum is what those objects cost, wherever they are held.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use prometheus_client::metrics::gauge::Gauge;

/// What one cached object costs beside its JSON and its identity strings: the `Obj` and its `Arc`, the
/// cache's map entry, a history entry, the expectations, and the allocator's rounding. Measured, not
/// derived: 10,000 ConfigMaps of 1 KiB (1,426 bytes of JSON each) raised the daemon's resident memory by
/// 2,296 bytes each (`make bench`, the watch bench), about this much more than their JSON and identity.
const OVERHEAD: u64 = 700;

/// The bytes the daemon may hold for its apps' watches, and how many it holds now.
#[derive(Debug)]
pub struct Budget {
    /// `watch.maxCacheBytes`, or the share of the container's memory limit it defaults to.
    limit: u64,
    /// Bytes charged by objects alive now.
    used: AtomicU64,
    /// The same, as a metric (`consistd_watch_budget_used_bytes`), moved with every charge and refund.
    used_gauge: Gauge,
}

/// A charge that would take the budget past its limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "watch.maxCacheBytes is {limit} bytes, {used} of them in use: the watch needed {needed} bytes more \
     (subscribe to fewer objects, with a narrower selector or namespace, or raise the limit)"
)]
pub struct Exhausted {
    /// The budget's limit.
    pub limit: u64,
    /// What was in use when the watch was refused, its own objects included.
    pub used: u64,
    /// What the watch would have needed beyond that.
    pub needed: u64,
}

/// One object's share of the budget, given back when the last copy of the object is dropped.
#[derive(Clone, Default)]
pub struct Charge(Option<Arc<Held>>);

/// The bytes of one charge while it is held.
struct Held {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    /// A budget of `limit` bytes, none used.
    pub fn new(limit: u64) -> Arc<Self> {
        Self::reporting(limit, Gauge::default())
    }

    /// A budget of `limit` bytes whose use `used_gauge` shows.
    pub fn reporting(limit: u64, used_gauge: Gauge) -> Arc<Self> {
        Arc::new(Self { limit, used: AtomicU64::new(0), used_gauge })
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// What an object whose JSON is `json_len` bytes and whose identity strings are `identity_len` bytes
    /// costs.
    pub fn cost(json_len: usize, identity_len: usize) -> u64 {
        (json_len as u64) + 2 * (identity_len as u64) + OVERHEAD
    }

    /// Charges `bytes` unless that would take the budget past its limit; the refusal says how far.
    pub fn try_charge(self: &Arc<Self>, bytes: u64) -> Result<Charge, Exhausted> {
        let limit = self.limit;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|after| *after <= limit)
            })
            .map(|_| self.held(bytes))
            .map_err(|used| Exhausted { limit, used, needed: bytes })
    }

    fn held(self: &Arc<Self>, bytes: u64) -> Charge {
        self.used_gauge.inc_by(gauge(bytes));
        Charge(Some(Arc::new(Held { budget: self.clone(), bytes })))
    }

    /// Charges `bytes` whatever the limit: the daemon's own watches (its elections' Leases, its channels),
    /// which an app's watch must never starve, are counted but never refused.
    pub fn charge(self: &Arc<Self>, bytes: u64) -> Charge {
        self.used.fetch_add(bytes, Ordering::AcqRel);
        self.held(bytes)
    }
}

/// A byte count as a gauge's value.
pub(crate) fn gauge(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.budget.used_gauge.dec_by(gauge(self.bytes));
    }
}

impl Charge {
    /// The bytes charged; 0 for an object charged to no budget.
    pub fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |held| held.bytes)
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Charge({})", self.bytes())
    }
}

/// Bookkeeping, not part of an object: two objects are equal whatever they are charged to.
impl PartialEq for Charge {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Charge {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_is_held_while_any_copy_lives_and_given_back_once() {
        let budget = Budget::new(1000);
        let charge = budget.try_charge(600).expect("fits");
        let copy = charge.clone();
        assert_eq!(budget.used(), 600, "a copy is not charged again");
        drop(charge);
        assert_eq!(budget.used(), 600, "held while a copy lives");
        drop(copy);
        assert_eq!(budget.used(), 0, "given back once");
    }

    #[test]
    fn a_charge_past_the_limit_is_refused_naming_the_limit_and_the_bytes_needed() {
        let budget = Budget::new(1000);
        let _held = budget.try_charge(900).expect("fits");
        let refused = budget.try_charge(200).expect_err("past the limit");
        assert_eq!(refused, Exhausted { limit: 1000, used: 900, needed: 200 });
        assert!(refused.to_string().starts_with("watch.maxCacheBytes is 1000 bytes, 900 of them in use"), "{refused}");
        assert_eq!(budget.used(), 900, "a refused charge takes nothing");
        let _exact = budget.try_charge(100).expect("up to the limit fits");
    }

    #[test]
    fn the_metric_follows_every_charge_and_refund() {
        let used = Gauge::default();
        let budget = Budget::reporting(1000, used.clone());
        let charge = budget.try_charge(600).expect("fits");
        let own = budget.charge(100);
        assert_eq!(used.get(), 700);
        drop((charge, own));
        assert_eq!(used.get(), 0);
    }

    #[test]
    fn the_daemons_own_objects_are_counted_but_never_refused() {
        let budget = Budget::new(100);
        let own = budget.charge(150);
        assert_eq!(budget.used(), 150);
        assert!(budget.try_charge(1).is_err(), "an app's watch now finds the budget spent");
        drop(own);
        assert!(budget.try_charge(1).is_ok());
    }
}
