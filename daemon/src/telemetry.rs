//! Structured logs with tracing: human-readable text, or one JSON object per line for log pipelines; the
//! level filter can be swapped while running (a config reload's `log.level`).

use tracing_subscriber::{EnvFilter, Registry, layer::SubscriberExt, reload, util::SubscriberInitExt};

use crate::config::LogFormat;

/// Changes the running daemon's log level filter.
#[derive(Debug, Clone)]
pub struct LogLevel(reload::Handle<EnvFilter, Registry>);

impl LogLevel {
    /// Replaces the filter with `level`, a filter directive (`info`, `consistd=debug,kube=warn`).
    pub fn set(&self, level: &str) -> Result<(), String> {
        let filter = EnvFilter::try_new(level).map_err(|e| format!("log.level {level:?}: {e}"))?;
        self.0.reload(filter).map_err(|e| format!("set log level {level:?}: {e}"))
    }
}

/// Installs the global subscriber, writing to stderr. `level` is a validated filter directive.
pub fn init(format: LogFormat, level: &str) -> LogLevel {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let text = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => registry.with(text).try_init(),
        LogFormat::Json => registry.with(text.json().flatten_event(true).with_current_span(false)).try_init(),
    };
    // Already installed (tests that run twice): keep the first.
    let _ = result;
    LogLevel(handle)
}
