"""Watches: the snapshot then live events, resuming after a lost connection, resyncing after a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import consistd
from consistd import Consistency, EventType, Mode
from support import Daemon, SocketProxy, configmap, next_item, unique


async def test_consistent_watch_sees_the_snapshot_then_its_own_write(client: consistd.Client, namespace: str) -> None:
    created = await client.objects.create("configmaps", configmap("settings", {"a": "1"}), namespace=namespace)
    async with client.watch("configmaps", namespace=namespace, mode=Mode.CONSISTENT) as watch:
        added = await next_item(watch)
        assert added.type == EventType.ADDED and added.object is not None
        assert (added.object.name, added.object.resource_version) == ("settings", created.resource_version)
        assert added.cursor
        synced = await next_item(watch)
        assert synced.type == EventType.SYNCED and synced.object is None

        patched = await client.objects.patch("configmaps", "settings", {"data": {"b": "2"}}, namespace=namespace)
        own = await next_item(watch)
        assert own.type == EventType.MODIFIED and own.object is not None
        assert own.consistency == Consistency.OWN_WRITE
        assert own.object.resource_version == patched.resource_version
        assert own.object.json["data"] == {"a": "1", "b": "2"}
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
