"""The reconciler: a work queue's items handed to a handler, at most ``max_leases`` at once and never two for
one key, each lease completed by how the handler ended (ReconcileService.Reconcile)."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, cast

import grpc
from google.protobuf import duration_pb2

from ._retry import Backoff, is_retryable, task_cancelled
from .errors import ConsistdError
from .inbox import call_handler
from .objects import ConditionStatus, EventSeverity, Guard, Object, Objects, SetConditionResult
from .ordered import refused
from .v1 import reconcile_pb2
from .watch import Consistency, View, view_to_proto

if TYPE_CHECKING:
    from .v1.reconcile_pb2_grpc import ReconcileServiceStub

log = logging.getLogger("consistd.reconcile")

#: The longest error text a completion may carry, in bytes; a longer one is cut.
MAX_ERROR_BYTES = 4096
#: The shortest REQUEUE delay the sidecar takes, in seconds: a shorter one (0 included) is sent as this.
MIN_REQUEUE = 0.001
#: The longest REQUEUE delay the sidecar takes, in seconds (a day): a longer one is sent as this.
MAX_REQUEUE = 86_400.0

#: A duration: seconds, or a timedelta.
Seconds = float | timedelta

#: How a related object names its primary: exactly one of these fields of Related is set.
_MAPS_BY = ("controller_owner", "label", "annotation", "field")


class ShardBy(enum.IntEnum):
    """What a ``sharded`` queue hashes a key by to find its slot."""

    DEFAULT = reconcile_pb2.SHARD_BY_UNSPECIFIED
    """The key, as KEY."""
    KEY = reconcile_pb2.SHARD_BY_KEY
    """The key, namespace and name: keys spread evenly over the slots; every member watches every object."""
    NAMESPACE = reconcile_pb2.SHARD_BY_NAMESPACE
    """The key's namespace, as Kubernetes' sharded list and watch (KEP-5866) hashes ``metadata.namespace``: a
    namespace's keys are owned together, and each member lists and watches only its slots' namespaces (where the
    apiserver honours shard selectors; elsewhere the sidecar drops the rest itself). Only for a primary of a
    namespaced resource in every namespace; related queries are watched whole."""


class Changed(enum.Flag):
    """Parts of an object whose change queues a pass (``only_changes_of`` of ReconcileSpec and of Related),
    combined with ``|``: ``Changed.GENERATION | Changed.LABELS``. Any part named will do (controller-runtime's
    GenerationChangedPredicate and label and annotation predicates, kube-rs's ``predicates``)."""

    GENERATION = enum.auto()
    """``metadata.generation``, which the apiserver moves on a change of the spec, not of status or metadata
    alone; an object without one (a ConfigMap, a Secret) counts every change."""
    LABELS = enum.auto()
    """``metadata.labels``."""
    ANNOTATIONS = enum.auto()
    """``metadata.annotations``."""


@dataclass(frozen=True)
class Related:
    """Objects whose changes queue the primary they name (a ``RelatedQuery``). Set exactly one of
    ``controller_owner`` (the controller ownerReference whose kind is the primary's), ``label``,
    ``annotation`` or ``field`` (a dot-separated path such as ``"spec.configMapName"``): a value ``"name"``
    names the primary in the related object's own namespace, ``"namespace/name"`` names it anywhere."""

    #: The related objects' resource, in any form a watch accepts.
    resource: str
    #: Their namespace; empty for every namespace (or a cluster-scoped resource).
    namespace: str = ""
    label_selector: str = ""
    field_selector: str = ""
    controller_owner: bool = False
    label: str = ""
    annotation: str = ""
    field: str = ""
    #: How much of each related object the queue's watch keeps (see View); None: the whole object without
    #: ``metadata.managedFields``. A projection also keeps what the mapping reads; a metadata-only view can map
    #: by ``controller_owner``, ``label``, ``annotation``, or a ``field`` under metadata.
    view: View | None = None
    #: The priority of the passes its changes queue (the primary's changes: 0): a higher one is handed out
    #: first, and a key already queued rises to it.
    priority: int = 0
    #: Only a change of these parts of a related object queues its primary (see Changed); a related object's
    #: first state, its deletion, its deletionTimestamp being set and its move to another primary always do.
    #: None (or no part): every change.
    only_changes_of: Changed | None = None

    def __post_init__(self) -> None:
        given = [name for name in _MAPS_BY if getattr(self, name)]
        if len(given) > 1:
            raise ValueError(f"Related({self.resource!r}): set one of {', '.join(_MAPS_BY)}, not {' and '.join(given)}")

    def to_proto(self) -> reconcile_pb2.RelatedQuery:
        """The protocol message (with no way to name the primary set, the sidecar refuses it naming the field)."""
        query = reconcile_pb2.ObjectQuery(
            resource=self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            view=view_to_proto(self.view),
            changes=_change_filter(self.only_changes_of),
        )
        maps_by = {name: getattr(self, name) for name in _MAPS_BY if getattr(self, name)}
        return reconcile_pb2.RelatedQuery(query=query, priority=self.priority, **maps_by)


@dataclass(frozen=True)
class ReconcileSpec:
    """A work queue (``QueueSpec``): which objects are the work and how it is handed out. Reconcilers that
    open the same ``name`` on one sidecar share the queue (the spec must be the same): a key is handed to at
    most one of them at a time. Every field the sidecar refuses raises ConsistdError INVALID_ARGUMENT naming
    it (``spec.max_leases: ...``)."""

    #: The queue's name, a DNS label (lowercase letters, digits, '-'): its metrics' ``name`` label and the
    #: name ``consistd status`` shows.
    name: str
    #: The primary objects' resource ("configmaps", "apps/v1/deployments", ...): each object is one key.
    resource: str
    #: Their namespace; empty for every namespace (or a cluster-scoped resource).
    namespace: str = ""
    label_selector: str = ""
    field_selector: str = ""
    #: How much of each primary object the queue's watch keeps and hands out as ``WorkItem.object`` (see View);
    #: None: the whole object without ``metadata.managedFields``.
    view: View | None = None
    #: Other objects whose changes queue the primary they name.
    related: Sequence[Related] = ()
    #: How many handlers run at once (controller-runtime's MaxConcurrentReconciles); 1 to 10,000.
    max_leases: int = 1
    #: A RETRY waits ``retry_base_delay * 2**(failures-1)``, at most ``retry_max_delay``, and a token of a
    #: bucket the queue shares (``retry_rate`` per second, ``retry_burst``). None: client-go's 5 ms, 1000 s,
    #: 10/s and 100.
    retry_base_delay: Seconds | None = None
    retry_max_delay: Seconds | None = None
    retry_rate: float | None = None
    retry_burst: int | None = None
    #: A handler not done within this goes on, but its lease goes back to the queue (and its completion is
    #: refused); None: 10 minutes.
    lease_timeout: Seconds | None = None
    #: When set, work is handed out only while this sidecar leads the election (a Lease name), and every
    #: item carries the term and a ``guard`` for its writes. With ``sharded``, it names the group whose members
    #: share the keys instead.
    election: str = ""
    #: The election Lease's namespace; empty for the sidecar's own.
    election_namespace: str = ""
    #: Spread the keys over every pod whose sidecar runs this queue (same name, same spec) under ``election``,
    #: which then names the group whose members share them: each key is leased to one pod at a time across the
    #: group. Needs ``election`` (the sidecar refuses it without one, INVALID_ARGUMENT naming ``spec.sharded``).
    #: Each item's ``term`` is then the epoch of the key's slot, and its ``guard`` works unchanged.
    sharded: bool = False
    #: What a ``sharded`` queue hashes a key by to find its slot: ``ShardBy.KEY`` (as the default) spreads the keys
    #: evenly; ``ShardBy.NAMESPACE`` keeps a namespace's keys together, and each pod's sidecar then lists and
    #: watches only its share of the namespaces (Kubernetes' sharded list and watch, KEP-5866). Needs ``sharded``
    #: and a primary of a namespaced resource in every namespace (the sidecar refuses it otherwise,
    #: INVALID_ARGUMENT naming ``spec.shard_by``).
    shard_by: ShardBy = ShardBy.DEFAULT
    #: Only a change of these parts of a primary queues a pass (``Changed.GENERATION``: a write of status or
    #: metadata alone hands out nothing; see Changed); an object's first state, its deletion and its
    #: deletionTimestamp being set always do. None (or no part): every change.
    only_changes_of: Changed | None = None
    #: A finalizer the queue keeps on its primary objects, a qualified name (``"example.com/cleanup"``; the
    #: sidecar refuses another, INVALID_ARGUMENT naming ``spec.finalizer``); empty for none. The sidecar adds it
    #: before an object's first pass, and hands out an object being deleted that still carries it as a finalize
    #: pass (``WorkItem.finalizing``): DONE removes it (a deposed leader's removal is refused), anything else
    #: keeps it. Needs a primary the sidecar may patch.
    finalizer: str = ""

    def to_proto(self) -> reconcile_pb2.QueueSpec:
        """The protocol message."""
        retry = None
        if (self.retry_base_delay, self.retry_max_delay, self.retry_rate, self.retry_burst) != (None,) * 4:
            retry = reconcile_pb2.RetryPolicy(
                base_delay=_duration(self.retry_base_delay),
                max_delay=_duration(self.retry_max_delay),
                rate=self.retry_rate or 0.0,
                burst=self.retry_burst or 0,
            )
        election = None
        if self.election or self.election_namespace:
            election = reconcile_pb2.ElectionRef(election=self.election, namespace=self.election_namespace)
        return reconcile_pb2.QueueSpec(
            name=self.name,
            primary=reconcile_pb2.ObjectQuery(
                resource=self.resource,
                namespace=self.namespace,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                view=view_to_proto(self.view),
                changes=_change_filter(self.only_changes_of),
            ),
            related=[r.to_proto() for r in self.related],
            max_leases=self.max_leases,
            retry=retry,
            lease_timeout=_duration(self.lease_timeout),
            election=election,
            sharded=self.sharded,
            # Without sharded it goes as it is: the sidecar refuses it, naming spec.shard_by.
            shard_by=cast("reconcile_pb2.ShardBy", int(self.shard_by)),
            finalizer=self.finalizer,
        )


@dataclass(frozen=True)
class WorkItem:
    """A lease on one key (namespace/name of a primary object): until the handler ends (or the lease times
    out) no other handler gets the key, on this sidecar."""

    #: Names the lease; writes through ``objects`` name it, so the key's next pass waits until they show.
    lease_id: str
    #: The primary's namespace (empty when cluster-scoped) ...
    namespace: str
    #: ... and name.
    name: str
    #: The primary as the sidecar's cache held it when the lease was granted (``.json``, ``.raw``), as the
    #: spec's ``view`` keeps it; None when a related object queued the key but no such primary exists.
    object: Object | None
    #: The primary was deleted: ``object`` is its last known state. Handed out once.
    deleted: bool
    #: CONSISTENT: at least as new as every write this pod made to it (and, naming a lease of this key, to
    #: its related objects). TIMED_OUT: such a write was not seen in time; this is the latest state known.
    consistency: Consistency
    #: 1 for the first pass after a change; n for the nth pass in a row after the handler raised.
    attempt: int
    #: The election's term the lease was granted in; 0 without an election. In a ``sharded`` queue, the epoch
    #: of the key's slot.
    term: int
    #: When the lease times out and goes back to the queue.
    expires_at: datetime | None
    #: What the previous attempt raised, when this pass follows one that did.
    last_error: str
    #: The client's objects with every write naming this lease (``reconcile_lease``): the key's next pass
    #: waits until the queue's watches show them. With an election, the daemon guards each of them with the
    #: lease's term (and refuses one naming a lease no longer held).
    objects: Objects = dataclasses.field(repr=False, compare=False)
    #: With an election, the guard of the term the lease was granted in: a write carrying it succeeds
    #: only while this sidecar still leads in that term. In a ``sharded`` queue, the same guard (the spec's
    #: election, the item's term: the slot's epoch) on a write naming the lease, as ``objects``' do, carries the
    #: slot's claim. None without an election.
    guard: Guard | None = None
    #: A finalize pass: the primary is being deleted and still carries the spec's ``finalizer`` (DONE removes it).
    finalizing: bool = False
    #: The queue's primary resource, as the spec names it (``ReconcileSpec.resource``): what ``set_condition``
    #: writes to and ``record_event`` reports about.
    resource: str = ""
    #: The queue's name (``ReconcileSpec.name``): the reporting controller of the events ``record_event`` records.
    queue: str = ""

    @property
    def key(self) -> str:
        """``namespace/name``, or ``name`` when cluster-scoped."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def timed_out(self) -> bool:
        """Whether a write of this pod was not seen in time (``consistency`` TIMED_OUT)."""
        return self.consistency == Consistency.TIMED_OUT

    async def set_condition(
        self,
        type: str,
        status: ConditionStatus | str,
        reason: str,
        message: str = "",
    ) -> SetConditionResult:
        """Sets the status condition ``type`` of this item's primary, as apimachinery's ``meta.SetStatusCondition``
        does, in the sidecar (``Objects.set_condition``): its observedGeneration is the metadata.generation of the
        ``object`` this pass was handed (0 when there is none: the sidecar then takes the generation it reads), its
        lastTransitionTime is kept while its status stays, and it is written only when something changed, with
        server-side apply to the status subresource under a field manager per condition type, so one condition
        never drops another (the primary's status.conditions must be a list map keyed by type, as Go's
        ``[]metav1.Condition`` with ``+listType=map`` and ``+listMapKey=type`` generates it). The write goes
        through ``objects``: it names this item's lease (the key's next pass waits until it shows, and the
        handler's own write queues no pass), and when the queue follows an election the sidecar guards it with the
        lease's term. ``status`` is a ConditionStatus or ``"True"``, ``"False"``, ``"Unknown"``; anything else
        raises ValueError before anything is sent. The answer says whether it wrote (``changed``) and the
        ``last_transition_time``."""
        return await self.objects.set_condition(
            self.resource,
            self.name,
            type,
            status,
            reason,
            message,
            namespace=self.namespace,
            observed_generation=_generation(self.object),
        )

    async def record_event(
        self,
        severity: EventSeverity | str,
        reason: str,
        action: str,
        note: str = "",
    ) -> bool:
        """Records an event (events.k8s.io/v1) about this item's primary, reported by the queue: its name
        (``queue``) is the event's reporting controller. As client-go's event recorder does, in the sidecar
        (``Objects.record_event``), once for every app of the pod: a repeat within 6 minutes (the same severity,
        reason, action, reporting controller and object), from this app or another of the pod, is counted on the
        first one's series (its count and lastObservedTime; its note stays the first's), not written anew; and the
        queue's events about one object pass client-go's rate limit (a burst of 25, then one per 5 minutes).
        Returns whether it was recorded: False when that limit dropped it. The event names the ``object`` this pass
        was handed by its uid (when there is none the sidecar reads it). ``severity`` is an EventSeverity or
        ``"Normal"``, ``"Warning"``; anything else raises ValueError before anything is sent. ``reason`` and
        ``action`` are CamelCase (``"Drifted"``, ``"Reconcile"``), 1 to 128 characters; ``note``, for humans, at
        most 1024 bytes. The event is not a write of the primary: it names no lease. RBAC: the sidecar's service
        account needs create and patch on ``events.k8s.io`` ``events``."""
        return await self.objects.record_event(
            self.resource,
            self.name,
            severity,
            reason,
            action,
            note,
            namespace=self.namespace,
            uid=self.object.uid if self.object is not None else "",
            reporting_controller=self.queue,
        )


@dataclass(frozen=True)
class Requeue:
    """What a handler returns to be handed the key again after ``after`` seconds (sooner if the object
    changes meanwhile): ``return consistd.requeue_after(30)``."""

    after: float
    #: The priority of the pass it queues: a higher one is handed out first.
    priority: int = 0


def requeue_after(delay: Seconds, *, priority: int = 0) -> Requeue:
    """The handler's result asking for the key again after ``delay`` (seconds or a timedelta), sooner if
    the object changes; the sidecar takes 1 ms to a day (0 asks for the key again at once). ``priority`` is
    the pass's (controller-runtime's ``Result.Priority``): a higher one is handed out first; default 0."""
    return Requeue(after=delay.total_seconds() if isinstance(delay, timedelta) else float(delay), priority=priority)


class Terminal(Exception):  # noqa: N818 (what it means to the queue, not that it is an error)
    """Raised by a handler whose key failed in a way retrying cannot help: the lease ends TERMINAL with
    this text, and the key waits until its object (or a related one) changes."""


#: A reconcile handler: a coroutine function (or a plain function, run in a worker thread) taking a
#: WorkItem. Returning None is DONE, returning ``requeue_after(...)`` is REQUEUE, raising is RETRY (with
#: the exception's text), raising ``Terminal`` is TERMINAL.
ReconcileHandler = Callable[[WorkItem], Awaitable[Requeue | None] | Requeue | None]


class Reconciler:
    """Runs a handler on a queue's work items (``await client.reconcile(spec, handler)``).

    Every item runs in a task of its own, at most ``max_leases`` at once; the completion goes out on the
    stream when the handler ends. When the connection to the sidecar is lost (UNAVAILABLE, or the stream
    ends unasked) the queue is opened again with the same spec, with backoff: the sidecar returned the old
    stream's leases, so the completions of handlers still running for it are dropped, and an item of the
    new stream waits for a handler of the old one still running on its key, and for a free slot. A spec the
    sidecar refuses raises ConsistdError; cancelling ``run()`` cancels the running handlers and closes the
    stream."""

    def __init__(
        self, stub: ReconcileServiceStub, objects: Objects, spec: ReconcileSpec, handler: ReconcileHandler
    ) -> None:
        self._stub = stub
        self._objects = objects
        self._spec = spec
        self._request = reconcile_pb2.ReconcileRequest(spec=spec.to_proto())
        self._handler = handler
        # Handlers running, of every stream (the daemon bounds them per stream; this, across a reconnect).
        self._slots = asyncio.Semaphore(max(spec.max_leases, 1))
        # Per key, the task of its latest item: the next item of the key waits for it.
        self._latest: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def run(self) -> None:
        """Handles work items until cancelled; raises ConsistdError when the sidecar refuses the spec
        (INVALID_ARGUMENT naming the field, FAILED_PRECONDITION, NOT_FOUND, PERMISSION_DENIED) or ends the
        stream with any error but UNAVAILABLE."""
        self._stopping = False
        backoff = Backoff()
        try:
            while True:
                stream = _Stream(self._stub.Reconcile(), self._request)
                try:
                    error = await self._serve(stream, backoff)
                finally:
                    stream.end()
                if not is_retryable(error.code):
                    raise error
                name, code = self._spec.name, error.code.name
                log.info("reconcile queue %s lost (%s: %s); opening it again", name, code, error.message)
                await backoff.wait()
        finally:
            await self._stop()

    async def _serve(self, stream: _Stream, backoff: Backoff) -> ConsistdError:
        """Reads the stream until it ends, starting a task per work item; returns why it ended."""
        while True:
            try:
                response = await stream.call.read()
            except grpc.aio.AioRpcError as e:
                return ConsistdError.from_rpc(e)
            if response is grpc.aio.EOF:
                return ConsistdError(grpc.StatusCode.UNAVAILABLE, "the sidecar ended the reconcile stream")
            kind = response.WhichOneof("response")
            if kind == "started":
                backoff.reset()
                log.info(
                    "reconcile queue %s started (comparable resourceVersions: %s)",
                    response.started.name,
                    response.started.comparable_resource_versions,
                )
            elif kind == "item":
                self._start(stream, self._item(response.item))
            elif kind == "refused":
                # The lease, if still this stream's, stays held until it times out; the handler is done.
                log.warning(
                    "reconcile queue %s refused the completion of lease %s: %s",
                    self._spec.name,
                    response.refused.lease_id,
                    refused(response.refused.refusal),
                )

    def _item(self, w: reconcile_pb2.WorkItem) -> WorkItem:
        guard = None
        if self._spec.election:
            guard = Guard(election=self._spec.election, namespace=self._spec.election_namespace, term=w.term)
        return WorkItem(
            lease_id=w.lease_id,
            namespace=w.namespace,
            name=w.name,
            object=Object.from_proto(w.object) if w.HasField("object") else None,
            deleted=w.deleted,
            consistency=Consistency(w.consistency),
            attempt=w.attempt,
            term=w.term,
            expires_at=w.expires_at.ToDatetime(tzinfo=timezone.utc) if w.HasField("expires_at") else None,
            last_error=w.last_error,
            objects=self._objects.for_lease(w.lease_id),
            guard=guard,
            finalizing=w.finalizing,
            resource=self._spec.resource,
            queue=self._spec.name,
        )

    def _start(self, stream: _Stream, item: WorkItem) -> None:
        """Starts the item's task; it waits for the task of the key's previous item, if one still runs (it
        can only be of a lost stream: the sidecar never leases a key twice at once)."""
        key = (item.namespace, item.name)
        previous = self._latest.get(key)
        task = asyncio.get_running_loop().create_task(
            self._work(stream, item, previous), name=f"consistd-reconcile {self._spec.name} {item.key}"
        )
        self._latest[key] = task
        self._tasks.add(task)

        def finished(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if self._latest.get(key) is task:
                del self._latest[key]

        task.add_done_callback(finished)

    async def _work(self, stream: _Stream, item: WorkItem, previous: asyncio.Task[None] | None) -> None:
        """Runs the handler on one item once its key and a slot are free, and sends the completion."""
        try:
            if previous is not None:
                await asyncio.wait([previous])
            async with self._slots:
                if stream.lost:
                    return  # its lease went back with its stream; the key comes again on the new one
                completion = await self._handle(item)
            if not stream.complete(completion):
                log.info(
                    "dropped the completion of %s (lease %s): its stream was lost, and the lease with it",
                    item.key,
                    item.lease_id,
                )
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug of the SDK's: never let a task's error go unseen
            log.exception("reconcile queue %s: handling %s failed", self._spec.name, item.key)

    async def _handle(self, item: WorkItem) -> reconcile_pb2.Completion:
        """Calls the handler and turns how it ended into the lease's completion."""
        lease = item.lease_id
        try:
            result = await call_handler(self._handler, item)
        except Terminal as e:
            log.warning("handler gave up on %s (attempt %d): %s", item.key, item.attempt, _text(e))
            return reconcile_pb2.Completion(lease_id=lease, outcome=reconcile_pb2.OUTCOME_TERMINAL, error=_text(e))
        except asyncio.CancelledError as e:
            if self._stopping or task_cancelled():
                raise
            # The handler's own await was cancelled, not the handler: a failure like any other.
            result = e
        except Exception as e:  # any failure of the handler means "hand it out again after its backoff"
            result = e
        if isinstance(result, BaseException):
            log.warning("handler failed on %s (attempt %d); retrying: %r", item.key, item.attempt, result)
            return reconcile_pb2.Completion(lease_id=lease, outcome=reconcile_pb2.OUTCOME_RETRY, error=_text(result))
        if result is None:
            return reconcile_pb2.Completion(lease_id=lease, outcome=reconcile_pb2.OUTCOME_DONE)
        if isinstance(result, Requeue):
            after = _duration(min(max(result.after, MIN_REQUEUE), MAX_REQUEUE))
            return reconcile_pb2.Completion(
                lease_id=lease, outcome=reconcile_pb2.OUTCOME_REQUEUE, requeue_after=after, priority=result.priority
            )
        error = f"the handler returned {result!r}; return None, or consistd.requeue_after(...)"
        log.warning("handler failed on %s (attempt %d); retrying: %s", item.key, item.attempt, error)
        return reconcile_pb2.Completion(lease_id=lease, outcome=reconcile_pb2.OUTCOME_RETRY, error=_text(error))

    async def _stop(self) -> None:
        """Cancels every handler still running and waits for them."""
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Stream:
    """One opened Reconcile call: a writer task sends the spec, then each completion as its handler ends;
    ``lost`` once the call ended (its leases went back to the queue), after which completions are dropped."""

    def __init__(self, call: grpc.aio.StreamStreamCall, spec: reconcile_pb2.ReconcileRequest) -> None:
        self.call = call
        self.lost = False
        self._out: asyncio.Queue[reconcile_pb2.ReconcileRequest] = asyncio.Queue()
        self._out.put_nowait(spec)
        self._writer = asyncio.get_running_loop().create_task(self._write(), name="consistd-reconcile-writer")

    async def _write(self) -> None:
        try:
            while True:
                await self.call.write(await self._out.get())
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            # The call ended (the connection went, or the spec was refused): its reader reports why.
            log.debug("reconcile stream: a write failed: %r", e)

    def complete(self, completion: reconcile_pb2.Completion) -> bool:
        """Queues a completion for the writer; False when the stream was lost."""
        if self.lost:
            return False
        self._out.put_nowait(reconcile_pb2.ReconcileRequest(complete=completion))
        return True

    def end(self) -> None:
        """Closes the call; the sidecar returns its leases to the queue."""
        self.lost = True
        self._writer.cancel()
        self.call.cancel()


def _text(error: BaseException | str) -> str:
    """An error's text for a completion: the error and each error it was raised from (``raise ... from``),
    joined by ": " ("outer: cause: root cause", as the Rust SDK sends an error's sources), each its ``str``
    or, when that is empty, its type's name; cut to MAX_ERROR_BYTES of UTF-8."""
    if isinstance(error, str):
        text = error
    else:
        parts: list[str] = []
        seen: set[int] = set()
        cause: BaseException | None = error
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            parts.append(str(cause) or type(cause).__name__)
            cause = cause.__cause__
        text = ": ".join(parts)
    return text.encode(errors="replace")[:MAX_ERROR_BYTES].decode(errors="ignore")


def _generation(obj: Object | None) -> int:
    """The object's metadata.generation; 0 when there is no object or it has none (a view without it)."""
    if obj is None:
        return 0
    generation = obj.json.get("metadata", {}).get("generation")
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else 0


def _change_filter(parts: Changed | None) -> reconcile_pb2.ChangeFilter | None:
    """A query's ``changes``: None when no part is named (every change queues a pass)."""
    if not parts:
        return None
    return reconcile_pb2.ChangeFilter(
        generation=Changed.GENERATION in parts,
        labels=Changed.LABELS in parts,
        annotations=Changed.ANNOTATIONS in parts,
    )


def _duration(value: Seconds | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d
