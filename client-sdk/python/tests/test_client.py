"""Connecting, waiting until the sidecar is ready, and errors that keep the daemon's status."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

import consistd
from consistd._retry import Backoff


async def test_connects_with_no_arguments_to_consistd_socket() -> None:
    async with consistd.Client() as client:
        assert client.socket == os.environ["CONSISTD_SOCKET"]
        await client.wait_ready(10)


def test_without_consistd_socket_uses_the_default_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONSISTD_SOCKET")
    assert consistd.Client().socket == "/var/run/consistd/consistd.sock" == consistd.DEFAULT_SOCKET


async def test_wait_ready_on_a_missing_socket_fails_after_the_timeout(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sock"
    async with consistd.Client(missing) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(consistd.NotReadyError) as raised:
            await client.wait_ready(0.5)
        elapsed = loop.time() - start
    assert 0.45 <= elapsed < 3, elapsed
    error = raised.value
    assert isinstance(error, consistd.ConsistdError)
    assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert str(missing) in str(error) and "not ready within 0.5 s" in str(error)
    assert "UNAVAILABLE" in error.last, error.last


async def test_errors_keep_the_grpc_code_and_the_field_named_in_the_message(
    client: consistd.Client, namespace: str
) -> None:
    with pytest.raises(consistd.ConsistdError) as raised:
        async for _ in client.watch(""):
            pass
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.message.startswith("resource"), raised.value.message

    with pytest.raises(consistd.ConsistdError) as raised:
        await client.objects.get("configmaps", "absent", namespace=namespace)
    assert raised.value.code == grpc.StatusCode.NOT_FOUND

    with pytest.raises(consistd.ConsistdError) as raised:
        await client.send("127.0.0.1:1", "", "1", b"x")
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.message.startswith("resource_id"), raised.value.message


async def test_backoff_doubles_up_to_the_cap_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    backoff = Backoff()
    for _ in range(8):
        await backoff.wait()
    backoff.reset()
    await backoff.wait()
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 0.1]
