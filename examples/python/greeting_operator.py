"""A ConfigMap controller on the consistd Python SDK: a work queue hands it each ConfigMap only while it leads,
consistent with its own writes; it writes fenced by its term, notifies a peer and waits for the ACK;
`receive` is that peer's side.

    python examples/python/configmap_controller.py controller   # campaign; while LEADER, annotate ConfigMaps
    python examples/python/configmap_controller.py receive      # print and ACK the notifications
    python examples/python/configmap_controller.py sharded      # work on this replica's share of a sharded queue

Environment: CONSISTD_SOCKET (the sidecar; SDK default), EXAMPLE_NAMESPACE (default "default"),
EXAMPLE_ELECTION ("configmap-controller"), EXAMPLE_SELECTOR ("example.consistd.io/watch=true"),
EXAMPLE_PEER (whom to notify: "host:port" of a peer's sidecar, or "service/NAME" for every ready endpoint
of the Service NAME in the sidecar's namespace; unset: no notification), EXAMPLE_EXIT_AFTER (exit 0 after
this many ConfigMaps handled or messages received; unset: run until SIGTERM or SIGINT, then resign and
exit 0), EXAMPLE_SHARD_SELECTOR (`sharded`'s ConfigMaps, "example.consistd.io/shard=true").
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import consistd

OBSERVED_KEYS = "example.consistd.io/observed-keys"
HANDLED_BY = "example.consistd.io/handled-by"


@dataclass(frozen=True)
class Settings:
    """What the environment asks for."""

    namespace: str
    election: str
    selector: str
    shard_selector: str
    peer: consistd.Destination | None
    exit_after: int | None

    @classmethod
    def from_env(cls) -> Settings:
        exit_after = os.environ.get("EXAMPLE_EXIT_AFTER")
        return cls(
            namespace=os.environ.get("EXAMPLE_NAMESPACE", "default"),
            election=os.environ.get("EXAMPLE_ELECTION", "configmap-controller"),
            selector=os.environ.get("EXAMPLE_SELECTOR", "example.consistd.io/watch=true"),
            shard_selector=os.environ.get("EXAMPLE_SHARD_SELECTOR", "example.consistd.io/shard=true"),
            peer=destination(os.environ.get("EXAMPLE_PEER", "")),
            exit_after=int(exit_after) if exit_after else None,
        )


def destination(peer: str) -> consistd.Destination | None:
    """EXAMPLE_PEER as a destination: "service/NAME" is every ready endpoint of that Service (the
    sidecar reads its EndpointSlices), anything else one peer's "host:port"; empty is none."""
    if peer.startswith("service/"):
        return consistd.ServiceEndpoints(peer.removeprefix("service/"))
    return peer or None


def described(to: consistd.Destination) -> str:
    """A destination as EXAMPLE_PEER spells it."""
    return f"service/{to.name}" if isinstance(to, consistd.ServiceEndpoints) else str(to)


async def controller(client: consistd.Client, settings: Settings) -> None:
    """Campaigns, and meanwhile works on the queue of the namespace's selected ConfigMaps, which hands a
    ConfigMap out only while this sidecar leads (and takes its leases back the moment it stops leading).
    Returns after EXAMPLE_EXIT_AFTER ConfigMaps were handled."""
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    handled = 0

    def counted() -> None:
        nonlocal handled
        handled += 1
        if settings.exit_after is not None and handled >= settings.exit_after and not finished.done():
            finished.set_result(None)

    async def follow(campaign: consistd.Campaign) -> None:
        async for status in campaign:
            print(f"leadership {status.state.name} holder={status.holder or '-'} term={status.term}")

    spec = consistd.ReconcileSpec(
        name=settings.election,  # one queue per election, so apps with other elections never share it
        resource="configmaps",
        namespace=settings.namespace,
        label_selector=settings.selector,
        max_leases=4,
        election=settings.election,
        election_namespace=settings.namespace,
    )
    async with client.campaign(settings.election, namespace=settings.namespace) as campaign:
        jobs = {
            asyncio.create_task(follow(campaign)),
            asyncio.create_task(client.reconcile(spec, handler(client, settings, counted))),
        }
        try:
            await asyncio.wait({*jobs, finished}, return_when=asyncio.FIRST_COMPLETED)
            for job in jobs:
                if job.done():
                    job.result()  # the campaign or the queue failed: raise its error
            finished.result()
        finally:
            for job in jobs:
                job.cancel()


def handler(
    client: consistd.Client, settings: Settings, counted: Callable[[], None]
) -> consistd.ReconcileHandler:
    """The queue's handler: annotates a ConfigMap with its sorted data keys (fenced by the term the lease
    was granted in), then notifies the peer and waits for its ACK. Raising hands the key back for a retry."""

    async def handle(item: consistd.WorkItem) -> None:
        if item.deleted or item.object is None:
            return
        print(f"reconciling {item.key} attempt={item.attempt} term={item.term} {item.consistency.name}")
        cm = item.object
        keys = sorted((cm.json.get("data") or {}).keys())
        joined = ",".join(keys)
        if (cm.json["metadata"].get("annotations") or {}).get(OBSERVED_KEYS) == joined:
            return  # already handled (our own patch included: the queue hands out a state that shows it)
        patch = {"metadata": {"annotations": {OBSERVED_KEYS: joined, HANDLED_BY: "python-example"}}}
        patched = await item.objects.patch("configmaps", cm.name, patch, namespace=cm.namespace, guard=item.guard)
        print(f"patched {item.key} keys={joined} resourceVersion={patched.resource_version}")
        if settings.peer:
            payload = {"namespace": cm.namespace, "name": cm.name, "keys": keys}
            sent = await client.send(settings.peer, f"configmaps/{item.key}", patched.resource_version, payload)
            ack = await sent.ack()
            print(f"notified {described(settings.peer)} {ack.outcome.name} {sent.message_id}")
        counted()

    return handle


async def sharded(client: consistd.Client, settings: Settings) -> None:
    """Works on this replica's share of the namespace's ConfigMaps that EXAMPLE_SHARD_SELECTOR selects: one queue
    sharded over every replica that runs it (the election group EXAMPLE_ELECTION-shards), so each ConfigMap is
    handed to one replica at a time and a replica joining or leaving moves only its share. Each pass annotates
    the ConfigMap with its data keys, fenced by the slot's epoch, and holds its lease 200 ms; it prints
    `grant KEY MS` when it starts and `done KEY MS` when it ends (wall-clock milliseconds), which the
    end-to-end test audits for two replicas holding one key at once."""
    spec = consistd.ReconcileSpec(
        name=f"{settings.election}-sharded",
        resource="configmaps",
        namespace=settings.namespace,
        label_selector=settings.shard_selector,
        max_leases=4,
        election=f"{settings.election}-shards",
        election_namespace=settings.namespace,
        sharded=True,
    )

    async def handle(item: consistd.WorkItem) -> None:
        print(f"grant {item.key} {time.time_ns() // 1_000_000} term={item.term}")
        try:
            if not item.deleted and item.object is not None:
                cm = item.object
                joined = ",".join(sorted((cm.json.get("data") or {}).keys()))
                if (cm.json["metadata"].get("annotations") or {}).get(OBSERVED_KEYS) != joined:
                    patch = {"metadata": {"annotations": {OBSERVED_KEYS: joined, HANDLED_BY: "python-example-sharded"}}}
                    await item.objects.patch("configmaps", cm.name, patch, namespace=cm.namespace, guard=item.guard)
            await asyncio.sleep(0.2)
        finally:
            print(f"done {item.key} {time.time_ns() // 1_000_000}")

    await client.reconcile(spec, handle)


async def receive(client: consistd.Client, settings: Settings) -> None:
    """Prints each notification and ACKs it by returning; returns once EXAMPLE_EXIT_AFTER were ACKed."""

    def handle(message: consistd.InboxMessage) -> None:
        print(f"received {message.resource_id} {message.event_id} {message.text}")

    await client.inbox.serve(handle, max_messages=settings.exit_after)


async def main(command: str) -> None:
    """Runs ``command`` until it is done or SIGTERM/SIGINT arrives; then leaving the campaign resigns
    (the sidecar releases the Lease, so another replica leads at once) and the process exits 0."""
    settings = Settings.from_env()
    job = asyncio.current_task()
    assert job is not None
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop, job, signal.Signals(signum).name)
    try:
        async with consistd.Client() as client:
            await client.wait_ready(30)
            await {"controller": controller, "receive": receive, "sharded": sharded}[command](client, settings)
    except asyncio.CancelledError:
        print("stopped")


def stop(job: asyncio.Task[None], name: str) -> None:
    """The signal handler: says so, and cancels the job."""
    print(f"stopping on {name}")
    job.cancel()


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("controller", "receive", "sharded"):
        sys.exit(f"usage: {sys.argv[0]} controller|receive|sharded")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # each line as it is printed
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1]))
