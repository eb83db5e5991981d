"""One long-lived bidirectional stream shared by many calls (SendStream, AckStream): each call's request
goes out on it and its answer comes back in request order, so calls made together share the sidecar's
disk flush instead of each paying for a unary call of its own."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import grpc

from .errors import ConsistdError

Req = TypeVar("Req")
Resp = TypeVar("Resp")

#: Requests queued for the stream beyond those the sidecar is working on; a caller beyond it waits.
QUEUED = 1024

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def refused(refusal: Any) -> ConsistdError:
    """The error of a request the sidecar refused on the stream (a ``Refusal``): the status its unary
    call would have raised."""
    return ConsistdError(_CODES.get(refusal.code, grpc.StatusCode.UNKNOWN), refusal.message)


class Ordered(Generic[Req, Resp]):
    """A shared stream, opened by the first call and again by the first call after it broke.

    ``open_stream`` starts the gRPC call; ``answer`` turns one response into the call's result or raises
    its refusal; ``what`` names the operation in errors (``"send"``, ``"ack"``)."""

    def __init__(self, open_stream: Callable[[], Any], answer: Callable[[Resp], Any], what: str) -> None:
        self._open_stream = open_stream
        self._answer = answer
        self._what = what
        self._stream: _Stream | None = None
        self._closed = False

    async def call(self, request: Req) -> Any:
        """Sends ``request`` on the stream and returns its answer. A caller that gives up (cancelled,
        timed out) before its request went out takes it back; after, its answer is dropped."""
        if self._closed:
            raise ConsistdError(grpc.StatusCode.CANCELLED, f"{self._what}: the client was closed")
        if self._stream is None or self._stream.broken is not None:
            # The stream outlives the call that opens it, so it runs in a context of its own, not in that
            # call's (and so not in its OpenTelemetry trace).
            self._stream = contextvars.Context().run(lambda: _Stream(self._open_stream(), self._what))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._stream.requests.put((request, future))
        return self._answer(await future)

    async def close(self) -> None:
        """Ends the stream; waiting and later calls fail with CANCELLED."""
        self._closed = True
        if self._stream is not None:
            await self._stream.stop(ConsistdError(grpc.StatusCode.CANCELLED, f"{self._what}: the client was closed"))
            self._stream = None


class _Stream:
    """One opened stream: a writer task sends queued requests in order, a reader task hands each answer
    to the oldest waiting call."""

    def __init__(self, call: Any, what: str) -> None:
        self.call = call
        self.what = what
        self.requests: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue(QUEUED)
        self.waiting: deque[asyncio.Future[Any]] = deque()
        #: Why the stream broke; no call uses it after that.
        self.broken: ConsistdError | None = None
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(self._write(), name=f"consistd-{what}-stream-writer"),
            loop.create_task(self._read(), name=f"consistd-{what}-stream-reader"),
        ]

    async def _write(self) -> None:
        try:
            while True:
                request, future = await self.requests.get()
                if future.done():
                    continue  # its caller gave up before it went out
                self.waiting.append(future)
                await self.call.write(request)
        except grpc.aio.AioRpcError as e:
            self._break(ConsistdError.from_rpc(e))
        except (asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            self._break(ConsistdError(grpc.StatusCode.UNAVAILABLE, str(e)))

    async def _read(self) -> None:
        try:
            async for response in self.call:
                # Answers come in request order: this one is the oldest waiting call's.
                future = self.waiting.popleft()
                if not future.done():  # else its caller gave up: its answer is dropped
                    future.set_result(response)
            error = ConsistdError(grpc.StatusCode.UNAVAILABLE, "the sidecar ended the stream")
        except grpc.aio.AioRpcError as e:
            error = ConsistdError.from_rpc(e)
        self._break(error)

    def _break(self, error: ConsistdError) -> None:
        """Fails every call waiting on the stream, and those queued for it, with ``error``."""
        if self.broken is None:
            code = error.code
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
                code = grpc.StatusCode.UNAVAILABLE
                message = f"{self.what}: lost the connection to the sidecar: {error.message}"
            else:
                message = f"{self.what}: {error.message}"
            self.broken = ConsistdError(code, message)
        self.call.cancel()
        while self.waiting:
            _fail(self.waiting.popleft(), self.broken)
        while not self.requests.empty():
            _fail(self.requests.get_nowait()[1], self.broken)
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def stop(self, error: ConsistdError) -> None:
        self.broken = self.broken or error
        self._break(error)
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _fail(future: asyncio.Future[Any], error: ConsistdError) -> None:
    if not future.done():
        future.set_exception(error)
