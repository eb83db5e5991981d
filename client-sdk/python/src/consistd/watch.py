"""Watch streams that reconnect on their own and resume after the last event they delivered."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import grpc

from ._own_writes import OwnWrites
from ._retry import Backoff, is_retryable, task_cancelled
from .errors import ConsistdError
from .objects import Object
from .v1 import object_pb2, watch_pb2

if TYPE_CHECKING:
    from .v1.watch_pb2_grpc import WatchServiceStub

log = logging.getLogger("consistd.watch")


class Mode(enum.IntEnum):
    """How a watch wants its events."""

    RAW = watch_pb2.DELIVERY_MODE_RAW
    """Every watch event, in apiserver order, none skipped."""
    CONSISTENT = watch_pb2.DELIVERY_MODE_CONSISTENT
    """Per object, only states consistent with this pod's own writes; a slow watcher gets the latest."""


class EventType(enum.IntEnum):
    """What an event tells."""

    UNSPECIFIED = watch_pb2.EVENT_TYPE_UNSPECIFIED
    ADDED = watch_pb2.EVENT_TYPE_ADDED
    """The object exists (initial state, creation, or reappearance after a relist)."""
    MODIFIED = watch_pb2.EVENT_TYPE_MODIFIED
    """The object changed."""
    DELETED = watch_pb2.EVENT_TYPE_DELETED
    """The object is gone; ``object`` is its last known state."""
    SYNCED = watch_pb2.EVENT_TYPE_SYNCED
    """Marker: every object of the initial state (or of a fresh snapshot) has been delivered."""
    RESYNC_REQUIRED = watch_pb2.EVENT_TYPE_RESYNC_REQUIRED
    """Marker: the watch could not resume; a fresh snapshot (ADDED..., SYNCED) follows to reconcile against."""


class Consistency(enum.IntEnum):
    """How an event relates to this pod's own writes."""

    UNSPECIFIED = watch_pb2.CONSISTENCY_UNSPECIFIED
    CONSISTENT = watch_pb2.CONSISTENCY_CONSISTENT
    """No write of this pod to the object is pending."""
    AWAITING_OWN_WRITE = watch_pb2.CONSISTENCY_AWAITING_OWN_WRITE
    """A write of this pod is pending and this state predates it (RAW mode only)."""
    OWN_WRITE = watch_pb2.CONSISTENCY_OWN_WRITE
    """Exactly the state this pod's own write produced."""
    TIMED_OUT = watch_pb2.CONSISTENCY_TIMED_OUT
    """This pod's write was not seen in time; this is the latest state known."""


@dataclass(frozen=True)
class View:
    """How much of each object a watch (or a queue's query) keeps in the sidecar and delivers (``ObjectView``):
    less held is less memory in the sidecar. Queries with different views are different upstream watches, each
    with its own cache; queries with the same view share one. ``View()`` (as no view) is the whole object
    without ``metadata.managedFields``. The sidecar refuses a bad view with ConsistdError INVALID_ARGUMENT
    naming the field (``view.fields[1]: ...``).

    >>> consistd.View(metadata_only=True)                              # metadata only
    >>> consistd.View(fields=("spec.replicas", "status.conditions"))  # a projection
    """

    #: Only each object's metadata, read with the apiserver's metadata-only requests (PartialObjectMetadata, as
    #: client-go's metadata informer and controller-runtime's OnlyMetadata): no spec, status or data;
    #: apiVersion and kind still name the resource. Not with ``fields``.
    metadata_only: bool = False
    #: Only these fields, as dot-separated paths ("spec.replicas", "status.conditions", "metadata.labels"),
    #: beside apiVersion, kind and metadata's name, namespace, uid, resourceVersion, generation and
    #: deletionTimestamp, which every view keeps. An array is kept whole; a path the object does not have
    #: keeps nothing. At most 32 paths; not with ``metadata_only``. Kept as a tuple.
    fields: Sequence[str] = ()
    #: Keep ``metadata.managedFields`` (server-side apply's bookkeeping), dropped otherwise.
    managed_fields: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.fields, str):
            raise TypeError(f"View(fields={self.fields!r}): give a sequence of paths, not one string")
        object.__setattr__(self, "fields", tuple(self.fields))

    def to_proto(self) -> object_pb2.ObjectView:
        """The protocol message."""
        return object_pb2.ObjectView(
            metadata_only=self.metadata_only, fields=self.fields, managed_fields=self.managed_fields
        )


def view_to_proto(view: View | None) -> object_pb2.ObjectView | None:
    """The view as a request carries it: None (no view) for None and for ``View()``, so that such a request is
    as one without views."""
    if view is None or view == View():
        return None
    return view.to_proto()


@dataclass(frozen=True)
class Event:
    """One event of a watch, or one of its markers (SYNCED, RESYNC_REQUIRED)."""

    type: EventType
    #: The object; None for SYNCED and RESYNC_REQUIRED.
    object: Object | None
    #: Resume position after this event (pass it as ``resume_cursor`` to continue from here).
    cursor: str
    #: How the object's state relates to this pod's own writes, as the daemon judged it when it sent it.
    consistency: Consistency
    #: RAW mode only: True when, as the app took this ADDED or MODIFIED event, a write of this client to
    #: the object had already returned a larger resourceVersion (the state is older than the app's own
    #: write). A CONSISTENT watch drops such events instead.
    predates_own_write: bool = False
    #: For a MODIFIED event: the resourceVersion of the state of this object that the daemon's watch saw directly
    #: before this one, so no write to the object came between the two (it names the daemon's watch's previous
    #: state, which a CONSISTENT watch may not have delivered). Empty when that is not known: ADDED and DELETED
    #: events, and states from a list or a snapshot (the first one, a relist, a resync), where writes in between
    #: were never seen. With it an app tells the state its own write made on top of a state it had (this state's
    #: resourceVersion is the one its write returned, and this is the state it wrote on) from one that also holds
    #: someone else's change; ``client.watch_latest`` does so (see Latest).
    previous_resource_version: str = ""

    @classmethod
    def from_proto(cls, r: watch_pb2.SubscribeResponse, predates_own_write: bool = False) -> Event:
        """The event carried by a protocol message."""
        return cls(
            type=EventType(r.type),
            object=Object.from_proto(r.object) if r.HasField("object") else None,
            cursor=r.cursor,
            consistency=Consistency(r.consistency),
            predates_own_write=predates_own_write,
            previous_resource_version=r.previous_resource_version,
        )


#: The events the own-write rule judges; DELETED, SYNCED and RESYNC_REQUIRED always pass.
_JUDGED = frozenset({watch_pb2.EVENT_TYPE_ADDED, watch_pb2.EVENT_TYPE_MODIFIED})


class Watch:
    """An async iterator of a watch's events (``client.watch(...)``).

    When the connection to the sidecar is lost (UNAVAILABLE, or the stream ends without the caller
    stopping it), it subscribes again with the cursor of the last event it delivered, with backoff,
    so each event arrives once; if the daemon cannot resume from there, the next events are
    RESYNC_REQUIRED and a fresh snapshot ending in SYNCED. Any other error ends the iteration with a
    ``ConsistdError``. ``aclose()`` (or leaving ``async with``) ends the subscription.

    The own-write rule: when the app takes an ADDED or MODIFIED event whose object a write of the same
    client (``client.objects``) already returned with a larger resourceVersion, a CONSISTENT watch drops
    it and hands over the next event, and a RAW watch delivers it with ``predates_own_write`` True. The
    daemon judged the state when it sent it, before the write reached it; the state then waited here.
    """

    def __init__(
        self,
        stub: WatchServiceStub,
        request: watch_pb2.SubscribeRequest,
        own_writes: OwnWrites | None = None,
        *,
        judged: bool = True,
    ) -> None:
        self._stub = stub
        self._request = request
        # The client's record of its writes, shared with its objects client and its other watches.
        self._own_writes = own_writes if own_writes is not None else OwnWrites()
        # Whether the own-write rule is applied here; not for the reader of a Latest, which applies it where its
        # worker takes a state and must see every state the daemon sent to keep its books.
        self._judged = judged
        # The open subscription; None before the first read and between reconnects.
        self._call: grpc.aio.UnaryStreamCall | None = None
        self._backoff = Backoff()
        self._closed = False

    @property
    def cursor(self) -> str:
        """The cursor of the last event delivered, or dropped by the own-write rule (where a reconnect
        resumes); empty before the first."""
        return self._request.resume_cursor

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Event:
        while not self._closed:
            if self._call is None:
                self._call = self._stub.Subscribe(self._request)
            try:
                response = await self._call.read()
            except asyncio.CancelledError:
                # grpc.aio cancels the call with the read; a later read subscribes again from the cursor.
                self._call = None
                if self._closed and not task_cancelled():
                    break  # aclose() from another task
                raise
            except grpc.aio.AioRpcError as e:
                error = ConsistdError.from_rpc(e)
                code, message = error.code, error.message
            else:
                if response is not grpc.aio.EOF:
                    self._backoff.reset()
                    # A dropped event was processed too: a reconnect resumes after it, not before.
                    if response.cursor:
                        self._request.resume_cursor = response.cursor
                    event = self._take(response)
                    if event is None:
                        continue
                    return event
                code, message = grpc.StatusCode.UNAVAILABLE, "the sidecar ended the watch"
            self._call = None
            if not is_retryable(code):
                self._closed = True
                raise ConsistdError(code, message)
            log.info("watch of %s lost (%s: %s); resubscribing", self._request.resource, code.name, message)
            await self._backoff.wait()
        raise StopAsyncIteration

    def _take(self, response: watch_pb2.SubscribeResponse) -> Event | None:
        """The event the app takes now, or None when the own-write rule drops it (CONSISTENT). The rule
        is applied here, as the app takes the event, and not when it arrived: a write the app made while
        the event waited unread must count."""
        predates = (
            self._judged
            and response.type in _JUDGED
            and self._own_writes.predates(response.object.uid, response.object.resource_version)
        )
        if predates and self._request.mode == watch_pb2.DELIVERY_MODE_CONSISTENT:
            log.debug(
                "dropped %s %s/%s@%s: older than this client's own write",
                EventType(response.type).name,
                response.object.namespace,
                response.object.name,
                response.object.resource_version,
            )
            return None
        return Event.from_proto(response, predates_own_write=predates)

    async def aclose(self) -> None:
        """Ends the subscription; the iteration stops."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
