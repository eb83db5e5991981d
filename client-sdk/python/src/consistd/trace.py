"""OpenTelemetry trace context of ACK-tracked messages: a send carries its W3C context, a delivery gives it back."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .v1 import outbox_pb2

__all__ = ["PROCESS_SPAN", "TRACER", "context", "inject", "process"]

#: The instrumentation scope of the spans this SDK starts.
TRACER = "consistd"
#: Where the messages of ``Inbox.serve`` come from, as a messaging destination.
DESTINATION = "consistd.inbox"
#: The name of the span of handling one message (messaging conventions: ``process <destination>``).
PROCESS_SPAN = f"process {DESTINATION}"

# The W3C format itself rather than the global propagator, so messages carry it whatever the app configured.
_W3C = TraceContextTextMapPropagator()


class TraceFields(Protocol):
    """A message with W3C trace fields: ``consistd.InboxMessage`` or the protocol's ``InboxMessage``."""

    @property
    def traceparent(self) -> str: ...

    @property
    def tracestate(self) -> str: ...


class Delivered(TraceFields, Protocol):
    """A delivered message: its trace fields and the sidecar's id for it."""

    @property
    def message_id(self) -> str: ...


def inject(request: outbox_pb2.SendRequest, context: Context | None = None) -> None:
    """Writes the span context of ``context`` (default: the current one) into ``request.traceparent`` and
    ``request.tracestate``, unless the request already carries a traceparent or the context holds no valid
    span. ``Client.send`` does this; call it to build a request for the generated stub yourself."""
    if request.traceparent:
        return
    if context is None:
        context = otel_context.get_current()
    if not trace.get_current_span(context).get_span_context().is_valid:
        return
    fields: dict[str, str] = {}
    _W3C.inject(fields, context=context)
    request.traceparent = fields.get("traceparent", "")
    request.tracestate = fields.get("tracestate", "")


def context(message: TraceFields) -> Context:
    """The context ``message`` was sent under, holding the sender's span as a remote parent: start the span of
    the work the message causes in it (``tracer.start_as_current_span(name, context=context(message))``).
    Without a traceparent it is an empty Context, so such a span starts a trace of its own."""
    fields = {"traceparent": message.traceparent, "tracestate": message.tracestate}
    return _W3C.extract(fields, context=Context())


def process(message: Delivered) -> AbstractContextManager[trace.Span]:
    """The CONSUMER span of handling one message, child of the context it was sent under, from the global
    tracer provider (a no-op unless the app installed one): a context manager that makes it current and ends
    it on exit. ``Inbox.serve`` runs each handler call in one."""
    tracer = trace.get_tracer(TRACER)
    return tracer.start_as_current_span(
        PROCESS_SPAN,
        context=context(message),
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "consistd",
            "messaging.operation.type": "process",
            "messaging.destination.name": DESTINATION,
            "messaging.message.id": message.message_id,
        },
    )
