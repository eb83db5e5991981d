// OpenTelemetry trace context of ACK-tracked messages: a send carries the W3C context of the span it is
// made under, and a delivered message gives the receiving app that context back as the parent of its work.

package consistd

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

const (
	// tracerName is the instrumentation scope of the spans this SDK starts.
	tracerName = "consistd"
	// inboxDestination names the inbox in the messaging attributes and span names.
	inboxDestination = "consistd.inbox"
)

// w3c reads and writes the W3C traceparent and tracestate fields, whatever propagator the app installed
// globally: the fields of a message are W3C by definition.
var w3c = propagation.TraceContext{}

// injectTrace writes the span context of ctx into req's TraceParent and TraceState, unless req already
// carries a traceparent or ctx holds no valid span.
func injectTrace(ctx context.Context, req *SendRequest) {
	if req.TraceParent != "" || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	fields := propagation.MapCarrier{}
	w3c.Inject(ctx, fields)
	req.TraceParent, req.TraceState = fields.Get("traceparent"), fields.Get("tracestate")
}

// Context returns parent carrying the span context the message was sent under, as a remote span
// context: start the span of the work the message causes from it. Any span parent held is replaced;
// when the message was sent under none the result holds no span, so a span started from it begins a
// trace of its own. Serve already runs each handler in a span under this context.
func (m *Message) Context(parent context.Context) context.Context {
	noSpan := trace.ContextWithSpanContext(parent, trace.SpanContext{})
	return w3c.Extract(noSpan, propagation.MapCarrier{"traceparent": m.TraceParent, "tracestate": m.TraceState})
}

// startProcess starts the CONSUMER span of handling m (messaging semantic conventions: "process
// <destination>"), child of the context m was sent under, from the global tracer provider (a no-op
// unless the app installed one). It returns ctx carrying the span.
func startProcess(ctx context.Context, m *Message) (context.Context, trace.Span) {
	tracer := otel.Tracer(tracerName, trace.WithSchemaURL(semconv.SchemaURL))
	return tracer.Start(m.Context(ctx), "process "+inboxDestination,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String("consistd"),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(inboxDestination),
			semconv.MessagingMessageID(m.ID),
		))
}

// endProcess ends the span of handling a message, marked failed when the handler returned err.
func endProcess(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
