"""The conformance agent (conformance_agent.py, client-sdk/conformance/README.md) as the suite sees it: a process
on daemon a that answers each JSON command with one line under its id, with the canonical name of the status the
SDK raised, runs commands concurrently, and exits 0 when its input closes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import consistd
from support import configmap, unique

AGENT = Path(__file__).resolve().parent.parent / "conformance_agent.py"
#: A peer address nothing listens on: messages to it stay pending until a newer event supersedes them.
NOWHERE = "127.0.0.1:1"
#: A send's fields but its guard, for the sends that are refused.
SEND = {"peer": NOWHERE, "resourceId": "r", "eventId": "1", "payload": "x"}
#: What the watches of commands that are refused watch.
WATCHED = {"resource": "configmaps", "namespace": "n"}
#: A reconcile's fields but its election, change filter and finalizer, for the reconciles that are refused.
QUEUE = {"stream": "q", "queue": "q", **WATCHED}
#: A handle's status condition.
CONDITION = {"type": "Ready", "status": "True", "reason": "Available", "message": "m"}
#: A handle's event.
EVENT = {"severity": "Warning", "reason": "Drifted", "action": "Reconcile", "note": "n"}
#: How long an answer may take.
WAIT = 15.0


class AgentProcess:
    """The agent running on ``CONSISTD_SOCKET`` (daemon a); its lines routed to the commands and streams."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        #: Every line the agent printed, in order.
        self.lines: list[dict[str, Any]] = []
        self._answers: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self.streams: defaultdict[str, asyncio.Queue[dict[str, Any]]] = defaultdict(asyncio.Queue)
        self._next_id = 0
        self._reading = asyncio.create_task(self._read())

    @classmethod
    async def start(cls) -> AgentProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(AGENT), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return cls(process)

    def _answer(self, id_: Any) -> asyncio.Future[dict[str, Any]]:
        return self._answers.setdefault(id_, asyncio.get_running_loop().create_future())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            assert line.endswith(b"\n"), line
            value = json.loads(line)
            self.lines.append(value)
            if "id" in value:
                answer = self._answer(value["id"])
                assert not answer.done(), f"a second answer: {value}"
                answer.set_result(value)
            else:
                self.streams[value["stream"]].put_nowait(value)

    def write(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")

    def send(self, op: str, **fields: Any) -> asyncio.Future[dict[str, Any]]:
        """Sends a command; its answer line comes in the future returned."""
        self._next_id += 1
        self.write(json.dumps({"id": self._next_id, "op": op, **fields}).encode())
        return self._answer(self._next_id)

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """A command's answer: ``ok``'s value; an error fails the test."""
        answer = await asyncio.wait_for(self.send(op, **fields), WAIT)
        assert "ok" in answer, answer
        ok: dict[str, Any] = answer["ok"]
        return ok

    async def fails(self, op: str, **fields: Any) -> str:
        """The code of a command's error; an answer without one fails the test."""
        answer = await asyncio.wait_for(self.send(op, **fields), WAIT)
        assert "error" in answer and "ok" not in answer, answer
        code: str = answer["error"]["code"]
        return code

    async def item(self, stream: str) -> dict[str, Any]:
        line = await asyncio.wait_for(self.streams[stream].get(), WAIT)
        assert "item" in line, line
        item: dict[str, Any] = line["item"]
        return item

    async def close(self) -> int:
        """Closes the agent's input and returns its exit status."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        status = await asyncio.wait_for(self.process.wait(), WAIT)
        await asyncio.wait_for(self._reading, WAIT)
        return status

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        self._reading.cancel()


@pytest.fixture
async def agent() -> AsyncIterator[AgentProcess]:
    assert os.environ.get("CONSISTD_SOCKET")
    a = await AgentProcess.start()
    yield a
    a.kill()


@pytest.mark.parametrize(
    "command",
    [
        {"id": 1, "op": "nope"},
        {"id": 2},
        {"id": 3, "op": "get", "resource": "configmaps", "namespace": 7, "name": "x"},
        {"id": 4, "op": "watch", "stream": "w", **WATCHED, "mode": "FAST", "take": True},
        {"id": 5, "op": "watch", "stream": "w", **WATCHED, "mode": "RAW", "take": "yes"},
        {"id": 6, "op": "take", "stream": "w"},
        {"id": 7, "op": "take", "stream": "w", "count": -1},
        {"id": 8, "op": "take", "stream": "w", "count": True},
        {"id": 9, "op": "take", "stream": "unknown", "count": 1},
        {"id": 10, "op": "outcome", "messageId": "m", "timeoutMs": "soon"},
        {"id": 11, "op": "outcome", "messageId": "never-sent"},
        {"id": 12, "op": "patch", "resource": "configmaps", "namespace": "n", "name": "x"},
        {"id": "thirteen", "op": "send", "peer": NOWHERE, "resourceId": "r", "eventId": 1, "payload": "x"},
        {"id": 14, "op": "send", **SEND, "guard": "e"},
        {"id": 15, "op": "send", **SEND, "guard": {"election": "e", "namespace": "n", "term": "1"}},
        {"id": 16, "op": "send", **SEND, "guard": {"election": "e", "namespace": "n", "term": -1}},
        {"id": 17, "op": "send", **SEND, "guard": {"namespace": "n", "term": 1}},
        {"id": 18, "op": "reconcile", **QUEUE, "changes": "labels"},
        {"id": 19, "op": "reconcile", **QUEUE, "changes": {"labels": "yes"}},
        {"id": 20, "op": "reconcile", **QUEUE, "election": 7},
        {"id": 21, "op": "reconcile", **QUEUE, "election": "e"},
        {"id": 22, "op": "reconcile", **QUEUE, "finalizer": 7},
    ],
)
async def test_a_command_it_cannot_run_is_invalid_argument_under_its_id(
    agent: AgentProcess, command: dict[str, Any]
) -> None:
    agent.write(b"not a command")  # said on standard error; no answer
    agent.write(json.dumps(command).encode())
    assert await agent.close() == 0
    [answer] = agent.lines
    assert answer["id"] == command["id"] and "ok" not in answer, answer
    assert answer["error"]["code"] == "INVALID_ARGUMENT", answer


@pytest.mark.parametrize(
    ("condition", "named"),
    [
        pytest.param("Ready", "condition: must be an object or null", id="not-an-object"),
        pytest.param({**CONDITION, "status": "true"}, "condition.status: 'true' is not True", id="status-lowercase"),
        pytest.param({**CONDITION, "status": True}, "condition.status: must be a string", id="status-a-boolean"),
        pytest.param({"type": "Ready", "status": "True", "reason": "R"}, "condition.message: ", id="no-message"),
    ],
)
async def test_a_handle_whose_condition_it_cannot_set_is_invalid_argument_naming_it(
    agent: AgentProcess, condition: Any, named: str
) -> None:
    """Checked before the handler is looked for (none waits here), so the error names the condition."""
    handle = {"stream": "q", "name": "a", "patch": None, "outcome": "DONE", "condition": condition}
    answer = await asyncio.wait_for(agent.send("handle", **handle), WAIT)
    assert answer.get("error", {}).get("code") == "INVALID_ARGUMENT", answer
    assert answer["error"]["message"].startswith(named), answer
    assert await agent.close() == 0


@pytest.mark.parametrize(
    ("event", "named"),
    [
        pytest.param("Warning", "event: must be an object or null", id="not-an-object"),
        pytest.param({**EVENT, "severity": "warning"}, "event.severity: 'warning' is not Normal", id="lowercase"),
        pytest.param({**EVENT, "severity": "Error"}, "event.severity: 'Error' is not Normal", id="not-a-severity"),
        pytest.param({**EVENT, "severity": 1}, "event.severity: must be a string", id="severity-a-number"),
        pytest.param({"severity": "Normal", "reason": "R", "action": "A"}, "event.note: ", id="no-note"),
    ],
)
async def test_a_handle_whose_event_it_cannot_record_is_invalid_argument_naming_it(
    agent: AgentProcess, event: Any, named: str
) -> None:
    """Checked before the handler is looked for (none waits here), so the error names the event."""
    handle = {"stream": "q", "name": "a", "patch": None, "outcome": "DONE", "event": event}
    answer = await asyncio.wait_for(agent.send("handle", **handle), WAIT)
    assert answer.get("error", {}).get("code") == "INVALID_ARGUMENT", answer
    assert answer["error"]["message"].startswith(named), answer
    assert await agent.close() == 0


async def test_answers_carry_what_the_sdk_returned_and_the_code_of_what_it_raised(
    agent: AgentProcess, client: consistd.Client, namespace: str
) -> None:
    cm = {"resource": "configmaps", "namespace": namespace, "name": "c"}
    assert await agent.fails("get", **cm) == "NOT_FOUND"
    created = await client.objects.create("configmaps", configmap("c", {"v": "0"}), namespace=namespace)
    patched = await agent.call("patch", **cm, patch={"data": {"v": "1"}})
    assert patched["uid"] == created.uid and int(patched["resourceVersion"]) > int(created.resource_version)
    assert (await client.objects.get("configmaps", "c", namespace=namespace)).json["data"] == {"v": "1"}
    assert await agent.call("get", **cm) == {"resourceVersion": patched["resourceVersion"]}

    send = {"peer": NOWHERE, "resourceId": f"{namespace}/r", "payload": "x"}
    older = (await agent.call("send", **send, eventId="1"))["messageId"]
    # The SDK's own timeout (SentMessage.ack's TimeoutError) is DEADLINE_EXCEEDED; the message stays pending.
    assert await agent.fails("outcome", messageId=older, timeoutMs=200) == "DEADLINE_EXCEEDED"
    await agent.call("send", **send, eventId="2")
    assert (await agent.call("outcome", messageId=older, timeoutMs=0))["outcome"] == "SUPERSEDED"
    assert await agent.close() == 0


async def test_a_send_goes_under_the_guard_given_and_under_none_when_it_is_null(
    agent: AgentProcess, namespace: str
) -> None:
    send = {"peer": NOWHERE, "resourceId": f"{namespace}/r", "payload": "x"}
    # The agent leads no election: a guard reaching the sidecar is refused, naming it.
    not_led = {"election": unique("sdk-py-not-led"), "namespace": namespace, "term": 1}
    answer = await asyncio.wait_for(agent.send("send", **send, eventId="1", guard=not_led), WAIT)
    assert answer.get("error", {}).get("code") == "FAILED_PRECONDITION", answer
    assert answer["error"]["message"].startswith("guard: "), answer
    assert (await agent.call("send", **send, eventId="2", guard=None))["messageId"]
    assert await agent.close() == 0


async def test_a_command_that_waits_holds_up_no_other_and_closing_its_input_ends_the_agent(
    agent: AgentProcess, client: consistd.Client, namespace: str
) -> None:
    watch = {"resource": "configmaps", "namespace": namespace, "mode": "RAW"}
    await agent.call("watch", stream="paused", take=False, **watch)
    await agent.call("watch", stream="taking", take=True, **watch)
    assert (await agent.item("taking"))["type"] == "SYNCED"
    assert agent.streams["paused"].empty(), "nothing taken before a take"
    await agent.call("take", stream="paused", count=1)
    synced = {"type": "SYNCED", "name": "", "resourceVersion": "", "predatesOwnWrite": False}
    assert await agent.item("paused") == synced

    # A take waiting for an event holds up neither a get nor the watch that takes as events come.
    waiting = agent.send("take", stream="paused", count=1)
    cm = {"resource": "configmaps", "namespace": namespace, "name": "c"}
    assert await agent.fails("get", **cm) == "NOT_FOUND"
    assert not waiting.done()
    created = await client.objects.create("configmaps", configmap("c", {"v": "0"}), namespace=namespace)
    added = {"type": "ADDED", "name": "c", "resourceVersion": created.resource_version, "predatesOwnWrite": False}
    assert await agent.item("taking") == added
    assert (await asyncio.wait_for(waiting, WAIT))["ok"] == {}
    assert await agent.item("paused") == added

    # A command still waiting when the input closes ends unanswered, and the agent exits 0.
    unanswered = agent.send("take", stream="paused", count=1)
    assert await agent.close() == 0
    assert not unanswered.done()
