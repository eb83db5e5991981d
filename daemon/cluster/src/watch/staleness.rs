//! How far a watch is behind the apiserver's store, the way KEP-5647's `store_resource_version` shows it for
//! the apiserver's own watch cache: every `watch.stalenessCheck`, a consistent read of at most one object of
//! the watch's resource gives the store's resourceVersion now, and the watch is behind for as long as its
//! high-water mark has not reached the oldest such version. A quiet watch reaches it only with its next
//! bookmark (about once a minute); a busy one with its next event.

use std::{sync::Arc, time::Duration};

use consistd_observe::metrics::Metrics;
use kube::{Api, api::ListParams};
use tokio::time::Instant;

use super::{budget::gauge, object::RawObject, shared::SharedWatch};

/// Reads the store's version every `every` until the watch stops, keeping its two gauges.
pub(super) async fn run(watch: Arc<SharedWatch>, api: Api<RawObject>, every: Duration, metrics: Metrics) {
    let label = watch.label().clone();
    let mut behind = Behind::default();
    let one = ListParams::default().limit(1);
    loop {
        tokio::select! {
            () = watch.stopped() => break,
            () = tokio::time::sleep(every) => {}
        }
        // A consistent read (no resourceVersion), one object at most: the apiserver serves it from its watch
        // cache once that has caught up with the store, at the store's current version.
        let read = tokio::select! {
            () = watch.stopped() => break,
            read = api.list(&one) => read,
        };
        let now = Instant::now();
        let mark = watch.high_water();
        match read.map(|list| list.metadata.resource_version.and_then(|v| v.parse::<u64>().ok())) {
            Ok(Some(store)) => {
                behind.read(store, mark, now);
                metrics.watch_store_resource_version.get_or_create(&label).set(gauge(store));
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(%error, resource = %watch.key.resource.plural, namespace = %watch.key.namespace, "consistent read for the watch's staleness failed; trying again at the next check");
            }
        }
        metrics.watch_staleness.get_or_create(&label).set(behind.seconds(mark, now));
    }
    metrics.watch_staleness.remove(&label);
    metrics.watch_store_resource_version.remove(&label);
}

/// The oldest consistent read whose version a watch has not reached yet.
#[derive(Debug, Default)]
struct Behind {
    since: Option<(Instant, u64)>,
}

impl Behind {
    /// A consistent read at `now` gave the store's version `store`; the watch's mark was `mark`.
    fn read(&mut self, store: u64, mark: u64, now: Instant) {
        if self.since.is_none() && mark < store {
            self.since = Some((now, store));
        }
    }

    /// How long the watch, its mark at `mark`, has been behind the store at `now` (0 once it has caught up).
    fn seconds(&mut self, mark: u64, now: Instant) -> f64 {
        if self.since.is_some_and(|(_, store)| mark >= store) {
            self.since = None;
        }
        self.since.map_or(0.0, |(at, _)| now.saturating_duration_since(at).as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_is_behind_from_the_read_it_has_not_reached_until_it_reaches_it() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut behind = Behind::default();
        behind.read(10, 10, at(0));
        assert!(behind.seconds(10, at(0)).abs() < f64::EPSILON, "at the store's version: not behind");
        behind.read(20, 12, at(1));
        behind.read(30, 12, at(2));
        assert!((behind.seconds(12, at(3)) - 2.0).abs() < 1e-9, "behind since the first read it has not reached");
        assert!(behind.seconds(25, at(4)).abs() < f64::EPSILON, "past 20: caught up with that read");
        behind.read(40, 25, at(5));
        assert!((behind.seconds(25, at(7)) - 2.0).abs() < 1e-9, "a new read counts from its own time");
    }
}
