"""Benchmark subscriber (hack/sdk/python.sh bench-subscriber NAMESPACE ROUNDS): per round, subscribes to the
namespace's ConfigMaps in RAW mode and counts events until SYNCED; prints one JSON line per round on stdout."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

import consistd


async def main(namespace: str, rounds: int) -> None:
    async with consistd.Client() as client:
        await client.wait_ready(30)
        for _ in range(rounds):
            events = 0
            start = time.perf_counter()
            async with client.watch("configmaps", namespace=namespace, mode=consistd.Mode.RAW) as watch:
                async for event in watch:
                    if event.type == consistd.EventType.SYNCED:
                        break
                    events += 1
            seconds = time.perf_counter() - start
            line = {"language": "python", "events": events, "seconds": round(seconds, 3)}
            print(json.dumps(line, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} NAMESPACE ROUNDS")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
