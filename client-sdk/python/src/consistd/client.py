"""The connection to one consistd sidecar over its Unix socket, and the entry point to every service."""

from __future__ import annotations

import asyncio
import os
from types import TracebackType
from typing import Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.context import Context

from . import trace
from ._own_writes import OwnWrites
from .errors import NotReadyError, unary
from .inbox import Inbox, acked
from .latest import Latest
from .leadership import Campaign, LeadershipStatus, LeaseTiming, Observation
from .objects import Guard, Object, Objects
from .ordered import Ordered
from .outbox import Destination, Outbox, SentMessage, destination_to_proto, encode_payload
from .reconcile import ReconcileHandler, Reconciler, ReconcileSpec
from .v1 import (
    inbox_pb2,
    inbox_pb2_grpc,
    leadership_pb2,
    leadership_pb2_grpc,
    objects_pb2_grpc,
    outbox_pb2,
    outbox_pb2_grpc,
    reconcile_pb2_grpc,
    rollout_pb2_grpc,
    watch_pb2,
    watch_pb2_grpc,
)
from .watch import Mode, View, Watch, view_to_proto

#: Where the sidecar listens unless ``CONSISTD_SOCKET`` says otherwise.
DEFAULT_SOCKET = "/var/run/consistd/consistd.sock"

#: How often ``wait_ready`` asks again, in seconds.
READY_POLL = 0.05

_CHANNEL_OPTIONS = [
    # The channel's own reconnect pauses follow the SDK's backoff (100 ms doubling to 5 s) instead of
    # gRPC's default 1 s to 120 s, so a restarted sidecar is reached again within seconds.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5000),
    # Answers of any size: a List (or a Get, or a watch event) of big objects passes gRPC's default 4 MiB
    # receive limit, and the sidecar is the app's own, trusted, over a local socket.
    ("grpc.max_receive_message_length", -1),
]


class Client:
    """A connection to one consistd sidecar. Connects lazily and reconnects on demand; use it from
    one event loop, and close it (``await client.close()`` or ``async with``) when done.

    >>> async with consistd.Client() as client:
    ...     await client.wait_ready(10)
    ...     async for event in client.watch("configmaps", namespace="default"):
    ...         print(event.type.name, event.object and event.object.name)
    """

    def __init__(self, socket: str | os.PathLike[str] | None = None) -> None:
        """A client for the socket at ``socket``, else the one named by ``CONSISTD_SOCKET``, else
        ``/var/run/consistd/consistd.sock``. Nothing is connected until the first call."""
        if socket is None:
            socket = os.environ.get("CONSISTD_SOCKET") or DEFAULT_SOCKET
        #: The socket this client talks to.
        self.socket = os.fspath(socket)
        self._channel: grpc.aio.Channel | None = None
        self._stubs: dict[str, Any] = {}
        self._outbox: Outbox | None = None
        self._inbox_acks: Ordered[inbox_pb2.AckStreamRequest, inbox_pb2.AckStreamResponse] | None = None
        # The own-write rule's record (see Watch): what this client's writes returned, shared by its watches.
        self._own_writes = OwnWrites()

    @property
    def channel(self) -> grpc.aio.Channel:
        """The gRPC channel, for generated stubs not wrapped here (``consistd.v1.*_pb2_grpc``)."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel("unix:" + os.path.abspath(self.socket), options=_CHANNEL_OPTIONS)
        return self._channel

    def _stub(self, stub_class: Any) -> Any:
        stub = self._stubs.get(stub_class.__name__)
        if stub is None:
            stub = self._stubs[stub_class.__name__] = stub_class(self.channel)
        return stub

    async def close(self) -> None:
        """Ends every stream and closes the connection; waits for a sent message's outcome end with CANCELLED."""
        if self._outbox is not None:
            await self._outbox.close()
            self._outbox = None
        if self._inbox_acks is not None:
            await self._inbox_acks.close()
            self._inbox_acks = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stubs.clear()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the sidecar's health service reports SERVING, retrying while the socket is
        missing or the daemon is starting; raises NotReadyError (naming the socket and the last answer
        seen) after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        health = self._stub(health_pb2_grpc.HealthStub)
        last = "no answer"
        while True:
            remaining = deadline - loop.time()
            try:
                response = await health.Check(health_pb2.HealthCheckRequest(), timeout=max(remaining, 0.01))
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = "health is " + health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            except grpc.aio.AioRpcError as e:
                last = f"{e.code().name}: {e.details()}"
            if loop.time() + READY_POLL > deadline:
                raise NotReadyError(self.socket, timeout, last)
            await asyncio.sleep(READY_POLL)

    def watch(
        self,
        resource: str,
        *,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        mode: Mode = Mode.CONSISTENT,
        resume_cursor: str = "",
        view: View | None = None,
    ) -> Watch:
        """Watches ``resource`` ("configmaps", "apps/v1/deployments", a kind, ...): the current objects
        as ADDED events, then SYNCED, then live changes, reconnecting and resuming on its own (see
        Watch). An empty namespace watches every namespace; ``resume_cursor`` starts after the event
        with that cursor instead of from a fresh snapshot (a cursor resumes only a watch of the same
        view). ``view`` is how much of each object the sidecar keeps and delivers
        (``View(metadata_only=True)``, ``View(fields=("spec.replicas",))``, see View); None is the whole
        object without ``metadata.managedFields``. An event older than a write this client made to its
        object is dropped (CONSISTENT) or marked ``predates_own_write`` (RAW) as the app takes it."""
        request = watch_pb2.SubscribeRequest(
            resource=resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            mode=cast("watch_pb2.DeliveryMode", int(mode)),
            resume_cursor=resume_cursor,
            view=view_to_proto(view),
        )
        return Watch(self._stub(watch_pb2_grpc.WatchServiceStub), request, self._own_writes)

    def watch_latest(
        self,
        resource: str,
        *,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        view: View | None = None,
    ) -> Latest:
        """The newest state of each object ``resource`` has (in ``namespace``, matching the selectors, as ``view``
        keeps it), from a CONSISTENT watch, handed to workers as they ask (see Latest): the way to consume a
        CONSISTENT watch when the handler is slow. A worker never handles a state older than this client's own
        write to the object, and never an object another worker holds. Nor is it handed back the state this
        client's own write made directly on the state last handed out for the object (that state's previous one, as
        the daemon names it, is the one handed out, and its resourceVersion the one the write returned): the worker
        already has it. A state with another writer's change in between, one with no previous state (from a list
        or a resync), or one made by more than one write since the last hand-out is handed out.

        >>> async with client.watch_latest("configmaps", namespace="default") as latest:
        ...     async with latest.take() as event:  # ADDED, MODIFIED or DELETED: the object's newest state
        ...         ...
        """
        request = watch_pb2.SubscribeRequest(
            resource=resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            mode=watch_pb2.DELIVERY_MODE_CONSISTENT,
            view=view_to_proto(view),
        )
        watch = Watch(self._stub(watch_pb2_grpc.WatchServiceStub), request, self._own_writes, judged=False)
        return Latest(watch, self._own_writes)

    def predates_own_write(self, obj: Object) -> bool:
        """Whether ``obj`` is older than a write this client made to it and saw return: the own-write rule a
        watch applies as the app takes an event, for an app that keeps the events it took in a buffer of its
        own (a worker per object on the newest state, say). Such an app asks again when its worker takes a
        state from that buffer, since its own write may have returned while the state waited there."""
        return self._own_writes.predates(obj.uid, obj.resource_version)

    @property
    def objects(self) -> Objects:
        """Reads and writes of Kubernetes objects."""
        return Objects(self._stub(objects_pb2_grpc.ObjectsServiceStub), self._own_writes)

    def campaign(
        self, election: str, *, namespace: str = "", identity: str = "", timing: LeaseTiming | None = None
    ) -> Campaign:
        """Stands in ``election`` (a Lease name) while the returned Campaign is open, and streams this
        sidecar's view of it (see Campaign). An empty namespace is the sidecar's own; an empty
        identity is the sidecar's (by default the pod name)."""
        request = leadership_pb2.CampaignRequest(
            election=election,
            namespace=namespace,
            identity=identity,
            timing=timing.to_proto() if timing is not None else None,
        )
        return Campaign(self._stub(leadership_pb2_grpc.LeadershipServiceStub), request)

    def observe(self, election: str, *, namespace: str = "") -> Observation:
        """Streams ``election``'s states without taking part (see Observation)."""
        request = leadership_pb2.ObserveRequest(election=election, namespace=namespace)
        return Observation(self._stub(leadership_pb2_grpc.LeadershipServiceStub), request)

    async def get_leadership(self, election: str, *, namespace: str = "") -> LeadershipStatus:
        """``election``'s current state, at once."""
        request = leadership_pb2.GetLeadershipRequest(election=election, namespace=namespace)
        response = await unary(self._stub(leadership_pb2_grpc.LeadershipServiceStub).GetLeadership, request)
        return LeadershipStatus.from_proto(response.status)

    async def send(
        self,
        to: Destination,
        resource_id: str,
        event_id: str,
        payload: Any,
        *,
        content_type: str | None = None,
        context: Context | None = None,
        traceparent: str = "",
        tracestate: str = "",
        guard: Guard | None = None,
    ) -> SentMessage:
        """Sends ``payload`` about ``resource_id`` to a peer (``"host:port"`` or Peer), every endpoint
        of a Service (ServiceEndpoints) or every member of an election (ElectionMembers), and returns
        once the sidecar has stored it; ``await (await client.send(...)).ack()`` waits for its first
        outcome (see SentMessage.ack).
        bytes go as they are, str as UTF-8 text, anything else as JSON (content type set to match
        unless given). Per (destination, resource_id) one message is in flight: a newer event
        supersedes an older un-ACKed one; receivers deduplicate by (sender, resource_id, event_id).

        The message carries the W3C trace context of the current OpenTelemetry span, or of ``context``'s
        span, to the receiving app (none when there is no valid span); a ``traceparent`` given (with its
        ``tracestate``) is carried instead.

        With ``guard`` (``status.guard()`` of the LEADER status the app acts on), the sidecar stores the message
        only while it leads that election in that term, else it raises ConsistdError FAILED_PRECONDITION
        ("guard: ..."); the message carries the claim, and the receiving app sees it as ``message.guard``. A
        receiving sidecar that has stored a message of a later term of that election refuses it for good: its
        outcome is FAILED, the reason naming both terms."""
        body, kind = encode_payload(payload, content_type)
        request = outbox_pb2.SendRequest(
            destination=destination_to_proto(to),
            resource_id=resource_id,
            event_id=event_id,
            payload=body,
            content_type=kind,
            traceparent=traceparent,
            tracestate=tracestate,
            guard=guard.to_proto() if guard is not None else None,
        )
        trace.inject(request, context)
        if self._outbox is None:
            self._outbox = Outbox(self._stub(outbox_pb2_grpc.OutboxServiceStub))
        return await self._outbox.send(request)

    @property
    def inbox(self) -> Inbox:
        """Messages from peers: ``await client.inbox.serve(handler)``."""
        stub = self._stub(inbox_pb2_grpc.InboxServiceStub)
        if self._inbox_acks is None:
            # Every ACK of this client goes out on one AckStream.
            self._inbox_acks = Ordered(stub.AckStream, acked, "ack")
        return Inbox(stub, self._inbox_acks)

    async def reconcile(self, spec: ReconcileSpec, handler: ReconcileHandler) -> None:
        """Works on the queue ``spec`` describes until cancelled: calls ``handler`` with each WorkItem (a lease
        on one key), at most ``spec.max_leases`` at once and never two for one key, and completes the lease
        by how it ended: returning None is DONE, returning ``consistd.requeue_after(d)`` is REQUEUE, raising
        is RETRY with the exception's text (the key comes back after its backoff, ``attempt`` one higher),
        raising ``consistd.Terminal`` is TERMINAL (the key waits for a change). Writes through
        ``item.objects`` name the lease, so the key's next pass waits until they show.

        A lost connection opens the queue again with backoff (see Reconciler); a spec the sidecar refuses
        raises ConsistdError (INVALID_ARGUMENT naming the field, FAILED_PRECONDITION, NOT_FOUND,
        PERMISSION_DENIED). Cancelling it cancels the running handlers and closes the stream."""
        stub = self._stub(reconcile_pb2_grpc.ReconcileServiceStub)
        await Reconciler(stub, self.objects, spec, handler).run()

    @property
    def rollout(self) -> rollout_pb2_grpc.RolloutServiceStub:
        """Versioned rollouts and the replica barrier (the generated stub; not wrapped yet)."""
        stub: rollout_pb2_grpc.RolloutServiceStub = self._stub(rollout_pb2_grpc.RolloutServiceStub)
        return stub
