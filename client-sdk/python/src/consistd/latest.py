"""The newest state per object of a CONSISTENT watch, handed to the app's workers when they ask, with the own-write
rule applied at that moment and no worker handed back the state its own write made on the state it had: the way to
consume a watch whose handler is slow (``client.watch_latest``).

An app that reads a watch into a buffer of its own (the newest state per object) while a worker per object handles
one state at a time takes each state twice: when its reader takes it from the watch, and when its worker takes it
from the buffer. The watch applies the own-write rule at the first take; a state taken while the worker was still
writing then waits in the buffer, and the worker, once its write returned, handles a state older than it (issue 46,
item 5: a Kopf-shaped app executed one value twice in 56). Here the buffer is the SDK's, and the rule is applied
when a worker is handed a state.

A worker that writes on the state it was handed would then be handed its own write's state, a change it made itself,
and handle the object once more for nothing. The daemon names, with each MODIFIED, the state its watch saw directly
before it (``Event.previous_resource_version``), so the hand-out can tell that state, made by the worker's write
alone on the state workers last had, from one that also holds another writer's change, and keeps it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType

import grpc

from ._own_writes import OwnWrites
from .errors import ConsistdError
from .objects import Object
from .watch import Consistency, Event, EventType, Watch

log = logging.getLogger("consistd.latest")

#: An object's key: its namespace (empty when cluster-scoped) and name.
Key = tuple[str, str]

#: The events that are objects' states: ADDED and MODIFIED (the own-write rule judges these), DELETED.
_STATES = frozenset({EventType.ADDED, EventType.MODIFIED, EventType.DELETED})


@dataclass
class Taken:
    """The state handed to a worker (``await latest.next()``): the object's newest event when it was handed out.
    The object stays in progress, handed to no other worker, until ``done()``."""

    #: ADDED, MODIFIED or DELETED.
    event: Event
    _latest: Latest = field(repr=False)
    _done: bool = field(default=False, repr=False)

    @property
    def namespace(self) -> str:
        """The object's namespace; empty when cluster-scoped."""
        assert self.event.object is not None
        return self.event.object.namespace

    @property
    def name(self) -> str:
        """The object's name."""
        assert self.event.object is not None
        return self.event.object.name

    def done(self) -> None:
        """Ends the work on this object: a state that came meanwhile is handed out next. Calling it again does
        nothing."""
        if not self._done:
            self._done = True
            assert self.event.object is not None
            self._latest._release((self.event.object.namespace, self.event.object.name))


class Latest:
    """The newest state of each object of a CONSISTENT watch, for workers that ask for the next one when they are
    ready (``client.watch_latest(...)``):

    >>> async with client.watch_latest("configmaps", namespace="default") as latest:
    ...     async def worker() -> None:
    ...         while True:
    ...             async with latest.take() as event:  # the object's newest state; no other worker has it meanwhile
    ...                 await handle(event)               # leaving the block hands the object on
    ...     await asyncio.gather(*(worker() for _ in range(4)))

    * **One pending state per object.** A task of the SDK's reads the watch continuously and keeps, per object
      (namespace and name), only the newest state not yet handed out: a DELETED replaces whatever waited, and so
      does a later state (a re-created object's ADDED replaces its deletion). That is the bound: one event per
      object, plus the identity (namespace, name, uid, resourceVersion) of each object the watch says exists,
      to tell deletions after a resync.
    * **Pulled, never pushed.** A worker asks for the next object's newest state; a slow worker never holds up the
      reader, and is never handed a state that waited in a queue while a newer one came.
    * **The own-write rule where the worker takes it.** An ADDED or MODIFIED state older than a write this client
      made and saw return is dropped when it would be handed out, however long it waited: a worker is never handed
      a state that predates its own write (the write's own state follows).
    * **Not handed back its own write.** An ADDED or MODIFIED state is not handed out either when it is exactly
      what this client's own write made on top of the state last handed out for that object: the same object
      (uid), its ``previous_resource_version`` is the state last handed out (or last kept back this way), and its
      resourceVersion is the largest one this client's writes to it returned. The worker already has that state
      and nothing else happened in between. Still handed out: a state whose previous one is another writer's (a
      change no worker saw came between), a state with no previous one (from a list or a resync's snapshot), and
      a state made by more than one write since the last hand-out (only the newest waits, so the states between
      were never handed out). Per object, the books keep the uid and resourceVersion of that last state, until
      the object's deletion.
    * **One worker per object at a time.** An object handed out is in progress until the worker is done with it
      (leaving ``async with latest.take()``, or ``taken.done()``); newer states wait meanwhile and are handed out
      after. So any number of workers can share one ``Latest``, each on a different object.
    * **Markers.** SYNCED and RESYNC_REQUIRED are not handed out. After RESYNC_REQUIRED (the watch could not
      resume), every object of the fresh snapshot is handed out again, and at its SYNCED each object the watch said
      existed but the snapshot does not hold is handed out as DELETED, its object carrying only its identity (the
      JSON holds ``metadata`` with name, namespace, uid and resourceVersion).
    * **Errors.** An error that ends the watch (anything but a lost connection, which the watch resumes from) is
      raised by every ``next()`` (and ``take()``) from then on, at once, as ConsistdError; states still pending are
      dropped. After ``aclose()`` (leaving ``async with``) they raise ConsistdError CANCELLED.

    The reader starts at ``async with`` (or the first ``next()``) on the running event loop.
    """

    def __init__(self, watch: Watch, own_writes: OwnWrites) -> None:
        #: The watch, its own-write rule off: applied here, where a worker takes a state.
        self._watch = watch
        self._own_writes = own_writes
        self._reader: asyncio.Task[None] | None = None
        #: The newest state of each object not handed out yet.
        self._pending: dict[Key, Event] = {}
        #: Keys with a pending state and no worker, oldest first: the order they are handed out in.
        self._ready: deque[Key] = deque()
        #: Keys a worker holds.
        self._taken: set[Key] = set()
        #: Per object, the (uid, resourceVersion) of the last state handed to a worker, or kept back as the state
        #: this client's own write made directly on that one: what a state's previous_resource_version is checked
        #: against when it would be handed out.
        #: Forgotten at the object's deletion, so it holds at most the live objects.
        self._seen: dict[Key, tuple[str, str]] = {}
        #: The identity of each object the watch says exists: what a resync's snapshot is checked against.
        self._live: dict[Key, Object] = {}
        #: Since RESYNC_REQUIRED and until its SYNCED, the keys the fresh snapshot held.
        self._resync: set[Key] | None = None
        #: What ended the watch: (code, message).
        self._failed: tuple[grpc.StatusCode, str] | None = None
        #: Workers waiting in next(), woken at every change.
        self._waiters: list[asyncio.Future[None]] = []

    def __len__(self) -> int:
        """How many objects have a state waiting (held by a worker or not)."""
        return len(self._pending)

    async def __aenter__(self) -> Latest:
        self._start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Ends the watch; workers waiting in ``next()`` raise ConsistdError CANCELLED."""
        if self._failed is None:
            self._fail(grpc.StatusCode.CANCELLED, "the newest-state watch was closed")
        await self._watch.aclose()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def next(self) -> Taken:
        """Waits for the next object with a pending state that no worker holds, and hands its newest state out
        (dropping, at this moment, a state older than this client's own write to it, and the state this client's
        own write made directly on the one last handed out: see Latest). Call ``done()`` on what it returns when
        the work is over; ``take()`` does that for you. Raises the ConsistdError that ended the watch. Cancelling a
        waiting call takes nothing."""
        self._start()
        while True:
            if self._failed is not None:
                raise ConsistdError(*self._failed)
            event = self._hand_out()
            if event is not None:
                return Taken(event, self)
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    @contextlib.asynccontextmanager
    async def take(self) -> AsyncIterator[Event]:
        """``async with latest.take() as event``: the next object's newest state (see ``next()``), handed on when
        the block ends, however it ends."""
        taken = await self.next()
        try:
            yield taken.event
        finally:
            taken.done()

    def _start(self) -> None:
        if self._reader is None and self._failed is None:
            self._reader = asyncio.get_running_loop().create_task(self._read(), name="consistd latest reader")

    async def _read(self) -> None:
        """Every event of the watch into the books, until the watch fails or is closed."""
        try:
            async for event in self._watch:
                self._arrived(event)
                self._wake()
        except ConsistdError as e:
            self._fail(e.code, e.message)
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("the newest-state reader failed")
            self._fail(grpc.StatusCode.UNKNOWN, f"the newest-state reader failed: {e!r}")
            return
        if self._failed is None:
            self._fail(grpc.StatusCode.CANCELLED, "the watch ended")

    def _arrived(self, event: Event) -> None:
        """Takes in one event of the watch."""
        if event.type == EventType.RESYNC_REQUIRED:
            self._resync = set()
        elif event.type == EventType.SYNCED:
            seen, self._resync = self._resync, None
            if seen is not None:
                for key in [k for k in self._live if k not in seen]:
                    self._put(key, _deleted(self._live.pop(key), event.cursor))
        elif event.type in _STATES and event.object is not None:
            obj = event.object
            key = (obj.namespace, obj.name)
            if event.type == EventType.DELETED:
                self._live.pop(key, None)
            else:
                self._live[key] = _identity(obj)
                if self._resync is not None:
                    self._resync.add(key)
            self._put(key, event)

    def _put(self, key: Key, event: Event) -> None:
        """Makes ``event`` the key's pending state, replacing an older one; the key becomes ready unless it already
        was or a worker holds it. A deletion forgets the state last handed out."""
        if event.type == EventType.DELETED:
            self._seen.pop(key, None)
        if key not in self._pending and key not in self._taken:
            self._ready.append(key)
        self._pending[key] = event

    def _hand_out(self) -> Event | None:
        """The next ready key's state, the key now taken; a state older than the client's own write is dropped here
        (the own-write rule at the take), and so is the state the client's own write made on the state last handed
        out."""
        while self._ready:
            key = self._ready.popleft()
            event = self._pending.pop(key, None)
            obj = event.object if event is not None else None
            if event is None or obj is None:
                continue
            if event.type != EventType.DELETED and self._own_writes.predates(obj.uid, obj.resource_version):
                log.debug("dropped %s/%s@%s: older than this client's own write", *key, obj.resource_version)
                continue  # its own write's state follows on the watch
            if event.type != EventType.DELETED:
                identity = (obj.uid, obj.resource_version)
                own = self._own_write_on_seen(key, event)
                self._seen[key] = identity
                if own:
                    log.debug("kept back %s/%s@%s: own write on the state last handed out", *key, obj.resource_version)
                    continue  # the worker already has it
            self._taken.add(key)
            return event
        return None

    def _own_write_on_seen(self, key: Key, event: Event) -> bool:
        """Whether ``event`` is exactly the state this client's own write made directly on the key's state last
        handed out (or kept back): the same uid, its previous state that one, and its resourceVersion the largest
        this client's writes to the object returned."""
        obj = event.object
        seen = self._seen.get(key)
        return (
            obj is not None
            and seen is not None
            and seen[0] == obj.uid
            and event.previous_resource_version != ""
            and event.previous_resource_version == seen[1]
            and self._own_writes.wrote(obj.uid, obj.resource_version)
        )

    def _release(self, key: Key) -> None:
        self._taken.discard(key)
        if key in self._pending:
            self._ready.append(key)
        self._wake()

    def _fail(self, code: grpc.StatusCode, message: str) -> None:
        self._failed = (code, message)
        self._pending.clear()
        self._ready.clear()
        self._seen.clear()
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def _deleted(identity: Object, cursor: str) -> Event:
    """The DELETED event of an object a resync's snapshot no longer holds: its identity, and as JSON its metadata."""
    metadata = {"name": identity.name, "uid": identity.uid, "resourceVersion": identity.resource_version}
    if identity.namespace:
        metadata["namespace"] = identity.namespace
    raw = json.dumps({"metadata": metadata}, separators=(",", ":")).encode()
    obj = Object(
        uid=identity.uid,
        namespace=identity.namespace,
        name=identity.name,
        resource_version=identity.resource_version,
        raw=raw,
    )
    return Event(type=EventType.DELETED, object=obj, cursor=cursor, consistency=Consistency.UNSPECIFIED)


def _identity(obj: Object) -> Object:
    """What the books keep of a live object: its identity, not its JSON."""
    return Object(uid=obj.uid, namespace=obj.namespace, name=obj.name, resource_version=obj.resource_version, raw=b"")
