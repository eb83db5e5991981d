"""The end-to-end test's own parts of the app pods (hack/e2e-consistd.sh mounts this file from a ConfigMap
into the Python example's image and runs it beside the example controller):

    pod.py member CHANNEL                 take part in a rollout channel: print and report every version
    pod.py burst SERVICE COUNT PREFIX     Send COUNT messages to every endpoint of SERVICE, saying which were stored
    pod.py publish CHANNEL PAYLOAD SECS   publish PAYLOAD, wait until every live member applied it (the barrier)

`member` lines: `applied CHANNEL VERSION PAYLOAD`. `burst` sends resource_id `burst/PREFIX-I` for I in
0..COUNT and prints `stored burst/PREFIX-I` once Send returned (the sidecar has it on disk: it must reach
every endpoint whatever happens next); when the sidecar goes away it prints `sidecar gone: ...` and exits 3.
`publish` prints one JSON line (version, all_applied, members, lagging, live) and exits 0 only when all applied.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import grpc

import consistd
from consistd.errors import unary
from consistd.v1 import rollout_pb2


async def member(client: consistd.Client, channel: str) -> None:
    """Subscribes to the channel (which makes this replica a member) and reports each version applied;
    subscribes again when the sidecar restarts."""
    while True:
        try:
            async for v in client.rollout.SubscribeVersions(rollout_pb2.SubscribeVersionsRequest(channel=channel)):
                print(f"applied {channel} {v.version} {v.payload.decode()}")
                await unary(
                    client.rollout.ReportApplied, rollout_pb2.ReportAppliedRequest(channel=channel, version=v.version)
                )
        except (grpc.aio.AioRpcError, consistd.ConsistdError) as e:
            code = e.code() if isinstance(e, grpc.aio.AioRpcError) else e.code
            if code is not grpc.StatusCode.UNAVAILABLE:
                raise
        print("member: the sidecar went away; subscribing again")
        await client.wait_ready(120)


async def burst(client: consistd.Client, service: str, count: int, prefix: str) -> int:
    """Sends ``count`` messages to every ready endpoint of ``service``, naming each one stored; 3 when
    the sidecar went away before all were."""
    to = consistd.ServiceEndpoints(service)
    for i in range(count):
        resource_id = f"burst/{prefix}-{i}"
        try:
            await client.send(to, resource_id, "1", {"i": i})
        except consistd.ConsistdError as e:
            if e.code is not grpc.StatusCode.UNAVAILABLE:
                raise
            print(f"sidecar gone: {e}")
            return 3
        print(f"stored {resource_id}")
    return 0


async def publish(client: consistd.Client, channel: str, payload: str, seconds: float) -> bool:
    """Publishes ``payload`` and waits for the barrier; True when every live member applied it."""
    started = time.monotonic()
    published = await unary(
        client.rollout.Publish, rollout_pb2.PublishRequest(channel=channel, payload=payload.encode())
    )
    publish_ms = round((time.monotonic() - started) * 1000)
    request = rollout_pb2.WaitAppliedRequest(channel=channel, version=published.version)
    request.timeout.FromSeconds(int(seconds))
    waited = await unary(client.rollout.WaitApplied, request)
    wait_ms = round((time.monotonic() - started) * 1000) - publish_ms
    members = {m.member: m.applied_version for m in waited.members}
    result = {
        "version": published.version,
        "publish_ms": publish_ms,
        "wait_ms": wait_ms,
        "all_applied": waited.all_applied,
        "members": members,
        "lagging": list(waited.lagging),
        "live": sorted(m.member for m in waited.members if m.live),
        # When the sidecar last saw each member (its own renewal, or the channel leader reaching it).
        "seen": {m.member: m.last_seen.ToJsonString() for m in waited.members if m.HasField("last_seen")},
    }
    print(json.dumps(result, sort_keys=True))
    return bool(waited.all_applied)


async def main(args: list[str]) -> int:
    job = asyncio.current_task()
    assert job is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, job.cancel)
    async with consistd.Client() as client:
        await client.wait_ready(120)
        match args:
            case ["member", channel]:
                await member(client, channel)
            case ["burst", service, count, prefix]:
                return await burst(client, service, int(count), prefix)
            case ["publish", channel, payload, seconds]:
                return 0 if await publish(client, channel, payload, float(seconds)) else 1
            case _:
                print(__doc__, file=sys.stderr)
                return 2
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    try:
        sys.exit(asyncio.run(main(sys.argv[1:])))
    except asyncio.CancelledError:
        print("stopped")
