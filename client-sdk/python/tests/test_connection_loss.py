"""A connection to the sidecar that breaks under a stream write is a lost connection (UNAVAILABLE), as
grpcio reports it (INTERNAL "Internal error from Core"): the call that made the write may retry, and a
receive loop receives again instead of ending. The first two tests stand in a fake gRPC call for
grpcio's, which cannot be made to fail exactly under a write on demand; the last SIGKILLs a real daemon
while its app sends and ACKs."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import consistd
from consistd import ConsistdError, InboxMessage
from consistd.inbox import Inbox, acked
from consistd.ordered import Ordered
from consistd.v1 import inbox_pb2
from support import Daemon, unique


def write_failed() -> grpc.aio.AioRpcError:
    """What grpcio's aio client raises when its core cannot make a stream write (grpc/aio/_call.py)."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="Internal error from Core",
        debug_error_string="Socket closed",
    )


class BrokenStream:
    """A bidirectional call whose connection broke: a write fails the way grpcio fails it, and so does
    reading (grpcio sets that status on the call)."""

    def __init__(self) -> None:
        self.cancelled = False

    async def write(self, request: Any) -> None:
        raise write_failed()

    def __aiter__(self) -> BrokenStream:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0.05)  # the write fails first, as when the connection breaks under it
        raise write_failed()

    def cancel(self) -> bool:
        self.cancelled = True
        return True


async def test_a_write_that_breaks_with_the_connection_fails_the_call_as_unavailable() -> None:
    ordered: Ordered[inbox_pb2.AckStreamRequest, inbox_pb2.AckStreamResponse] = Ordered(BrokenStream, acked, "ack")
    with pytest.raises(ConsistdError) as raised:
        await asyncio.wait_for(ordered.call(inbox_pb2.AckStreamRequest(message_id="1")), 5)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE, raised.value
    assert "ack: lost the connection to the sidecar: a write failed: Socket closed" == raised.value.message


class OneMessage:
    """A Receive call that delivers message "1", then waits."""

    def __init__(self) -> None:
        self.message = inbox_pb2.InboxMessage(message_id="1", resource_id="r", event_id="e", delivery_attempt=1)

    def cancel(self) -> bool:
        return True

    async def _messages(self) -> AsyncIterator[inbox_pb2.ReceiveResponse]:
        yield inbox_pb2.ReceiveResponse(message=self.message)
        await asyncio.Event().wait()

    def __aiter__(self) -> AsyncIterator[inbox_pb2.ReceiveResponse]:
        return self._messages()


class InboxStub:
    """Counts Receive calls; each delivers message "1"."""

    def __init__(self) -> None:
        self.receives = 0

    def Receive(self, request: inbox_pb2.ReceiveRequest) -> OneMessage:  # noqa: N802 (the generated name)
        self.receives += 1
        return OneMessage()


class AckStreams:
    """Opens AckStreams: the first one's connection breaks under the ACK's write, later ones ACK."""

    def __init__(self) -> None:
        self.opened = 0

    def __call__(self) -> Any:
        self.opened += 1
        return BrokenStream() if self.opened == 1 else Acking()


class Acking(BrokenStream):
    """An AckStream that answers every ACK."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: asyncio.Queue[inbox_pb2.AckStreamResponse] = asyncio.Queue()

    async def write(self, request: Any) -> None:
        await self.answers.put(inbox_pb2.AckStreamResponse())

    async def __anext__(self) -> Any:
        return await self.answers.get()


async def test_serve_receives_again_when_the_connection_breaks_under_an_ack() -> None:
    stub, streams = InboxStub(), AckStreams()
    inbox = Inbox(stub, Ordered(streams, acked, "ack"))  # type: ignore[arg-type]
    handled: list[int] = []

    def handler(message: InboxMessage) -> None:
        handled.append(message.delivery_attempt)

    await asyncio.wait_for(inbox.serve(handler, max_messages=1), 10)
    assert (stub.receives, streams.opened, len(handled)) == (2, 2, 2), "Receive calls, AckStreams, handler calls"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("round_", range(6))
async def test_a_receiver_keeps_receiving_across_a_sigkill_of_its_sidecar(short_dir: Path, round_: int) -> None:
    """The app sends to its own sidecar's peer port while it receives and ACKs; the sidecar is SIGKILLed
    at a different moment each round and started again on its store: the receive loop goes on, and every
    message whose send returned is received."""
    port = free_port()
    daemon = Daemon(short_dir, unique("sdk-py-kill"), f'peer:\n  listen: "127.0.0.1:{port}"\n  insecure: true\n')
    await daemon.start()
    prefix = unique("sdk-py/kill")
    stored: list[str] = []
    received: set[str] = set()
    try:
        async with consistd.Client(daemon.socket) as receiver, consistd.Client(daemon.socket) as sender:
            serving = asyncio.create_task(receiver.inbox.serve(lambda m: received.add(m.resource_id)))

            killed = asyncio.Event()

            async def send_until_the_sidecar_goes() -> None:
                for i in range(100_000):
                    if killed.is_set():
                        return
                    try:
                        await sender.send(f"127.0.0.1:{port}", f"{prefix}/{i}", "1", b"x")
                    except ConsistdError as e:
                        assert e.code == grpc.StatusCode.UNAVAILABLE, e
                        return
                    stored.append(f"{prefix}/{i}")

            sending = asyncio.create_task(send_until_the_sidecar_goes())
            while len(stored) < 20 + 15 * round_ and not sending.done():
                await asyncio.sleep(0.01)
            await daemon.kill()
            killed.set()
            await daemon.start()
            # The send in flight at the kill fails as a lost connection (UNAVAILABLE), which ends the loop.
            await asyncio.wait_for(sending, 30)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while set(stored) - received and not serving.done() and loop.time() < deadline:
                await asyncio.sleep(0.1)
            assert not serving.done(), f"the receive loop ended: {serving.exception()!r}"
            serving.cancel()
        missing = set(stored) - received
        assert not missing, f"{len(missing)} of {len(stored)} stored messages not received"
    finally:
        await daemon.stop()
