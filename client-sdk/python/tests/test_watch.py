"""Watches: the snapshot then live events, resuming after a lost connection, resyncing after a restart. The
tests at the end stand in a fake gRPC call for grpcio's, to check the request a watch's view makes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

import consistd
from consistd import Consistency, EventType, Mode
from consistd.v1 import object_pb2, watch_pb2, watch_pb2_grpc
from support import Daemon, SocketProxy, configmap, next_item, unique


async def test_consistent_watch_sees_the_snapshot_then_its_own_write(client: consistd.Client, namespace: str) -> None:
    created = await client.objects.create("configmaps", configmap("settings", {"a": "1"}), namespace=namespace)
    async with client.watch("configmaps", namespace=namespace, mode=Mode.CONSISTENT) as watch:
        added = await next_item(watch)
        assert added.type == EventType.ADDED and added.object is not None
        assert (added.object.name, added.object.resource_version) == ("settings", created.resource_version)
        assert added.previous_resource_version == "", "a listed state has no previous state"
        synced = await next_item(watch)
        assert synced.type == EventType.SYNCED and synced.object is None
        # The ADDED has a cursor only when the watch was new (a snapshot's objects have none): SYNCED always.
        assert synced.cursor

        patched = await client.objects.patch("configmaps", "settings", {"data": {"b": "2"}}, namespace=namespace)
        own = await next_item(watch)
        assert own.type == EventType.MODIFIED and own.object is not None
        assert own.consistency == Consistency.OWN_WRITE
        assert own.object.resource_version == patched.resource_version
        assert own.object.json["data"] == {"a": "1", "b": "2"}
        assert own.previous_resource_version == created.resource_version, "the state the watch saw directly before"
        assert watch.cursor == own.cursor


async def test_watch_resumes_after_every_connection_is_cut_without_resync(
    client: consistd.Client, namespace: str, short_dir: Path
) -> None:
    proxy = await SocketProxy(client.socket, str(short_dir / "proxy.sock")).start()
    await client.objects.create("configmaps", configmap("cm-0", {}), namespace=namespace)
    seen: list[tuple[EventType, str, str]] = []
    try:
        async with consistd.Client(proxy.path) as via_proxy:
            async with via_proxy.watch("configmaps", namespace=namespace, mode=Mode.RAW) as watch:

                async def take(count: int) -> None:
                    for _ in range(count):
                        e = await next_item(watch, 30)
                        seen.append(
                            (e.type, e.object.name if e.object else "", e.object.resource_version if e.object else "")
                        )

                await take(2)  # ADDED cm-0, SYNCED
                await client.objects.create("configmaps", configmap("cm-1", {}), namespace=namespace)
                await take(1)

                # Lose the connection mid-stream and keep it lost while the namespace changes.
                proxy.paused = True
                proxy.cut()
                await client.objects.create("configmaps", configmap("cm-2", {}), namespace=namespace)
                await client.objects.patch("configmaps", "cm-0", {"data": {"x": "1"}}, namespace=namespace)
                await client.objects.create("configmaps", configmap("cm-3", {}), namespace=namespace)
                await asyncio.sleep(0.5)
                proxy.paused = False
                await take(3)
    finally:
        await proxy.close()

    assert proxy.forwarded >= 2, "the watch did not reconnect"
    kinds = [(t, name) for t, name, _ in seen]
    assert kinds == [
        (EventType.ADDED, "cm-0"),
        (EventType.SYNCED, ""),
        (EventType.ADDED, "cm-1"),
        (EventType.ADDED, "cm-2"),
        (EventType.MODIFIED, "cm-0"),
        (EventType.ADDED, "cm-3"),
    ], seen
    assert len(set(seen)) == len(seen), f"an event arrived twice: {seen}"


async def test_watch_across_a_daemon_restart_yields_resync_then_the_snapshot(
    client: consistd.Client, namespace: str, short_dir: Path
) -> None:
    await client.objects.create("configmaps", configmap("survivor", {"k": "v"}), namespace=namespace)
    daemon = Daemon(short_dir, unique("sdk-py-restart"))
    await daemon.start()
    try:
        async with consistd.Client(daemon.socket) as own:
            await own.wait_ready(30)
            async with own.watch("configmaps", namespace=namespace, mode=Mode.RAW) as watch:
                assert [(await next_item(watch)).type for _ in range(2)] == [EventType.ADDED, EventType.SYNCED]
                before = watch.cursor

                await daemon.stop()
                await daemon.start()

                events = [await next_item(watch, 60) for _ in range(3)]
                assert [e.type for e in events] == [EventType.RESYNC_REQUIRED, EventType.ADDED, EventType.SYNCED]
                assert events[1].object is not None and events[1].object.name == "survivor"
                assert watch.cursor != before
    finally:
        await daemon.stop()


async def test_aclose_from_another_task_ends_the_iteration_cleanly(client: consistd.Client, namespace: str) -> None:
    watch = client.watch("configmaps", namespace=namespace)
    synced = asyncio.Event()

    async def drain() -> list[EventType]:
        seen = []
        async for event in watch:
            seen.append(event.type)
            synced.set()
        return seen

    draining = asyncio.create_task(drain())
    await asyncio.wait_for(synced.wait(), 15)
    await asyncio.sleep(0.1)  # the reader is waiting for the next event
    await watch.aclose()
    assert await asyncio.wait_for(draining, 5) == [EventType.SYNCED]


# Without a daemon.


class Subscription:
    """A Subscribe call that answers ``responses``, then loses its connection (UNAVAILABLE)."""

    def __init__(self, *responses: watch_pb2.SubscribeResponse) -> None:
        self._responses = list(responses)

    async def read(self) -> Any:
        if self._responses:
            return self._responses.pop(0)
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="Socket closed"
        )

    def cancel(self) -> bool:
        return True


class Subscriber:
    """Stands in for WatchServiceStub.Subscribe: keeps a copy of each request (the Watch reuses its request and
    moves its cursor on), answers each with one SYNCED marker, then loses the connection."""

    def __init__(self) -> None:
        self.requests: list[watch_pb2.SubscribeRequest] = []

    def __call__(self, request: watch_pb2.SubscribeRequest) -> Subscription:
        copy = watch_pb2.SubscribeRequest()
        copy.CopyFrom(request)
        self.requests.append(copy)
        n = len(self.requests)
        return Subscription(watch_pb2.SubscribeResponse(type=watch_pb2.EVENT_TYPE_SYNCED, cursor=f"c{n}"))


@pytest.mark.parametrize(
    ("view", "sent"),
    [
        pytest.param(None, None, id="none"),
        pytest.param(consistd.View(), None, id="default-is-none"),
        pytest.param(consistd.View(metadata_only=True), object_pb2.ObjectView(metadata_only=True), id="metadata-only"),
        pytest.param(
            consistd.View(fields=["spec.replicas", "metadata.labels"], managed_fields=True),
            object_pb2.ObjectView(fields=["spec.replicas", "metadata.labels"], managed_fields=True),
            id="projection-with-managed-fields",
        ),
    ],
)
async def test_a_watch_sends_its_view_on_every_subscribe_and_none_by_default(
    tmp_path: Path, view: consistd.View | None, sent: object_pb2.ObjectView | None
) -> None:
    subscribe = Subscriber()
    async with consistd.Client(tmp_path / "unused.sock") as client:
        client._stub(watch_pb2_grpc.WatchServiceStub).Subscribe = subscribe
        async with client.watch("deployments.apps", namespace="ns", view=view) as watch:
            # The second SYNCED comes from the Subscribe after the first connection was lost.
            assert [(await next_item(watch, 5)).cursor for _ in range(2)] == ["c1", "c2"]
    assert [r.resume_cursor for r in subscribe.requests] == ["", "c1"]
    for request in subscribe.requests:
        if sent is None:
            assert not request.HasField("view"), request
        else:
            assert request.HasField("view") and request.view == sent, request


def test_a_view_keeps_its_fields_as_a_tuple_and_refuses_a_single_string() -> None:
    paths = ["spec.replicas"]
    view = consistd.View(fields=paths)
    paths.append("status")
    assert view.fields == ("spec.replicas",) and hash(view) == hash(consistd.View(fields=("spec.replicas",)))
    with pytest.raises(TypeError, match="not one string"):
        consistd.View(fields="spec.replicas")
    # What the sidecar refuses (both set, more than 32 paths) goes as it is: the sidecar names the field.
    both = consistd.View(metadata_only=True, fields=["data"]).to_proto()
    assert both == object_pb2.ObjectView(metadata_only=True, fields=["data"])


def test_an_event_carries_the_previous_resource_version_its_message_names() -> None:
    response = watch_pb2.SubscribeResponse(
        type=watch_pb2.EVENT_TYPE_MODIFIED,
        object=object_pb2.KubeObject(uid="u", namespace="ns", name="cm", resource_version="8"),
        cursor="c1",
        previous_resource_version="7",
    )
    assert consistd.Event.from_proto(response).previous_resource_version == "7"
    response.ClearField("previous_resource_version")
    assert consistd.Event.from_proto(response).previous_resource_version == ""
