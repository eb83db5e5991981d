"""The own-write rule's record: per object uid, the largest resourceVersion this client's writes returned.

The daemon judges a CONSISTENT state when it sends it, so a state it sent just before the app's write
reached it can still wait, unread, in this process (grpcio's buffers) when that write returns. A watch
asks this record when the app takes each event, and drops (CONSISTENT) or marks (RAW) a state older
than the app's own write (proto/consistd/v1/watch.proto, DELIVERY_MODE_CONSISTENT).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

#: How long an entry is kept after the last write that recorded it, in seconds. An entry matters only
#: while a state the daemon sent before that write can still be unread in this process, and the daemon
#: sends those before the write's own state, so they are gone as soon as the app has taken that one.
#: Ten minutes is far beyond how long an app leaves a watch unread in practice, and forgetting keeps an
#: app that writes many objects (most never written again, some deleted) from growing without end. A
#: stale state still unread after that is delivered as it is; the write's own state follows it.
TTL = 600.0

#: At most this many uids are kept (about 15 MB with the uids); past it the oldest entries go first. It
#: only binds for an app writing more than ~80 distinct objects a second for the whole TTL, and the
#: oldest entries are the least likely to still have an older state waiting unread.
CAPACITY = 50_000


def integer_version(resource_version: str) -> int | None:
    """A resourceVersion as the integer it is (Kubernetes 1.35+, KEP-5504), or None when it is not a
    decimal integer (older apiservers make no promise): such a version is never recorded or compared.
    Only ASCII digits count; ``int()`` alone would also take signs, spaces, ``_`` and other scripts' digits."""
    if resource_version.isascii() and resource_version.isdigit():
        return int(resource_version)
    return None


class OwnWrites:
    """Per object uid, the largest resourceVersion a write of this client returned, for a while (TTL,
    CAPACITY). One per ``Client`` (one connection), shared by its objects client and all its watches:
    a write made through another client is not this app's write as far as these watches know."""

    def __init__(self, ttl: float = TTL, capacity: int = CAPACITY, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._capacity = capacity
        self._clock = clock
        # uid -> (largest version, when last written); oldest write first.
        self._versions: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._versions)

    def record(self, uid: str, resource_version: str) -> None:
        """Remembers a write's answer: the uid's version becomes the larger of the one kept and this."""
        version = integer_version(resource_version)
        if not uid or version is None:
            return
        now = self._clock()
        kept = self._versions.pop(uid, None)
        if kept is not None:
            version = max(version, kept[0])
        self._versions[uid] = (version, now)
        self._forget(now)

    def predates(self, uid: str, resource_version: str) -> bool:
        """Whether a state of the object ``uid`` at ``resource_version`` is older than a write of this
        client to it; False when either version is not an integer or the uid is not (or no longer) kept."""
        self._forget(self._clock())
        kept = self._versions.get(uid)
        version = integer_version(resource_version)
        return kept is not None and version is not None and version < kept[0]

    def _forget(self, now: float) -> None:
        """Drops the entries older than the TTL and, past the capacity, the oldest."""
        while self._versions:
            _, written_at = next(iter(self._versions.values()))
            if len(self._versions) <= self._capacity and now - written_at <= self._ttl:
                return
            self._versions.popitem(last=False)
