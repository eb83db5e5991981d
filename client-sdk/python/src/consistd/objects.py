"""Kubernetes objects read and written through the sidecar, as JSON, optionally fenced by a leader's term."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from ._own_writes import OwnWrites
from .errors import unary
from .v1 import object_pb2, objects_pb2

if TYPE_CHECKING:
    from .v1.objects_pb2_grpc import ObjectsServiceStub

#: A JSON document: a parsed value (dict, list, ...) or its text or bytes.
Json = dict[str, Any] | list[Any] | str | bytes


def encode_json(document: Json) -> bytes:
    """The bytes of a JSON document; str and bytes are taken as JSON text already."""
    if isinstance(document, bytes):
        return document
    if isinstance(document, str):
        return document.encode()
    return json.dumps(document, separators=(",", ":")).encode()


class PatchType(enum.IntEnum):
    """The patch formats the apiserver accepts."""

    JSON = objects_pb2.PATCH_TYPE_JSON
    """RFC 6902 JSON patch."""
    MERGE = objects_pb2.PATCH_TYPE_MERGE
    """RFC 7386 JSON merge patch."""
    STRATEGIC = objects_pb2.PATCH_TYPE_STRATEGIC
    """Kubernetes strategic merge patch (built-in types only)."""
    APPLY = objects_pb2.PATCH_TYPE_APPLY
    """Server-side apply; needs ``field_manager``."""


class PropagationPolicy(enum.IntEnum):
    """How dependents are handled on delete."""

    DEFAULT = objects_pb2.PROPAGATION_POLICY_UNSPECIFIED
    ORPHAN = objects_pb2.PROPAGATION_POLICY_ORPHAN
    BACKGROUND = objects_pb2.PROPAGATION_POLICY_BACKGROUND
    FOREGROUND = objects_pb2.PROPAGATION_POLICY_FOREGROUND


class ConditionStatus(str, enum.Enum):
    """A status condition's status, as Kubernetes spells it (metav1.ConditionStatus). A member equals its
    string, and ``set_condition`` takes either: ``ConditionStatus.TRUE`` or ``"True"``."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"

    @classmethod
    def of(cls, status: ConditionStatus | str) -> ConditionStatus:
        """The member ``status`` is, or names (``"True"``, ``"False"``, ``"Unknown"``, spelled so); ValueError
        for anything else, before anything is sent."""
        try:
            return cls(status)
        except ValueError:
            raise ValueError(f"status: {status!r} is not True, False or Unknown") from None

    def to_proto(self) -> objects_pb2.ConditionStatus:
        """The protocol's enum value."""
        return _CONDITION_STATUSES[self]


_CONDITION_STATUSES = {
    ConditionStatus.TRUE: objects_pb2.CONDITION_STATUS_TRUE,
    ConditionStatus.FALSE: objects_pb2.CONDITION_STATUS_FALSE,
    ConditionStatus.UNKNOWN: objects_pb2.CONDITION_STATUS_UNKNOWN,
}


class EventSeverity(str, enum.Enum):
    """An event's severity, as Kubernetes spells an Event's type. A member equals its string, and
    ``record_event`` takes either: ``EventSeverity.WARNING`` or ``"Warning"``."""

    NORMAL = "Normal"
    """Something happened, nothing to worry about."""
    WARNING = "Warning"
    """Something is not as it should be."""

    @classmethod
    def of(cls, severity: EventSeverity | str) -> EventSeverity:
        """The member ``severity`` is, or names (``"Normal"``, ``"Warning"``, spelled so); ValueError for anything
        else, before anything is sent."""
        try:
            return cls(severity)
        except ValueError:
            raise ValueError(f"severity: {severity!r} is not Normal or Warning") from None

    def to_proto(self) -> objects_pb2.EventSeverity:
        """The protocol's enum value."""
        return _EVENT_SEVERITIES[self]


_EVENT_SEVERITIES = {
    EventSeverity.NORMAL: objects_pb2.EVENT_SEVERITY_NORMAL,
    EventSeverity.WARNING: objects_pb2.EVENT_SEVERITY_WARNING,
}


@dataclass(frozen=True)
class Guard:
    """Fences a write or a send (``Client.send``): the daemon refuses it (FAILED_PRECONDITION) unless it leads
    ``election`` in exactly ``term``. ``LeadershipStatus.guard()`` builds one from the status that made you leader.
    Terms start at 1: a guard with ``term`` 0 (what an unset term reads as) is refused with
    INVALID_ARGUMENT naming ``guard.term``."""

    election: str
    term: int
    #: Namespace of the election's Lease; empty means the daemon's own namespace.
    namespace: str = ""

    def to_proto(self) -> object_pb2.WriteGuard:
        """The protocol message."""
        return object_pb2.WriteGuard(election=self.election, namespace=self.namespace, term=self.term)

    @classmethod
    def from_proto(cls, g: object_pb2.WriteGuard) -> Guard:
        """The guard carried by a protocol message."""
        return cls(election=g.election, namespace=g.namespace, term=g.term)


@dataclass(frozen=True)
class Object:
    """A Kubernetes object as the apiserver served it, with the fields apps need most lifted out."""

    #: metadata.uid: stable for the object's life; a re-created object has a new one.
    uid: str
    #: metadata.namespace; empty for cluster-scoped objects.
    namespace: str
    #: metadata.name.
    name: str
    #: metadata.resourceVersion: a decimal integer growing with every change on Kubernetes 1.35+
    #: (KEP-5504), so two versions of one object compare as numbers; before 1.35, compare for equality only.
    resource_version: str
    #: The object as JSON text. A watch's or a queue's objects are as its View keeps them: by default whole
    #: but for metadata.managedFields. Reads and writes answer with whole objects; one read from a watch's
    #: cache has managedFields only if that watch keeps them.
    raw: bytes
    #: True when ``update`` or ``patch`` would have changed nothing and was not sent: a synced watch's cache in the
    #: sidecar already showed the object as the write would leave it, and this is that cached object (its
    #: resource_version unchanged). False on every other object, and on a write sent with ``send_unchanged``. Not
    #: part of equality: it says how the object was answered, not what it is.
    unchanged: bool = field(default=False, compare=False)

    @cached_property
    def json(self) -> dict[str, Any]:
        """The object (apiVersion, kind, metadata, spec, ...; see ``raw``), parsed once."""
        parsed: dict[str, Any] = json.loads(self.raw)
        return parsed

    @classmethod
    def from_proto(cls, o: object_pb2.KubeObject, *, unchanged: bool = False) -> Object:
        """The object carried by a protocol message (``unchanged``: the write's answer said so)."""
        return cls(
            uid=o.uid,
            namespace=o.namespace,
            name=o.name,
            resource_version=o.resource_version,
            raw=o.json,
            unchanged=unchanged,
        )


@dataclass(frozen=True)
class ObjectList:
    """The objects a list matched."""

    objects: list[Object]
    #: The list's resourceVersion.
    resource_version: str
    #: True when the watch hub's cache answered, False when the apiserver did.
    from_cache: bool


@dataclass(frozen=True)
class SetConditionResult:
    """What ``set_condition`` answered."""

    #: Whether a write was sent: False when the object already had the condition (same status, reason, message
    #: and observedGeneration), and nothing was written.
    changed: bool
    #: The condition's lastTransitionTime (RFC 3339, as the apiserver keeps it: to the second) as written, or as
    #: it was when nothing was written: it moves only when the status does.
    last_transition_time: str
    #: The object as the write left it, or as the sidecar read it when nothing was written.
    object: Object


class Objects:
    """Reads and writes of Kubernetes objects through the sidecar (``client.objects``). Every write
    records an expectation, so CONSISTENT watchers of this pod see its own write. ``resource`` takes
    any form a watch accepts ("configmaps", "deployments.apps", "apps/v1/deployments", "Deployment").

    Every write also records, per uid, the largest resourceVersion it returned, in the client's record
    that its watches share: a watch of this client never hands the app a state older than the app's own
    write (the own-write rule, see Watch).

    A write made for a reconcile work item names its lease (``reconcile_lease=item.lease_id``, or every write
    of ``item.objects``): the key's next pass is then handed out only once the queue's watches show it."""

    def __init__(
        self, stub: ObjectsServiceStub, own_writes: OwnWrites | None = None, reconcile_lease: str = ""
    ) -> None:
        self._stub = stub
        self._own_writes = own_writes if own_writes is not None else OwnWrites()
        # The lease every write names unless it names one itself (``for_lease``).
        self._reconcile_lease = reconcile_lease

    def for_lease(self, lease_id: str) -> Objects:
        """This objects client with every write naming the reconcile lease ``lease_id`` (a ``WorkItem``'s;
        ``item.objects`` is this): the key's next pass then waits until the queue's watches show the write.
        It shares this client's record of its own writes."""
        return Objects(self._stub, self._own_writes, lease_id)

    async def get(self, resource: str, name: str, *, namespace: str = "", read_your_writes: bool = False) -> Object:
        """One object; NOT_FOUND if it does not exist. ``read_your_writes`` waits, when the cache
        answers, until this pod's pending writes to it are visible."""
        request = objects_pb2.GetRequest(
            resource=resource, namespace=namespace, name=name, read_your_writes=read_your_writes
        )
        response = await unary(self._stub.Get, request)
        return Object.from_proto(response.object)

    async def list(
        self,
        resource: str,
        *,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        read_your_writes: bool = False,
    ) -> ObjectList:
        """The objects matching the selectors; an empty namespace lists every namespace."""
        request = objects_pb2.ListRequest(
            resource=resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            read_your_writes=read_your_writes,
        )
        response = await unary(self._stub.List, request)
        return ObjectList(
            objects=[Object.from_proto(o) for o in response.objects],
            resource_version=response.resource_version,
            from_cache=response.source == objects_pb2.READ_SOURCE_CACHE,
        )

    async def create(
        self,
        resource: str,
        body: Json,
        *,
        namespace: str = "",
        field_manager: str = "",
        guard: Guard | None = None,
        reconcile_lease: str = "",
    ) -> Object:
        """Creates the object ``body`` (metadata.name or generateName set); returns it as created.
        ``reconcile_lease`` names the work item's lease the write is made for (see ``for_lease``)."""
        request = objects_pb2.CreateRequest(
            resource=resource,
            namespace=namespace,
            object=encode_json(body),
            field_manager=field_manager,
            guard=_guard(guard),
            reconcile_lease=reconcile_lease or self._reconcile_lease,
        )
        response = await unary(self._stub.Create, request)
        return self._written(response.object)

    async def update(
        self,
        resource: str,
        name: str,
        body: Json,
        *,
        namespace: str = "",
        subresource: str = "",
        field_manager: str = "",
        guard: Guard | None = None,
        reconcile_lease: str = "",
        send_unchanged: bool = False,
    ) -> Object:
        """Replaces the object (or its ``"status"`` subresource) with ``body``; a
        metadata.resourceVersion in it makes the update conditional (ABORTED on conflict). When a synced watch's
        cache in the sidecar shows the update would change nothing, it is not sent: the cached object comes back
        with ``unchanged`` set. ``send_unchanged`` sends it to the apiserver anyway."""
        request = objects_pb2.UpdateRequest(
            resource=resource,
            namespace=namespace,
            name=name,
            object=encode_json(body),
            subresource=subresource,
            field_manager=field_manager,
            guard=_guard(guard),
            reconcile_lease=reconcile_lease or self._reconcile_lease,
            send_unchanged=send_unchanged,
        )
        response = await unary(self._stub.Update, request)
        return self._written(response.object, unchanged=response.unchanged)

    async def patch(
        self,
        resource: str,
        name: str,
        patch: Json,
        *,
        namespace: str = "",
        patch_type: PatchType = PatchType.MERGE,
        subresource: str = "",
        field_manager: str = "",
        force: bool = False,
        guard: Guard | None = None,
        reconcile_lease: str = "",
        send_unchanged: bool = False,
    ) -> Object:
        """Patches the object (a JSON merge patch unless ``patch_type`` says otherwise); returns it as
        stored. A merge or JSON patch that a synced watch's cache in the sidecar shows would change nothing is not
        sent: the cached object comes back with ``unchanged`` set. ``send_unchanged`` sends it to the apiserver
        anyway (strategic merge patches and apply always go)."""
        request = objects_pb2.PatchRequest(
            resource=resource,
            namespace=namespace,
            name=name,
            patch_type=cast("objects_pb2.PatchType", int(patch_type)),
            patch=encode_json(patch),
            subresource=subresource,
            field_manager=field_manager,
            force=force,
            guard=_guard(guard),
            reconcile_lease=reconcile_lease or self._reconcile_lease,
            send_unchanged=send_unchanged,
        )
        response = await unary(self._stub.Patch, request)
        return self._written(response.object, unchanged=response.unchanged)

    async def delete(
        self,
        resource: str,
        name: str,
        *,
        namespace: str = "",
        precondition_uid: str = "",
        precondition_resource_version: str = "",
        propagation_policy: PropagationPolicy = PropagationPolicy.DEFAULT,
        guard: Guard | None = None,
        reconcile_lease: str = "",
    ) -> Object | None:
        """Deletes the object, optionally only if it still has the given uid or resourceVersion;
        returns its last state when the apiserver sent it."""
        request = objects_pb2.DeleteRequest(
            resource=resource,
            namespace=namespace,
            name=name,
            precondition_uid=precondition_uid,
            precondition_resource_version=precondition_resource_version,
            propagation_policy=cast("objects_pb2.PropagationPolicy", int(propagation_policy)),
            guard=_guard(guard),
            reconcile_lease=reconcile_lease or self._reconcile_lease,
        )
        response = await unary(self._stub.Delete, request)
        return self._written(response.object) if response.HasField("object") else None

    async def set_condition(
        self,
        resource: str,
        name: str,
        type: str,
        status: ConditionStatus | str,
        reason: str,
        message: str = "",
        *,
        namespace: str = "",
        observed_generation: int = 0,
        field_manager: str = "",
        guard: Guard | None = None,
        reconcile_lease: str = "",
    ) -> SetConditionResult:
        """Sets the condition ``type`` of the object's status.conditions, as apimachinery's
        ``meta.SetStatusCondition`` does, in the sidecar (``ObjectsService.SetCondition``): it is written only when
        its status, reason, message or observedGeneration differ from the object's (server-side apply of the
        condition alone to the status subresource, under the field manager ``<field_manager>/<type>``, default
        ``consistd/<type>``, so one condition never drops another: status.conditions must be a list map keyed by
        type), its lastTransitionTime kept while its status stays, else now. ``observed_generation`` 0 is the
        generation of the object as the sidecar reads it. ``status`` is a ConditionStatus or its string; anything
        else raises ValueError before anything is sent. A resource without a status subresource is NOT_FOUND. A
        write is recorded for the own-write rule; an answer that wrote nothing is not. ``WorkItem.set_condition``
        fills this in for an item's primary."""
        condition = objects_pb2.Condition(
            type=type,
            status=ConditionStatus.of(status).to_proto(),
            reason=reason,
            message=message,
            observed_generation=observed_generation,
        )
        request = objects_pb2.SetConditionRequest(
            resource=resource,
            namespace=namespace,
            name=name,
            condition=condition,
            field_manager=field_manager,
            guard=_guard(guard),
            reconcile_lease=reconcile_lease or self._reconcile_lease,
        )
        response = await unary(self._stub.SetCondition, request)
        obj = self._written(response.object) if response.changed else Object.from_proto(response.object)
        return SetConditionResult(
            changed=response.changed, last_transition_time=response.last_transition_time, object=obj
        )

    async def record_event(
        self,
        resource: str,
        name: str,
        severity: EventSeverity | str,
        reason: str,
        action: str,
        note: str = "",
        *,
        namespace: str = "",
        uid: str = "",
        reporting_controller: str = "",
    ) -> bool:
        """Records an event (events.k8s.io/v1) about the object, in its namespace (``"default"`` for a
        cluster-scoped one), reported by ``reporting_controller`` (default ``"consistd"``), as client-go's event
        recorder does, once in the sidecar for every app of the pod (``ObjectsService.RecordEvent``): a repeat
        within 6 minutes (the same severity, reason, action, reporting controller and object) is counted on the
        first one's series, not written anew; a reporting controller's events about one object pass client-go's
        rate limit (a burst of 25, then one per 5 minutes). Returns False when that limit dropped it. ``reason``
        and ``action`` are CamelCase, 1 to 128 characters; ``note`` at most 1024 bytes. ``uid`` is the object's
        when the app has it; else the sidecar reads it. ``severity`` is an EventSeverity or its string; anything
        else raises ValueError before anything is sent. Nothing is recorded for the own-write rule (the object is
        not written). ``WorkItem.record_event`` fills this in for an item's primary."""
        request = objects_pb2.RecordEventRequest(
            resource=resource,
            namespace=namespace,
            name=name,
            uid=uid,
            severity=EventSeverity.of(severity).to_proto(),
            reason=reason,
            action=action,
            note=note,
            reporting_controller=reporting_controller,
        )
        response: objects_pb2.RecordEventResponse = await unary(self._stub.RecordEvent, request)
        return response.recorded

    def _written(self, o: object_pb2.KubeObject, *, unchanged: bool = False) -> Object:
        """The object a write returned, recorded first, so that an event the app takes after the write
        returns is judged against it. An ``unchanged`` answer is recorded like any other: the cached object is a
        state the object has, never older than this pod's own writes to it, so a state older than it is rightly
        held back; the record keeps the largest version either way."""
        self._own_writes.record(o.uid, o.resource_version)
        return Object.from_proto(o, unchanged=unchanged)


def _guard(guard: Guard | None) -> object_pb2.WriteGuard | None:
    return guard.to_proto() if guard is not None else None
