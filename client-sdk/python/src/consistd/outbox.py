"""Sends with an awaitable outcome: the sidecar stores a message and resends it until the peer's app ACKs
it (or a newer event supersedes it, or delivery fails for good). Awaiting a sent message's outcome asks the
sidecar for it (``OutboxService.WaitOutcome``), which answers the message's first outcome at once when it
came already, else when it comes; the SDK keeps no outcome stream and no table of outcomes."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import grpc

from ._retry import Backoff, is_retryable, task_cancelled
from .errors import ConsistdError
from .ordered import Ordered, refused
from .v1 import outbox_pb2

if TYPE_CHECKING:
    from .v1.outbox_pb2_grpc import OutboxServiceStub

log = logging.getLogger("consistd.outbox")


@dataclass(frozen=True)
class Peer:
    """A peer sidecar's address, ``"host:port"``."""

    address: str


@dataclass(frozen=True)
class ServiceEndpoints:
    """Every ready endpoint of a Kubernetes Service, including ones that appear later."""

    name: str
    #: Namespace of the Service; empty means the sidecar's own namespace.
    namespace: str = ""


@dataclass(frozen=True)
class ElectionMembers:
    """Every member (candidate) of an election group."""

    election: str


#: Where a message goes; a plain string is a peer address.
Destination = str | Peer | ServiceEndpoints | ElectionMembers


def destination_to_proto(to: Destination) -> outbox_pb2.Destination:
    """The protocol message for a destination."""
    if isinstance(to, str):
        return outbox_pb2.Destination(peer=to)
    if isinstance(to, Peer):
        return outbox_pb2.Destination(peer=to.address)
    if isinstance(to, ServiceEndpoints):
        return outbox_pb2.Destination(service=outbox_pb2.ServiceDestination(namespace=to.namespace, name=to.name))
    if isinstance(to, ElectionMembers):
        return outbox_pb2.Destination(election=to.election)
    raise TypeError(f"not a destination: {to!r}")


class AckOutcome(enum.IntEnum):
    """The end of a message's life."""

    UNSPECIFIED = outbox_pb2.ACK_OUTCOME_UNSPECIFIED
    ACKED = outbox_pb2.ACK_OUTCOME_ACKED
    """The receiving app acknowledged the message."""
    SUPERSEDED = outbox_pb2.ACK_OUTCOME_SUPERSEDED
    """A newer event for the same (destination, resource_id) replaced it before it was ACKed."""
    FAILED = outbox_pb2.ACK_OUTCOME_FAILED
    """Delivery was given up; ``reason`` says why."""


@dataclass(frozen=True)
class Ack:
    """The outcome of one sent message at one receiver."""

    message_id: str
    outcome: AckOutcome
    #: Why, for FAILED.
    reason: str
    #: The peer address that answered.
    peer: str
    resource_id: str
    event_id: str
    at: datetime | None

    @classmethod
    def from_proto(cls, r: outbox_pb2.WatchAcksResponse) -> Ack:
        """The outcome carried by a protocol message."""
        return cls(
            message_id=r.message_id,
            outcome=AckOutcome(r.outcome),
            reason=r.reason,
            peer=r.peer,
            resource_id=r.resource_id,
            event_id=r.event_id,
            at=r.at.ToDatetime(tzinfo=timezone.utc) if r.HasField("at") else None,
        )


class SentMessage:
    """A message the sidecar has stored; ``await message.ack()`` waits for its outcome."""

    def __init__(self, message_id: str, outbox: Outbox) -> None:
        #: The sidecar's id for the message.
        self.message_id = message_id
        self._outbox = outbox
        self._ack: Ack | None = None

    async def ack(self, timeout: float | None = None) -> Ack:
        """The message's first outcome: ACKED, SUPERSEDED or FAILED (with a reason); for a Service or
        election destination, the first receiver's. Asks the sidecar (``WaitOutcome``), which answers at
        once when the outcome came already; a lost connection is retried with backoff, so an outcome
        that came meanwhile is still seen. Raises TimeoutError after ``timeout`` seconds (the message
        stays pending; call again to keep waiting), and ConsistdError with the sidecar's status when it
        answers otherwise: NOT_FOUND when it no longer knows the outcome (it restarted since the message
        settled, or 10,000 later messages settled since), CANCELLED when the client was closed. Once
        there is an outcome, calling again returns it without asking."""
        if self._ack is None:
            self._ack = await asyncio.wait_for(self._outbox.wait_outcome(self.message_id), timeout)
        return self._ack

    def __repr__(self) -> str:
        return f"SentMessage(message_id={self.message_id!r})"


def _stored(response: outbox_pb2.SendStreamResponse) -> str:
    """A SendStream answer: the stored message's id, or the refusal raised."""
    if response.HasField("refusal"):
        raise refused(response.refusal)
    return response.message_id


class Outbox:
    """A client's side of OutboxService on one connection: every send goes out on one shared SendStream,
    and each wait for an outcome is a WaitOutcome call of its own. Nothing is kept per message: a send
    nobody awaits costs nothing once it returns."""

    def __init__(self, stub: OutboxServiceStub) -> None:
        self._stub = stub
        self._sends: Ordered[outbox_pb2.SendStreamRequest, outbox_pb2.SendStreamResponse] = Ordered(
            stub.SendStream, _stored, "send"
        )
        self._closed = False

    async def send(self, request: outbox_pb2.SendRequest) -> SentMessage:
        """Sends on the shared stream and returns once the sidecar stored the message."""
        message_id: str = await self._sends.call(outbox_pb2.SendStreamRequest(message=request))
        return SentMessage(message_id, self)

    async def wait_outcome(self, message_id: str) -> Ack:
        """The first outcome of message ``message_id``, asked again with backoff after a lost connection."""
        request = outbox_pb2.WaitOutcomeRequest(message_id=message_id)
        backoff = Backoff()
        while True:
            if self._closed:
                raise _closed()
            try:
                response = await self._stub.WaitOutcome(request)
            except asyncio.CancelledError:
                # Closing the client cancels the calls on its channel: CANCELLED, not the caller's cancellation.
                if self._closed and not task_cancelled():
                    raise _closed() from None
                raise
            except grpc.aio.AioRpcError as e:
                error = ConsistdError.from_rpc(e)
                if not is_retryable(error.code):
                    raise error from e
                log.info("waiting for the outcome of message %s: %s; asking again", message_id, error)
                await backoff.wait()
            else:
                return Ack.from_proto(response.outcome)

    async def close(self) -> None:
        """Ends the send stream; sends and waits for outcomes, pending and later, fail with CANCELLED."""
        self._closed = True
        await self._sends.close()


def _closed() -> ConsistdError:
    return ConsistdError(grpc.StatusCode.CANCELLED, "the client was closed")


def encode_payload(payload: Any, content_type: str | None) -> tuple[bytes, str]:
    """The payload's bytes and content type: bytes as given, str as UTF-8 text, anything else as JSON."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload), content_type or ""
    if isinstance(payload, str):
        return payload.encode(), content_type or "text/plain; charset=utf-8"
    return json.dumps(payload, separators=(",", ":")).encode(), content_type or "application/json"
