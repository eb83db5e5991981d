"""Sends with an awaitable ACK, and the inbox handler that ACKs on return and NACKs on raise."""

from __future__ import annotations

import asyncio
import os

import consistd
from consistd import AckOutcome, InboxMessage
from support import unique

PEER = os.environ.get("CONSISTD_TEST_PEER_ADDRESS", "")


async def test_a_send_is_acked_once_the_peers_handler_returns(client: consistd.Client, peer: consistd.Client) -> None:
    resource_id = unique("sdk-py/ack")
    received: list[InboxMessage] = []

    async def handler(message: InboxMessage) -> None:
        if message.resource_id == resource_id:
            received.append(message)

    serving = asyncio.create_task(peer.inbox.serve(handler))
    try:
        sent = await client.send(PEER, resource_id, "v1", {"hello": "peer"})
        assert sent.message_id
        ack = await sent.ack(timeout=30)
    finally:
        serving.cancel()
    assert ack.outcome == AckOutcome.ACKED and ack.message_id == sent.message_id and ack.reason == ""
    assert ack.resource_id == resource_id and ack.event_id == "v1"
    [message] = received
    assert message.json() == {"hello": "peer"} and message.content_type == "application/json"
    assert message.sender == "sdk-a" and message.event_id == "v1" and message.delivery_attempt == 1


async def test_a_handler_that_raises_gets_the_message_again_then_it_is_acked(
    client: consistd.Client, peer: consistd.Client
) -> None:
    resource_id = unique("sdk-py/retry")
    attempts: list[int] = []

    def handler(message: InboxMessage) -> None:  # a plain function: run in a worker thread
        if message.resource_id != resource_id:
            return
        attempts.append(message.delivery_attempt)
        if len(attempts) == 1:
            raise RuntimeError("not yet")

    serving = asyncio.create_task(peer.inbox.serve(handler, retry_after=0.2))
    try:
        sent = await client.send(PEER, resource_id, "v1", "text payload")
        ack = await sent.ack(timeout=30)
    finally:
        serving.cancel()
    assert ack.outcome == AckOutcome.ACKED
    assert attempts == [1, 2]


async def test_serve_returns_after_max_messages_and_a_newer_send_supersedes(
    client: consistd.Client, peer: consistd.Client
) -> None:
    resource_id = unique("sdk-py/supersede")
    first = await client.send(PEER, resource_id, "1", b"old")
    second = await client.send(PEER, resource_id, "2", b"new")
    assert (await first.ack(timeout=30)).outcome in (AckOutcome.SUPERSEDED, AckOutcome.ACKED)

    got: list[str] = []

    async def handler(message: InboxMessage) -> None:
        got.append(message.event_id if message.resource_id == resource_id else "")

    # Other tests' leftovers may come first; serve until this resource's newest event is ACKed.
    while "2" not in got:
        await asyncio.wait_for(peer.inbox.serve(handler, max_messages=1), 30)
    assert (await second.ack(timeout=30)).outcome == AckOutcome.ACKED
