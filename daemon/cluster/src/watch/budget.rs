//! The memory budget in bytes for the objects the daemon holds for its apps' watches: each cached object is
//! charged once while any copy of it lives (the cache, a list in progress, the history, subscriber queues,
//! a consistent subscriber's held states), so the sum is what those objects cost, wherever they are held.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use prometheus_client::metrics::gauge::Gauge;

/// What one cached object costs beside its JSON (and any identity strings it holds apart from it): the
/// `Obj` and its `Arc`, the cache's table slot, its share of the history, the expectations, and the
/// allocator's rounding. Measured, not derived (`make bench`, the memory bench): above the JSON, 250 to 290
/// bytes per object in sets of 30,000 and 370 to 490 in sets of 10,000, where each object also has a history
/// entry; this is the most of those and a little, so the budget counts on the safe side.
const OVERHEAD: u64 = 500;

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

    /// What an object whose JSON is `json_len` bytes and that holds `identity_len` bytes of identity
    /// strings beside it costs.
    pub fn cost(json_len: usize, identity_len: usize) -> u64 {
        (json_len as u64) + (identity_len as u64) + OVERHEAD
    }

    /// Takes `bytes` unless that would take the budget past its limit; the refusal says how far.
    pub fn try_take(&self, bytes: u64) -> Result<(), Exhausted> {
        let limit = self.limit;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|after| *after <= limit)
            })
            .map_err(|used| Exhausted { limit, used, needed: bytes })?;
        self.used_gauge.inc_by(gauge(bytes));
        Ok(())
    }

    /// Takes `bytes` whatever the limit: the daemon's own watches (its elections' Leases, its channels),
    /// which an app's watch must never starve, are counted but never refused.
    pub fn take(&self, bytes: u64) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
        self.used_gauge.inc_by(gauge(bytes));
    }

    /// Gives back `bytes` taken before.
    pub fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.used_gauge.dec_by(gauge(bytes));
    }
}

/// A byte count as a gauge's value.
pub(crate) fn gauge(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_past_the_limit_is_refused_naming_the_limit_and_the_bytes_needed() {
        let budget = Budget::new(1000);
        budget.try_take(900).expect("fits");
        let refused = budget.try_take(200).expect_err("past the limit");
        assert_eq!(refused, Exhausted { limit: 1000, used: 900, needed: 200 });
        assert!(refused.to_string().starts_with("watch.maxCacheBytes is 1000 bytes, 900 of them in use"), "{refused}");
        assert_eq!(budget.used(), 900, "a refused charge takes nothing");
        budget.try_take(100).expect("up to the limit fits");
    }

    #[test]
    fn the_metric_follows_every_charge_and_refund() {
        let used = Gauge::default();
        let budget = Budget::reporting(1000, used.clone());
        budget.try_take(600).expect("fits");
        budget.take(100);
        assert_eq!(used.get(), 700);
        budget.give_back(700);
        assert_eq!(used.get(), 0);
    }

    #[test]
    fn the_daemons_own_objects_are_counted_but_never_refused() {
        let budget = Budget::new(100);
        budget.take(150);
        assert_eq!(budget.used(), 150);
        assert!(budget.try_take(1).is_err(), "an app's watch now finds the budget spent");
        budget.give_back(150);
        assert!(budget.try_take(1).is_ok());
    }
}
