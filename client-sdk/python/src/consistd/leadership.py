"""Leadership as async iterators of states: campaign while the iterator is open, or observe without taking part."""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from ._retry import Backoff, is_retryable, task_cancelled
from .errors import ConsistdError
from .objects import Guard
from .v1 import leadership_pb2

if TYPE_CHECKING:
    from .v1.leadership_pb2_grpc import LeadershipServiceStub

log = logging.getLogger("consistd.leadership")


class LeadershipState(enum.IntEnum):
    """This sidecar's view of an election."""

    UNSPECIFIED = leadership_pb2.LEADERSHIP_STATE_UNSPECIFIED
    LEADER = leadership_pb2.LEADERSHIP_STATE_LEADER
    """This sidecar holds the Lease and renewed it within the renew deadline: act as leader."""
    FOLLOWER = leadership_pb2.LEADERSHIP_STATE_FOLLOWER
    """Another candidate holds a live Lease."""
    UNKNOWN = leadership_pb2.LEADERSHIP_STATE_UNKNOWN
    """Nobody is known to lead: the apiserver or the sidecar cannot be reached, or no leader is decided."""


@dataclass(frozen=True)
class LeaseTiming:
    """An election's timing in seconds; None takes the daemon's default (client-go's 15 s / 10 s / 2 s)."""

    #: How long a Lease stays valid after its last renewal.
    lease_duration: float | None = None
    #: A leader that has not renewed for this long stops reporting LEADER; below lease_duration.
    renew_deadline: float | None = None
    #: How often candidates try to acquire and leaders renew; below renew_deadline.
    retry_period: float | None = None

    def to_proto(self) -> leadership_pb2.LeaseTiming:
        """The protocol message."""
        return leadership_pb2.LeaseTiming(
            lease_duration=_duration(self.lease_duration),
            renew_deadline=_duration(self.renew_deadline),
            retry_period=_duration(self.retry_period),
        )


@dataclass(frozen=True)
class LeadershipStatus:
    """One state of an election as this sidecar sees it."""

    #: The election (the Lease's name).
    election: str
    #: The Lease's namespace.
    namespace: str
    #: LEADER, FOLLOWER or UNKNOWN.
    state: LeadershipState
    #: The current holder's identity; empty when nobody holds the Lease.
    holder: str
    #: The fencing term: 1 for an election's first leader, higher on every change of holder; 0 only in an
    #: UNKNOWN status before any Lease was read. Pass it in a write's guard.
    term: int
    #: This sidecar's identity in the election.
    identity: str
    #: When the current holder acquired the Lease.
    acquired_at: datetime | None = None
    #: When the current holder last renewed the Lease.
    renewed_at: datetime | None = None
    #: When the sidecar observed this state.
    observed_at: datetime | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this sidecar leads: the only state in which the app may act as leader."""
        return self.state == LeadershipState.LEADER

    def guard(self) -> Guard:
        """A write guard for this election and term: writes carrying it succeed only while this term lasts."""
        return Guard(election=self.election, namespace=self.namespace, term=self.term)

    @classmethod
    def from_proto(cls, s: leadership_pb2.LeadershipStatus) -> LeadershipStatus:
        """The status carried by a protocol message."""
        return cls(
            election=s.election,
            namespace=s.namespace,
            state=LeadershipState(s.state),
            holder=s.holder,
            term=s.term,
            identity=s.identity,
            acquired_at=_time(s, "acquired_at"),
            renewed_at=_time(s, "renewed_at"),
            observed_at=_time(s, "observed_at"),
        )


class _Election:
    """The shared state machine of Campaign and Observation: read statuses from the open stream; when
    the sidecar is lost, report UNKNOWN at once, then open the stream again after a backoff."""

    def __init__(self, election: str, namespace: str, identity: str) -> None:
        # What an UNKNOWN reported before the first status carries.
        self._unknown = LeadershipStatus(
            election=election, namespace=namespace, state=LeadershipState.UNKNOWN, holder="", term=0, identity=identity
        )
        self._status: LeadershipStatus | None = None
        self._call: grpc.aio.UnaryStreamCall | None = None
        self._backoff = Backoff()
        # True after a lost stream, until it delivers again: the next open waits for the backoff.
        self._reconnecting = False
        self._closed = False

    def _open(self) -> grpc.aio.UnaryStreamCall:
        raise NotImplementedError

    @property
    def status(self) -> LeadershipStatus | None:
        """The last status this iterator delivered; None before the first."""
        return self._status

    @property
    def is_leader(self) -> bool:
        """Whether the last status delivered was LEADER."""
        return self._status is not None and self._status.is_leader

    @property
    def term(self) -> int:
        """The term of the last status delivered (0 before the first)."""
        return self._status.term if self._status is not None else 0

    def __aiter__(self) -> _Election:
        return self

    async def __anext__(self) -> LeadershipStatus:
        while not self._closed:
            if self._call is None:
                if self._reconnecting:
                    await self._backoff.wait()
                self._call = self._open()
            try:
                response = await self._call.read()
            except asyncio.CancelledError:
                self._call = None
                if self._closed and not task_cancelled():
                    break  # aclose() from another task
                raise
            except grpc.aio.AioRpcError as e:
                error = ConsistdError.from_rpc(e)
                code, message = error.code, error.message
            else:
                if response is not grpc.aio.EOF:
                    if not response.HasField("status"):
                        continue
                    self._backoff.reset()
                    self._reconnecting = False
                    self._status = LeadershipStatus.from_proto(response.status)
                    return self._status
                code, message = grpc.StatusCode.UNAVAILABLE, "the sidecar ended the election stream"
            self._call = None
            if not is_retryable(code):
                self._closed = True
                raise ConsistdError(code, message)
            log.info("election %s lost (%s: %s); trying again", self._unknown.election, code.name, message)
            self._reconnecting = True
            # Tell the app at once that it may no longer lead, then try again on the next read.
            if self._status is None or self._status.state != LeadershipState.UNKNOWN:
                last = self._status or self._unknown
                self._status = replace(
                    last, state=LeadershipState.UNKNOWN, holder="", observed_at=datetime.now(timezone.utc)
                )
                return self._status
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Closes the stream (a campaign resigns at once); the iteration stops."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def __aenter__(self) -> Any:
        if self._call is None and not self._closed:
            self._call = self._open()  # a campaign stands from here on, not from the first read
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class Campaign(_Election):
    """Candidacy in an election while open (``client.campaign(...)``), as an async iterator of this
    sidecar's view: the current state first, then every change (rapid changes coalesced, the last
    one always current). Leaving ``async with`` (or ``aclose()``) resigns at once. If the connection
    to the sidecar is lost it yields UNKNOWN straight away (stop acting as leader) and campaigns again
    with backoff; any other error ends the iteration with a ``ConsistdError``."""

    def __init__(self, stub: LeadershipServiceStub, request: leadership_pb2.CampaignRequest) -> None:
        super().__init__(request.election, request.namespace, request.identity)
        self._stub = stub
        self._request = request

    def _open(self) -> grpc.aio.UnaryStreamCall:
        call: grpc.aio.UnaryStreamCall = self._stub.Campaign(self._request)
        return call

    def __aiter__(self) -> Campaign:
        return self

    async def __aenter__(self) -> Campaign:
        await super().__aenter__()
        return self


class Observation(_Election):
    """An election's states without taking part (``client.observe(...)``), reconnecting like Campaign."""

    def __init__(self, stub: LeadershipServiceStub, request: leadership_pb2.ObserveRequest) -> None:
        super().__init__(request.election, request.namespace, "")
        self._stub = stub
        self._request = request

    def _open(self) -> grpc.aio.UnaryStreamCall:
        call: grpc.aio.UnaryStreamCall = self._stub.Observe(self._request)
        return call

    def __aiter__(self) -> Observation:
        return self

    async def __aenter__(self) -> Observation:
        await super().__aenter__()
        return self


def _duration(seconds: float | None) -> duration_pb2.Duration | None:
    if seconds is None:
        return None
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def _time(message: Any, field: str) -> datetime | None:
    if not message.HasField(field):
        return None
    t: timestamp_pb2.Timestamp = getattr(message, field)
    return t.ToDatetime(tzinfo=timezone.utc)
