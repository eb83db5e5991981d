//! Structured logs with tracing: human-readable text, or one JSON object per line for log pipelines; the
//! level filter can be swapped while running (a config reload's `log.level`). With an OTLP endpoint
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, the standard variable) the same spans are exported as OpenTelemetry
//! traces over OTLP/gRPC, and W3C trace context is read from incoming calls.

use std::sync::atomic::{AtomicBool, Ordering};

use consistd_core::config::{Environment, LogFormat};
use opentelemetry::{propagation::TextMapCompositePropagator, trace::TracerProvider as _};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_subscriber::{EnvFilter, Registry, layer::SubscriberExt, reload, util::SubscriberInitExt};

mod context;
pub use context::{BadTraceContext, TraceContext};

/// Whether spans are exported: only then do calls and apiserver requests get spans of their own (with
/// traces off they would only add their fields to every log line).
static TRACES: AtomicBool = AtomicBool::new(false);

/// Whether [`init`] turned traces on.
pub fn traces_on() -> bool {
    TRACES.load(Ordering::Relaxed)
}

/// W3C trace context of `headers` (an incoming call's `traceparent`), for a span's parent.
pub fn remote_context(headers: &http::HeaderMap) -> opentelemetry::Context {
    struct Headers<'a>(&'a http::HeaderMap);
    impl opentelemetry::propagation::Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(http::HeaderName::as_str).collect()
        }
    }
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)))
}

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

/// What [`init`] installed.
#[derive(Debug)]
pub struct Telemetry {
    /// The log level filter, for reloads.
    pub log: LogLevel,
    /// The trace pipeline when traces are exported; flushed by [`Telemetry::shutdown`].
    traces: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered (a stopping daemon's last calls) and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.traces
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "could not flush the last traces");
        }
    }
}

/// Installs the global subscriber, writing logs to stderr. `level` is a validated filter directive. With
/// `OTEL_EXPORTER_OTLP_ENDPOINT` in `env` (e.g. `http://otel-collector:4317`) spans are also exported
/// there, as service `OTEL_SERVICE_NAME` (default `consistd`). Call it inside the tokio runtime: the
/// exporter's connection runs on it.
pub fn init(format: LogFormat, level: &str, env: &Environment) -> Telemetry {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let otlp_endpoint = env.var("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|e| !e.is_empty());
    let service = env.var("OTEL_SERVICE_NAME").filter(|s| !s.is_empty()).unwrap_or("consistd");
    let provider = otlp_endpoint.and_then(|endpoint| match tracer_provider(endpoint, service) {
        Ok(provider) => Some(provider),
        Err(error) => {
            eprintln!("consistd: OpenTelemetry traces stay off: build the OTLP exporter for {endpoint}: {error}");
            None
        }
    });
    let traces = provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("consistd")));
    let registry = tracing_subscriber::registry().with(filter).with(traces);
    let text = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => registry.with(text).try_init(),
        LogFormat::Json => registry.with(text.json().flatten_event(true).with_current_span(false)).try_init(),
    };
    // Already installed (tests that run twice): keep the first.
    let _ = result;
    if provider.is_some() {
        TRACES.store(true, Ordering::Relaxed);
        opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![Box::new(
            TraceContextPropagator::new(),
        )]));
        tracing::info!(endpoint = otlp_endpoint, "exporting traces over OTLP");
    }
    Telemetry { log: LogLevel(handle), traces: provider }
}

fn tracer_provider(endpoint: &str, service: &str) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint).build()?;
    let resource = Resource::builder().with_service_name(service.to_owned()).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}
