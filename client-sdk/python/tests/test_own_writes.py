"""The own-write rule, where the app takes an event: a state the daemon sent before the app's write reached
it can still be unread in the SDK when that write returns; as the app takes it, a CONSISTENT watch drops
it and a RAW watch marks it ``predates_own_write``. The first tests race a third party's write (through
the peer daemon, so not this app's) against the app's own on a real daemon; the rest stand in fake gRPC
calls for grpcio's, to lose the connection right after a dropped event and to choose the versions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import grpc
import pytest

import consistd
from consistd import Event, EventType, Mode
from consistd._own_writes import OwnWrites, integer_version
from consistd.objects import Objects
from consistd.v1 import object_pb2, objects_pb2, watch_pb2
from support import configmap, next_item

#: How long the third party's state is given to reach the app's client before the app writes: the daemon
#: sends it within milliseconds of the apiserver's watch event; this is far more.
ARRIVES = 1.0


async def unread_third_party_state_then_own_write(
    client: consistd.Client, peer: consistd.Client, namespace: str, watch: consistd.Watch
) -> tuple[str, str]:
    """The watch at SYNCED; a third party changes the object (rv2) and the state reaches the app's client
    unread; then the app's own patch (rv3). Returns (rv2, rv3)."""
    assert [(await next_item(watch)).type for _ in range(2)] == [EventType.ADDED, EventType.SYNCED]
    third = await peer.objects.patch("configmaps", "raced", {"data": {"by": "third party"}}, namespace=namespace)
    await asyncio.sleep(ARRIVES)
    own = await client.objects.patch("configmaps", "raced", {"data": {"by": "app"}}, namespace=namespace)
    assert int(third.resource_version) < int(own.resource_version)
    return third.resource_version, own.resource_version


async def test_a_consistent_watch_never_hands_the_app_a_state_older_than_its_own_write(
    client: consistd.Client, peer: consistd.Client, namespace: str
) -> None:
    await client.objects.create("configmaps", configmap("raced", {"by": "creator"}), namespace=namespace)
    async with client.watch("configmaps", namespace=namespace, mode=Mode.CONSISTENT) as watch:
        third, own = await unread_third_party_state_then_own_write(client, peer, namespace, watch)
        taken = await next_item(watch)
        assert taken.object is not None
        assert taken.object.resource_version != third, "the app was handed the state its own write replaced"
        assert (taken.type, taken.object.resource_version) == (EventType.MODIFIED, own)
        assert taken.object.json["data"] == {"by": "app"} and not taken.predates_own_write
        assert watch.cursor == taken.cursor


async def test_a_raw_watch_marks_the_state_older_than_the_apps_own_write(
    client: consistd.Client, peer: consistd.Client, namespace: str
) -> None:
    await client.objects.create("configmaps", configmap("raced", {"by": "creator"}), namespace=namespace)
    async with client.watch("configmaps", namespace=namespace, mode=Mode.RAW) as watch:
        third, own = await unread_third_party_state_then_own_write(client, peer, namespace, watch)
        older, newer = await next_item(watch), await next_item(watch)
    assert older.object is not None and newer.object is not None
    assert (older.type, older.object.resource_version, older.predates_own_write) == (EventType.MODIFIED, third, True)
    assert (newer.type, newer.object.resource_version, newer.predates_own_write) == (EventType.MODIFIED, own, False)


async def test_a_state_the_app_buffered_is_judged_again_when_its_worker_takes_it(
    client: consistd.Client, peer: consistd.Client, namespace: str
) -> None:
    """An app that takes events into a buffer of its own (a worker per object) took the third party's state
    before its write returned: the watch could not drop it, so the worker asks predates_own_write."""
    await client.objects.create("configmaps", configmap("raced", {"by": "creator"}), namespace=namespace)
    async with client.watch("configmaps", namespace=namespace, mode=Mode.CONSISTENT) as watch:
        assert [(await next_item(watch)).type for _ in range(2)] == [EventType.ADDED, EventType.SYNCED]
        await peer.objects.patch("configmaps", "raced", {"data": {"by": "third party"}}, namespace=namespace)
        buffered = (await next_item(watch)).object  # taken before the app's own write: delivered
        assert buffered is not None and buffered.json["data"] == {"by": "third party"}
        assert not client.predates_own_write(buffered)
        own = await client.objects.patch("configmaps", "raced", {"data": {"by": "app"}}, namespace=namespace)
        assert client.predates_own_write(buffered), "a state older than the app's own write was judged current"
        assert own.json["data"] == {"by": "app"} and not client.predates_own_write(own)
    async with consistd.Client(client.socket) as other:
        assert not other.predates_own_write(buffered), "another client's write counted as this one's"


async def test_a_write_through_another_client_is_not_an_own_write(client: consistd.Client, namespace: str) -> None:
    """The record belongs to one client: its watches do not judge against another client's writes."""
    await client.objects.create("configmaps", configmap("other", {}), namespace=namespace)
    async with consistd.Client(client.socket) as watcher:
        async with watcher.watch("configmaps", namespace=namespace, mode=Mode.RAW) as watch:
            assert [(await next_item(watch)).type for _ in range(2)] == [EventType.ADDED, EventType.SYNCED]
            first = await client.objects.patch("configmaps", "other", {"data": {"n": "1"}}, namespace=namespace)
            await asyncio.sleep(ARRIVES)
            await client.objects.patch("configmaps", "other", {"data": {"n": "2"}}, namespace=namespace)
            taken = await next_item(watch)
    assert taken.object is not None and taken.object.resource_version == first.resource_version
    assert not taken.predates_own_write


# Without a daemon.

UID = "0b5c4a9e-0000-4000-8000-000000000001"


def kube_object(resource_version: str, uid: str = UID) -> object_pb2.KubeObject:
    return object_pb2.KubeObject(uid=uid, namespace="ns", name="cm", resource_version=resource_version, json=b"{}")


def event(type_: int, resource_version: str = "", cursor: str = "", uid: str = UID) -> watch_pb2.SubscribeResponse:
    """A SubscribeResponse; markers (SYNCED, RESYNC_REQUIRED) carry no object."""
    if type_ in (watch_pb2.EVENT_TYPE_SYNCED, watch_pb2.EVENT_TYPE_RESYNC_REQUIRED):
        return watch_pb2.SubscribeResponse(type=type_, cursor=cursor)
    return watch_pb2.SubscribeResponse(type=type_, object=kube_object(resource_version, uid), cursor=cursor)


ADDED, MODIFIED, DELETED = watch_pb2.EVENT_TYPE_ADDED, watch_pb2.EVENT_TYPE_MODIFIED, watch_pb2.EVENT_TYPE_DELETED
SYNCED = watch_pb2.EVENT_TYPE_SYNCED


class FakeSubscription:
    """A Subscribe call that has already received ``responses`` (as grpcio's buffers hold them before the
    app reads), then loses its connection (UNAVAILABLE) if ``then_lost``, else waits."""

    def __init__(self, responses: list[watch_pb2.SubscribeResponse], then_lost: bool) -> None:
        self._responses = list(responses)
        self._then_lost = then_lost

    async def read(self) -> Any:
        if self._responses:
            return self._responses.pop(0)
        if self._then_lost:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="Socket closed"
            )
        await asyncio.Event().wait()

    def cancel(self) -> bool:
        return True


class WatchStub:
    """Answers each Subscribe with the next FakeSubscription and keeps the cursor each was asked to resume
    from (the Watch passes its request object on and changes it later)."""

    def __init__(self, *subscriptions: FakeSubscription) -> None:
        self._subscriptions = list(subscriptions)
        self.resumed_from: list[str] = []

    def Subscribe(self, request: watch_pb2.SubscribeRequest) -> FakeSubscription:  # noqa: N802 (generated name)
        self.resumed_from.append(request.resume_cursor)
        return self._subscriptions.pop(0)


class ObjectsStub:
    """Answers every write with the object at ``answer`` (a resourceVersion)."""

    def __init__(self) -> None:
        self.answer = ""

    def _object(self) -> object_pb2.KubeObject:
        return kube_object(self.answer)

    async def Create(self, request: Any) -> objects_pb2.CreateResponse:  # noqa: N802
        return objects_pb2.CreateResponse(object=self._object())

    async def Update(self, request: Any) -> objects_pb2.UpdateResponse:  # noqa: N802
        return objects_pb2.UpdateResponse(object=self._object())

    async def Patch(self, request: Any) -> objects_pb2.PatchResponse:  # noqa: N802
        return objects_pb2.PatchResponse(object=self._object())

    async def Delete(self, request: Any) -> objects_pb2.DeleteResponse:  # noqa: N802
        return objects_pb2.DeleteResponse(object=self._object()) if self.answer else objects_pb2.DeleteResponse()

    async def SetCondition(self, request: Any) -> objects_pb2.SetConditionResponse:  # noqa: N802
        # Whether it wrote: the answer's version is odd (a write) or even (as read, nothing written).
        changed = int(self.answer) % 2 == 1
        time = "2026-01-02T03:04:05Z"
        return objects_pb2.SetConditionResponse(object=self._object(), changed=changed, last_transition_time=time)


def watch_of(stub: WatchStub, mode: Mode, own_writes: OwnWrites) -> consistd.Watch:
    delivery = cast("watch_pb2.DeliveryMode", int(mode))
    request = watch_pb2.SubscribeRequest(resource="configmaps", namespace="ns", mode=delivery)
    return consistd.Watch(stub, request, own_writes)  # type: ignore[arg-type]


async def written(own_writes: OwnWrites, resource_version: str) -> None:
    """The app patches the object through an objects client sharing ``own_writes``; the write returns
    ``resource_version``."""
    stub = ObjectsStub()
    stub.answer = resource_version
    await Objects(stub, own_writes).patch("configmaps", "cm", {"data": {}}, namespace="ns")  # type: ignore[arg-type]


def described(e: Event) -> tuple[str, str, str, bool]:
    return (e.type.name, e.object.resource_version if e.object else "", e.cursor, e.predates_own_write)


async def test_a_dropped_event_advances_the_cursor_a_reconnect_resumes_from() -> None:
    own_writes = OwnWrites()
    stub = WatchStub(
        FakeSubscription([event(ADDED, "5", "c1"), event(SYNCED, cursor="c2"), event(MODIFIED, "6", "c3")], True),
        FakeSubscription([event(MODIFIED, "7", "c4")], False),
    )
    async with watch_of(stub, Mode.CONSISTENT, own_writes) as watch:
        taken = [described(await next_item(watch, 5)) for _ in range(2)]
        # MODIFIED@6 is already in the client when the app's write returns 7.
        await written(own_writes, "7")
        taken.append(described(await next_item(watch, 5)))
    assert taken == [("ADDED", "5", "c1", False), ("SYNCED", "", "c2", False), ("MODIFIED", "7", "c4", False)]
    assert stub.resumed_from == ["", "c3"], "the reconnect resumed before the dropped event"


async def test_the_rule_judges_when_the_app_takes_an_event_not_when_it_arrived() -> None:
    own_writes = OwnWrites()
    stub = WatchStub(FakeSubscription([event(ADDED, "5", "c1"), event(MODIFIED, "6", "c2")], False))
    async with watch_of(stub, Mode.RAW, own_writes) as watch:
        first = await next_item(watch, 5)
        await written(own_writes, "9")
        second = await next_item(watch, 5)
    assert [described(first), described(second)] == [("ADDED", "5", "c1", False), ("MODIFIED", "6", "c2", True)]
    # The event's state is the daemon's; only the mark is the SDK's.
    assert second.consistency == consistd.Consistency.UNSPECIFIED


@pytest.mark.parametrize("mode", [Mode.CONSISTENT, Mode.RAW])
async def test_deleted_and_markers_are_never_dropped_and_equal_or_later_versions_pass(mode: Mode) -> None:
    own_writes = OwnWrites()
    await written(own_writes, "10")
    responses = [
        event(DELETED, "3", "c1"),
        event(watch_pb2.EVENT_TYPE_RESYNC_REQUIRED, cursor="c2"),
        event(ADDED, "10", "c3"),
        event(SYNCED, cursor="c4"),
        event(MODIFIED, "11", "c5"),
        event(MODIFIED, "4", "c6", uid="another-object"),
    ]
    async with watch_of(WatchStub(FakeSubscription(responses, False)), mode, own_writes) as watch:
        taken = [described(await next_item(watch, 5)) for _ in responses]
    assert taken == [
        ("DELETED", "3", "c1", False),
        ("RESYNC_REQUIRED", "", "c2", False),
        ("ADDED", "10", "c3", False),
        ("SYNCED", "", "c4", False),
        ("MODIFIED", "11", "c5", False),
        ("MODIFIED", "4", "c6", False),
    ]


@pytest.mark.parametrize(
    ("recorded", "delivered"),
    [("10", "9a"), ("10", "x"), ("10", ""), ("10", "+9"), ("10", " 9"), ("10", "٩"), ("abc", "9"), ("", "9")],
)
async def test_a_version_that_is_not_a_decimal_integer_is_never_compared(recorded: str, delivered: str) -> None:
    own_writes = OwnWrites()
    await written(own_writes, recorded)
    responses = [event(MODIFIED, delivered, "c1"), event(MODIFIED, "11", "c2")]
    async with watch_of(WatchStub(FakeSubscription(responses, False)), Mode.CONSISTENT, own_writes) as watch:
        assert described(await next_item(watch, 5)) == ("MODIFIED", delivered, "c1", False)


async def test_every_write_records_the_largest_version_it_returned() -> None:
    own_writes, stub = OwnWrites(), ObjectsStub()
    objects = Objects(stub, own_writes)  # type: ignore[arg-type]
    writes: list[tuple[str, Callable[[], Any]]] = [
        ("3", lambda: objects.create("configmaps", {}, namespace="ns")),
        ("5", lambda: objects.update("configmaps", "cm", {}, namespace="ns", subresource="status")),
        ("4", lambda: objects.patch("configmaps", "cm", {}, namespace="ns")),  # answered out of order
        ("7", lambda: objects.patch("configmaps", "cm", {}, namespace="ns", subresource="status")),
        ("9", lambda: objects.delete("configmaps", "cm", namespace="ns")),
        ("", lambda: objects.delete("configmaps", "cm", namespace="ns")),  # no object in the answer
    ]
    largest = []
    for answer, write in writes:
        stub.answer = answer
        await write()
        largest.append(next(v for v in range(20) if not own_writes.predates(UID, str(v))))
    assert largest == [3, 5, 5, 7, 9, 9]


async def test_a_set_condition_is_recorded_only_when_it_wrote() -> None:
    """A condition the sidecar wrote (``changed``) is recorded for the own-write rule; an answer that wrote nothing
    (the object as the sidecar read it) is not: no write of this pod's made that state."""
    own_writes, stub = OwnWrites(), ObjectsStub()
    objects = Objects(stub, own_writes)  # type: ignore[arg-type]
    answers = []
    largest = []
    for answer in ["4", "3", "8", "9"]:  # odd: written; even: nothing written
        stub.answer = answer
        answers.append(await objects.set_condition("widgets", "cm", "Ready", "True", "Done", namespace="ns"))
        largest.append(next(v for v in range(20) if not own_writes.predates(UID, str(v))))
    assert [(a.changed, a.object.resource_version) for a in answers] == [
        (False, "4"),
        (True, "3"),
        (False, "8"),
        (True, "9"),
    ]
    assert largest == [0, 3, 3, 9], "only the answers that wrote were recorded"
    assert not own_writes.wrote(UID, "8") and own_writes.wrote(UID, "9")


def test_the_record_keeps_the_objects_written_most_recently_and_forgets_the_least_recently_written() -> None:
    own_writes = OwnWrites(capacity=3)
    for uid in "abc":
        own_writes.record(uid, "10")
    assert [own_writes.predates(uid, "9") for uid in "abc"] == [True, True, True]
    own_writes.record("a", "8")  # written again: still 10, and now the most recently written
    own_writes.record("d", "10")  # one too many: the least recently written, "b", goes
    assert [own_writes.predates(uid, "9") for uid in "abcd"] == [True, False, True, True] and len(own_writes) == 3
    own_writes.predates("c", "9")  # asking is not writing: "c" stays the least recently written
    own_writes.record("e", "10")
    assert [own_writes.predates(uid, "9") for uid in "abcde"] == [True, False, False, True, True]
    assert len(own_writes) == 3


def test_by_default_the_record_keeps_the_10000_objects_written_most_recently_however_long_ago(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own_writes = OwnWrites()
    for i in range(10_000):
        own_writes.record(f"uid-{i}", "10")
    # No entry ages out, a day later either: only writes to other objects push one out.
    day_later = time.monotonic() + 86_400, time.time() + 86_400
    monkeypatch.setattr(time, "monotonic", lambda: day_later[0])
    monkeypatch.setattr(time, "time", lambda: day_later[1])
    assert len(own_writes) == 10_000 and own_writes.predates("uid-0", "9")
    own_writes.record("uid-10000", "10")
    assert len(own_writes) == 10_000
    assert not own_writes.predates("uid-0", "9") and own_writes.predates("uid-1", "9")
    assert own_writes.predates("uid-10000", "9")


def test_wrote_is_exactly_the_largest_version_the_writes_returned_compared_as_integers() -> None:
    own_writes = OwnWrites()
    own_writes.record(UID, "7")
    own_writes.record(UID, "5")
    wrote = [own_writes.wrote(UID, v) for v in ("7", "007", "5", "8", "x", "")]
    assert wrote == [True, True, False, False, False, False]
    assert not own_writes.wrote("another-object", "7")


def test_only_ascii_decimal_integers_are_versions() -> None:
    assert [integer_version(v) for v in ("0", "12", "007", "", "1_0", "-1", "+1", " 1", "1.0", "١٢", "²")] == [
        0, 12, 7, None, None, None, None, None, None, None, None,
    ]  # fmt: skip
