"""The Python SDK's agent for the SDK conformance suite: serves the agent protocol of
client-sdk/conformance/README.md with one ``consistd.Client`` on ``CONSISTD_SOCKET``.

Commands come one JSON object a line on standard input, read without blocking the event loop; each runs in a
task of its own and is answered with one JSON line on standard output, where the watches, campaigns and
reconcilers it starts print their items too. The agent uses the SDK's public API only, as an app would, and
exits 0 when standard input closes. Everything else it has to say goes to standard error.

    hack/sdk/python.sh conformance
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import IO, Any

import consistd

log = logging.getLogger("conformance-agent")

#: The longest command line read: a patch or a payload may be long.
LINE_LIMIT = 16 << 20

#: A JSON object, as ``json`` parses and prints it.
JsonObject = dict[str, Any]

#: The watch modes by the name a command gives.
MODES = {"RAW": consistd.Mode.RAW, "CONSISTENT": consistd.Mode.CONSISTENT}
#: The parts of a ``reconcile``'s change filter by the name its ``changes`` gives.
CHANGED = {
    "generation": consistd.Changed.GENERATION,
    "labels": consistd.Changed.LABELS,
    "annotations": consistd.Changed.ANNOTATIONS,
}


class Failure(Exception):
    """A command's or a stream's error as the protocol prints it: a gRPC code's canonical name and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def to_json(self) -> JsonObject:
        """The ``error`` of an answer or a stream line."""
        return {"code": self.code, "message": self.message}


def invalid(message: str) -> Failure:
    """The failure of a command the agent cannot run: an unknown op, a missing field or one of the wrong type."""
    return Failure("INVALID_ARGUMENT", message)


def failure_of(error: Exception) -> Failure:
    """The failure of an error the SDK raised: the name of the gRPC status code ConsistdError keeps (the names of
    ``grpc.StatusCode``'s members are the canonical ones) and its message. Anything else is not an error the SDK
    should give an app: UNKNOWN, naming its type."""
    if isinstance(error, Failure):
        return error
    if isinstance(error, consistd.ConsistdError):
        return Failure(error.code.name, error.message)
    return Failure("UNKNOWN", f"{type(error).__name__}: {error}")


class Command:
    """One command's fields, checked for type as they are read; ``where`` prefixes the names errors give (the
    fields of an object inside a command)."""

    def __init__(self, fields: JsonObject, where: str = "") -> None:
        self.fields = fields
        self.where = where

    def text(self, name: str) -> str:
        """The string field ``name``, which must be set."""
        value = self.fields.get(name)
        if not isinstance(value, str):
            raise invalid(f"{self.where}{name}: must be a string")
        return value

    def number(self, name: str, *, required: bool) -> int:
        """The non-negative integer field ``name``; 0 when absent (or null), unless it is required."""
        value = self.fields.get(name)
        if value is None and not required:
            return 0
        # bool is an int in Python, not a number in JSON.
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise invalid(f"{self.where}{name}: must be a non-negative integer")
        return value

    def optional_text(self, name: str) -> str:
        """The string field ``name``; empty when absent (or null)."""
        return "" if self.fields.get(name) is None else self.text(name)

    def flag(self, name: str) -> bool:
        """The boolean field ``name``; False when absent (or null)."""
        value = self.fields.get(name, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise invalid(f"{self.where}{name}: must be a boolean")
        return value

    def changes(self, name: str) -> consistd.Changed | None:
        """The change filter field ``name``, ``{"generation", "labels", "annotations"}`` booleans, as the SDK's
        Changed; None when absent (or null)."""
        value = self.fields.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise invalid(f"{self.where}{name}: must be an object or null")
        c = Command(value, f"{self.where}{name}.")
        parts = consistd.Changed(0)
        for field_name, part in CHANGED.items():
            if c.flag(field_name):
                parts |= part
        return parts

    def condition(self, name: str) -> Condition | None:
        """The status condition field ``name``, ``{"type", "status", "reason", "message"}`` with a status of
        ``"True"``, ``"False"`` or ``"Unknown"`` (the SDK's ConditionStatus); None when absent (or null)."""
        value = self.fields.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise invalid(f"{self.where}{name}: must be an object or null")
        c = Command(value, f"{self.where}{name}.")
        try:
            status = consistd.ConditionStatus.of(c.text("status"))
        except ValueError:
            raise invalid(f"{c.where}status: {value['status']!r} is not True, False or Unknown") from None
        return Condition(type=c.text("type"), status=status, reason=c.text("reason"), message=c.text("message"))

    def event(self, name: str) -> EventToRecord | None:
        """The event field ``name``, ``{"severity", "reason", "action", "note"}`` with a severity of ``"Normal"`` or
        ``"Warning"`` (the SDK's EventSeverity); None when absent (or null)."""
        value = self.fields.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise invalid(f"{self.where}{name}: must be an object or null")
        c = Command(value, f"{self.where}{name}.")
        try:
            severity = consistd.EventSeverity.of(c.text("severity"))
        except ValueError:
            raise invalid(f"{c.where}severity: {value['severity']!r} is not Normal or Warning") from None
        return EventToRecord(severity=severity, reason=c.text("reason"), action=c.text("action"), note=c.text("note"))

    def guard(self, name: str) -> consistd.Guard | None:
        """The guard field ``name``, ``{"election", "namespace", "term"}``, as the SDK's Guard; None when absent (or
        null)."""
        value = self.fields.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise invalid(f"{self.where}{name}: must be an object or null")
        g = Command(value, f"{self.where}{name}.")
        return consistd.Guard(
            election=g.text("election"), namespace=g.text("namespace"), term=g.number("term", required=True)
        )


class Output:
    """Standard output: one JSON value a line, each written whole and flushed at once. The agent is one event
    loop on one thread, so the lines of concurrent commands never interleave."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def line(self, value: JsonObject) -> None:
        self._stream.write(json.dumps(value, separators=(",", ":")).encode() + b"\n")
        self._stream.flush()

    def stream_item(self, stream: str, item: JsonObject) -> None:
        """A line of a watch or a campaign: an item."""
        self.line({"stream": stream, "item": item})

    def stream_error(self, stream: str, error: Exception) -> None:
        """A line of a watch or a campaign: the error that ended it."""
        self.line({"stream": stream, "error": failure_of(error).to_json()})


def event_item(event: consistd.Event) -> JsonObject:
    """A watch event as the protocol prints it (name and resourceVersion empty for the markers)."""
    obj = event.object
    return {
        "type": event.type.name,
        "name": obj.name if obj is not None else "",
        "resourceVersion": obj.resource_version if obj is not None else "",
        "predatesOwnWrite": event.predates_own_write,
    }


def state_item(status: consistd.LeadershipStatus) -> JsonObject:
    """A leadership state as the protocol prints it."""
    return {"state": status.state.name, "holder": status.holder, "term": status.term}


def work_item(item: consistd.WorkItem) -> JsonObject:
    """A work item as the protocol prints it."""
    return {
        "namespace": item.namespace,
        "name": item.name,
        "term": item.term,
        "attempt": item.attempt,
        "leaseId": item.lease_id,
        "finalizing": item.finalizing,
    }


class Retry(Exception):  # noqa: N818 (what it asks of the reconciler)
    """Raised by the reconcile handler told RETRY: the SDK completes the lease RETRY."""


@dataclass
class Condition:
    """A status condition a ``handle`` sets on the item's primary first."""

    type: str
    status: consistd.ConditionStatus
    reason: str
    message: str


@dataclass
class EventToRecord:
    """An event a ``handle`` records about the item's primary, after its condition and before its patch."""

    severity: consistd.EventSeverity
    reason: str
    action: str
    note: str


@dataclass
class Handle:
    """What a ``handle`` tells the reconcile handler waiting for it: the status condition to set first (None:
    none), the event to record next (None: none), the merge patch to write (None: no write), whether to end DONE
    (else RETRY), and where to answer with the result or the first failure."""

    condition: Condition | None
    event: EventToRecord | None
    patch: Any
    done: bool
    answer: asyncio.Future[JsonObject]


@dataclass
class PausedWatch:
    """A watch started with ``take`` false: nothing pulls from its iterator until a ``take`` command does, so the
    SDK applies the own-write rule when the app takes each event, not when it arrives."""

    events: consistd.Watch
    #: Takes of one watch run one after another.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The iteration ended (its error, if any, was printed when it was taken).
    ended: bool = False


class Agent:
    """What the agent keeps between commands, and the ops."""

    def __init__(self, client: consistd.Client, out: Output) -> None:
        self._client = client
        self._out = out
        #: What each send returned, by message id, for ``outcome``.
        self._sent: dict[str, consistd.SentMessage] = {}
        #: The watches started with ``take`` false, by stream name.
        self._paused: dict[str, PausedWatch] = {}
        #: The reconcile handlers waiting for their ``handle``, by (stream, item name).
        self._handlers: dict[tuple[str, str], asyncio.Future[Handle]] = {}
        #: The newest-state watches, by stream name.
        self._latest: dict[str, consistd.Latest] = {}
        #: What each worker of a newest-state watch holds, by (stream, worker).
        self._held: dict[tuple[str, str], consistd.Taken] = {}
        #: The commands running and the streams printing (the loop keeps only weak references to tasks).
        self._tasks: set[asyncio.Task[None]] = set()
        self._ops: dict[str, Callable[[Command], Awaitable[JsonObject]]] = {
            "get": self.get,
            "patch": self.patch,
            "watch": self.watch,
            "take": self.take,
            "send": self.send,
            "outcome": self.outcome,
            "campaign": self.campaign,
            "reconcile": self.reconcile,
            "handle": self.handle,
            "latest": self.latest,
            "next": self.next,
            "done": self.done,
        }

    def start(self, command: JsonObject) -> None:
        """Runs ``command`` in a task of its own, so that one that waits holds up no other."""
        self._spawn(self.run(command), f"command {command.get('id')!r}")

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self, command: JsonObject) -> None:
        """Runs one command and prints its answer (none if the agent is stopped meanwhile)."""
        id_ = command.get("id")
        op = command.get("op")
        try:
            handler = self._ops.get(op) if isinstance(op, str) else None
            if handler is None:
                raise invalid(f"op: unknown op {op!r}")
            ok = await handler(Command(command))
        except Exception as e:
            if not isinstance(e, (Failure, consistd.ConsistdError)):
                log.exception("command %r (%s) failed with an error that is not the SDK's", id_, op)
            self._out.line({"id": id_, "error": failure_of(e).to_json()})
        else:
            self._out.line({"id": id_, "ok": ok})

    async def stop(self) -> None:
        """Ends every command and stream still running, without answers, and closes the paused watches."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for paused in self._paused.values():
            await paused.events.aclose()
        for latest in self._latest.values():
            await latest.aclose()

    async def get(self, c: Command) -> JsonObject:
        """Reads the object."""
        resource, namespace, name = c.text("resource"), c.text("namespace"), c.text("name")
        obj = await self._client.objects.get(resource, name, namespace=namespace)
        return {"resourceVersion": obj.resource_version}

    async def patch(self, c: Command) -> JsonObject:
        """Merge-patches the object through the SDK's objects client, which records what it returned for the
        own-write rule of the client's watches."""
        resource, namespace, name = c.text("resource"), c.text("namespace"), c.text("name")
        if "patch" not in c.fields:
            raise invalid("patch: must be set")
        # As JSON text: the SDK takes a str as JSON already, so any JSON value goes as it came.
        patch = json.dumps(c.fields["patch"], separators=(",", ":"))
        obj = await self._client.objects.patch(
            resource, name, patch, namespace=namespace, patch_type=consistd.PatchType.MERGE
        )
        return {"resourceVersion": obj.resource_version, "uid": obj.uid}

    async def watch(self, c: Command) -> JsonObject:
        """Subscribes. With ``take`` true it takes every event as it comes and prints it; with ``take`` false it
        keeps the watch for ``take`` commands, taking nothing until then."""
        stream, resource, namespace = c.text("stream"), c.text("resource"), c.text("namespace")
        mode = MODES.get(c.text("mode"))
        if mode is None:
            raise invalid(f"mode: {c.fields['mode']!r} is neither RAW nor CONSISTENT")
        take = c.flag("take")
        events = self._client.watch(resource, namespace=namespace, mode=mode)
        if take:
            self._spawn(self._print_stream(stream, events, event_item), f"watch {stream!r}")
        else:
            self._paused[stream] = PausedWatch(events)
        return {}

    async def take(self, c: Command) -> JsonObject:
        """Takes the next ``count`` events of a watch started with ``take`` false, printing each."""
        stream, count = c.text("stream"), c.number("count", required=True)
        paused = self._paused.get(stream)
        if paused is None:
            raise invalid(f"stream: no watch {stream!r} started with take false")
        async with paused.lock:
            for _ in range(count):
                if paused.ended:
                    break
                try:
                    event = await anext(paused.events)
                except StopAsyncIteration:
                    paused.ended = True
                    break
                except consistd.ConsistdError as e:
                    paused.ended = True
                    self._out.stream_error(stream, e)
                    break
                self._out.stream_item(stream, event_item(event))
        return {}

    async def send(self, c: Command) -> JsonObject:
        """Sends the message, under the guard given through ``send``'s own ``guard``, and keeps what ``send``
        returned under its message id."""
        peer, resource_id, event_id = c.text("peer"), c.text("resourceId"), c.text("eventId")
        payload, guard = c.text("payload"), c.guard("guard")
        sent = await self._client.send(peer, resource_id, event_id, payload, guard=guard)
        self._sent[sent.message_id] = sent
        return {"messageId": sent.message_id}

    async def outcome(self, c: Command) -> JsonObject:
        """Awaits the outcome of a send, bounded by ``SentMessage.ack``'s own timeout when ``timeoutMs`` is set."""
        message_id, timeout_ms = c.text("messageId"), c.number("timeoutMs", required=False)
        sent = self._sent.get(message_id)
        if sent is None:
            raise invalid(f"messageId: this agent sent no message {message_id!r}")
        try:
            ack = await sent.ack(timeout=timeout_ms / 1000 if timeout_ms else None)
        # asyncio.wait_for's timeout: asyncio.TimeoutError, which is TimeoutError itself from Python 3.11.
        except (TimeoutError, asyncio.TimeoutError):
            raise Failure("DEADLINE_EXCEEDED", f"no outcome within {timeout_ms} ms") from None
        return {"outcome": ack.outcome.name, "peer": ack.peer, "reason": ack.reason}

    async def campaign(self, c: Command) -> JsonObject:
        """Campaigns and prints every state the SDK yields."""
        stream, election, namespace = c.text("stream"), c.text("election"), c.text("namespace")
        campaign = self._client.campaign(election, namespace=namespace)
        self._spawn(self._campaign(stream, campaign), f"campaign {stream!r}")
        return {}

    async def _campaign(self, stream: str, campaign: consistd.Campaign) -> None:
        # Leaving `async with` (the agent stopping) resigns.
        async with campaign:
            await self._print_stream(stream, campaign, state_item)

    async def reconcile(self, c: Command) -> JsonObject:
        """Runs the SDK's reconciler on a queue whose work is handed out only while the daemon leads the election
        (none when ``election`` is absent or empty), a change of a primary queuing a pass only if it changed a
        part ``changes`` names (every change when it is absent or null), keeping the finalizer ``finalizer`` names
        on its primaries (none when it is absent, null or empty); its handler prints each work item and waits for a
        ``handle`` of its name."""
        stream = c.text("stream")
        election = c.optional_text("election")
        spec = consistd.ReconcileSpec(
            name=c.text("queue"),
            resource=c.text("resource"),
            namespace=c.text("namespace"),
            election=election,
            election_namespace=c.text("electionNamespace") if election else "",
            only_changes_of=c.changes("changes"),
            finalizer=c.optional_text("finalizer"),
        )

        async def handler(item: consistd.WorkItem) -> None:
            await self._handler(stream, item)

        self._spawn(self._reconcile(spec, handler), f"reconcile {stream!r}")
        return {}

    async def _reconcile(self, spec: consistd.ReconcileSpec, handler: consistd.ReconcileHandler) -> None:
        try:
            await self._client.reconcile(spec, handler)
        except consistd.ConsistdError as e:
            log.error("the reconciler of queue %s ended: %s", spec.name, e)

    async def _handler(self, stream: str, item: consistd.WorkItem) -> None:
        """The reconcile handler: prints the item, waits for its ``handle``, sets the condition and records the event
        through the item's helpers and writes as told through the item's objects client, answers with the results
        and ends as told (with a retry when the condition was not set or the event not recorded)."""
        key = (stream, item.name)
        told: asyncio.Future[Handle] = asyncio.get_running_loop().create_future()
        # Waiting before the item is printed: the suite may send the handle as soon as it reads the line.
        self._handlers[key] = told
        try:
            self._out.stream_item(stream, work_item(item))
            handle = await told
        finally:
            if self._handlers.get(key) is told:
                del self._handlers[key]
        condition_set = handle.condition is None
        event_recorded = handle.event is None
        try:
            answer: JsonObject = {}
            if handle.condition is not None:
                answer["condition"] = await self._set_condition(item, handle.condition)
                condition_set = True
            if handle.event is not None:
                answer["event"] = await self._record_event(item, handle.event)
                event_recorded = True
            answer.update(await self._write(item, handle.patch))
            handle.answer.set_result(answer)
        except Exception as e:
            handle.answer.set_exception(failure_of(e))
        finally:
            # Cancelled meanwhile (the agent stopping): the handle still gets an answer.
            if not handle.answer.done():
                handle.answer.set_exception(Failure("UNKNOWN", "the handler ended without answering"))
        if not condition_set:
            raise Retry("the condition was not set")
        if not event_recorded:
            raise Retry("the event was not recorded")
        if not handle.done:
            raise Retry("the suite asked for a retry")

    @staticmethod
    async def _set_condition(item: consistd.WorkItem, condition: Condition) -> JsonObject:
        """Sets the status condition on the item's primary through the SDK's item helper; whether it wrote and the
        condition's lastTransitionTime."""
        set_ = await item.set_condition(condition.type, condition.status, condition.reason, condition.message)
        return {"changed": set_.changed, "lastTransitionTime": set_.last_transition_time}

    @staticmethod
    async def _record_event(item: consistd.WorkItem, event: EventToRecord) -> JsonObject:
        """Records the event about the item's primary through the SDK's item helper; whether it was recorded (False:
        the rate limit dropped it)."""
        recorded = await item.record_event(event.severity, event.reason, event.action, event.note)
        return {"recorded": recorded}

    @staticmethod
    async def _write(item: consistd.WorkItem, patch: Any) -> JsonObject:
        """Merge-patches the item's primary through the item's own objects client (as it is, adding no guard);
        the new resourceVersion."""
        if patch is None:
            return {}
        obj = await item.objects.patch(
            "configmaps",
            item.name,
            json.dumps(patch, separators=(",", ":")),
            namespace=item.namespace,
            patch_type=consistd.PatchType.MERGE,
        )
        return {"resourceVersion": obj.resource_version}

    async def handle(self, c: Command) -> JsonObject:
        """Tells the reconcile handler waiting with the item ``name`` which status condition to set, which event to
        record, what to write and how to end; answers with the results, or fails with the first error."""
        stream, name, outcome = c.text("stream"), c.text("name"), c.text("outcome")
        if outcome not in ("DONE", "RETRY"):
            raise invalid(f"outcome: {outcome!r} is neither DONE nor RETRY")
        condition = c.condition("condition")
        event = c.event("event")
        told = self._handlers.pop((stream, name), None)
        if told is None or told.done():
            raise invalid(f"name: no handler waits with item {name!r}")
        answer: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        done = outcome == "DONE"
        told.set_result(Handle(condition=condition, event=event, patch=c.fields.get("patch"), done=done, answer=answer))
        return await answer

    async def latest(self, c: Command) -> JsonObject:
        """Opens the SDK's newest-state consumer of a CONSISTENT watch."""
        stream, resource, namespace = c.text("stream"), c.text("resource"), c.text("namespace")
        latest = self._client.watch_latest(resource, namespace=namespace)
        await latest.__aenter__()  # the reader starts; stop() closes it
        self._latest[stream] = latest
        return {}

    async def next(self, c: Command) -> JsonObject:
        """A worker asks for the next object's newest state, and holds it until its ``done``."""
        stream, worker = c.text("stream"), c.text("worker")
        latest = self._latest.get(stream)
        if latest is None:
            raise invalid(f"stream: no newest-state watch {stream!r}")
        if (stream, worker) in self._held:
            raise invalid(f"worker: {worker!r} holds an object already")
        taken = await latest.next()
        self._held[(stream, worker)] = taken
        return event_item(taken.event)

    async def done(self, c: Command) -> JsonObject:
        """The worker is done with the object it holds."""
        stream, worker = c.text("stream"), c.text("worker")
        taken = self._held.pop((stream, worker), None)
        if taken is None:
            raise invalid(f"worker: {worker!r} holds nothing")
        taken.done()
        return {}

    async def _print_stream(self, stream: str, items: AsyncIterator[Any], to_json: Callable[[Any], JsonObject]) -> None:
        """Prints every item of a watch or a campaign as it comes, then the error that ended it, if any."""
        try:
            async for item in items:
                self._out.stream_item(stream, to_json(item))
        except Exception as e:
            if not isinstance(e, consistd.ConsistdError):
                log.exception("stream %r failed with an error that is not the SDK's", stream)
            self._out.stream_error(stream, e)


async def read_commands(reader: asyncio.StreamReader, agent: Agent) -> None:
    """Starts each command ``reader`` gives, until it ends."""
    while True:
        try:
            line = await reader.readline()
        except ValueError as e:  # longer than LINE_LIMIT: the reader skipped it
            log.error("a command line too long: %s", e)
            continue
        if not line:
            return
        if not line.strip():
            continue
        try:
            command = json.loads(line)
        except ValueError as e:
            log.error("not a JSON command (%s): %r", e, line)
            continue
        if not isinstance(command, dict):
            log.error("not a JSON object: %r", line)
            continue
        agent.start(command)


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    # Standard input through the event loop: reading it holds up no command.
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    client = consistd.Client()
    agent = Agent(client, Output(sys.stdout.buffer))
    try:
        await read_commands(reader, agent)
    finally:
        # Standard input closed: what still runs ends unanswered (nobody is left to ask for it).
        await agent.stop()
        await client.close()


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s: %(message)s")
    asyncio.run(main())
