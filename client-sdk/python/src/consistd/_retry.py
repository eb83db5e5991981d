"""When a stream to the sidecar may be opened again, how long to wait before doing so (the values
proto/consistd/v1/watch.proto states for every client), and why a read stopped."""

from __future__ import annotations

import asyncio

import grpc

#: First pause before reconnecting, in seconds.
INITIAL = 0.1
#: Longest pause between reconnects, in seconds.
CAP = 5.0


def is_retryable(code: grpc.StatusCode) -> bool:
    """Whether a failed stream is worth opening again: the sidecar restarted, shut down or was not
    reachable. Every other code is the daemon's answer to the request and is handed to the caller."""
    return code is grpc.StatusCode.UNAVAILABLE


class Backoff:
    """Doubling pauses from 100 ms up to 5 s, back to the start after a success."""

    def __init__(self, initial: float = INITIAL, cap: float = CAP) -> None:
        self._initial = initial
        self._cap = cap
        self._next = initial

    async def wait(self) -> None:
        """Sleeps the current pause and doubles the next one."""
        pause, self._next = self._next, min(self._next * 2, self._cap)
        await asyncio.sleep(pause)

    def reset(self) -> None:
        """Starts again from the shortest pause (after the stream delivered something)."""
        self._next = self._initial


def task_cancelled() -> bool:
    """Whether the current task is being cancelled (Python 3.11+ can tell; earlier versions answer
    False). A stream read also ends with CancelledError when the stream was closed from another task."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling is not None and cancelling())
