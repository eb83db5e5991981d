"""Awaiting a sent message's outcome: ``sent.ack()`` asks the sidecar (OutboxService.WaitOutcome) for the
message's first outcome. A lost connection is asked again with backoff, so an outcome that came meanwhile is
still seen; the app's timeout bounds one wait; an outcome obtained is kept; an outcome the sidecar no longer
knows is NOT_FOUND as it sent it; and a send never awaited makes no call after it returns."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

import consistd
from consistd import AckOutcome, ConsistdError, InboxMessage
from consistd.v1 import outbox_pb2, outbox_pb2_grpc
from support import Daemon, SocketProxy, calls_started, unique

PEER = os.environ.get("CONSISTD_TEST_PEER_ADDRESS", "")
ADMIN = os.environ.get("CONSISTD_TEST_ADMIN_SOCKET", "")
#: A peer address nothing listens on: messages to it stay pending until a newer event supersedes them.
NOWHERE = "127.0.0.1:1"


async def outcome_at_the_sidecar(client: consistd.Client, message_id: str) -> outbox_pb2.WatchAcksResponse:
    """The message's first outcome, asked with the generated stub on ``client``'s own connection."""
    stub = outbox_pb2_grpc.OutboxServiceStub(client.channel)
    response = await stub.WaitOutcome(outbox_pb2.WaitOutcomeRequest(message_id=message_id), timeout=30)
    return response.outcome


async def until(holds: Callable[[], Awaitable[bool]], what: str, timeout: float = 15.0) -> None:
    """Polls ``holds`` until it answers True, failing the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await holds():
        assert loop.time() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


async def test_an_outcome_that_came_while_the_connection_was_cut_is_seen_once_it_is_back(
    short_dir: Path, client: consistd.Client, peer: consistd.Client
) -> None:
    resource_id = unique("sdk-py/cut")
    proxy = await SocketProxy(os.environ["CONSISTD_SOCKET"], str(short_dir / "proxy.sock")).start()
    serving: asyncio.Task[None] | None = None
    try:
        async with consistd.Client(proxy.path) as app:
            sent = await app.send(PEER, resource_id, "1", b"x")
            before = await calls_started(ADMIN, "WaitOutcome")
            waiting = asyncio.create_task(sent.ack(timeout=60))

            async def wait_reached_the_sidecar() -> bool:
                return await calls_started(ADMIN, "WaitOutcome") > before

            await until(wait_reached_the_sidecar, "the app's WaitOutcome reached the sidecar")
            proxy.paused = True
            proxy.cut()

            # While the app's connection is down, the peer's app ACKs the message.
            async def handler(message: InboxMessage) -> None:
                pass

            serving = asyncio.create_task(peer.inbox.serve(handler))
            outcome = await outcome_at_the_sidecar(client, sent.message_id)
            assert outcome.outcome == outbox_pb2.ACK_OUTCOME_ACKED, outcome
            await asyncio.sleep(0.5)  # a wait that gave up on the lost connection would have ended by now
            assert not waiting.done(), f"the wait ended while the connection was cut: {waiting.exception()!r}"

            proxy.paused = False
            ack = await asyncio.wait_for(waiting, 30)
    finally:
        if serving is not None:
            serving.cancel()
        await proxy.close()
    assert (ack.outcome, ack.message_id, ack.resource_id, ack.event_id) == (
        AckOutcome.ACKED,
        sent.message_id,
        resource_id,
        "1",
    )
    assert proxy.forwarded >= 2, "the app connected again"


async def test_a_message_a_newer_event_replaced_is_superseded(client: consistd.Client) -> None:
    resource_id = unique("sdk-py/superseded")
    first = await client.send(NOWHERE, resource_id, "1", b"old")
    second = await client.send(NOWHERE, resource_id, "2", b"new")
    ack = await first.ack(timeout=30)
    assert (ack.outcome, ack.message_id, ack.resource_id, ack.event_id, ack.reason) == (
        AckOutcome.SUPERSEDED,
        first.message_id,
        resource_id,
        "1",
        "",
    )
    assert second.message_id != first.message_id


async def test_a_wait_that_timed_out_goes_on_when_awaited_again_and_an_outcome_obtained_is_kept(
    client: consistd.Client,
) -> None:
    resource_id = unique("sdk-py/timeout")
    sent = await client.send(NOWHERE, resource_id, "1", b"x")
    loop = asyncio.get_running_loop()
    started = loop.time()
    timing_out = asyncio.create_task(sent.ack(timeout=0.5))
    done, _ = await asyncio.wait({timing_out}, timeout=10)
    assert done, "ack(timeout=0.5) did not return within 10 s"
    with pytest.raises(TimeoutError):
        timing_out.result()
    assert 0.5 <= loop.time() - started < 5

    # Awaiting again waits on; the outcome comes while it waits.
    again = asyncio.create_task(sent.ack(timeout=30))
    await asyncio.sleep(0.2)
    assert not again.done(), f"the second wait ended before the outcome came: {again.exception()!r}"
    await client.send(NOWHERE, resource_id, "2", b"y")
    ack = await again
    assert (ack.outcome, ack.message_id, ack.event_id) == (AckOutcome.SUPERSEDED, sent.message_id, "1")

    calls = await calls_started(ADMIN, "WaitOutcome")
    assert await sent.ack() is ack, "the outcome obtained is returned again"
    assert await calls_started(ADMIN, "WaitOutcome") == calls, "without asking the sidecar"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_outcome_the_restarted_sidecar_no_longer_knows_is_not_found(short_dir: Path) -> None:
    """The app sends to its own sidecar's peer port and receives there; the sidecar restarts after both
    messages were ACKed: the outcome the app obtained before is kept, the other one is NOT_FOUND."""
    port = free_port()
    daemon = Daemon(short_dir, unique("sdk-py-restart"), f'peer:\n  listen: "127.0.0.1:{port}"\n  insecure: true\n')
    await daemon.start()
    try:
        async with consistd.Client(daemon.socket) as receiver, consistd.Client(daemon.socket) as sender:
            serving = asyncio.create_task(receiver.inbox.serve(lambda m: None))
            try:
                kept = await sender.send(f"127.0.0.1:{port}", unique("sdk-py/kept"), "1", b"x")
                kept_ack = await kept.ack(timeout=30)
                assert kept_ack.outcome == AckOutcome.ACKED
                forgotten = await sender.send(f"127.0.0.1:{port}", unique("sdk-py/forgotten"), "1", b"x")
                outcome = await outcome_at_the_sidecar(receiver, forgotten.message_id)
                assert outcome.outcome == outbox_pb2.ACK_OUTCOME_ACKED, outcome
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
            await daemon.stop()
            await daemon.start()

            assert await kept.ack(timeout=30) is kept_ack
            assert await calls_started(daemon.admin_socket, "WaitOutcome") == 0, "the kept outcome asked nobody"
            with pytest.raises(ConsistdError) as raised:
                await forgotten.ack(timeout=30)
            assert raised.value.code == grpc.StatusCode.NOT_FOUND, raised.value
            assert raised.value.message.startswith(f"message {forgotten.message_id}: its outcome is not known"), (
                raised.value.message
            )
            assert await calls_started(daemon.admin_socket, "WaitOutcome") >= 1
    finally:
        await daemon.stop()


async def test_a_send_never_awaited_makes_no_call_after_it_returns(client: consistd.Client) -> None:
    methods = ("SendStream", "WaitOutcome", "WatchAcks", "GetOutboxStatus")
    before = [await calls_started(ADMIN, m) for m in methods]
    resource_id = unique("sdk-py/unawaited")
    async with consistd.Client() as app:
        for i in range(5):  # each one supersedes the one before: outcomes nobody awaits
            await app.send(NOWHERE, resource_id, str(i), b"x")
        await asyncio.sleep(0.5)
    after = [await calls_started(ADMIN, m) for m in methods]
    assert [a - b for a, b in zip(after, before)] == [1, 0, 0, 0], f"{methods} calls started"


async def test_a_wait_cut_by_closing_the_client_is_cancelled_and_one_the_app_cancels_is_cancelled() -> None:
    app = consistd.Client()
    try:
        sent = await app.send(NOWHERE, unique("sdk-py/closed"), "1", b"x")
        before = await calls_started(ADMIN, "WaitOutcome")
        cancelled, cut = asyncio.create_task(sent.ack()), asyncio.create_task(sent.ack())

        async def both_reached_the_sidecar() -> bool:
            return await calls_started(ADMIN, "WaitOutcome") >= before + 2

        await until(both_reached_the_sidecar, "both waits reached the sidecar")
        cancelled.cancel()
        await asyncio.wait({cancelled}, timeout=10)
        assert cancelled.cancelled(), "the app's cancellation of a wait is a cancellation"
        assert not cut.done(), "cancelling one wait leaves the other waiting"
    finally:
        await app.close()
    with pytest.raises(ConsistdError) as raised:
        await asyncio.wait_for(cut, 10)
    assert (raised.value.code, raised.value.message) == (grpc.StatusCode.CANCELLED, "the client was closed")
    with pytest.raises(ConsistdError) as raised:
        await sent.ack()
    assert raised.value.code == grpc.StatusCode.CANCELLED, "a wait after the close too"
