"""The consistd sides of the Kopf comparison (daemon/benches/kopf.rs): the same job as kopf_operator.py on the
consistd Python SDK, through a sidecar. For each ConfigMap labelled bench.consistd.io/kopf=true whose
`data.value` differs from its annotation bench.consistd.io/handled, the handler records an execution, works
BENCH_HANDLER_MS (an asyncio sleep), then patches the value into that annotation. Two ways:

    python consistd_app.py queue    # the SDK's reconciler: the sidecar's work queue hands out each key
    python consistd_app.py stream   # the SDK's newest state per ConfigMap (watch_latest), a worker each (as Kopf)
    python consistd_app.py stream-unchecked   # a hand-written buffer of the newest states, no recheck (a control)

`stream` is the way the SDK offers to consume a CONSISTENT watch with a slow handler: the SDK keeps the newest
state of each ConfigMap and applies the own-write rule when it hands one to a worker. `stream-unchecked` keeps
the newest states in a buffer of the app's own and applies the rule only when its reader takes a state,
before the worker's own patch returned: it shows what the figures look like when a state older than the
handler's own patch is handled.

Environment: CONSISTD_SOCKET (the sidecar), BENCH_NAMESPACE, BENCH_HANDLER_MS, BENCH_EXECUTIONS (the file each
execution is appended to as one JSON line {name, value, at, consistency}; at: wall-clock seconds;
consistency: how the state handled relates to the app's own writes, TIMED_OUT when the sidecar gave up
waiting for one), BENCH_PASSES (the file each pass is appended to as one JSON line {name, value, at,
executed}: on the queue every work item handed to the handler, on a stream every state a worker takes;
executed: whether it ran the handler).
"""

import asyncio
import json
import os
import sys
import time
from typing import Any, TextIO

import consistd

LABEL = "bench.consistd.io/kopf"
#: Workers on the newest-state watch: as many as the bench's ConfigMaps, so each has one, as in Kopf.
WORKERS = 10
HANDLED = "bench.consistd.io/handled"


def unhandled(cm: dict[str, Any]) -> str | None:
    """The ConfigMap's value when the handler has not handled it yet; None when there is nothing to do."""
    value = (cm.get("data") or {}).get("value")
    handled = (cm["metadata"].get("annotations") or {}).get(HANDLED)
    return None if value is None or value == handled else value


class Handler:
    """The job: record the execution, work, patch the handled value back; and the record of every pass."""

    def __init__(self, executions: TextIO, passes: TextIO, work: float) -> None:
        self._executions = executions
        self._passes = passes
        self._work = work

    def passed(self, name: str, cm: dict[str, Any] | None, executed: bool) -> None:
        """Records a pass over ConfigMap ``name`` in state ``cm`` (None: deleted or absent)."""
        value = ((cm or {}).get("data") or {}).get("value") or ""
        self._passes.write(json.dumps({"name": name, "value": value, "at": time.time(), "executed": executed}) + "\n")

    async def __call__(
        self, objects: consistd.Objects, namespace: str, name: str, value: str, consistency: consistd.Consistency
    ) -> None:
        execution = {"name": name, "value": value, "at": time.time(), "consistency": consistency.name}
        self._executions.write(json.dumps(execution) + "\n")
        await asyncio.sleep(self._work)
        await objects.patch("configmaps", name, {"metadata": {"annotations": {HANDLED: value}}}, namespace=namespace)


async def queue(client: consistd.Client, namespace: str, handler: Handler) -> None:
    """The reconciler: a key at a time per ConfigMap, each handed out consistent with the app's writes."""

    async def handle(item: consistd.WorkItem) -> None:
        if item.deleted or item.object is None:
            handler.passed(item.name, None, False)
            return
        value = unhandled(item.object.json)
        handler.passed(item.name, item.object.json, value is not None)
        if value is not None:
            await handler(item.objects, item.namespace, item.name, value, item.consistency)

    spec = consistd.ReconcileSpec(
        name="kopf-bench", resource="configmaps", namespace=namespace, label_selector=f"{LABEL}=true", max_leases=64
    )
    await client.reconcile(spec, handle)


async def latest(client: consistd.Client, namespace: str, handler: Handler) -> None:
    """The SDK's newest state per ConfigMap (``client.watch_latest``): a worker per ConfigMap, as Kopf has, each
    handed the newest state when it asks, never one older than its own patch and never a ConfigMap another
    worker holds (the SDK applies the own-write rule at the hand-out)."""

    async def worker(latest: consistd.Latest) -> None:
        while True:
            async with latest.take() as event:
                assert event.object is not None
                name = event.object.name
                value = None if event.type == consistd.EventType.DELETED else unhandled(event.object.json)
                handler.passed(name, event.object.json, value is not None)
                if value is not None:
                    await handler(client.objects, namespace, name, value, event.consistency)

    async with client.watch_latest("configmaps", namespace=namespace, label_selector=f"{LABEL}=true") as latest:
        workers = [asyncio.create_task(worker(latest)) for _ in range(WORKERS)]
        # Until SIGTERM or an error: the first worker's error ends the process.
        done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()


async def unchecked(client: consistd.Client, namespace: str, handler: Handler) -> None:
    """The control: a CONSISTENT watch feeding a worker per ConfigMap from a buffer of the app's own (the newest
    state of each), its worker not asking ``client.predates_own_write`` of what it takes: the own-write rule was
    applied when the reader took the state, before the worker's own patch returned."""
    newest: dict[str, consistd.Event] = {}  # the newest unhandled state of each ConfigMap
    workers: dict[str, asyncio.Task[None]] = {}
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def work(name: str) -> None:
        while name in newest:
            event = newest.pop(name)
            assert event.object is not None
            value = unhandled(event.object.json)
            handler.passed(name, event.object.json, value is not None)
            if value is not None:
                await handler(client.objects, namespace, name, value, event.consistency)
        del workers[name]

    def finished(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and not failed.done():
            failed.set_exception(task.exception())  # type: ignore[arg-type]

    watch = client.watch(
        "configmaps", namespace=namespace, label_selector=f"{LABEL}=true", mode=consistd.Mode.CONSISTENT
    )
    async with watch:
        async for event in watch:
            if event.object is None:
                continue  # the SYNCED and RESYNC_REQUIRED markers
            name = event.object.name
            if event.type == consistd.EventType.DELETED or unhandled(event.object.json) is None:
                newest.pop(name, None)  # nothing to do: a queued older state is stale
                continue
            newest[name] = event
            if name not in workers:
                workers[name] = asyncio.create_task(work(name))
                workers[name].add_done_callback(finished)
            if failed.done():
                failed.result()  # a worker failed: its error ends the process


async def main(how: str) -> None:
    namespace = os.environ["BENCH_NAMESPACE"]
    executions = open(os.environ["BENCH_EXECUTIONS"], "a", buffering=1)  # noqa: SIM115 (open for the whole run)
    passes = open(os.environ["BENCH_PASSES"], "a", buffering=1)  # noqa: SIM115 (open for the whole run)
    handler = Handler(executions, passes, int(os.environ.get("BENCH_HANDLER_MS", "0")) / 1000)
    async with consistd.Client() as client:
        await client.wait_ready(30)
        # Until SIGTERM or an error.
        if how == "queue":
            await queue(client, namespace, handler)
        elif how == "stream":
            await latest(client, namespace, handler)
        else:
            await unchecked(client, namespace, handler)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("queue", "stream", "stream-unchecked"):
        sys.exit(f"usage: {sys.argv[0]} queue|stream|stream-unchecked")
    asyncio.run(main(sys.argv[1]))
