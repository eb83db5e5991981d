"""Audits the grants of a sharded queue from its replicas' logs: each `sharded` container of the example prints
`grant KEY MS` when a pass starts and `done KEY MS` when it ends (wall-clock milliseconds; the pods share this
machine's clock). Fails, naming them, on any moment two pods held one key; a pass with no `done` (its pod
ended first) counts as held until its log's last line.

    python3 hack/e2e/shard_audit.py DIR     # DIR/POD.log for every pod; prints one JSON line of figures
"""

from __future__ import annotations

import json
import pathlib
import sys


def passes(log: str) -> list[tuple[str, int, int]]:
    """(key, start, end) of each pass in one pod's log."""
    open_: dict[str, int] = {}
    out: list[tuple[str, int, int]] = []
    last = 0
    for line in log.splitlines():
        words = line.split()
        if len(words) < 3 or words[0] not in ("grant", "done") or not words[2].isdigit():
            continue
        key, at = words[1], int(words[2])
        last = max(last, at)
        if words[0] == "grant":
            open_[key] = at
        elif key in open_:
            out.append((key, open_.pop(key), at))
    out.extend((key, start, max(last, start)) for key, start in open_.items())
    return out


def overlaps(by_pod: dict[str, list[tuple[str, int, int]]]) -> list[str]:
    """Every pair of passes of one key, by two pods, that overlap in time."""
    grants = sorted((key, start, end, pod) for pod, ps in by_pod.items() for key, start, end in ps)
    found = []
    for i, (key, start, end, pod) in enumerate(grants):
        for other, o_start, o_end, o_pod in grants[i + 1 :]:
            if other != key or o_start >= end:
                break
            if o_pod != pod:
                found.append(f"{key}: {pod} [{start}, {end}] and {o_pod} [{o_start}, {o_end}]")
    return found


def main(directory: str) -> int:
    by_pod = {p.stem: passes(p.read_text()) for p in sorted(pathlib.Path(directory).glob("*.log"))}
    found = overlaps(by_pod)
    figures = {"passes": {pod: len(ps) for pod, ps in by_pod.items()}, "overlaps": len(found)}
    print(json.dumps(figures))
    for f in found[:10]:
        print(f"two pods held one key: {f}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
