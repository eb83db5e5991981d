// OpenTelemetry trace context of ACK-tracked messages: a send carries the W3C context it is made under, a delivery gives it back.
import {
  type Context,
  context as otelContext,
  defaultTextMapGetter,
  defaultTextMapSetter,
  isSpanContextValid,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  trace,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";

/** The instrumentation scope of the spans this SDK starts. */
const TRACER = "consistd";
/** Where delivered messages come from, as the messaging semantic conventions name a destination. */
const DESTINATION = "consistd.inbox";

/**
 * W3C Trace Context, used directly rather than through the global propagator: messages carry exactly
 * `traceparent` and `tracestate`, whatever propagation the app configured for its own calls.
 */
const propagator = new W3CTraceContextPropagator();

/** The W3C fields of a message: the SDK's `Message`, a generated `SendRequest` or an `InboxMessage`. */
export interface TraceFields {
  traceparent?: string;
  tracestate?: string;
}

/**
 * Writes the span context of `cx` (default: the active context) into `fields.traceparent` and
 * `fields.tracestate`, unless `fields` already carries a traceparent or `cx` holds no valid span.
 * `Client.send` does this for you; call it when sending a generated `SendRequest` through
 * `client.services.outbox`.
 */
export function inject(fields: TraceFields, cx: Context = otelContext.active()): void {
  const span = trace.getSpanContext(cx);
  if (fields.traceparent || !span || !isSpanContextValid(span)) return;
  const carrier: Record<string, string> = {};
  propagator.inject(cx, carrier, defaultTextMapSetter);
  fields.traceparent = carrier.traceparent ?? "";
  fields.tracestate = carrier.tracestate ?? "";
}

/**
 * The context `message` was sent under, holding its sender's span as a remote parent: start the span of
 * the work the message causes in it (`tracer.startSpan(name, {}, context(message))`). Without a
 * traceparent it is the root context, so such a span starts a trace of its own.
 */
export function context(message: TraceFields): Context {
  const carrier = { traceparent: message.traceparent ?? "", tracestate: message.tracestate ?? "" };
  return propagator.extract(ROOT_CONTEXT, carrier, defaultTextMapGetter);
}

/**
 * Starts the CONSUMER span of handling the message `messageId` sent under `parent` (messaging semantic
 * conventions: `process <destination>`), from the global tracer provider: a no-op unless the app
 * registered one.
 */
export function startProcessing(messageId: string, parent: Context): Span {
  return trace.getTracer(TRACER).startSpan(
    `process ${DESTINATION}`,
    {
      kind: SpanKind.CONSUMER,
      attributes: {
        "messaging.system": "consistd",
        "messaging.operation.type": "process",
        "messaging.destination.name": DESTINATION,
        "messaging.message.id": messageId,
      },
    },
    parent,
  );
}
