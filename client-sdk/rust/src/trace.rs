//! OpenTelemetry trace context of ACK-tracked messages: a send carries the W3C context it is made
//! under, and a delivery gives the receiving app that context back as the parent of its work.

use std::collections::HashMap;

use opentelemetry::{
    Context, KeyValue,
    propagation::TextMapPropagator as _,
    trace::{SpanKind, TraceContextExt as _, Tracer as _},
};
use opentelemetry_sdk::propagation::TraceContextPropagator;

use crate::proto::{InboxMessage, SendRequest};

/// The instrumentation scope of the spans this SDK starts.
const TRACER: &str = "consistd";

/// Writes the span context of `cx` into `request`'s `traceparent` and `tracestate` (W3C), unless the
/// request already carries a traceparent or `cx` has no valid span. [`crate::Client::send`] does this
/// with [`Context::current`]; call it yourself to send under another context, e.g. a `tracing` span's
/// (`tracing_opentelemetry::OpenTelemetrySpanExt::context`).
pub fn inject(request: &mut SendRequest, cx: &Context) {
    if !request.traceparent.is_empty() || !cx.span().span_context().is_valid() {
        return;
    }
    let mut fields = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut fields);
    request.traceparent = fields.remove("traceparent").unwrap_or_default();
    request.tracestate = fields.remove("tracestate").unwrap_or_default();
}

/// The context `message` was sent under, as a remote parent: start the span of the work the message
/// causes with it (`tracer.start_with_context(name, &context(message))`). Without one it is an empty
/// context, so such a span starts a trace of its own.
pub fn context(message: &InboxMessage) -> Context {
    let fields = HashMap::from([
        ("traceparent".to_owned(), message.traceparent.clone()),
        ("tracestate".to_owned(), message.tracestate.clone()),
    ]);
    TraceContextPropagator::new().extract(&fields)
}

/// The CONSUMER span of handling `message` (messaging semantic conventions: `process <destination>`),
/// child of the context it was sent under, from the global tracer provider (a no-op unless the app
/// installed one). Returns the context holding it.
pub(crate) fn process(message: &InboxMessage) -> Context {
    let tracer = opentelemetry::global::tracer(TRACER);
    let span = tracer
        .span_builder("process consistd.inbox")
        .with_kind(SpanKind::Consumer)
        .with_attributes([
            KeyValue::new("messaging.system", "consistd"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.destination.name", "consistd.inbox"),
            KeyValue::new("messaging.message.id", message.message_id.clone()),
        ])
        .start_with_context(&tracer, &context(message));
    Context::current_with_span(span)
}
