"""Test helpers: unique names, reading with a deadline, a cuttable Unix-socket proxy, a daemon of our own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def unique(prefix: str) -> str:
    """A name no other test (or earlier run) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def next_item(stream: AsyncIterator[T], timeout: float = 15.0) -> T:
    """The stream's next item, failing the test if it takes longer than ``timeout`` seconds."""
    return await asyncio.wait_for(stream.__anext__(), timeout)


async def next_matching(stream: AsyncIterator[T], predicate: Callable[[T], bool], timeout: float = 30.0) -> T:
    """The first item satisfying ``predicate``, within ``timeout`` seconds."""

    async def scan() -> T:
        async for item in stream:
            if predicate(item):
                return item
        raise AssertionError("the stream ended")

    return await asyncio.wait_for(scan(), timeout)


def configmap(name: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A ConfigMap's JSON."""
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data}


class SocketProxy:
    """A Unix-socket proxy in front of a daemon's socket that can cut every connection and, while
    paused, refuse new ones (accepts then closes them), so a client sees its connection lost."""

    def __init__(self, upstream: str, path: str) -> None:
        self.upstream = upstream
        self.path = path
        #: Connections forwarded to the daemon so far.
        self.forwarded = 0
        self.paused = False
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> SocketProxy:
        self._server = await asyncio.start_unix_server(self._accept, self.path)
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.paused:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        self.forwarded += 1
        self._open |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._open.discard(writer)
            writer.transport.abort()

    def cut(self) -> None:
        """Drops every open connection at once (both sides)."""
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class Daemon:
    """A consistd of the test's own (``$CONSISTD_BIN run``) in ``directory``, restartable on the
    same socket and store; ``config`` is more of its YAML, after the identity."""

    def __init__(self, directory: Path, identity: str, config: str = "") -> None:
        self.directory = directory
        self.socket = str(directory / "consistd.sock")
        self.admin_socket = str(directory / "admin.sock")
        self.config = directory / "consistd.yaml"
        self.config.write_text(f"identity: {identity}\n{config}")
        self.log = directory / "consistd.log"
        self._process: asyncio.subprocess.Process | None = None

    async def start(self, timeout: float = 30.0) -> None:
        binary = os.environ["CONSISTD_BIN"]
        env = dict(os.environ, KUBECONFIG=os.environ["CONSISTD_TEST_KUBECONFIG"])
        with self.log.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                binary, "run", "--config", str(self.config), "--socket", self.socket,
                "--admin-socket", self.admin_socket, "--store-dir", str(self.directory / "store"),
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            status = await asyncio.create_subprocess_exec(
                binary, "status", "--admin-socket", self.admin_socket,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if await status.wait() == 0:
                return
            if self._process.returncode is not None:
                break
            await asyncio.sleep(0.2)
        raise AssertionError(f"consistd did not become ready:\n{self.log.read_text()[-4000:]}")

    def signal(self, signum: int) -> None:
        """Sends ``signum`` to the running daemon (SIGSTOP freezes it as a stuck or cut-off sidecar;
        SIGCONT before ``stop``, which a stopped process cannot act on)."""
        assert self._process is not None and self._process.returncode is None, "the daemon is not running"
        self._process.send_signal(signum)

    async def kill(self) -> None:
        """SIGKILL: the daemon dies at once, as under the OOM killer; ``start`` runs it again."""
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()

    async def stop(self) -> None:
        """SIGTERM, and wait for the daemon to exit."""
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), 30)
            except asyncio.TimeoutError:
                self._process.kill()
                await self._process.wait()
        self._process = None


async def calls_started(admin_socket: str, method: str) -> float:
    """How many calls of gRPC ``method`` (e.g. ``"SendStream"``) the daemon has started, from
    ``consistd_grpc_server_started_total`` on its admin socket's /metrics (HTTP/1.0)."""
    reader, writer = await asyncio.open_unix_connection(admin_socket)
    writer.write(b"GET /metrics HTTP/1.0\r\nHost: consistd\r\n\r\n")
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    head, _, body = response.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.0 200") or head.startswith("HTTP/1.1 200"), head
    label = f'grpc_method="{method}"'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("consistd_grpc_server_started_total{") and label in line
    )
