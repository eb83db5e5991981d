"""Fixtures: clients of the two daemons hack/with-daemons.sh started, and a fresh namespace per test."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import consistd
from support import unique


def pytest_configure(config: pytest.Config) -> None:
    for name in ("CONSISTD_SOCKET", "CONSISTD_TEST_PEER_SOCKET", "CONSISTD_TEST_PEER_ADDRESS", "CONSISTD_BIN"):
        if not os.environ.get(name):
            raise pytest.UsageError(f"{name} is not set: run under hack/with-daemons.sh")


@pytest.fixture
async def client() -> AsyncIterator[consistd.Client]:
    """Daemon a (identity sdk-a), the app's sidecar, connected with no arguments."""
    async with consistd.Client() as c:
        await c.wait_ready(10)
        yield c


@pytest.fixture
async def peer() -> AsyncIterator[consistd.Client]:
    """Daemon b (identity sdk-b), a peer pod's sidecar: sends to CONSISTD_TEST_PEER_ADDRESS arrive in its inbox."""
    async with consistd.Client(os.environ["CONSISTD_TEST_PEER_SOCKET"]) as c:
        await c.wait_ready(10)
        yield c


@pytest.fixture
async def namespace(client: consistd.Client) -> AsyncIterator[str]:
    """A namespace of the test's own, deleted afterwards."""
    name = unique("sdk-py")
    await client.objects.create("namespaces", {"metadata": {"name": name}})
    yield name
    await client.objects.delete("namespaces", name)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path, for Unix sockets (at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cpy-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
