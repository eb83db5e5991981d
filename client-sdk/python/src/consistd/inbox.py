"""The inbox: messages that peer pods sent to this pod's app, handed to a handler and ACKed or NACKed by its result."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf import duration_pb2
from opentelemetry.context import Context
from opentelemetry.trace import StatusCode

from . import trace
from ._retry import Backoff, is_retryable
from .errors import ConsistdError, unary
from .objects import Guard
from .ordered import Ordered, refused
from .v1 import inbox_pb2

if TYPE_CHECKING:
    from .v1.inbox_pb2_grpc import InboxServiceStub

log = logging.getLogger("consistd.inbox")

T = TypeVar("T")

#: The longest NACK reason the sidecar accepts, in bytes.
MAX_REASON_BYTES = 4096


@dataclass(frozen=True)
class InboxMessage:
    """One message from a peer."""

    #: The sidecar's id for the message (what ``ack`` and ``nack`` take).
    message_id: str
    #: The sending pod's identity.
    sender: str
    resource_id: str
    event_id: str
    payload: bytes
    content_type: str
    #: 1 on first delivery, higher after a NACK or a reconnect.
    delivery_attempt: int
    received_at: datetime | None
    #: The W3C trace context the message was sent under (empty when none): see ``context``.
    traceparent: str = ""
    tracestate: str = ""
    #: The guard the sending app sent it under (its election, the Lease's namespace and the term); None for an
    #: unguarded send. Once this sidecar stored it, it refuses every later message of that election guarded by
    #: an older term.
    guard: Guard | None = None

    @property
    def context(self) -> Context:
        """The OpenTelemetry context the message was sent under, to parent the span of its processing
        (an empty Context when it was sent under none); ``serve`` already runs the handler in such a span."""
        return trace.context(self)

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8 (undecodable bytes replaced)."""
        return self.payload.decode(errors="replace")

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)

    @classmethod
    def from_proto(cls, m: inbox_pb2.InboxMessage) -> InboxMessage:
        """The message carried by a protocol message."""
        return cls(
            message_id=m.message_id,
            sender=m.sender,
            resource_id=m.resource_id,
            event_id=m.event_id,
            payload=m.payload,
            content_type=m.content_type,
            delivery_attempt=m.delivery_attempt,
            received_at=m.received_at.ToDatetime(tzinfo=timezone.utc) if m.HasField("received_at") else None,
            traceparent=m.traceparent,
            tracestate=m.tracestate,
            guard=Guard.from_proto(m.guard) if m.HasField("guard") else None,
        )


#: A message handler: a coroutine function, or a plain function (run in a worker thread).
Handler = Callable[[InboxMessage], Awaitable[None] | None]


class Inbox:
    """Messages from peers (``client.inbox``)."""

    def __init__(
        self, stub: InboxServiceStub, acks: Ordered[inbox_pb2.AckStreamRequest, inbox_pb2.AckStreamResponse]
    ) -> None:
        self._stub = stub
        self._acks = acks

    async def serve(self, handler: Handler, *, retry_after: float = 1.0, max_messages: int | None = None) -> None:
        """Calls ``handler`` with each message, one at a time, oldest first. When it returns, the
        message is ACKed (the ACK travels back to the sender); when it raises, the message is NACKed
        with the exception as reason and delivered again after ``retry_after`` seconds. When the
        connection to the sidecar is lost it receives again with backoff (a message being handled
        then is delivered again). Runs until cancelled, or returns once ``max_messages`` messages
        were ACKed; any other error from the sidecar raises ConsistdError.

        Each call runs in an OpenTelemetry CONSUMER span ``process consistd.inbox``, child of the context
        the message was sent under and current while the handler runs; a raise marks it ERROR. Spans go to
        the global tracer provider, a no-op unless the app installs one."""
        backoff = Backoff()
        acked = 0
        while True:
            call = self._stub.Receive(inbox_pb2.ReceiveRequest())
            try:
                async for response in call:
                    backoff.reset()
                    if await self._handle(handler, InboxMessage.from_proto(response.message), retry_after):
                        acked += 1
                        if max_messages is not None and acked >= max_messages:
                            return
                code, message = grpc.StatusCode.UNAVAILABLE, "the sidecar ended the inbox stream"
            except grpc.aio.AioRpcError as e:
                error = ConsistdError.from_rpc(e)
                code, message = error.code, error.message
            except ConsistdError as e:
                code, message = e.code, e.message
            finally:
                call.cancel()
            if not is_retryable(code):
                raise ConsistdError(code, message)
            log.info("inbox stream lost (%s: %s); receiving again", code.name, message)
            await backoff.wait()

    async def _handle(self, handler: Handler, message: InboxMessage, retry_after: float) -> bool:
        """Runs the handler on one message in its CONSUMER span and ACKs or NACKs it; True when it was ACKed."""
        with trace.process(message) as span:
            try:
                await call_handler(handler, message)
            except Exception as e:  # any failure of the handler means "deliver it again"
                reason = f"{type(e).__name__}: {e}"
                span.record_exception(e)
                span.set_status(StatusCode.ERROR, reason)
                log.warning(
                    "handler failed on message %s (attempt %d); NACKed: %r",
                    message.message_id,
                    message.delivery_attempt,
                    e,
                )
                await self.nack(message.message_id, reason=reason, retry_after=retry_after)
                return False
            try:
                await self.ack(message.message_id)
            except ConsistdError as e:
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise
                # Already settled (e.g. ACKed before a reconnect redelivered it): nothing left to do.
                log.info("message %s was already settled: %s", message.message_id, e.message)
                return False
            return True

    async def ack(self, message_id: str) -> None:
        """Confirms a message was processed; the ACK is stored and travels back to the sender."""
        await self._acks.call(inbox_pb2.AckStreamRequest(message_id=message_id))

    async def nack(self, message_id: str, *, reason: str = "", retry_after: float | None = None) -> None:
        """Asks for a message to be delivered again after ``retry_after`` seconds (None: at once);
        ``reason`` is logged by the sidecar (cut to 4096 bytes)."""
        delay = None
        if retry_after is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(round(retry_after * 1e9))
        reason = reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")
        await unary(self._stub.Nack, inbox_pb2.NackRequest(message_id=message_id, retry_after=delay, reason=reason))


def acked(response: inbox_pb2.AckStreamResponse) -> None:
    """An AckStream answer: nothing, or the refusal raised."""
    if response.HasField("refusal"):
        raise refused(response.refusal)


async def call_handler(handler: Callable[[T], Any], argument: T) -> Any:
    """Calls ``handler`` and returns its result: a coroutine function (or an object whose ``__call__`` is one)
    on the loop, a plain one in a worker thread (which sees the caller's context, and so the current span).
    Shared with the reconciler."""
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__):
        return await handler(argument)
    result = await asyncio.to_thread(handler, argument)
    if inspect.isawaitable(result):
        return await result
    return result
