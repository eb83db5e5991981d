"""The own-write rule's record: per object uid, the largest resourceVersion this client's writes returned.

The daemon judges a CONSISTENT state when it sends it, so a state it sent just before the app's write
reached it can still wait, unread, in this process (grpcio's buffers) when that write returns. A watch
asks this record when the app takes each event, and drops (CONSISTENT) or marks (RAW) a state older
than the app's own write (proto/consistd/v1/watch.proto, DELIVERY_MODE_CONSISTENT). The newest-state
watch (latest.py) also asks whether a state is exactly the one the app's latest write made, to keep that
state from the worker that wrote it.
"""

from __future__ import annotations

from collections import OrderedDict

#: How many objects the record keeps at least: the 10,000 written most recently, the least recently written
#: forgotten first (the same bound in every SDK, client-sdk/README.md). An entry matters only while a state
#: the daemon sent before that write can still be unread in this process, and the daemon sends those before
#: the write's own state, which the app takes in order: so the entries that matter are those of the latest
#: writes. A stale state still unread after its entry was forgotten is delivered as it is; the write's own
#: state follows it. About 2 MB with the uids.
CAPACITY = 10_000


def integer_version(resource_version: str) -> int | None:
    """A resourceVersion as the integer it is (Kubernetes 1.35+, KEP-5504), or None when it is not a
    decimal integer (older apiservers make no promise): such a version is never recorded or compared.
    Only ASCII digits count; ``int()`` alone would also take signs, spaces, ``_`` and other scripts' digits."""
    if resource_version.isascii() and resource_version.isdigit():
        return int(resource_version)
    return None


class OwnWrites:
    """Per object uid, the largest resourceVersion a write of this client returned, for the ``capacity``
    objects written most recently. One per ``Client`` (one connection), shared by its objects client and
    all its watches: a write made through another client is not this app's write as far as these watches
    know."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        # uid -> largest version; least recently written first.
        self._versions: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._versions)

    def record(self, uid: str, resource_version: str) -> None:
        """Remembers a write's answer: the uid's version becomes the larger of the one kept and this, and
        the uid becomes the most recently written; past the capacity, the least recently written goes."""
        version = integer_version(resource_version)
        if not uid or version is None:
            return
        kept = self._versions.pop(uid, None)
        self._versions[uid] = version if kept is None else max(version, kept)
        while len(self._versions) > self._capacity:
            self._versions.popitem(last=False)

    def predates(self, uid: str, resource_version: str) -> bool:
        """Whether a state of the object ``uid`` at ``resource_version`` is older than a write of this
        client to it; False when either version is not an integer or the uid is not (or no longer) kept.
        Asking does not count as a write: it keeps the uid no longer."""
        kept = self._versions.get(uid)
        version = integer_version(resource_version)
        return kept is not None and version is not None and version < kept

    def wrote(self, uid: str, resource_version: str) -> bool:
        """Whether ``resource_version`` is exactly the largest version a write of this client to the object
        ``uid`` returned: the state of this client's latest write to it. False when either version is not an
        integer or the uid is not (or no longer) kept. Asking does not count as a write."""
        kept = self._versions.get(uid)
        version = integer_version(resource_version)
        return kept is not None and version is not None and version == kept
