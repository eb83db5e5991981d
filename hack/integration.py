#!/usr/bin/env python3
"""Runs the workspace's integration test binaries (`cargo test --workspace --test '*'`) in lanes side by side.

    hack/integration.py [--lanes N] [--beside 'NAME=COMMAND'...]

Builds them once (`cargo test --no-run`), then runs each binary in its package's directory, as cargo does, N at a
time (default 2, or $CONSISTD_TEST_LANES): most of these tests wait on the apiserver, on leases and on network
faults, and one binary at a time leaves the cores idle. The longest binaries start first (their times from the
last run, kept in target/test-durations.json, else a table below), so the lanes end together. Each binary's
output is printed whole when it ends; every binary runs whatever the others did (cargo's --no-fail-fast), and
the exit code is 1 if any failed. A binary that changes what every process on the machine sees (EXCLUSIVE: the
black holes' nftables rules drop a port's packets on every interface, and a port number can be any process's)
runs alone, before the lanes start; so does one that stops the shared control plane (control_plane pauses etcd and
restarts the apiserver). Each --beside COMMAND (split as a shell would, run from the repository) is one more job of
the lanes, taken as a binary is (`make test` runs the SDKs' suite so), at a lower CPU priority (nice 10): the
fault tests' timings keep the cores they need, the suite beside them takes what they leave.
"""

import argparse
import json
import os
import pathlib
import queue
import shlex
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
DURATIONS = REPO / "target" / "test-durations.json"
# Seconds per binary from a CI run on 2 cores (2026-12-02), for a first run with no durations kept.
KNOWN = {
    "sdks": 497, "outbox_faults": 91, "blackhole": 86, "peer_tls": 48, "pause": 45, "slow_link": 36, "rollout": 29,
    "control_plane": 27, "readiness": 24, "fencing": 22, "memory": 17, "leadership": 15, "inject": 13,
    "reconcile": 13, "discovery": 13, "disk": 12, "consistency": 11, "reload": 10,
}
UNKNOWN = 8
# The nice value of a --beside job.
BESIDE_NICE = 10
# Binaries run with nothing beside them: their faults are not confined to their own processes.
EXCLUSIVE = {"blackhole", "control_plane"}


def beside(spec: str) -> tuple[str, list[str], pathlib.Path]:
    """A --beside job, "NAME=COMMAND", as the lanes run it: (NAME, its argv at nice BESIDE_NICE, the repository)."""
    name, _, command = spec.partition("=")
    argv = shlex.split(command)
    if not name or not argv:
        raise ValueError(f"--beside {spec!r}: must be NAME=COMMAND")
    return name, ["nice", "-n", str(BESIDE_NICE), *argv], REPO


def build(cargo: str) -> list[tuple[str, list[str], pathlib.Path]]:
    """Builds the test binaries; returns what `test_binaries` reads of cargo's messages."""
    cmd = [cargo, "test", "--workspace", "--test", "*", "--no-run", "--message-format=json-render-diagnostics"]
    out = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"integration: building the test binaries failed ({' '.join(cmd)})")
    return test_binaries(out.stdout, REPO)


def test_binaries(messages: str, repo: pathlib.Path) -> list[tuple[str, list[str], pathlib.Path]]:
    """(name, [executable], package directory) of each integration test binary in cargo's JSON `messages`, the
    name with its package's directory (two packages may each have a test of one name)."""
    binaries = []
    for line in messages.splitlines():
        msg = json.loads(line)
        target = msg.get("target", {})
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and target.get("kind") == ["test"]:
            package = pathlib.Path(msg["manifest_path"]).parent
            binaries.append((f"{package.relative_to(repo)}/{target['name']}", [msg["executable"]], package))
    return binaries


def expected(durations: dict[str, float], name: str) -> float:
    return durations.get(name, KNOWN.get(name.rsplit("/", 1)[-1], UNKNOWN))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=int(os.environ.get("CONSISTD_TEST_LANES", "2")))
    parser.add_argument("--beside", action="append", default=[], metavar="NAME=COMMAND",
                        help="a command run as one more job of the lanes")
    args = parser.parse_args()
    if args.lanes < 1:
        sys.exit("integration: --lanes must be at least 1")
    try:
        jobs = [beside(spec) for spec in args.beside]
    except ValueError as e:
        sys.exit(f"integration: {e}")
    binaries = build(os.environ.get("CARGO", "cargo"))
    try:
        durations = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        durations = {}
    alone = [b for b in binaries if b[0].rsplit("/", 1)[-1] in EXCLUSIVE]
    work: queue.Queue = queue.Queue()
    for b in sorted([*jobs, *(b for b in binaries if b not in alone)], key=lambda b: -expected(durations, b[0])):
        work.put(b)
    print_lock = threading.Lock()
    failed: list[str] = []
    took: dict[str, float] = {}

    def run(name: str, argv: list[str], cwd: pathlib.Path) -> None:
        start = time.monotonic()
        with tempfile.TemporaryFile(mode="w+") as log:
            rc = subprocess.run(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
            log.seek(0)
            output = log.read()
        took[name] = time.monotonic() - start
        with print_lock:
            outcome = "ok" if rc == 0 else f"FAILED (exit {rc})"
            print(f"===== {name}: {took[name]:.1f} s, {outcome}", flush=True)
            sys.stdout.write(output)
            sys.stdout.flush()
            if rc != 0:
                failed.append(name)

    def lane() -> None:
        while True:
            try:
                b = work.get_nowait()
            except queue.Empty:
                return
            run(*b)

    for b in alone:
        run(*b)
    lanes = [threading.Thread(target=lane) for _ in range(args.lanes)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    DURATIONS.parent.mkdir(parents=True, exist_ok=True)
    DURATIONS.write_text(json.dumps({**durations, **took}, indent=1, sort_keys=True))
    if failed:
        print(f"integration: {len(failed)} of {len(binaries) + len(jobs)} jobs failed: {' '.join(sorted(failed))}")
        return 1
    also = "".join(f" and {name}" for name, _, _ in jobs)
    print(f"integration: {len(binaries)} test binaries{also} passed in {args.lanes} lanes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
