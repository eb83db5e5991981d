"""asyncio client for the consistd sidecar: watches that resume on their own, Kubernetes objects as
JSON, leadership with fencing terms, sends with an awaitable outcome, an inbox handler and a reconciler on a
work queue.

    import consistd

    async with consistd.Client() as client:          # CONSISTD_SOCKET, else /var/run/consistd/consistd.sock
        await client.wait_ready(10)
        async for event in client.watch("configmaps", namespace="default", mode=consistd.Mode.CONSISTENT):
            print(event.type.name, event.object.name if event.object else "")

The generated protocol is in ``consistd.v1`` (``from consistd.v1 import watch_pb2``); ``consistd.trace`` has the
OpenTelemetry helpers (a send carries the current span's W3C context, a message gives it back).
"""

from . import trace
from .client import DEFAULT_SOCKET, Client
from .errors import ConsistdError, NotReadyError
from .inbox import Handler, Inbox, InboxMessage
from .latest import Latest, Taken
from .leadership import Campaign, LeadershipState, LeadershipStatus, LeaseTiming, Observation
from .objects import (
    ConditionStatus,
    EventSeverity,
    Guard,
    Object,
    ObjectList,
    Objects,
    PatchType,
    PropagationPolicy,
    SetConditionResult,
)
from .outbox import Ack, AckOutcome, Destination, ElectionMembers, Peer, SentMessage, ServiceEndpoints
from .reconcile import (
    Changed,
    ReconcileHandler,
    Reconciler,
    ReconcileSpec,
    Related,
    Requeue,
    ShardBy,
    Terminal,
    WorkItem,
    requeue_after,
)
from .watch import Consistency, Event, EventType, Mode, View, Watch

__all__ = [
    "DEFAULT_SOCKET",
    "Ack",
    "AckOutcome",
    "Campaign",
    "Changed",
    "Client",
    "ConditionStatus",
    "ConsistdError",
    "Consistency",
    "Destination",
    "ElectionMembers",
    "Event",
    "EventSeverity",
    "EventType",
    "Guard",
    "Handler",
    "Inbox",
    "InboxMessage",
    "Latest",
    "LeadershipState",
    "LeadershipStatus",
    "LeaseTiming",
    "Mode",
    "NotReadyError",
    "Object",
    "ObjectList",
    "Objects",
    "Observation",
    "PatchType",
    "Peer",
    "PropagationPolicy",
    "ReconcileHandler",
    "ReconcileSpec",
    "Reconciler",
    "Related",
    "Requeue",
    "SentMessage",
    "ServiceEndpoints",
    "SetConditionResult",
    "ShardBy",
    "Taken",
    "Terminal",
    "View",
    "Watch",
    "WorkItem",
    "requeue_after",
    "trace",
]
