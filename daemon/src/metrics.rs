//! Prometheus metrics: one registry for the daemon, encoded as text on the admin endpoint's /metrics.

use std::sync::Arc;

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, gauge::Gauge, info::Info},
    registry::Registry,
};

/// The daemon's metrics; clones share the same registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// 1 while the apiserver answers the health probe, else 0.
    pub apiserver_up: Gauge,
    /// Upstream apiserver watches running (one per distinct query).
    pub watch_upstreams: Gauge,
    /// Local subscribers across all watches.
    pub watch_subscribers: Gauge,
    /// Events received from upstream watches.
    pub watch_events: Counter,
    /// Upstream watch failures (each retried with backoff).
    pub watch_upstream_errors: Counter,
    /// Subscribers cut off for falling behind (each then gets RESYNC_REQUIRED and a snapshot).
    pub watch_resyncs: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every consistd metric registered under the `consistd_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("consistd");
        registry.register(
            "build",
            "The consistd version running",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let apiserver_up = Gauge::default();
        registry.register("apiserver_up", "1 while the apiserver answers the health probe", apiserver_up.clone());
        let watch_upstreams = Gauge::default();
        registry.register("watch_upstreams", "Upstream apiserver watches running", watch_upstreams.clone());
        let watch_subscribers = Gauge::default();
        registry.register("watch_subscribers", "Local watch subscribers", watch_subscribers.clone());
        let watch_events = Counter::default();
        registry.register("watch_events", "Events received from upstream watches", watch_events.clone());
        let watch_upstream_errors = Counter::default();
        registry.register("watch_upstream_errors", "Upstream watch failures", watch_upstream_errors.clone());
        let watch_resyncs = Counter::default();
        registry.register("watch_resyncs", "Subscribers cut off for falling behind", watch_resyncs.clone());
        Self {
            registry: Arc::new(registry),
            apiserver_up,
            watch_upstreams,
            watch_subscribers,
            watch_events,
            watch_upstream_errors,
            watch_resyncs,
        }
    }

    /// The metrics in Prometheus' text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_prefixed_metrics() {
        let metrics = Metrics::new();
        metrics.apiserver_up.set(1);
        let text = metrics.encode();
        assert!(text.contains("consistd_apiserver_up 1"), "{text}");
        assert!(text.contains("consistd_build_info{version=\""), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
