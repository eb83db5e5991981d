"""The reconciler (``client.reconcile``) on the daemon's work queue: every key handled once; a change during
a pass gives exactly one more, never two handlers for one key at once; how the handler ends is the lease's
outcome (raise: RETRY with its text, ``requeue_after``: REQUEUE, ``Terminal``: TERMINAL); the handler's own
write is seen by the key's next pass; a queue's change filter hands out only the changes it names; a bad spec
raises; and a SIGKILLed sidecar is reconnected to. The tests at the end stand in a fake gRPC call for grpcio's,
to lose a stream while a handler runs, to see a refused completion, to check each completion the SDK builds,
the spec's finalizer it sends and the item's ``finalizing`` it hands out, and the requests ``item.set_condition``
and ``item.record_event`` send."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

import consistd
from consistd import Changed, ConsistdError, ReconcileSpec, Related, Terminal, WorkItem, requeue_after
from consistd.objects import Guard, Objects
from consistd.reconcile import Reconciler
from consistd.v1 import object_pb2, objects_pb2, reconcile_pb2
from support import Daemon, configmap, unique

#: How long a test waits for a pass it expects.
WAIT = 30.0
#: How long a test watches for a pass it does not expect: the daemon hands out a ready key within
#: milliseconds; this is far more.
QUIET = 2.0


@dataclass
class Pass:
    """One handler call, as the handler saw it."""

    key: str
    attempt: int
    last_error: str
    data: dict[str, str]
    resource_version: int
    consistency: consistd.Consistency
    lease_id: str
    started: float
    ended: float | None = None


class Recorder:
    """Wraps a handler: records every pass and counts, per key, the handlers running at once."""

    def __init__(self, behave: Callable[[WorkItem, Pass], Awaitable[Any]] | None = None) -> None:
        self.passes: list[Pass] = []
        self.overlaps: list[str] = []
        self._running: Counter[str] = Counter()
        self._behave = behave

    async def __call__(self, item: WorkItem) -> Any:
        loop = asyncio.get_running_loop()
        if self._running[item.key]:
            self.overlaps.append(item.key)
        self._running[item.key] += 1
        json = item.object.json if item.object is not None else {}
        this = Pass(
            key=item.key,
            attempt=item.attempt,
            last_error=item.last_error,
            data=json.get("data") or {},
            resource_version=int(item.object.resource_version) if item.object is not None else 0,
            consistency=item.consistency,
            lease_id=item.lease_id,
            started=loop.time(),
        )
        self.passes.append(this)
        try:
            return await self._behave(item, this) if self._behave is not None else None
        finally:
            self._running[item.key] -= 1
            this.ended = loop.time()

    def of(self, name: str) -> list[Pass]:
        """The passes of one key (by name), in order."""
        return [p for p in self.passes if p.key.rsplit("/", 1)[-1] == name]

    def ended(self, name: str) -> list[Pass]:
        """The passes of one key whose handler has returned."""
        return [p for p in self.of(name) if p.ended is not None]


def queue(namespace: str, **fields: Any) -> ReconcileSpec:
    """A queue of the ConfigMaps in ``namespace``, with a name of its own."""
    return ReconcileSpec(name=unique("q"), resource="configmaps", namespace=namespace, **fields)


@contextlib.asynccontextmanager
async def reconciling(
    client: consistd.Client, spec: ReconcileSpec, handler: consistd.ReconcileHandler
) -> AsyncIterator[asyncio.Task[None]]:
    """Runs ``client.reconcile`` in a task for the block; cancels it after (its error, if any, is raised)."""
    task = asyncio.create_task(client.reconcile(spec, handler))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(what: str, condition: Callable[[], bool], task: asyncio.Task[None], timeout: float = WAIT) -> None:
    """Waits until ``condition()`` holds, failing if it takes longer than ``timeout`` or the reconciler ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if task.done():
            raise AssertionError(f"the reconciler ended waiting for {what}: {task.exception()!r}")
        if loop.time() > deadline:
            raise AssertionError(f"waited {timeout:g} s in vain for {what}")
        await asyncio.sleep(0.02)


async def test_every_key_is_handled_once(client: consistd.Client, namespace: str) -> None:
    names = [f"cm-{i}" for i in range(6)]
    for name in names:
        await client.objects.create("configmaps", configmap(name, {"v": "0"}), namespace=namespace)
    recorder = Recorder()
    async with reconciling(client, queue(namespace, max_leases=3), recorder) as task:
        await until("a pass of every key", lambda: len(recorder.passes) >= len(names), task)
        await asyncio.sleep(QUIET)
    assert sorted(p.key for p in recorder.passes) == sorted(f"{namespace}/{n}" for n in names), "each key once"
    assert all(p.attempt == 1 and p.consistency == consistd.Consistency.CONSISTENT for p in recorder.passes)
    assert all(p.data == {"v": "0"} for p in recorder.passes)
    assert not recorder.overlaps


async def test_a_change_while_the_handler_runs_gives_exactly_one_more_pass_never_two_at_once(
    client: consistd.Client, peer: consistd.Client, namespace: str
) -> None:
    await client.objects.create("configmaps", configmap("busy", {"v": "0"}), namespace=namespace)

    async def behave(item: WorkItem, this: Pass) -> None:
        if this.attempt == 1 and len(recorder.passes) == 1:
            # Three changes by someone else while the handler runs; their events reach the daemon meanwhile.
            for v in range(1, 4):
                await peer.objects.patch("configmaps", "busy", {"data": {"v": str(v)}}, namespace=namespace)
            await asyncio.sleep(1.0)

    recorder = Recorder(behave)
    async with reconciling(client, queue(namespace, max_leases=4), recorder) as task:
        await until("the second pass to end", lambda: len(recorder.ended("busy")) >= 2, task)
        await asyncio.sleep(QUIET)
    assert not recorder.overlaps, "two handlers ran for one key at once"
    passes = recorder.of("busy")
    assert len(passes) == 2, f"one more pass for the changes, not one per change: {passes}"
    assert passes[1].data == {"v": "3"} and passes[1].attempt == 1
    first_end = passes[0].ended
    assert first_end is not None and passes[1].started >= first_end


async def test_a_raise_is_retried_with_the_next_attempt_and_the_error_cut_to_4096_bytes(
    client: consistd.Client, namespace: str
) -> None:
    """The error's text carries what it was raised from, as the Rust SDK's carries an error's sources."""
    await client.objects.create("configmaps", configmap("flaky", {}), namespace=namespace)
    long = "é" * 3000  # 6000 bytes of UTF-8

    async def behave(item: WorkItem, this: Pass) -> None:
        if this.attempt == 1:
            raise RuntimeError("the backend said no") from ConnectionError("connection refused")
        if this.attempt == 2:
            raise RuntimeError(long)

    recorder = Recorder(behave)
    spec = queue(namespace, retry_base_delay=0.2)
    async with reconciling(client, spec, recorder) as task:
        await until("the third pass to end", lambda: len(recorder.ended("flaky")) >= 3, task)
        await asyncio.sleep(QUIET)
    passes = recorder.of("flaky")
    assert [(p.attempt, p.last_error) for p in passes] == [
        (1, ""),
        (2, "the backend said no: connection refused"),
        (3, "é" * 2048),
    ]
    first_end = passes[0].ended
    assert first_end is not None and passes[1].started - first_end >= 0.2 - 0.05, "after its backoff"


@pytest.mark.parametrize("delay", [0.3, timedelta(milliseconds=300)], ids=["seconds", "timedelta"])
async def test_requeue_after_hands_the_key_out_again_after_the_delay(
    client: consistd.Client, namespace: str, delay: float | timedelta
) -> None:
    await client.objects.create("configmaps", configmap("later", {}), namespace=namespace)

    async def behave(item: WorkItem, this: Pass) -> consistd.Requeue | None:
        return requeue_after(delay) if len(recorder.of("later")) == 1 else None

    recorder = Recorder(behave)
    async with reconciling(client, queue(namespace), recorder) as task:
        await until("the second pass to end", lambda: len(recorder.ended("later")) >= 2, task)
        await asyncio.sleep(QUIET)
    passes = recorder.of("later")
    assert len(passes) == 2, passes
    first_end = passes[0].ended
    assert first_end is not None
    waited = passes[1].started - first_end
    assert waited >= 0.3 - 0.02, f"handed out again after {waited:.3f} s"
    assert (passes[1].attempt, passes[1].last_error) == (1, ""), "a REQUEUE is not a failure"


async def test_terminal_waits_until_the_object_changes(
    client: consistd.Client, peer: consistd.Client, namespace: str
) -> None:
    await client.objects.create("configmaps", configmap("broken", {"v": "0"}), namespace=namespace)

    async def behave(item: WorkItem, this: Pass) -> None:
        if this.data.get("v") == "0":
            raise Terminal("v 0 cannot be fixed by retrying")

    recorder = Recorder(behave)
    async with reconciling(client, queue(namespace, retry_base_delay=0.01), recorder) as task:
        await until("the first pass to end", lambda: len(recorder.ended("broken")) >= 1, task)
        await asyncio.sleep(QUIET)
        assert len(recorder.of("broken")) == 1, "handed out again without a change"
        await peer.objects.patch("configmaps", "broken", {"data": {"v": "1"}}, namespace=namespace)
        await until("a pass after the change", lambda: len(recorder.ended("broken")) >= 2, task)
        await asyncio.sleep(QUIET)
    passes = recorder.of("broken")
    assert [p.data for p in passes] == [{"v": "0"}, {"v": "1"}]
    assert passes[1].attempt == 1


async def test_a_queue_filtering_on_labels_hands_out_the_first_state_and_a_label_change_but_not_a_data_change(
    client: consistd.Client, peer: consistd.Client, namespace: str
) -> None:
    await client.objects.create("configmaps", configmap("filtered", {"v": "0"}), namespace=namespace)
    recorder = Recorder()
    async with reconciling(client, queue(namespace, only_changes_of=Changed.LABELS), recorder) as task:
        await until("the first state", lambda: len(recorder.ended("filtered")) >= 1, task)
        await peer.objects.patch("configmaps", "filtered", {"data": {"v": "1"}}, namespace=namespace)
        await asyncio.sleep(QUIET)
        assert len(recorder.of("filtered")) == 1, "a change of the data, which the filter does not name, went out"
        labelled = {"metadata": {"labels": {"tier": "web"}}}
        await peer.objects.patch("configmaps", "filtered", labelled, namespace=namespace)
        await until("a pass after the label change", lambda: len(recorder.ended("filtered")) >= 2, task)
    passes = recorder.of("filtered")
    assert [(p.data, p.attempt) for p in passes] == [({"v": "0"}, 1), ({"v": "1"}, 1)], passes
    assert not recorder.overlaps


async def test_the_next_pass_is_at_least_as_new_as_the_handlers_own_patch_through_item_objects(
    client: consistd.Client, peer: consistd.Client, namespace: str
) -> None:
    """During each pass someone else changes the object (so there is a next pass) and then the handler
    patches it through ``item.objects``: the next pass's object is never older than that patch."""
    await client.objects.create("configmaps", configmap("own", {"round": "0"}), namespace=namespace)
    rounds = 5
    written: list[int] = []

    async def behave(item: WorkItem, this: Pass) -> None:
        n = len(written)
        if n >= rounds:
            return
        await peer.objects.patch("configmaps", "own", {"data": {"third": str(n)}}, namespace=namespace)
        await asyncio.sleep(0.3)  # its event reaches the daemon: the key is dirty, one more pass follows
        own = await item.objects.patch("configmaps", "own", {"data": {"round": str(n + 1)}}, namespace=namespace)
        written.append(int(own.resource_version))

    recorder = Recorder(behave)
    async with reconciling(client, queue(namespace), recorder) as task:
        await until(f"{rounds + 1} passes", lambda: len(recorder.ended("own")) > rounds, task)
    passes = recorder.of("own")
    for n, own_rv in enumerate(written):
        after = passes[n + 1]
        assert after.resource_version >= own_rv, f"round {n}: handed {after.resource_version} after writing {own_rv}"
        assert after.data["round"] == str(n + 1), f"round {n}: {after.data}"
    assert not recorder.overlaps


async def test_a_spec_the_daemon_refuses_raises_naming_the_field(client: consistd.Client, namespace: str) -> None:
    async def never(item: WorkItem) -> None:
        raise AssertionError("no work for a refused spec")

    for spec, code, field in [
        (queue(namespace, max_leases=0), grpc.StatusCode.INVALID_ARGUMENT, "spec.max_leases"),
        (ReconcileSpec(name="Not_A_Label", resource="configmaps"), grpc.StatusCode.INVALID_ARGUMENT, "spec.name"),
        (
            queue(namespace, related=[Related("configmaps")]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "spec.related[0].maps_by",
        ),
        (ReconcileSpec(name=unique("q"), resource="nosuchthings"), grpc.StatusCode.NOT_FOUND, "spec.primary"),
    ]:
        with pytest.raises(ConsistdError) as raised:
            await asyncio.wait_for(client.reconcile(spec, never), 15)
        assert (raised.value.code, raised.value.message.split(":")[0]) == (code, field), raised.value
    with pytest.raises(ValueError, match="set one of"):
        Related("configmaps", label="owner", controller_owner=True)


async def test_the_reconciler_keeps_going_across_a_sigkill_of_its_sidecar(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sidecar is SIGKILLed while a handler runs and started again on the same socket: the reconciler
    opens the queue again (the running handler's completion is dropped; the key's next pass waits for it to
    end) and handles a change made after."""
    caplog.set_level(logging.INFO, logger="consistd.reconcile")
    daemon = Daemon(short_dir, unique("sdk-py-reconcile"))
    await daemon.start()
    try:
        async with consistd.Client(daemon.socket) as client:
            await client.wait_ready(10)
            namespace = unique("sdk-py")
            await client.objects.create("namespaces", {"metadata": {"name": namespace}})
            try:
                await client.objects.create("configmaps", configmap("slow", {"v": "0"}), namespace=namespace)
                killed = asyncio.Event()

                async def behave(item: WorkItem, this: Pass) -> None:
                    if this.data == {"v": "0"} and not killed.is_set():
                        await asyncio.sleep(4.0)  # still running when the sidecar dies and comes back

                recorder = Recorder(behave)
                async with reconciling(client, queue(namespace, max_leases=2), recorder) as task:
                    await until("the first pass", lambda: len(recorder.of("slow")) >= 1, task)
                    await daemon.kill()
                    killed.set()
                    await daemon.start()
                    # The new stream hands the key out again (the old lease went back); that pass waits for
                    # the handler still running for the old stream.
                    await until("a pass on the new stream", lambda: len(recorder.ended("slow")) >= 2, task)
                    await client.objects.patch("configmaps", "slow", {"data": {"v": "1"}}, namespace=namespace)
                    await client.objects.create("configmaps", configmap("late", {}), namespace=namespace)
                    await until(
                        "a pass after the change", lambda: {"v": "1"} in [p.data for p in recorder.of("slow")], task
                    )
                    await until("the new key", lambda: len(recorder.ended("late")) >= 1, task)
                assert not recorder.overlaps, "two handlers ran for one key at once across the reconnect"
                old, again = recorder.of("slow")[:2]
                assert old.ended is not None and again.started >= old.ended and again.data == {"v": "0"}
                # Lease ids start again with the restarted daemon (the new stream's first lease has the old
                # one's id): the old handler's completion must go nowhere, not complete the new lease.
                # (Not any "refused": a reconnect that finds the socket gone logs "Connection refused".)
                refused = [r.getMessage() for r in caplog.records if "refused the completion" in r.getMessage()]
                assert not refused, refused
                dropped = [r.getMessage() for r in caplog.records if "dropped the completion" in r.getMessage()]
                assert len(dropped) == 1 and old.lease_id in dropped[0], dropped
            finally:
                await client.objects.delete("namespaces", namespace)
    finally:
        await daemon.stop()


# Without a daemon.


def item(lease_id: str, name: str = "a", attempt: int = 1) -> reconcile_pb2.ReconcileResponse:
    w = reconcile_pb2.WorkItem(lease_id=lease_id, namespace="ns", name=name, attempt=attempt)
    return reconcile_pb2.ReconcileResponse(item=w)


STARTED = reconcile_pb2.ReconcileResponse(started=reconcile_pb2.QueueStarted(name="q"))
LOST = object()


class FakeCall:
    """A Reconcile call: answers ``responses`` in turn (``LOST``: the connection breaks, UNAVAILABLE), then
    waits; keeps what the SDK wrote."""

    def __init__(self, *responses: Any) -> None:
        self.responses: asyncio.Queue[Any] = asyncio.Queue()
        for r in responses:
            self.responses.put_nowait(r)
        self.written: list[reconcile_pb2.ReconcileRequest] = []
        self.cancelled = False

    async def read(self) -> Any:
        response = await self.responses.get()
        if response is LOST:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="Socket closed"
            )
        return response

    async def write(self, request: reconcile_pb2.ReconcileRequest) -> None:
        if self.cancelled:
            raise asyncio.InvalidStateError("RPC already finished.")
        self.written.append(request)

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def completions(self) -> list[tuple[str, int]]:
        return [(r.complete.lease_id, r.complete.outcome) for r in self.written if r.HasField("complete")]


class ReconcileStub:
    def __init__(self, *calls: FakeCall) -> None:
        self.calls = list(calls)
        self.opened = 0

    def Reconcile(self) -> FakeCall:  # noqa: N802 (the generated name)
        self.opened += 1
        return self.calls.pop(0)


class ObjectsStub:
    """Keeps every write request; answers with an object."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def _answer(self, request: Any, response: Any) -> Any:
        self.requests.append(request)
        return response(object=object_pb2.KubeObject(uid="u", name="a", resource_version="7", json=b"{}"))

    async def Create(self, request: Any) -> Any:  # noqa: N802
        return await self._answer(request, objects_pb2.CreateResponse)

    async def Update(self, request: Any) -> Any:  # noqa: N802
        return await self._answer(request, objects_pb2.UpdateResponse)

    async def Patch(self, request: Any) -> Any:  # noqa: N802
        return await self._answer(request, objects_pb2.PatchResponse)

    async def Delete(self, request: Any) -> Any:  # noqa: N802
        return await self._answer(request, objects_pb2.DeleteResponse)

    async def SetCondition(self, request: Any) -> Any:  # noqa: N802
        self.requests.append(request)
        written = object_pb2.KubeObject(uid="u", name="w", resource_version="8", json=b"{}")
        return objects_pb2.SetConditionResponse(
            object=written, changed=True, last_transition_time="2026-01-02T03:04:05Z"
        )

    async def RecordEvent(self, request: Any) -> Any:  # noqa: N802
        # Recorded, then dropped (the rate limit), by turns: the answer is the sidecar's.
        self.requests.append(request)
        return objects_pb2.RecordEventResponse(recorded=len(self.requests) % 2 == 1)


def reconciler(stub: ReconcileStub, handler: consistd.ReconcileHandler, objects: Objects | None = None) -> Reconciler:
    objects = objects if objects is not None else Objects(ObjectsStub())  # type: ignore[arg-type]
    return Reconciler(stub, objects, ReconcileSpec(name="q", resource="configmaps", max_leases=2), handler)  # type: ignore[arg-type]


async def test_a_lost_stream_drops_the_running_handlers_completion_and_its_key_waits_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stream 1 leases "a" (lease 1) and breaks while its handler runs; stream 2 leases "a" again (lease 2)
    and refuses a completion. Lease 1's handler ends after the break: its completion goes nowhere; lease 2's
    handler starts only then; its completion goes out on stream 2; the refusal is logged, not fatal."""
    refusal = reconcile_pb2.CompletionRefused(lease_id="q.9.9")
    refusal.refusal.code, refusal.refusal.message = 9, "complete.lease_id: no such lease on this stream"
    first, second = FakeCall(STARTED, item("q.1.1")), FakeCall(STARTED, item("q.2.1"))
    stub = ReconcileStub(first, second)
    release = asyncio.Event()
    started: list[str] = []

    async def handler(item: WorkItem) -> None:
        started.append(item.lease_id)
        if item.lease_id == "q.1.1":
            await release.wait()

    with caplog.at_level(logging.INFO, logger="consistd.reconcile"):
        task = asyncio.create_task(reconciler(stub, handler).run())
        try:
            await until("the first handler", lambda: started == ["q.1.1"], task, 5)
            first.responses.put_nowait(LOST)
            await until("the second stream", lambda: stub.opened == 2, task, 5)
            second.responses.put_nowait(reconcile_pb2.ReconcileResponse(refused=refusal))
            await asyncio.sleep(0.3)
            assert started == ["q.1.1"], "lease 2's handler ran while lease 1's still did"
            release.set()
            await until("lease 2's completion", lambda: bool(second.completions()), task, 5)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert started == ["q.1.1", "q.2.1"]
    assert first.completions() == [] and second.completions() == [("q.2.1", reconcile_pb2.OUTCOME_DONE)]
    assert [r.WhichOneof("request") for r in second.written] == ["spec", "complete"]
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "refused" in r.getMessage()]
    assert refused and "q.9.9" in refused[0] and "FAILED_PRECONDITION" in refused[0], caplog.records
    assert first.cancelled and second.cancelled


async def test_cancelling_the_reconciler_cancels_its_running_handlers_and_closes_the_stream() -> None:
    call = FakeCall(STARTED, item("q.1.1", "a"), item("q.1.2", "b"))
    cancelled: list[str] = []
    running: list[str] = []

    async def handler(item: WorkItem) -> None:
        running.append(item.name)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(item.name)
            raise

    task = asyncio.create_task(reconciler(ReconcileStub(call), handler).run())
    await until("both handlers", lambda: len(running) == 2, task, 5)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done and task.cancelled(), "cancelling the reconciler did not end it"
    assert sorted(cancelled) == ["a", "b"] and call.cancelled and call.completions() == []


async def test_item_objects_writes_name_the_lease() -> None:
    objects_stub = ObjectsStub()
    objects = Objects(objects_stub)  # type: ignore[arg-type]
    call = FakeCall(STARTED, item("q.1.7"))

    async def handler(item: WorkItem) -> None:
        await item.objects.create("configmaps", {}, namespace="ns")
        await item.objects.update("configmaps", "a", {}, namespace="ns")
        await item.objects.patch("configmaps", "a", {}, namespace="ns")
        await item.objects.delete("configmaps", "a", namespace="ns")
        await objects.patch("configmaps", "a", {}, namespace="ns")  # the client's own objects: no lease
        await objects.patch("configmaps", "a", {}, namespace="ns", reconcile_lease=item.lease_id)

    task = asyncio.create_task(reconciler(ReconcileStub(call), handler, objects).run())
    try:
        await until("the completion", lambda: bool(call.completions()), task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [r.reconcile_lease for r in objects_stub.requests] == ["q.1.7"] * 4 + ["", "q.1.7"]


def widget(lease_id: str, json: bytes | None) -> reconcile_pb2.ReconcileResponse:
    """An item of the widget "w" in "ns", handed its object as ``json`` (None: no object)."""
    w = reconcile_pb2.WorkItem(lease_id=lease_id, namespace="ns", name="w", attempt=1)
    if json is not None:
        w.object.CopyFrom(object_pb2.KubeObject(uid="u", namespace="ns", name="w", resource_version="5", json=json))
    return reconcile_pb2.ReconcileResponse(item=w)


@pytest.mark.parametrize(
    ("status", "sent"),
    [
        pytest.param("True", objects_pb2.CONDITION_STATUS_TRUE, id="True"),
        pytest.param("False", objects_pb2.CONDITION_STATUS_FALSE, id="False"),
        pytest.param("Unknown", objects_pb2.CONDITION_STATUS_UNKNOWN, id="Unknown"),
        pytest.param(consistd.ConditionStatus.TRUE, objects_pb2.CONDITION_STATUS_TRUE, id="enum-TRUE"),
        pytest.param(consistd.ConditionStatus.FALSE, objects_pb2.CONDITION_STATUS_FALSE, id="enum-FALSE"),
        pytest.param(consistd.ConditionStatus.UNKNOWN, objects_pb2.CONDITION_STATUS_UNKNOWN, id="enum-UNKNOWN"),
    ],
)
async def test_an_items_set_condition_sends_its_primary_the_condition_judged_on_the_handed_generation_for_its_lease(
    status: consistd.ConditionStatus | str, sent: int
) -> None:
    """The request names the queue's primary resource, the item's namespace and name, the condition with its
    status mapped, the generation of the object the item was handed (0 with none) and the item's lease; the
    answer is the sidecar's."""
    objects_stub = ObjectsStub()
    handed = b'{"metadata":{"name":"w","namespace":"ns","generation":3},"spec":{"size":2}}'
    call = FakeCall(STARTED, widget("q.1.4", handed), widget("q.1.5", None), widget("q.1.6", b'{"metadata":{}}'))
    answers: list[consistd.SetConditionResult] = []

    async def handler(item: WorkItem) -> None:
        answers.append(await item.set_condition("example.com/Ready", status, "Available", "3 of 3"))

    spec = ReconcileSpec(name="q", resource="example.com/v1/widgets")
    objects = Objects(objects_stub)  # type: ignore[arg-type]
    task = asyncio.create_task(Reconciler(ReconcileStub(call), objects, spec, handler).run())  # type: ignore[arg-type]
    try:
        await until("the completions", lambda: len(call.completions()) == 3, task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [c[1] for c in call.completions()] == [DONE] * 3, call.written
    first, *others = objects_stub.requests
    assert isinstance(first, objects_pb2.SetConditionRequest)
    assert (first.resource, first.namespace, first.name) == ("example.com/v1/widgets", "ns", "w")
    condition = first.condition
    assert (condition.type, condition.status, condition.reason, condition.message) == (
        "example.com/Ready",
        sent,
        "Available",
        "3 of 3",
    )
    assert condition.observed_generation == 3, "the generation of the object the item was handed"
    assert first.reconcile_lease == "q.1.4", "made for the item's lease"
    assert (first.field_manager, first.HasField("guard")) == ("", False), "the sidecar's default manager, no guard"
    assert [(r.condition.observed_generation, r.reconcile_lease) for r in others] == [(0, "q.1.5"), (0, "q.1.6")]
    assert [(a.changed, a.last_transition_time, a.object.resource_version) for a in answers] == [
        (True, "2026-01-02T03:04:05Z", "8")
    ] * 3


@pytest.mark.parametrize("status", ["true", "TRUE", "", "Ready", True, None])
async def test_a_condition_status_that_is_not_true_false_or_unknown_is_a_value_error_and_sends_nothing(
    status: Any,
) -> None:
    objects_stub = ObjectsStub()
    objects = Objects(objects_stub)  # type: ignore[arg-type]
    call = FakeCall(STARTED, widget("q.1.1", None))
    raised: list[BaseException] = []

    async def handler(item: WorkItem) -> None:
        try:
            await item.set_condition("Ready", status, "Available")
        except ValueError as e:
            raised.append(e)

    task = asyncio.create_task(reconciler(ReconcileStub(call), handler, objects).run())
    try:
        await until("the completion", lambda: bool(call.completions()), task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [str(e) for e in raised] == [f"status: {status!r} is not True, False or Unknown"]
    with pytest.raises(ValueError, match="is not True, False or Unknown"):
        await objects.set_condition("widgets", "w", "Ready", status, "Available", namespace="ns")
    assert objects_stub.requests == [], "nothing was sent"


@pytest.mark.parametrize(
    ("severity", "sent"),
    [
        pytest.param("Normal", objects_pb2.EVENT_SEVERITY_NORMAL, id="Normal"),
        pytest.param("Warning", objects_pb2.EVENT_SEVERITY_WARNING, id="Warning"),
        pytest.param(consistd.EventSeverity.NORMAL, objects_pb2.EVENT_SEVERITY_NORMAL, id="enum-NORMAL"),
        pytest.param(consistd.EventSeverity.WARNING, objects_pb2.EVENT_SEVERITY_WARNING, id="enum-WARNING"),
    ],
)
async def test_an_items_record_event_names_its_primary_by_uid_reported_by_the_queue(
    severity: consistd.EventSeverity | str, sent: int
) -> None:
    """The request names the queue's primary resource, the item's namespace and name, the uid of the object the
    item was handed (empty with none: the sidecar reads it), the severity mapped, the reason, action and note, and
    the queue's name as the reporting controller; the answer is the sidecar's ``recorded``."""
    objects_stub = ObjectsStub()
    handed = b'{"metadata":{"name":"w","namespace":"ns","uid":"u"}}'
    call = FakeCall(STARTED, widget("eventful.1.4", handed), widget("eventful.1.5", None))
    answers: list[bool] = []

    async def handler(item: WorkItem) -> None:
        answers.append(await item.record_event(severity, "Drifted", "Reconcile", "data moved"))

    spec = ReconcileSpec(name="eventful", resource="example.com/v1/widgets")
    objects = Objects(objects_stub)  # type: ignore[arg-type]
    task = asyncio.create_task(Reconciler(ReconcileStub(call), objects, spec, handler).run())  # type: ignore[arg-type]
    try:
        await until("the completions", lambda: len(call.completions()) == 2, task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [c[1] for c in call.completions()] == [DONE] * 2, call.written
    assert all(isinstance(r, objects_pb2.RecordEventRequest) for r in objects_stub.requests), objects_stub.requests
    assert [
        (r.resource, r.namespace, r.name, r.uid, r.severity, r.reason, r.action, r.note, r.reporting_controller)
        for r in objects_stub.requests
    ] == [
        ("example.com/v1/widgets", "ns", "w", uid, sent, "Drifted", "Reconcile", "data moved", "eventful")
        for uid in ("u", "")
    ]
    assert answers == [True, False], "the sidecar's answers: recorded, then dropped by the rate limit"


@pytest.mark.parametrize("severity", ["normal", "WARNING", "", "Error", True, None, 1])
async def test_an_event_severity_that_is_not_normal_or_warning_is_a_value_error_and_sends_nothing(
    severity: Any,
) -> None:
    objects_stub = ObjectsStub()
    objects = Objects(objects_stub)  # type: ignore[arg-type]
    call = FakeCall(STARTED, widget("q.1.1", b'{"metadata":{"name":"w","namespace":"ns","uid":"u"}}'))
    raised: list[BaseException] = []

    async def handler(item: WorkItem) -> None:
        try:
            await item.record_event(severity, "Drifted", "Reconcile")
        except ValueError as e:
            raised.append(e)

    task = asyncio.create_task(reconciler(ReconcileStub(call), handler, objects).run())
    try:
        await until("the completion", lambda: bool(call.completions()), task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [str(e) for e in raised] == [f"severity: {severity!r} is not Normal or Warning"]
    with pytest.raises(ValueError, match="is not Normal or Warning"):
        await objects.record_event("widgets", "w", severity, "Drifted", "Reconcile", namespace="ns")
    assert objects_stub.requests == [], "nothing was sent"


class Boom(Exception):
    pass


DONE, REQUEUE = reconcile_pb2.OUTCOME_DONE, reconcile_pb2.OUTCOME_REQUEUE
RETRY, TERMINAL = reconcile_pb2.OUTCOME_RETRY, reconcile_pb2.OUTCOME_TERMINAL


@pytest.mark.parametrize(
    ("result", "outcome", "error", "requeue_after_ns"),
    [
        pytest.param(None, DONE, "", None, id="none"),
        pytest.param(requeue_after(2.5), REQUEUE, "", 2_500_000_000, id="requeue"),
        pytest.param(requeue_after(timedelta(minutes=1)), REQUEUE, "", 60_000_000_000, id="requeue-timedelta"),
        pytest.param(requeue_after(0), REQUEUE, "", 1_000_000, id="requeue-0-is-the-shortest-the-daemon-takes"),
        pytest.param(requeue_after(timedelta(days=3)), REQUEUE, "", 86_400_000_000_000, id="requeue-3d-is-a-day"),
        pytest.param(requeue_after(1, priority=7), REQUEUE, "", 1_000_000_000, id="requeue-with-priority"),
        pytest.param(RuntimeError("no"), RETRY, "no", None, id="raise"),
        pytest.param(Boom(), RETRY, "Boom", None, id="raise-without-text-is-its-type"),
        pytest.param(RuntimeError("x" * 5000), RETRY, "x" * 4096, None, id="raise-long-is-cut"),
        pytest.param(Terminal("never"), TERMINAL, "never", None, id="terminal"),
        pytest.param(
            42, RETRY, "the handler returned 42; return None, or consistd.requeue_after(...)", None, id="junk"
        ),
    ],
)
async def test_how_the_handler_ends_is_the_completion(
    result: Any, outcome: int, error: str, requeue_after_ns: int | None
) -> None:
    call = FakeCall(STARTED, item("q.1.1"))

    async def handler(item: WorkItem) -> Any:
        if isinstance(result, BaseException):
            raise result
        return result

    task = asyncio.create_task(reconciler(ReconcileStub(call), handler).run())
    try:
        await until("the completion", lambda: bool(call.completions()), task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    (completion,) = [r.complete for r in call.written if r.HasField("complete")]
    assert (completion.lease_id, completion.outcome, completion.error) == ("q.1.1", outcome, error)
    if requeue_after_ns is None:
        assert not completion.HasField("requeue_after")
    else:
        assert completion.requeue_after.ToNanoseconds() == requeue_after_ns
    assert completion.priority == (result.priority if isinstance(result, consistd.Requeue) else 0)


def test_a_related_querys_priority_goes_in_the_spec() -> None:
    related = consistd.Related("secrets", namespace="ns", label="owner", priority=5)
    assert related.to_proto().priority == 5
    assert consistd.Related("secrets", label="owner").to_proto().priority == 0


async def test_a_plain_function_handler_runs_in_a_worker_thread() -> None:
    call = FakeCall(STARTED, item("q.1.1"))
    threads: list[threading.Thread] = []

    def handler(item: WorkItem) -> consistd.Requeue:
        threads.append(threading.current_thread())
        return requeue_after(1)

    task = asyncio.create_task(reconciler(ReconcileStub(call), handler).run())
    try:
        await until("the completion", lambda: bool(call.completions()), task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert threads and threads[0] is not threading.main_thread()
    assert call.completions() == [("q.1.1", reconcile_pb2.OUTCOME_REQUEUE)]


def test_the_spec_carries_the_view_of_the_primary_and_of_each_related_query_and_none_by_default() -> None:
    spec = ReconcileSpec(
        name="q",
        resource="apps/v1/deployments",
        namespace="ns",
        view=consistd.View(fields=("spec.replicas", "status.conditions")),
        related=[
            Related("pods", controller_owner=True, view=consistd.View(metadata_only=True)),
            Related("configmaps", label="owner", view=consistd.View(managed_fields=True)),
            Related("secrets", annotation="example.com/owner", view=consistd.View()),
            Related("services", field="spec.selector.app"),
        ],
    ).to_proto()
    assert spec.primary == reconcile_pb2.ObjectQuery(
        resource="apps/v1/deployments",
        namespace="ns",
        view=object_pb2.ObjectView(fields=["spec.replicas", "status.conditions"]),
    )
    assert [r.query.view if r.query.HasField("view") else None for r in spec.related] == [
        object_pb2.ObjectView(metadata_only=True),
        object_pb2.ObjectView(managed_fields=True),
        None,  # View() is no view: the spec is as one from an SDK that knows none
        None,
    ]
    assert [r.WhichOneof("maps_by") for r in spec.related] == ["controller_owner", "label", "annotation", "field"]
    assert not ReconcileSpec(name="q", resource="configmaps").to_proto().primary.HasField("view")


def changes(query: reconcile_pb2.ObjectQuery) -> tuple[bool, bool, bool] | None:
    """A query's change filter as (generation, labels, annotations); None when unset."""
    if not query.HasField("changes"):
        return None
    return (query.changes.generation, query.changes.labels, query.changes.annotations)


def test_the_parts_whose_changes_queue_a_pass_go_on_the_query_they_are_asked_of_and_nowhere_else() -> None:
    spec = ReconcileSpec(
        name="q",
        resource="apps/v1/deployments",
        only_changes_of=Changed.GENERATION | Changed.LABELS,
        related=[
            Related("pods", controller_owner=True, only_changes_of=Changed.ANNOTATIONS),
            Related("secrets", label="owner"),
            Related("configmaps", label="owner", only_changes_of=Changed(0)),
        ],
    ).to_proto()
    assert changes(spec.primary) == (True, True, False)
    assert [changes(r.query) for r in spec.related] == [
        (False, False, True),
        None,  # unnamed: every change
        None,  # no part named is none: the spec is as one from an SDK that knows no filter
    ]
    # Asked of a related query only, the primary's stays unset; and each part maps to its own field.
    only_related = ReconcileSpec(
        name="q", resource="configmaps", related=[Related("secrets", label="owner", only_changes_of=Changed.LABELS)]
    ).to_proto()
    assert (changes(only_related.primary), changes(only_related.related[0].query)) == (None, (False, True, False))
    for part, fields in [
        (Changed.GENERATION, (True, False, False)),
        (Changed.LABELS, (False, True, False)),
        (Changed.ANNOTATIONS, (False, False, True)),
    ]:
        assert changes(ReconcileSpec(name="q", resource="configmaps", only_changes_of=part).to_proto().primary) == (
            fields
        ), part
    assert changes(ReconcileSpec(name="q", resource="configmaps").to_proto().primary) is None, "unset by default"


async def test_a_sharded_spec_is_sent_with_its_election_and_each_items_guard_is_it_in_the_slots_epoch() -> None:
    assert not ReconcileSpec(name="q", resource="configmaps").to_proto().sharded, "not sharded by default"
    spec = ReconcileSpec(name="q", resource="configmaps", election="web", election_namespace="leases", sharded=True)
    granted = reconcile_pb2.WorkItem(lease_id="q.1.1", namespace="ns", name="a", attempt=1, term=42)
    call = FakeCall(STARTED, reconcile_pb2.ReconcileResponse(item=granted))
    seen: list[tuple[int, Guard | None]] = []

    async def handler(item: WorkItem) -> None:
        seen.append((item.term, item.guard))

    objects = Objects(ObjectsStub())  # type: ignore[arg-type]
    task = asyncio.create_task(Reconciler(ReconcileStub(call), objects, spec, handler).run())  # type: ignore[arg-type]
    try:
        await until("the completion", lambda: bool(call.completions()), task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    sent = call.written[0].spec
    assert (sent.sharded, sent.election) == (True, reconcile_pb2.ElectionRef(election="web", namespace="leases"))
    assert seen == [(42, Guard(election="web", namespace="leases", term=42))], "the spec's election, the slot's epoch"
    # Without an election the spec goes as it is: the sidecar refuses it, naming spec.sharded.
    alone = ReconcileSpec(name="q", resource="configmaps", sharded=True).to_proto()
    assert alone.sharded and not alone.HasField("election")


def test_a_sharded_spec_is_sent_sharded_by_namespace_when_asked_and_by_key_unless_asked() -> None:
    by_key = ReconcileSpec(name="q", resource="configmaps", election="web", sharded=True).to_proto()
    assert by_key.shard_by == reconcile_pb2.SHARD_BY_UNSPECIFIED, "by key unless asked"
    spec = ReconcileSpec(
        name="q", resource="configmaps", election="web", sharded=True, shard_by=consistd.ShardBy.NAMESPACE
    ).to_proto()
    assert spec.shard_by == reconcile_pb2.SHARD_BY_NAMESPACE
    assert (spec.sharded, spec.election.election) == (True, "web"), "the other options kept"
    assert ReconcileSpec(name="q", resource="configmaps", shard_by=consistd.ShardBy.KEY).to_proto().shard_by == (
        reconcile_pb2.SHARD_BY_KEY
    )
    # Without sharded it goes as it is: the sidecar refuses it, naming spec.shard_by.
    alone = ReconcileSpec(name="q", resource="configmaps", shard_by=consistd.ShardBy.NAMESPACE).to_proto()
    assert (alone.sharded, alone.shard_by) == (False, reconcile_pb2.SHARD_BY_NAMESPACE)


async def test_the_queues_finalizer_goes_in_the_spec_it_sends_and_none_unless_named() -> None:
    spec = ReconcileSpec(name="q", resource="configmaps", finalizer="example.com/cleanup", max_leases=3)
    call = FakeCall(STARTED)
    objects = Objects(ObjectsStub())  # type: ignore[arg-type]
    task = asyncio.create_task(Reconciler(ReconcileStub(call), objects, spec, lambda item: None).run())  # type: ignore[arg-type]
    try:
        await until("the spec", lambda: bool(call.written), task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    sent = call.written[0].spec
    assert sent.finalizer == "example.com/cleanup"
    assert (sent.name, sent.primary.resource, sent.max_leases) == ("q", "configmaps", 3), "the other options kept"
    assert ReconcileSpec(name="q", resource="configmaps").to_proto().finalizer == "", "none unless named"


async def test_an_items_finalizing_is_the_work_items_and_false_on_any_other_pass() -> None:
    finalize = reconcile_pb2.WorkItem(lease_id="q.1.2", namespace="ns", name="b", attempt=2, finalizing=True)
    call = FakeCall(STARTED, item("q.1.1"), reconcile_pb2.ReconcileResponse(item=finalize))
    seen: dict[str, tuple[bool, int]] = {}

    async def handler(item: WorkItem) -> None:
        seen[item.name] = (item.finalizing, item.attempt)

    task = asyncio.create_task(reconciler(ReconcileStub(call), handler).run())
    try:
        await until("both completions", lambda: len(call.completions()) == 2, task, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert seen == {"a": (False, 1), "b": (True, 2)}
