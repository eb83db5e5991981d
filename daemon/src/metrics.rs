//! Prometheus metrics: one registry for the daemon, encoded as text on the admin endpoint's /metrics.

use std::sync::Arc;

use prometheus_client::{
    encoding::text::encode,
    metrics::{gauge::Gauge, info::Info},
    registry::Registry,
};

/// The daemon's metrics; clones share the same registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// 1 while the apiserver answers the health probe, else 0.
    pub apiserver_up: Gauge,
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
        Self { registry: Arc::new(registry), apiserver_up }
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
