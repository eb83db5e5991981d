"""Leadership as async iterators of states: campaign while the iterator is open, or observe without taking part."""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from ._retry import Backoff, is_retryable
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
    """This sidecar holds the Lease and renewed it within the renew deadline: act as leader (until the
    status's ``leader_until``)."""
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


class _Deadline:
    """A LEADER status's ``leader_until``, shared by the status an iterator yielded and the iterator, which
    moves it on at each renewal without yielding anything. Not part of what a status is: statuses compare
    equal whatever their deadlines."""

    __slots__ = ("until",)

    def __init__(self, until: datetime | None = None) -> None:
        self.until = until

    def __repr__(self) -> str:
        return f"_Deadline({self.until!r})"


@dataclass(frozen=True, repr=False)
class LeadershipStatus:
    """One state of an election as this sidecar sees it. Immutable, except that while it is the status an
    iterator last yielded, the sidecar's renewals move its ``leader_until`` on (see there)."""

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
    #: When the current holder last renewed the Lease, as of when this status was yielded (renewals after
    #: that move only ``leader_until``).
    renewed_at: datetime | None = None
    #: When the sidecar observed this state.
    observed_at: datetime | None = None
    # leader_until, moved on by renewals: shared with the iterator (and by a ``dataclasses.replace`` copy),
    # left out of equality, hash and repr (which shows leader_until).
    _deadline: _Deadline = field(default_factory=_Deadline, compare=False, kw_only=True)

    @property
    def leader_until(self) -> datetime | None:
        """Set only while LEADER: the moment (UTC, on the node's clock, which the app shares with its
        sidecar) until which the sidecar says LEADER without renewing again, from when it sent its last
        renewal plus the renew deadline. Each renewal moves it on, in the status the app holds too: a
        Campaign or Observation does not yield renewals, it moves the deadline of the status it last
        yielded. A sidecar that is stopped or cut off cannot say it no longer leads, so once this passes
        with no renewal the app must not act as leader: ``is_leader`` turns False then, and the iterator
        yields UNKNOWN at that moment. A status the iterator yielded before another state (a new term or
        holder, or that UNKNOWN) is no longer renewed and keeps its last deadline. None in other states
        (and from a sidecar too old to send it: then no deadline applies)."""
        return self._deadline.until if self.state == LeadershipState.LEADER else None

    @property
    def is_leader(self) -> bool:
        """Whether this sidecar leads now: LEADER and ``leader_until``, as the latest renewal moved it, not
        passed; the only state in which the app may act as leader. For the status an iterator last yielded
        it stays True while the sidecar renews, and turns False at the deadline when the renewals stop,
        even before the iterator yields the UNKNOWN that follows; a status yielded before another state
        turns False when its last deadline passes."""
        return self.state == LeadershipState.LEADER and not _passed(self.leader_until, datetime.now(timezone.utc))

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.compare]
        return f"LeadershipStatus({', '.join(shown)}, leader_until={self.leader_until!r})"

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
            _deadline=_Deadline(_time(s, "leader_until")),
        )


class _Election:
    """The shared state machine of Campaign and Observation: read statuses from the open stream; when
    the sidecar is lost, report UNKNOWN at once, then open the stream again after a backoff. While the
    app is told LEADER, the status's ``leader_until`` is a deadline: a renewal (the same LEADER, holder
    and term with a later ``leader_until``) is not yielded, it moves the deadline of the status last
    yielded (the object the app holds: they share a ``_Deadline``), and if the deadline passes with no
    newer status, the app is told UNKNOWN at that moment (the sidecar may be stopped or cut off)."""

    def __init__(self, election: str, namespace: str, identity: str) -> None:
        # What an UNKNOWN reported before the first status carries.
        self._unknown = LeadershipStatus(
            election=election, namespace=namespace, state=LeadershipState.UNKNOWN, holder="", term=0, identity=identity
        )
        # The last status yielded (the app's object itself), its deadline moved by the renewals read since.
        self._status: LeadershipStatus | None = None
        self._call: grpc.aio.UnaryStreamCall | None = None
        # The read under way on _call: it outlives a cancelled __anext__ (cancelling a grpc read cancels
        # the whole call) and, done, applies a renewal by itself and reads on (see _on_read).
        self._reading: asyncio.Task[Any] | None = None
        self._backoff = Backoff()
        # True after a lost stream, until it delivers again: the next open waits for the backoff.
        self._reconnecting = False
        self._closed = False

    def _open(self) -> grpc.aio.UnaryStreamCall:
        raise NotImplementedError

    @property
    def status(self) -> LeadershipStatus | None:
        """The last status this iterator delivered (the same object), its ``leader_until`` moved on by the
        renewals read since; None before the first."""
        return self._status

    @property
    def is_leader(self) -> bool:
        """Whether the last status delivered is leading (its ``is_leader``): LEADER and its
        ``leader_until``, moved on by renewals, not passed. Renewals are read while the stream is open
        even between reads of the iterator; a change of state waits for the app's next read, so keep
        iterating while you lead."""
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
            # The deadline first: a status read after it passed does not undo the demotion the app is owed.
            lapsed = self._lapse()
            if lapsed is not None:
                return lapsed
            reading = self._reading if self._reading is not None else self._read(self._call)
            if not reading.done():
                # Cancelling this wait (the caller's task) leaves the read, and so the stream, running.
                await asyncio.wait({reading}, timeout=self._until_deadline())
                continue  # read, a renewal applied (and read on), the deadline come, or closed
            self._reading = None
            try:
                response = reading.result()
            except asyncio.CancelledError:
                self._call = None
                if self._closed:
                    break  # aclose()
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
                    status = self._received(LeadershipStatus.from_proto(response.status))
                    if status is None:
                        continue
                    self._read(self._call)  # renewals go on moving the deadline while the app acts on this
                    return status
                code, message = grpc.StatusCode.UNAVAILABLE, "the sidecar ended the election stream"
            self._call = None
            if not is_retryable(code):
                self._closed = True
                raise ConsistdError(code, message)
            log.info("election %s lost (%s: %s); trying again", self._unknown.election, code.name, message)
            self._reconnecting = True
            # Tell the app at once that it may no longer lead, then try again on the next read.
            if self._status is None or self._status.state != LeadershipState.UNKNOWN:
                self._status = _demoted(self._status or self._unknown, datetime.now(timezone.utc))
                return self._status
        raise StopAsyncIteration

    def _read(self, call: grpc.aio.UnaryStreamCall) -> asyncio.Task[Any]:
        self._reading = asyncio.ensure_future(call.read())
        self._reading.add_done_callback(self._on_read)
        return self._reading

    def _on_read(self, reading: asyncio.Task[Any]) -> None:
        """A read is done: a renewal is applied here and the next read started, so the deadline moves on
        while the app does not iterate; anything else waits for __anext__."""
        if reading is not self._reading or self._closed or self._call is None:
            return
        if reading.cancelled() or reading.exception() is not None:
            return
        response = reading.result()
        if response is grpc.aio.EOF or not response.HasField("status"):
            return
        status = LeadershipStatus.from_proto(response.status)
        if self._renews(status, datetime.now(timezone.utc)):
            self._renew(status)
            self._read(self._call)

    def _renews(self, status: LeadershipStatus, now: datetime) -> bool:
        """Whether ``status`` only renews the leadership the app was last told of, still in time: the
        same LEADER, holder and term, before the last deadline and with a deadline of its own to come."""
        last = self._status
        return (
            last is not None
            and last.state == status.state == LeadershipState.LEADER
            and last.holder == status.holder
            and last.term == status.term
            and not _passed(last.leader_until, now)
            and status.leader_until is not None
            and not _passed(status.leader_until, now)
        )

    def _renew(self, status: LeadershipStatus) -> None:
        """Applies a renewal (``_renews``): the status the app holds, the one last yielded, gets its deadline."""
        if self._status is not None:
            self._status._deadline.until = status.leader_until

    def _received(self, status: LeadershipStatus) -> LeadershipStatus | None:
        """What to yield for a status from the sidecar: None for a renewal (applied, not yielded) or for a
        LEADER already past its deadline when the app was already told UNKNOWN in that term."""
        now = datetime.now(timezone.utc)
        if self._renews(status, now):
            self._renew(status)
            return None
        if status.state == LeadershipState.LEADER and _passed(status.leader_until, now):
            log.warning(
                "election %s: a LEADER status arrived past its leader_until %s; reporting UNKNOWN",
                status.election,
                status.leader_until,
            )
            status = _demoted(status, now)
            last = self._status
            if last is not None and (last.state, last.holder, last.term) == (status.state, status.holder, status.term):
                return None  # the app holds this UNKNOWN already
        self._status = status
        return status

    def _lapse(self) -> LeadershipStatus | None:
        """UNKNOWN, once, when the app was told LEADER and that status's deadline passed with no renewal."""
        last = self._status
        now = datetime.now(timezone.utc)
        if last is None or last.state != LeadershipState.LEADER or not _passed(last.leader_until, now):
            return None
        log.warning(
            "election %s: no renewal from the sidecar by leader_until %s; reporting UNKNOWN",
            last.election,
            last.leader_until,
        )
        self._status = _demoted(last, now)
        return self._status

    def _until_deadline(self) -> float | None:
        """Seconds until the deadline of the LEADER the app was told; None without one."""
        last = self._status
        if last is None or last.state != LeadershipState.LEADER or last.leader_until is None:
            return None
        return max(0.0, (last.leader_until - datetime.now(timezone.utc)).total_seconds())

    async def aclose(self) -> None:
        """Closes the stream (a campaign resigns at once); the iteration stops."""
        self._closed = True
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None
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
    one always current). Leaving ``async with`` (or ``aclose()``) resigns at once, and only that does:
    cancelling a pending read (say, ``asyncio.wait_for(campaign.__anext__(), t)`` timing out) leaves the
    stream open and the candidacy standing (renewals go on moving the deadline), and the next read goes
    on from where it was; so close a campaign you stop reading. If the connection to the sidecar is lost
    it yields UNKNOWN straight away (stop acting as leader) and campaigns again with backoff; any other
    error ends the iteration with a ``ConsistdError``. While LEADER, the sidecar renews every retry
    period and sends a later ``leader_until`` each time: those renewals are not yielded, they move the
    deadline of the LEADER status last yielded, so that status (held by the app) stays ``is_leader``;
    if ``leader_until`` passes with no newer status (the sidecar is stopped or cut off), it yields
    UNKNOWN at that moment, and LEADER again if the sidecar renews after all."""

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
    """An election's states without taking part (``client.observe(...)``), reconnecting like Campaign
    and, when the sidecar itself leads, ending its LEADER at ``leader_until`` like Campaign too."""

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


def _passed(deadline: datetime | None, now: datetime) -> bool:
    """Whether ``deadline`` is set and not after ``now``."""
    return deadline is not None and deadline <= now


def _demoted(last: LeadershipStatus, now: datetime) -> LeadershipStatus:
    """UNKNOWN in ``last``'s election and term: nobody known to lead, as far as the app can tell."""
    return replace(last, state=LeadershipState.UNKNOWN, holder="", observed_at=now, _deadline=_Deadline())


def _time(message: Any, field: str) -> datetime | None:
    if not message.HasField(field):
        return None
    t: timestamp_pb2.Timestamp = getattr(message, field)
    return t.ToDatetime(tzinfo=timezone.utc)
