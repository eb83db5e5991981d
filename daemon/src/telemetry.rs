//! Structured logs with tracing: human-readable text, or one JSON object per line for log pipelines.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber, writing to stderr. `level` is a validated filter directive.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
    // Already installed (tests that run twice): keep the first.
    let _ = result;
}
