"""The consistd side of the Kopf comparison (daemon/benches/kopf.rs): the same job as kopf_operator.py on the
consistd Python SDK. It watches the ConfigMaps labelled bench.consistd.io/kopf=true in CONSISTENT mode (only
states consistent with its own patches), and for each ConfigMap whose `data.value` differs from its annotation
bench.consistd.io/handled records an execution and patches the value into that annotation through the
sidecar. Like Kopf, it handles each ConfigMap in a worker of its own, on the newest state seen.

    python consistd_app.py

Environment: CONSISTD_SOCKET (the sidecar), BENCH_NAMESPACE, BENCH_EXECUTIONS (the file each execution is
appended to as one JSON line {name, value, at, consistency}; at: wall-clock seconds; consistency: how the
state handled relates to the app's own writes, TIMED_OUT when the sidecar gave up waiting for one).
"""

import asyncio
import json
import os
import time

import consistd

HANDLED = "bench.consistd.io/handled"


async def main() -> None:
    namespace = os.environ["BENCH_NAMESPACE"]
    executions = open(os.environ["BENCH_EXECUTIONS"], "a", buffering=1)  # noqa: SIM115 (open for the whole run)
    newest: dict[str, consistd.Event] = {}  # the newest unhandled state of each ConfigMap
    workers: dict[str, asyncio.Task[None]] = {}
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def work(client: consistd.Client, name: str) -> None:
        while name in newest:
            event = newest.pop(name)
            assert event.object is not None
            value = event.object.json["data"]["value"]
            execution = {"name": name, "value": value, "at": time.time(), "consistency": event.consistency.name}
            executions.write(json.dumps(execution) + "\n")
            patch = {"metadata": {"annotations": {HANDLED: value}}}
            await client.objects.patch("configmaps", name, patch, namespace=namespace)
        del workers[name]

    def finished(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and not failed.done():
            failed.set_exception(task.exception())  # type: ignore[arg-type]

    async def follow(client: consistd.Client) -> None:
        watch = client.watch(
            "configmaps", namespace=namespace, label_selector="bench.consistd.io/kopf=true", mode=consistd.Mode.CONSISTENT
        )
        async with watch:
            async for event in watch:
                if event.object is None:
                    continue  # the SYNCED and RESYNC_REQUIRED markers
                name, cm = event.object.name, event.object.json
                value = (cm.get("data") or {}).get("value")
                handled = (cm["metadata"].get("annotations") or {}).get(HANDLED)
                if event.type == consistd.EventType.DELETED or value is None or handled == value:
                    newest.pop(name, None)  # nothing to do: a queued older state is stale
                    continue
                newest[name] = event
                if name not in workers:
                    workers[name] = asyncio.create_task(work(client, name))
                    workers[name].add_done_callback(finished)

    async with consistd.Client() as client:
        await client.wait_ready(30)
        following = asyncio.create_task(follow(client))
        following.add_done_callback(finished)
        await failed  # runs until a worker or the watch fails (its error ends the process), or SIGTERM


if __name__ == "__main__":
    asyncio.run(main())
