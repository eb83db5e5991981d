"""Sends with an awaitable ACK, guarded by a leader's term or not, and the inbox handler that ACKs on return and
NACKs on raise."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

import consistd
from consistd import AckOutcome, InboxMessage
from consistd.v1 import inbox_pb2, object_pb2, outbox_pb2, outbox_pb2_grpc
from support import next_matching, unique

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
    assert message.guard is None, "an unguarded send"


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


async def test_a_guarded_send_goes_only_in_the_senders_term_and_the_receiver_sees_its_guard(
    client: consistd.Client, peer: consistd.Client
) -> None:
    resource_id = unique("sdk-py/guarded")
    received: list[InboxMessage] = []

    async def handler(message: InboxMessage) -> None:
        if message.resource_id == resource_id:
            received.append(message)

    async with client.campaign(unique("sdk-py-guarded-send")) as campaign:
        leading = await next_matching(campaign, lambda s: s.is_leader)
        stale = consistd.Guard(election=leading.election, namespace=leading.namespace, term=leading.term + 1)
        with pytest.raises(consistd.ConsistdError) as refused:
            await client.send(PEER, resource_id, "0", b"not held", guard=stale)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.message.startswith("guard: "), refused.value.message
        sent = await client.send(PEER, resource_id, "1", {"by": "leader"}, guard=leading.guard())

    serving = asyncio.create_task(peer.inbox.serve(handler))
    try:
        ack = await sent.ack(timeout=30)
    finally:
        serving.cancel()
    assert ack.outcome == AckOutcome.ACKED, ack
    [message] = received
    assert message.event_id == "1" and message.guard == leading.guard(), "the claim rode along to the receiver"


class SendStreamCall:
    """A SendStream call: keeps each SendRequest the SDK wrote and answers it stored, under a message id of its
    own."""

    def __init__(self) -> None:
        self.sent: list[outbox_pb2.SendRequest] = []
        self._answers: asyncio.Queue[outbox_pb2.SendStreamResponse] = asyncio.Queue()

    async def write(self, request: outbox_pb2.SendStreamRequest) -> None:
        self.sent.append(request.message)
        self._answers.put_nowait(outbox_pb2.SendStreamResponse(message_id=f"m{len(self.sent)}"))

    def __aiter__(self) -> SendStreamCall:
        return self

    async def __anext__(self) -> outbox_pb2.SendStreamResponse:
        return await self._answers.get()

    def cancel(self) -> bool:
        return True


async def test_send_puts_its_guard_in_the_request_and_none_without_one(tmp_path: Path) -> None:
    call = SendStreamCall()
    async with consistd.Client(tmp_path / "unused.sock") as client:
        client._stub(outbox_pb2_grpc.OutboxServiceStub).SendStream = lambda: call
        guard = consistd.Guard(election="e", namespace="ns", term=7)
        assert (await client.send("127.0.0.1:1", "r", "1", b"x", guard=guard)).message_id == "m1"
        await client.send("127.0.0.1:1", "r", "2", b"x")
    guarded, unguarded = call.sent
    assert guarded.HasField("guard") and guarded.guard == object_pb2.WriteGuard(election="e", namespace="ns", term=7)
    assert not unguarded.HasField("guard")


def test_a_received_message_gives_the_guard_it_was_sent_under_and_none_without_one() -> None:
    sent_under = object_pb2.WriteGuard(election="e", namespace="ns", term=7)
    guarded = InboxMessage.from_proto(inbox_pb2.InboxMessage(message_id="m", guard=sent_under))
    assert guarded.guard == consistd.Guard(election="e", namespace="ns", term=7)
    assert InboxMessage.from_proto(inbox_pb2.InboxMessage(message_id="m")).guard is None
