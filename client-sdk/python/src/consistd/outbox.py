"""ACK-tracked sends: the sidecar stores a message and resends it until the peer's app ACKs; the SDK
watches outcomes before it sends, so the awaitable ACK of every send resolves."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import grpc

from ._retry import Backoff, is_retryable
from .errors import ConsistdError, unary
from .ordered import Ordered, refused
from .v1 import outbox_pb2
import contextlib

if TYPE_CHECKING:
    from .v1.outbox_pb2_grpc import OutboxServiceStub

log = logging.getLogger("consistd.outbox")

#: How many outcomes of messages nobody awaits (yet) are kept: an outcome can arrive before Send
#: returns the message's id, and other apps on the same sidecar send too.
UNCLAIMED_OUTCOMES = 4096


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

    def __init__(self, message_id: str, outcome: asyncio.Future[Ack]) -> None:
        #: The sidecar's id for the message.
        self.message_id = message_id
        self._outcome = outcome

    async def ack(self, timeout: float | None = None) -> Ack:
        """The message's outcome: ACKED, SUPERSEDED or FAILED (with a reason). For a Service or
        election destination it is the first receiver's. Raises TimeoutError after ``timeout``
        seconds (the message stays pending; call again to keep waiting), or ConsistdError when
        the outcome can no longer be known (the sidecar restarted and the message is settled)."""
        return await asyncio.wait_for(asyncio.shield(self._outcome), timeout)

    def __repr__(self) -> str:
        return f"SentMessage(message_id={self.message_id!r})"


def _stored(response: outbox_pb2.SendStreamResponse) -> str:
    """A SendStream answer: the stored message's id, or the refusal raised."""
    if response.HasField("refusal"):
        raise refused(response.refusal)
    return response.message_id


class AckTracker:
    """One WatchAcks stream per client, opened before the first send and kept open: it resolves the
    outcome of every message this client sent and keeps recent outcomes nobody claimed yet. After a
    reconnect, messages the sidecar no longer lists as pending had their outcome while the stream was
    down; their ACK fails with UNAVAILABLE rather than waiting forever."""

    def __init__(self, stub: OutboxServiceStub) -> None:
        self._stub = stub
        # Every send of this client goes out on one SendStream.
        self._sends: Ordered[outbox_pb2.SendStreamRequest, outbox_pb2.SendStreamResponse] = Ordered(
            stub.SendStream, _stored, "send"
        )
        self._waiting: dict[str, asyncio.Future[Ack]] = {}
        self._unclaimed: OrderedDict[str, Ack] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        # Set while the stream is open at the sidecar (its response headers arrived).
        self._open = asyncio.Event()
        # The error that ended tracking for good; sends then fail with it.
        self._failed: ConsistdError | None = None

    async def send(self, request: outbox_pb2.SendRequest) -> SentMessage:
        """Sends once outcomes are watched, and returns the stored message with its pending outcome."""
        await self._ensure_open()
        message_id: str = await self._sends.call(outbox_pb2.SendStreamRequest(message=request))
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        # An outcome nobody awaits must not be logged as "exception never retrieved".
        future.add_done_callback(_retrieve)
        ack = self._unclaimed.pop(message_id, None)
        if ack is not None:
            future.set_result(ack)
        elif self._failed is not None:
            future.set_exception(self._failed)
        else:
            self._waiting[message_id] = future
        return SentMessage(message_id, future)

    async def close(self) -> None:
        """Stops watching; pending ACKs fail with CANCELLED."""
        await self._sends.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._fail_all(ConsistdError(grpc.StatusCode.CANCELLED, "the client was closed"))

    async def _ensure_open(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._task is None:
            # The stream outlives the send that opens it, so it runs in a context of its own, not in
            # that send's (and so not in its OpenTelemetry trace).
            loop = asyncio.get_running_loop()
            self._task = contextvars.Context().run(loop.create_task, self._run(), name="consistd-watch-acks")
        opened = asyncio.ensure_future(self._open.wait())
        done, _ = await asyncio.wait({opened, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if opened not in done:
            opened.cancel()
            raise self._failed or ConsistdError(grpc.StatusCode.CANCELLED, "ACK tracking stopped")

    async def _run(self) -> None:
        backoff = Backoff()
        reconnected = False
        while True:
            call = self._stub.WatchAcks(outbox_pb2.WatchAcksRequest())
            try:
                await call.initial_metadata()
                if reconnected:
                    await self._settle_unknown()
                self._open.set()
                async for response in call:
                    backoff.reset()
                    self._resolve(Ack.from_proto(response))
                code, message = grpc.StatusCode.UNAVAILABLE, "the sidecar ended the ACK stream"
            except grpc.aio.AioRpcError as e:
                error = ConsistdError.from_rpc(e)
                code, message = error.code, error.message
            except ConsistdError as e:
                code, message = e.code, e.message
            finally:
                self._open.clear()
                call.cancel()
            # A watcher that fell behind is told with DATA_LOSS and may watch again; settling the
            # pending messages after the reconnect covers the outcomes it missed.
            if not is_retryable(code) and code != grpc.StatusCode.DATA_LOSS:
                self._failed = ConsistdError(code, message)
                self._fail_all(self._failed)
                return
            log.info("ACK stream lost (%s: %s); watching again", code.name, message)
            reconnected = True
            await backoff.wait()

    def _resolve(self, ack: Ack) -> None:
        future = self._waiting.pop(ack.message_id, None)
        if future is not None:
            if not future.done():
                future.set_result(ack)
            return
        self._unclaimed[ack.message_id] = ack
        while len(self._unclaimed) > UNCLAIMED_OUTCOMES:
            self._unclaimed.popitem(last=False)

    async def _settle_unknown(self) -> None:
        """Fails the ACKs of awaited messages that settled while the stream was down."""
        if not self._waiting:
            return
        status = await unary(self._stub.GetOutboxStatus, outbox_pb2.GetOutboxStatusRequest())
        pending = {m.message_id for d in status.destinations for m in d.pending}
        for message_id in [m for m in self._waiting if m not in pending]:
            future = self._waiting.pop(message_id)
            if not future.done():
                future.set_exception(
                    ConsistdError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"message {message_id} settled while the connection to the sidecar was down; "
                        "its outcome is unknown",
                    )
                )

    def _fail_all(self, error: ConsistdError) -> None:
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)


def encode_payload(payload: Any, content_type: str | None) -> tuple[bytes, str]:
    """The payload's bytes and content type: bytes as given, str as UTF-8 text, anything else as JSON."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload), content_type or ""
    if isinstance(payload, str):
        return payload.encode(), content_type or "text/plain; charset=utf-8"
    return json.dumps(payload, separators=(",", ":")).encode(), content_type or "application/json"


def _retrieve(future: asyncio.Future[Ack]) -> None:
    if not future.cancelled():
        future.exception()
