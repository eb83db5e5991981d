"""leader_until without a daemon: a Campaign over a fake stream demotes the app to UNKNOWN at the deadline
when no newer status comes, takes renewals without yielding them (moving the deadline of the status the app
holds), and yields everything else as before."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import pytest

from consistd import Campaign, LeadershipState, LeadershipStatus
from consistd.v1 import leadership_pb2

#: How late after its deadline a demotion may come on a loaded machine.
LATE = 1.0


def now() -> datetime:
    return datetime.now(timezone.utc)


class FakeCall:
    """A Campaign stream whose responses (or errors, raised by read) the test puts in ``responses``."""

    def __init__(self) -> None:
        self.responses: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = False

    async def read(self) -> Any:
        item = await self.responses.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeStub:
    """A LeadershipServiceStub whose every Campaign call is a new FakeCall."""

    def __init__(self) -> None:
        self.calls: list[FakeCall] = []

    def Campaign(self, request: leadership_pb2.CampaignRequest) -> FakeCall:  # noqa: N802 (the stub's name)
        self.calls.append(FakeCall())
        return self.calls[-1]

    @property
    def call(self) -> FakeCall:
        return self.calls[-1]


def response(
    state: LeadershipState = LeadershipState.LEADER,
    *,
    until: datetime | float | None = None,
    holder: str = "me",
    term: int = 1,
) -> leadership_pb2.CampaignResponse:
    """A status from the sidecar; ``until`` is leader_until, or seconds from now."""
    status = leadership_pb2.LeadershipStatus(
        election="e", namespace="ns", state=state.value, holder=holder, term=term, identity="me"
    )
    status.observed_at.FromDatetime(now())
    if until is not None:
        status.leader_until.FromDatetime(until if isinstance(until, datetime) else now() + timedelta(seconds=until))
    return leadership_pb2.CampaignResponse(status=status)


def until_of(r: leadership_pb2.CampaignResponse) -> datetime:
    return r.status.leader_until.ToDatetime(tzinfo=timezone.utc)


def campaign() -> tuple[Campaign, FakeStub]:
    stub = FakeStub()
    request = leadership_pb2.CampaignRequest(election="e", namespace="ns", identity="me")
    return Campaign(stub, request), stub  # type: ignore[arg-type]


async def next_within(c: Campaign, seconds: float) -> LeadershipStatus:
    return await asyncio.wait_for(c.__anext__(), seconds)


async def nothing_within(c: Campaign, seconds: float) -> None:
    """Nothing is yielded within ``seconds`` (the read is left running: cancelling it keeps the stream)."""
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(c.__anext__(), seconds)


def test_a_status_carries_leader_until_and_is_leader_only_before_it() -> None:
    leading = LeadershipStatus.from_proto(response(until=5).status)
    assert leading.leader_until is not None and leading.is_leader
    lapsed = LeadershipStatus.from_proto(response(until=-0.001).status)
    assert lapsed.state == LeadershipState.LEADER and not lapsed.is_leader, "LEADER past leader_until is not leading"
    old_sidecar = LeadershipStatus.from_proto(response().status)
    assert old_sidecar.leader_until is None and old_sidecar.is_leader, "without leader_until no deadline applies"
    following = LeadershipStatus.from_proto(response(LeadershipState.FOLLOWER, holder="other").status)
    assert following.leader_until is None and not following.is_leader


def test_a_status_compares_and_hashes_by_its_fields_whatever_its_deadline_and_is_read_only() -> None:
    r = response(until=5)
    a, b = LeadershipStatus.from_proto(r.status), LeadershipStatus.from_proto(r.status)
    a._deadline.until = now() + timedelta(seconds=9)  # as a renewal would
    assert a == b and hash(a) == hash(b) and a.leader_until != b.leader_until
    assert a != dataclasses.replace(b, term=2)
    assert f"leader_until={a.leader_until!r}" in repr(a) and "_deadline" not in repr(a)
    with pytest.raises(AttributeError):
        a.leader_until = now()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.state = LeadershipState.FOLLOWER  # type: ignore[misc]
    # A copy made with replace shares the deadline, as the status it was made from goes on being renewed.
    copy = dataclasses.replace(a, observed_at=now())
    a._deadline.until = now() + timedelta(seconds=20)
    assert copy.leader_until == a.leader_until


async def test_a_leader_is_demoted_to_unknown_at_leader_until_when_nothing_newer_comes() -> None:
    c, stub = campaign()
    async with c:
        first = response(until=0.6, term=3)
        stub.call.responses.put_nowait(first)
        leading = await next_within(c, 5)
        assert leading.is_leader and c.is_leader and leading.leader_until == until_of(first)

        lost = await next_within(c, 0.6 + LATE + 1)
        at = now()
        assert at >= until_of(first), "demoted before leader_until"
        assert at <= until_of(first) + timedelta(seconds=LATE), f"demoted {at - until_of(first)} after leader_until"
        assert lost.state == LeadershipState.UNKNOWN and lost.holder == "" and lost.term == 3
        assert lost.leader_until is None and lost.election == "e" and lost.identity == "me"
        assert not c.is_leader and c.status == lost and not leading.is_leader
        await nothing_within(c, 0.3)  # demoted once
        assert len(stub.calls) == 1 and not stub.call.cancelled, "the demotion keeps the stream"


async def test_renewals_are_not_yielded_and_move_the_deadline_on() -> None:
    c, stub = campaign()
    async with c:
        first = response(until=0.5)
        stub.call.responses.put_nowait(first)
        held = await next_within(c, 5)
        assert held.is_leader
        last = None

        async def renew() -> None:
            nonlocal last
            for _ in range(8):  # 1.2 s of renewals every 0.15 s, each 0.6 s ahead
                await asyncio.sleep(0.15)
                last = response(until=0.6)
                stub.call.responses.put_nowait(last)
            await asyncio.sleep(0.05)
            # Past the deadline it was yielded with, the status the app holds leads on with the last renewal's.
            assert now() > until_of(first)
            assert held.is_leader and held.leader_until == until_of(last), "the held status missed the renewals"

        renewing = asyncio.create_task(renew())
        lost = await next_within(c, 1.2 + 0.6 + LATE + 1)
        at = now()
        await renewing
        assert last is not None
        assert lost.state == LeadershipState.UNKNOWN, "a renewal was yielded as a new state"
        assert until_of(last) <= at <= until_of(last) + timedelta(seconds=LATE), "the last renewal's deadline held"
        assert not held.is_leader and held.leader_until == until_of(last), "the held status ends at the deadline"


async def test_renewals_move_the_deadline_on_while_the_app_is_not_reading() -> None:
    c, stub = campaign()
    async with c:
        stub.call.responses.put_nowait(response(until=0.5, term=2))
        held = await next_within(c, 5)
        assert held.is_leader
        for _ in range(6):  # 0.9 s: past the first deadline
            await asyncio.sleep(0.15)
            last = response(until=0.8, term=2)
            stub.call.responses.put_nowait(last)
        await asyncio.sleep(0.05)
        assert c.is_leader, "renewals read between the app's reads keep it leader"
        assert held.is_leader, "renewals read between the app's reads keep the status it holds leading"
        assert c.status is held and held.leader_until == until_of(last) and c.term == 2
        await asyncio.sleep((until_of(last) - now()).total_seconds() + 0.01)
        assert not c.is_leader, "is_leader is False once leader_until has passed, even before the app reads"
        assert not held.is_leader
        lost = await next_within(c, 1)
        assert lost.state == LeadershipState.UNKNOWN and lost.term == 2


async def test_a_leader_status_past_its_leader_until_on_arrival_counts_as_unknown() -> None:
    c, stub = campaign()
    async with c:
        stub.call.responses.put_nowait(response(until=-1, term=4))
        lapsed = await next_within(c, 5)
        assert lapsed.state == LeadershipState.UNKNOWN and lapsed.holder == "" and lapsed.term == 4
        assert not c.is_leader
        # Another lapsed LEADER of the term tells the app nothing new; a follower does.
        stub.call.responses.put_nowait(response(until=-1, term=4))
        stub.call.responses.put_nowait(response(LeadershipState.FOLLOWER, holder="other", term=5))
        following = await next_within(c, 5)
        assert following.state == LeadershipState.FOLLOWER and following.holder == "other" and following.term == 5


async def test_a_renewal_after_the_demotion_is_yielded_as_leader_again() -> None:
    c, stub = campaign()
    async with c:
        stub.call.responses.put_nowait(response(until=0.2))
        first = await next_within(c, 5)
        assert first.is_leader
        assert (await next_within(c, 0.2 + LATE + 1)).state == LeadershipState.UNKNOWN
        stub.call.responses.put_nowait(response(until=5))
        again = await next_within(c, 5)
        assert again.is_leader and again.term == 1 and again.holder == "me" and c.is_leader
        assert not first.is_leader, "a status yielded before the UNKNOWN keeps its lapsed deadline"


async def test_a_renewal_read_after_the_deadline_passed_comes_after_the_owed_unknown() -> None:
    c, stub = campaign()
    async with c:
        stub.call.responses.put_nowait(response(until=0.2))
        assert (await next_within(c, 5)).is_leader
        await asyncio.sleep(0.3)  # the app does not read; the deadline passes
        assert not c.is_leader
        stub.call.responses.put_nowait(response(until=5))
        await asyncio.sleep(0.05)
        assert (await next_within(c, 1)).state == LeadershipState.UNKNOWN, "the app is told it stopped leading"
        assert (await next_within(c, 1)).is_leader


async def test_a_held_leader_status_keeps_its_last_deadline_once_another_state_is_yielded() -> None:
    c, stub = campaign()
    async with c:
        stub.call.responses.put_nowait(response(until=0.4, term=1))
        held = await next_within(c, 5)
        renewal = response(until=0.8, term=1)
        stub.call.responses.put_nowait(renewal)
        await asyncio.sleep(0.05)
        assert held.leader_until == until_of(renewal)
        # A new holder, then this sidecar leading again in a later term: neither moves the held deadline.
        stub.call.responses.put_nowait(response(LeadershipState.FOLLOWER, holder="other", term=2))
        assert (await next_within(c, 5)).state == LeadershipState.FOLLOWER
        stub.call.responses.put_nowait(response(until=5, term=3))
        leading = await next_within(c, 5)
        assert leading.term == 3 and leading is not held
        for _ in range(3):  # term 3's renewals
            stub.call.responses.put_nowait(response(until=5, term=3))
        await asyncio.sleep(0.05)
        assert held.leader_until == until_of(renewal), "another term's renewals moved the held deadline"
        await asyncio.sleep((until_of(renewal) - now()).total_seconds() + 0.01)
        assert not held.is_leader and leading.is_leader and c.is_leader


async def test_other_statuses_are_yielded_as_before() -> None:
    c, stub = campaign()
    async with c:
        stub.call.responses.put_nowait(response(until=5, term=1))
        assert (await next_within(c, 5)).is_leader
        stub.call.responses.put_nowait(response(LeadershipState.FOLLOWER, holder="other", term=2))
        following = await next_within(c, 5)
        assert following.state == LeadershipState.FOLLOWER and not c.is_leader
        # A LEADER in another term (or of another holder) is news even with leader_until.
        stub.call.responses.put_nowait(response(until=5, term=3))
        assert (await next_within(c, 5)).term == 3
        # A sidecar without leader_until: no deadline, every status yielded.
        stub.call.responses.put_nowait(response(term=4))
        assert (await next_within(c, 5)).term == 4
        stub.call.responses.put_nowait(response(term=4))
        unbounded = await next_within(c, 5)
        assert unbounded.is_leader and unbounded.leader_until is None
        await nothing_within(c, 0.3)
        assert c.is_leader


async def test_a_lost_stream_still_reports_unknown_at_once_and_a_cancelled_read_keeps_the_stream() -> None:
    c, stub = campaign()
    async with c:
        stub.call.responses.put_nowait(response(until=5, term=6))
        assert (await next_within(c, 5)).is_leader
        await nothing_within(c, 0.2)  # wait_for cancels the read of the app, not the stream
        assert len(stub.calls) == 1 and not stub.call.cancelled and c.is_leader
        stub.call.responses.put_nowait(
            grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone")
        )
        lost = await next_within(c, 1)
        assert lost.state == LeadershipState.UNKNOWN and lost.term == 6 and lost.leader_until is None
        # The next read opens the stream again (after the backoff) and yields its first status.
        reading = asyncio.ensure_future(c.__anext__())
        while len(stub.calls) < 2:
            await asyncio.sleep(0.02)
        stub.call.responses.put_nowait(response(until=5, term=6))
        assert (await asyncio.wait_for(reading, 5)).is_leader
    assert stub.call.cancelled, "leaving async with closes the stream"
