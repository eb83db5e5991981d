"""Sends and ACKs share one SendStream and one AckStream per client; a refused request fails alone and
a lost stream is opened again by the next call."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

import consistd
from consistd import AckOutcome, ConsistdError, InboxMessage
from support import SocketProxy, calls_started, unique

PEER = os.environ.get("CONSISTD_TEST_PEER_ADDRESS", "")
ADMIN = os.environ.get("CONSISTD_TEST_ADMIN_SOCKET", "")
PEER_ADMIN = os.environ.get("CONSISTD_TEST_PEER_ADMIN_SOCKET", "")


async def started(admin_socket: str, *methods: str) -> list[float]:
    return [await calls_started(admin_socket, m) for m in methods]


async def test_concurrent_sends_and_acks_go_out_on_one_stream_each_and_a_refused_send_fails_alone(
    client: consistd.Client, peer: consistd.Client
) -> None:
    prefix = unique("sdk-py/stream")
    sends_before = await started(ADMIN, "SendStream", "Send", "WaitOutcome", "WatchAcks")
    acks_before = await started(PEER_ADMIN, "AckStream", "Ack")
    received: set[str] = set()

    async def handler(message: InboxMessage) -> None:
        if message.resource_id.startswith(prefix):
            received.add(message.resource_id)

    serving = asyncio.create_task(peer.inbox.serve(handler))
    try:
        resources = [f"{prefix}/{i}" for i in range(200)]
        resources[57] = ""  # refused: resource_id must not be empty
        outcomes = await asyncio.gather(
            *(client.send(PEER, r, "1", b"x") for r in resources), return_exceptions=True
        )
        refused = outcomes[57]
        assert isinstance(refused, ConsistdError), refused
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT and "resource_id" in refused.message
        sent = [o for i, o in enumerate(outcomes) if i != 57]
        assert all(isinstance(s, consistd.SentMessage) for s in sent), [s for s in sent if isinstance(s, Exception)]
        acks = await asyncio.gather(*(s.ack(timeout=60) for s in sent))  # type: ignore[union-attr]
    finally:
        serving.cancel()
    assert {a.outcome for a in acks} == {AckOutcome.ACKED}
    assert received == {r for r in resources if r}
    sends_after = await started(ADMIN, "SendStream", "Send", "WaitOutcome", "WatchAcks")
    acks_after = await started(PEER_ADMIN, "AckStream", "Ack")
    assert [a - b for a, b in zip(sends_after, sends_before)] == [1, 0, len(sent), 0], (
        "SendStream, Send, WaitOutcome (one per awaited outcome), WatchAcks calls started"
    )
    assert [a - b for a, b in zip(acks_after, acks_before)] == [1, 0], "AckStream, Ack calls started"


async def test_a_send_after_the_connection_was_lost_opens_the_stream_again(short_dir: Path) -> None:
    proxy = await SocketProxy(os.environ["CONSISTD_SOCKET"], str(short_dir / "proxy.sock")).start()
    before = await calls_started(ADMIN, "SendStream")
    try:
        async with consistd.Client(proxy.path) as client:
            await client.send(PEER, unique("sdk-py/reopen"), "1", b"before")
            proxy.cut()
            lost = 0
            for _ in range(50):
                try:
                    sent = await client.send(PEER, unique("sdk-py/reopen"), "2", b"after")
                    break
                except ConsistdError as e:
                    # Only a send racing the cut may fail, and then as a lost connection.
                    assert e.code == grpc.StatusCode.UNAVAILABLE and "lost the connection" in e.message, e
                    lost += 1
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("no send succeeded after the connection was cut")
            assert sent.message_id and lost <= 3, f"{lost} sends failed after the cut"
    finally:
        await proxy.close()
    assert proxy.forwarded >= 2, "the client connected again"
    # One stream before the cut and one that carried the successful send; a send that failed may have
    # opened one more while the channel was still reconnecting.
    opened = await calls_started(ADMIN, "SendStream") - before
    assert 2 <= opened <= 2 + lost, f"{opened} SendStreams for {lost} failed sends"
