"""OpenTelemetry between the two daemons: a send's span parents the receiving handler's CONSUMER span.

A message sent under no span, or with its own traceparent, is delivered as such. Spans go to the OpenTelemetry
SDK's in-memory exporter behind the global tracer provider."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags, TraceState

import consistd
from consistd import AckOutcome, InboxMessage
from consistd.v1 import inbox_pb2, outbox_pb2, outbox_pb2_grpc
from support import unique

PEER = os.environ.get("CONSISTD_TEST_PEER_ADDRESS", "")
OWN_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="session")
def spans() -> InMemorySpanExporter:
    """The exporter behind the global tracer provider, installed once (the global provider can be set once)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "another tracer provider was installed first"
    return exporter


@pytest.fixture
def tracer(spans: InMemorySpanExporter) -> trace.Tracer:
    """The test's own tracer, for the senders' spans."""
    return trace.get_tracer("consistd-tests")


def traceparent(span: trace.Span) -> str:
    """The W3C traceparent of a sampled span: flags 01, or 03 where the OpenTelemetry SDK also marks its trace
    ids random (W3C Trace Context level 2)."""
    c = span.get_span_context()
    assert c.trace_flags.sampled
    return f"00-{trace.format_trace_id(c.trace_id)}-{trace.format_span_id(c.span_id)}-{c.trace_flags:02x}"


def parent_of(message: InboxMessage) -> SpanContext:
    """The span context a delivery's context holds."""
    return trace.get_current_span(message.context).get_span_context()


async def consumer_spans(spans: InMemorySpanExporter, message_id: str, count: int) -> list[ReadableSpan]:
    """The ``count`` finished CONSUMER spans of message ``message_id``, oldest first, once exported."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        found = [
            s
            for s in spans.get_finished_spans()
            if s.kind == SpanKind.CONSUMER and (s.attributes or {}).get("messaging.message.id") == message_id
        ]
        if len(found) >= count:
            return sorted(found, key=lambda s: s.start_time or 0)
        assert loop.time() < deadline, f"{len(found)} of {count} consumer spans for message {message_id}"
        await asyncio.sleep(0.02)


class Received:
    """Keeps the messages of some resources that a handler got, with the span current while it ran."""

    def __init__(self, *resource_ids: str, fail_first: bool = False) -> None:
        self.resource_ids = set(resource_ids)
        self.fail_first = fail_first
        self.messages: list[tuple[InboxMessage, SpanContext]] = []

    def record(self, message: InboxMessage) -> None:
        """What the handler does: keep the message, and fail the first attempt if asked to."""
        if message.resource_id not in self.resource_ids:
            return  # another test's leftover
        self.messages.append((message, trace.get_current_span().get_span_context()))
        if self.fail_first and message.delivery_attempt == 1:
            raise RuntimeError("not yet")

    def of(self, resource_id: str) -> list[tuple[InboxMessage, SpanContext]]:
        return [(m, s) for m, s in self.messages if m.resource_id == resource_id]


@pytest.fixture
async def serving(peer: consistd.Client) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Serve tasks of daemon b's inbox that the test starts, cancelled afterwards (before ``peer`` closes)."""
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_handler_runs_in_a_consumer_span_under_the_senders_span_and_a_failure_marks_it(
    client: consistd.Client,
    peer: consistd.Client,
    spans: InMemorySpanExporter,
    tracer: trace.Tracer,
    serving: list[asyncio.Task[None]],
) -> None:
    resource_id = unique("sdk-py/traced")
    received = Received(resource_id, fail_first=True)

    async def handler(message: InboxMessage) -> None:  # a coroutine function: run on the loop
        received.record(message)

    serving.append(asyncio.create_task(peer.inbox.serve(handler, retry_after=0.2)))

    with tracer.start_as_current_span("producer", kind=SpanKind.PRODUCER) as producer:
        sent = await client.send(PEER, resource_id, "1", {"traced": True})
    assert (await sent.ack(timeout=30)).outcome == AckOutcome.ACKED
    sender = producer.get_span_context()

    [(first, first_span), (second, second_span)] = received.of(resource_id)
    assert (first.delivery_attempt, second.delivery_attempt) == (1, 2)
    assert first.traceparent == traceparent(producer), "the message carries the sender's span"
    assert second.traceparent == first.traceparent, "and so does its redelivery"
    assert first_span.trace_id == sender.trace_id, "the handler runs in the sender's trace"
    assert first_span.span_id != sender.span_id, "in a span of its own"
    assert second_span.trace_id == sender.trace_id and second_span.span_id not in (sender.span_id, first_span.span_id)

    failed, acked = await consumer_spans(spans, first.message_id, 2)
    for span, seen in ((failed, first_span), (acked, second_span)):
        assert span.name == "process consistd.inbox"
        assert span.instrumentation_scope is not None and span.instrumentation_scope.name == "consistd"
        assert span.context is not None and span.context.span_id == seen.span_id, "the handler saw it as current"
        assert span.parent is not None and span.parent.is_remote, "its parent came with the message"
        assert (span.parent.trace_id, span.parent.span_id) == (sender.trace_id, sender.span_id)
        assert dict(span.attributes or {}) == {
            "messaging.system": "consistd",
            "messaging.operation.type": "process",
            "messaging.destination.name": "consistd.inbox",
            "messaging.message.id": first.message_id,
        }
    assert failed.status.status_code == StatusCode.ERROR, "the first, failed handling is marked"
    assert failed.status.description == "RuntimeError: not yet"
    [exception] = [e for e in failed.events if e.name == "exception"]
    assert (exception.attributes or {}).get("exception.type") == "RuntimeError"
    assert (exception.attributes or {}).get("exception.message") == "not yet"
    assert acked.status.status_code == StatusCode.UNSET and not acked.events


async def test_a_send_under_no_span_or_with_its_own_traceparent_is_delivered_as_such(
    client: consistd.Client,
    peer: consistd.Client,
    spans: InMemorySpanExporter,
    tracer: trace.Tracer,
    serving: list[asyncio.Task[None]],
) -> None:
    untraced, detached, explicit, own = (unique(f"sdk-py/{n}") for n in ("untraced", "detached", "explicit", "own"))
    received = Received(untraced, detached, explicit, own)
    serving.append(asyncio.create_task(peer.inbox.serve(received.record)))  # a plain function: in a thread

    sends = [await client.send(PEER, untraced, "1", b"{}")]
    elsewhere = tracer.start_span("not current")
    sends.append(await client.send(PEER, explicit, "1", b"{}", context=trace.set_span_in_context(elsewhere)))
    elsewhere.end()
    with tracer.start_as_current_span("producer"):
        sends.append(await client.send(PEER, detached, "1", b"{}", context=Context()))
        sends.append(await client.send(PEER, own, "1", b"{}", traceparent=OWN_TRACEPARENT, tracestate="v=1"))
    for sent in sends:
        assert (await sent.ack(timeout=30)).outcome == AckOutcome.ACKED

    for resource_id in (untraced, detached):
        [(message, handled_in)] = received.of(resource_id)
        assert (message.traceparent, message.tracestate) == ("", ""), resource_id
        assert not parent_of(message).is_valid, "no parent for a message sent under no span"
        [span] = await consumer_spans(spans, message.message_id, 1)
        assert span.parent is None, "its handling starts a trace of its own"
        assert span.context is not None and span.context.span_id == handled_in.span_id, "the thread saw it current"

    [(message, _)] = received.of(explicit)
    assert message.traceparent == traceparent(elsewhere), "the context given wins over the current one"

    [(message, handled_in)] = received.of(own)
    assert (message.traceparent, message.tracestate) == (OWN_TRACEPARENT, "v=1"), "the request's own context wins"
    parent = parent_of(message)
    assert parent.is_remote
    assert parent.trace_id == 0x0AF7651916CD43DD8448EB211C80319C and parent.span_id == 0xB7AD6B7169203331
    assert parent.trace_state.to_header() == "v=1"
    assert trace.get_current_span(consistd.trace.context(message)).get_span_context() == parent, "the helper agrees"
    assert handled_in.trace_id == parent.trace_id


async def test_the_send_stream_runs_outside_the_trace_of_the_send_that_opens_it(tracer: trace.Tracer) -> None:
    async with consistd.Client() as client:
        # The stream is opened in a context of its own: record the span current where SendStream is called.
        stub = client._stub(outbox_pb2_grpc.OutboxServiceStub)
        send_stream, current = stub.SendStream, []

        def recording(*args: Any, **kwargs: Any) -> Any:
            current.append(trace.get_current_span().get_span_context())
            return send_stream(*args, **kwargs)

        stub.SendStream = recording
        with tracer.start_as_current_span("first send"):
            await client.send(PEER, unique("sdk-py/first"), "1", b"{}")
    assert current and not current[0].is_valid, "the stream, which lives on, is in no send's trace"


def test_inject_writes_the_w3c_fields_of_a_valid_span_whatever_the_global_propagator() -> None:
    span = trace.NonRecordingSpan(
        SpanContext(
            trace_id=0x0AF7651916CD43DD8448EB211C80319C,
            span_id=0xB7AD6B7169203331,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
            trace_state=TraceState([("v", "1")]),
        )
    )
    under_span = trace.set_span_in_context(span)
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([]))  # an app that propagates nothing
    try:
        request = outbox_pb2.SendRequest(resource_id="r")
        consistd.trace.inject(request, under_span)
    finally:
        propagate.set_global_textmap(configured)
    assert (request.traceparent, request.tracestate) == (OWN_TRACEPARENT, "v=1")

    kept = outbox_pb2.SendRequest(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-00")
    consistd.trace.inject(kept, under_span)
    assert (kept.traceparent, kept.tracestate) == ("00-" + "1" * 32 + "-" + "2" * 16 + "-00", "")

    untraced = outbox_pb2.SendRequest()
    consistd.trace.inject(untraced, Context())
    consistd.trace.inject(untraced)  # the current context: no span in a plain test
    assert (untraced.traceparent, untraced.tracestate) == ("", "")


def test_context_reads_a_protocol_message_and_is_empty_without_a_traceparent() -> None:
    message = inbox_pb2.InboxMessage(traceparent=OWN_TRACEPARENT, tracestate="v=1")
    parent = trace.get_current_span(consistd.trace.context(message)).get_span_context()
    assert (parent.is_remote, parent.span_id, parent.trace_state.to_header()) == (True, 0xB7AD6B7169203331, "v=1")
    assert consistd.trace.context(inbox_pb2.InboxMessage()) == Context()
