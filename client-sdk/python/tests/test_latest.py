"""The newest state per object (``client.watch_latest``): one pending state per object, handed to workers as they
ask, the own-write rule applied at the hand-out, no worker handed back the state its own write made on the state it
had, one worker per object at a time. The first test runs on a real daemon, a third party's writes coming through
the peer daemon; the rest feed a fake watch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

import consistd
from consistd import Consistency, Event, EventType, Latest, Object
from consistd._own_writes import OwnWrites
from support import configmap

#: How long a state is given to reach the client (the daemon sends within milliseconds).
ARRIVES = 1.0


async def handed(latest: Latest, timeout: float = 15.0) -> consistd.Taken:
    return await asyncio.wait_for(latest.next(), timeout)


async def test_a_worker_is_handed_the_newest_state_and_never_one_older_than_its_own_write(
    client: consistd.Client, peer: consistd.Client, namespace: str
) -> None:
    created = await client.objects.create("configmaps", configmap("slow", {"v": "0"}), namespace=namespace)
    async with client.watch_latest("configmaps", namespace=namespace) as latest:
        first = await handed(latest)
        assert first.event.type == EventType.ADDED and first.name == "slow" and first.namespace == namespace
        assert first.event.object is not None and first.event.object.resource_version == created.resource_version
        # Another writer changes it twice while the worker works: both states reach the client and wait there.
        await peer.objects.patch("configmaps", "slow", {"data": {"v": "1"}}, namespace=namespace)
        theirs = await peer.objects.patch("configmaps", "slow", {"data": {"v": "2"}}, namespace=namespace)
        await asyncio.sleep(ARRIVES)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(latest.next(), 0.2)  # the object is the worker's
        assert len(latest) == 1, "one pending state: the newest"
        mine = await client.objects.patch("configmaps", "slow", {"data": {"v": "mine"}}, namespace=namespace)
        first.done()
        second = await handed(latest)
        assert second.event.object is not None
        assert second.event.object.resource_version != theirs.resource_version, "older than the worker's own write"
        assert (second.event.type, second.event.object.resource_version) == (EventType.MODIFIED, mine.resource_version)
        second.done()
        await peer.objects.delete("configmaps", "slow", namespace=namespace)
        async with latest.take() as gone:
            assert (gone.type, gone.object and gone.object.name) == (EventType.DELETED, "slow")


async def test_the_watchs_error_reaches_the_worker(client: consistd.Client) -> None:
    async with client.watch_latest("nosuchthings", namespace="default") as latest:
        with pytest.raises(consistd.ConsistdError) as raised:
            await handed(latest)
    assert raised.value.code == grpc.StatusCode.NOT_FOUND


# Without a daemon: a fake watch.


class FakeWatch:
    """A watch whose events the test feeds; ``fail`` ends it with an error."""

    def __init__(self) -> None:
        self._events: asyncio.Queue[Event | Exception] = asyncio.Queue()
        self.closed = False

    def feed(self, *events: Event | Exception) -> None:
        for e in events:
            self._events.put_nowait(e)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        item = await self._events.get()
        if isinstance(item, Exception):
            raise item
        return item

    async def aclose(self) -> None:
        self.closed = True


def state(type_: EventType, name: str, rv: str, previous: str = "", uid: str = "") -> Event:
    """A state of the object ``name`` (uid ``uid-<name>`` unless given); ``previous`` is the state the daemon's watch
    saw directly before it (MODIFIED only, empty when not known)."""
    obj = Object(uid=uid or f"uid-{name}", namespace="ns", name=name, resource_version=rv, raw=b"{}")
    return Event(
        type=type_, object=obj, cursor=f"c{rv}", consistency=Consistency.CONSISTENT, previous_resource_version=previous
    )


def marker(type_: EventType) -> Event:
    return Event(type=type_, object=None, cursor="", consistency=Consistency.UNSPECIFIED)


ADDED, MODIFIED, DELETED = EventType.ADDED, EventType.MODIFIED, EventType.DELETED


def seen(taken: consistd.Taken) -> tuple[str, str, str]:
    assert taken.event.object is not None
    return taken.event.type.name, taken.event.object.name, taken.event.object.resource_version


async def settled() -> None:
    """Lets the reader take in what was fed."""
    for _ in range(10):
        await asyncio.sleep(0)


async def nothing_ready(latest: Latest) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(latest.next(), 0.05)


def fake() -> tuple[Latest, FakeWatch, OwnWrites]:
    watch, writes = FakeWatch(), OwnWrites()
    return Latest(watch, writes), watch, writes  # type: ignore[arg-type]


async def test_only_the_newest_state_of_each_object_is_handed_out_in_the_order_objects_became_ready() -> None:
    latest, watch, _ = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"), state(ADDED, "b", "2"), marker(EventType.SYNCED))
        watch.feed(state(MODIFIED, "a", "3"), state(MODIFIED, "a", "4"))
        await settled()
        assert len(latest) == 2
        assert seen(await handed(latest)) == ("MODIFIED", "a", "4")
        assert seen(await handed(latest)) == ("ADDED", "b", "2")
        await nothing_ready(latest)


async def test_an_object_a_worker_holds_is_handed_to_no_other_until_it_is_done_then_its_newest_state_is() -> None:
    latest, watch, _ = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"))
        held = await handed(latest)
        watch.feed(state(MODIFIED, "a", "2"), state(MODIFIED, "a", "3"))
        await settled()
        await nothing_ready(latest)
        watch.feed(state(ADDED, "b", "4"))
        assert seen(await handed(latest))[1] == "b", "another object is handed out meanwhile"
        waiting = asyncio.ensure_future(handed(latest))
        await settled()
        assert not waiting.done(), "a was handed out while held"
        held.done()
        held.done()  # again: nothing more
        assert seen(await waiting) == ("MODIFIED", "a", "3")


async def test_a_state_older_than_an_own_write_that_returned_while_it_waited_is_dropped_when_handed_out() -> None:
    latest, watch, writes = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"))
        async with latest.take():
            # Another writer's state arrives while the worker writes; the worker's write returns version 3.
            watch.feed(state(MODIFIED, "a", "2"))
            await settled()
            writes.record("uid-a", "3")
        await nothing_ready(latest)
        assert len(latest) == 0, "the older state was dropped"
        watch.feed(state(MODIFIED, "a", "3"))
        assert seen(await handed(latest)) == ("MODIFIED", "a", "3"), "the write's own state is handed out"


async def test_a_worker_is_not_handed_back_the_state_its_own_write_made_on_its_state_but_is_handed_anothers() -> None:
    latest, watch, writes = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"))
        async with latest.take():
            writes.record("uid-a", "2")  # the worker writes on the state it holds
        watch.feed(state(MODIFIED, "a", "2", previous="1"))
        await nothing_ready(latest)
        assert len(latest) == 0, "the own write's state was kept back"
        # The app writes again on that state, no worker having taken anything since: kept back too (the state kept
        # back counts as the one the workers have).
        writes.record("uid-a", "3")
        watch.feed(state(MODIFIED, "a", "3", previous="2"))
        await nothing_ready(latest)
        # Another writer's change on top of it is handed out.
        watch.feed(state(MODIFIED, "a", "4", previous="3"))
        assert seen(await handed(latest)) == ("MODIFIED", "a", "4")


async def test_an_own_write_on_top_of_another_writers_change_no_worker_had_is_handed_out() -> None:
    latest, watch, writes = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"))
        async with latest.take():
            watch.feed(state(MODIFIED, "a", "2", previous="1"))  # another writer, while the worker works
            await settled()
            writes.record("uid-a", "3")  # the worker's write lands on that change
            watch.feed(state(MODIFIED, "a", "3", previous="2"))
            await settled()
        own = await handed(latest)
        assert seen(own) == ("MODIFIED", "a", "3"), "it holds a change no worker saw"
        # The worker's write on the state it now has: kept back.
        writes.record("uid-a", "4")
        own.done()
        watch.feed(state(MODIFIED, "a", "4", previous="3"))
        await nothing_ready(latest)


async def test_an_own_write_with_no_previous_state_known_is_handed_out() -> None:
    latest, watch, writes = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"), marker(EventType.SYNCED))
        async with latest.take():
            writes.record("uid-a", "2")
        # The watch could not resume: the write's state comes in a fresh snapshot, with no previous state.
        watch.feed(marker(EventType.RESYNC_REQUIRED), state(ADDED, "a", "2"), marker(EventType.SYNCED))
        listed = await handed(latest)
        assert seen(listed) == ("ADDED", "a", "2"), "writes in between were never seen"
        writes.record("uid-a", "3")
        listed.done()
        watch.feed(state(MODIFIED, "a", "3", previous="2"))
        await nothing_ready(latest)


async def test_after_a_deletion_the_state_last_handed_out_counts_no_more() -> None:
    latest, watch, writes = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"))
        (await handed(latest)).done()
        watch.feed(state(DELETED, "a", "2"))
        (await handed(latest)).done()
        assert latest._seen == {}, "a deleted object is forgotten"
        # A state naming the one handed out before the deletion as its previous (the same uid only so that nothing
        # but the deletion tells them apart) is handed out: the deletion came in between.
        writes.record("uid-a", "3")
        watch.feed(state(MODIFIED, "a", "3", previous="1"))
        after = await handed(latest)
        assert seen(after) == ("MODIFIED", "a", "3")
        after.done()
        # Deleted and re-created (a new uid): its first state is handed out, and the rule starts afresh from it.
        watch.feed(state(DELETED, "a", "4"), state(ADDED, "a", "5", uid="uid-a2"))
        recreated = await handed(latest)
        assert seen(recreated) == ("ADDED", "a", "5")
        writes.record("uid-a2", "6")
        recreated.done()
        watch.feed(state(MODIFIED, "a", "6", previous="5", uid="uid-a2"))
        await nothing_ready(latest)


async def test_a_state_of_another_object_of_the_same_name_is_handed_out() -> None:
    latest, watch, writes = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"), marker(EventType.SYNCED))
        (await handed(latest)).done()
        # Re-created while the watch could not resume: the snapshot holds the new object (a new uid), no deletion
        # came in between. The state names the old object's as its previous only so that the uid alone tells them
        # apart.
        writes.record("uid-a2", "2")
        watch.feed(marker(EventType.RESYNC_REQUIRED), state(MODIFIED, "a", "2", previous="1", uid="uid-a2"))
        assert seen(await handed(latest)) == ("MODIFIED", "a", "2")


async def test_a_deletion_replaces_the_waiting_state_and_is_handed_out_whatever_the_own_writes() -> None:
    latest, watch, writes = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"))
        held = await handed(latest)
        watch.feed(state(MODIFIED, "a", "2"), state(DELETED, "a", "2"))
        await settled()
        writes.record("uid-a", "9")
        held.done()
        assert seen(await handed(latest)) == ("DELETED", "a", "2")


async def test_after_a_resync_objects_missing_from_the_snapshot_are_handed_out_deleted() -> None:
    latest, watch, _ = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"), state(ADDED, "b", "2"), state(ADDED, "c", "3"), marker(EventType.SYNCED))
        for _ in range(3):
            (await handed(latest)).done()
        watch.feed(state(DELETED, "c", "4"))
        (await handed(latest)).done()
        # The watch could not resume: a fresh snapshot without b.
        watch.feed(marker(EventType.RESYNC_REQUIRED), state(ADDED, "a", "1"))
        await settled()
        assert seen(await handed(latest)) == ("ADDED", "a", "1"), "a is handed out again"
        await nothing_ready(latest)
        watch.feed(marker(EventType.SYNCED))
        gone = await handed(latest)
        assert seen(gone) == ("DELETED", "b", "2")
        assert gone.event.object is not None
        assert json.loads(gone.event.object.raw)["metadata"] == {
            "name": "b",
            "namespace": "ns",
            "uid": "uid-b",
            "resourceVersion": "2",
        }
        await nothing_ready(latest)


async def test_the_error_that_ends_the_watch_reaches_every_worker_that_asks_and_closing_ends_the_waits() -> None:
    latest, watch, _ = fake()
    async with latest:
        watch.feed(state(ADDED, "a", "1"))
        held = await handed(latest)
        waiting = asyncio.ensure_future(handed(latest))
        await settled()
        watch.feed(consistd.ConsistdError(grpc.StatusCode.NOT_FOUND, "no such resource"))
        with pytest.raises(consistd.ConsistdError) as raised:
            await waiting
        assert (raised.value.code, raised.value.message) == (grpc.StatusCode.NOT_FOUND, "no such resource")
        with pytest.raises(consistd.ConsistdError):
            await latest.next()
        held.done()
    closed, watch, _ = fake()
    async with closed:
        waiting = asyncio.ensure_future(handed(closed))
        await settled()
    assert watch.closed
    with pytest.raises(consistd.ConsistdError) as cancelled:
        await waiting
    assert cancelled.value.code == grpc.StatusCode.CANCELLED


def test_latest_and_taken_are_exported() -> None:
    names: Any = consistd.__all__
    assert "Latest" in names and "Taken" in names
