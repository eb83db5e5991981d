"""The errors the SDK raises: the daemon's gRPC status, kept whole."""

from __future__ import annotations

from typing import Any

import grpc

#: The status grpcio's aio client sets on a stream when a write fails in its core, which happens when the
#: connection breaks under the write (grpc/aio/_call.py, ``set_internal_error``): grpcio's, never the
#: sidecar's answer.
_GRPCIO_WRITE_FAILED = (grpc.StatusCode.INTERNAL, "Internal error from Core")


class ConsistdError(Exception):
    """A call to the sidecar failed. ``code`` and ``message`` are the gRPC status the daemon sent
    (INVALID_ARGUMENT messages start with the field name, e.g. ``"resource: must not be empty"``)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        #: The gRPC status code, e.g. ``grpc.StatusCode.NOT_FOUND``.
        self.code = code
        #: The status message as the daemon sent it.
        self.message = message

    @classmethod
    def from_rpc(cls, error: grpc.aio.AioRpcError) -> ConsistdError:
        """The error for a failed gRPC call. grpcio's own status for a stream write its core could not
        make (the connection to the sidecar went away under the write) is UNAVAILABLE, like every other
        lost connection, not the INTERNAL grpcio gives it."""
        code, details = error.code(), error.details() or ""
        if (code, details) == _GRPCIO_WRITE_FAILED:
            return cls(grpc.StatusCode.UNAVAILABLE, f"a write failed: {error.debug_error_string() or details}")
        return cls(code, details)


class NotReadyError(ConsistdError):
    """The sidecar did not report SERVING within the timeout given to ``Client.wait_ready``."""

    def __init__(self, socket: str, timeout: float, last: str) -> None:
        super().__init__(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"consistd at {socket} not ready within {timeout:g} s; last answer: {last}",
        )
        #: The socket that was asked.
        self.socket = socket
        #: How long ``wait_ready`` waited, in seconds.
        self.timeout = timeout
        #: The last answer seen (a health status, or a gRPC error).
        self.last = last


async def unary(method: Any, request: Any) -> Any:
    """Makes one unary call with a generated stub's method, raising ConsistdError when it fails."""
    try:
        return await method(request)
    except grpc.aio.AioRpcError as e:
        raise ConsistdError.from_rpc(e) from e
