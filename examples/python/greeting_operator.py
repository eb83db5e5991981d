"""The Greeting operator on the consistd Python SDK (examples/README.md is its spec): a reconcile queue hands it
each Greeting only while it leads, consistent with its own writes; it applies the Greeting's ConfigMap fenced by
its term, records an event, notifies a peer and waits for the ACK, sets the Ready condition, and deletes the
ConfigMap in the finalize pass. `receive` is that peer's side; `sharded` works on a sharded queue of ConfigMaps.

    python examples/python/greeting_operator.py controller   # campaign; while LEADER, reconcile the Greetings
    python examples/python/greeting_operator.py receive      # print and ACK the notifications
    python examples/python/greeting_operator.py sharded      # work on this replica's share of a sharded queue

Environment: CONSISTD_SOCKET (the sidecar; SDK default), EXAMPLE_NAMESPACE (default "default"),
EXAMPLE_ELECTION ("greeting-operator"), EXAMPLE_PEER (whom to notify: "host:port" of a peer's sidecar, or
"service/NAME" for every ready endpoint of the Service NAME in the sidecar's namespace; unset: no
notification), EXAMPLE_EXIT_AFTER (`receive` only: exit 0 after this many messages received), and
EXAMPLE_SHARD_SELECTOR (`sharded`'s ConfigMaps, "example.consistd.io/shard=true"). Every command runs until
SIGTERM or SIGINT, then resigns and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

import consistd

GREETINGS = "greetings.example.consistd.io"
GREETING_API_VERSION = "example.consistd.io/v1"
#: The field manager of the ConfigMaps' apply, and the value of their MANAGED_BY label.
OPERATOR = "greeting-operator"
MANAGED_BY = "app.kubernetes.io/managed-by"
FINALIZER = "example.consistd.io/cleanup"
OBSERVED_KEYS = "example.consistd.io/observed-keys"
HANDLED_BY = "example.consistd.io/handled-by"


@dataclass(frozen=True)
class Settings:
    """What the environment asks for."""

    namespace: str
    election: str
    shard_selector: str
    peer: consistd.Destination | None
    exit_after: int | None

    @classmethod
    def from_env(cls) -> Settings:
        exit_after = os.environ.get("EXAMPLE_EXIT_AFTER")
        return cls(
            namespace=os.environ.get("EXAMPLE_NAMESPACE", "default"),
            election=os.environ.get("EXAMPLE_ELECTION", "greeting-operator"),
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


class StepError(Exception):
    """A step of a pass failed; its text names the step, and the error it was raised from says why."""


@contextmanager
def step(what: str) -> Iterator[None]:
    """Raises a ConsistdError of the block again as a StepError naming ``what``."""
    try:
        yield
    except consistd.ConsistdError as e:
        raise StepError(what) from e


async def controller(client: consistd.Client, settings: Settings) -> None:
    """Campaigns for EXAMPLE_ELECTION and meanwhile works on the queue of the namespace's Greetings, which hands
    a Greeting out only while this sidecar leads (and takes its leases back the moment it stops leading). Runs
    until cancelled; raises what ended the campaign or the queue."""

    async def follow(campaign: consistd.Campaign) -> None:
        async for status in campaign:
            print(f"leadership {status.state.name} holder={status.holder or '-'} term={status.term}")

    async def handle(item: consistd.WorkItem) -> None:
        if item.finalizing:
            await finalize(item)
        elif not item.deleted and item.object is not None:
            await reconcile(client, settings.peer, item, item.object)

    async with client.campaign(settings.election, namespace=settings.namespace) as campaign:
        jobs = [
            asyncio.create_task(follow(campaign)),
            asyncio.create_task(client.reconcile(greeting_queue(settings), handle)),
        ]
        try:
            done, _ = await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
            for job in done:
                job.result()  # raise the campaign's or the queue's error
            raise RuntimeError("the campaign or the Greeting queue ended unasked")
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)


def greeting_queue(settings: Settings) -> consistd.ReconcileSpec:
    """The queue of the namespace's Greetings, named after the election and handed out only while it leads."""
    return consistd.ReconcileSpec(
        name=settings.election,
        resource=GREETINGS,
        namespace=settings.namespace,
        only_changes_of=consistd.Changed.GENERATION,  # a change of status, labels or annotations alone: no pass
        related=[  # the ConfigMap a Greeting owns, changed or deleted by someone else, queues the Greeting
            consistd.Related(
                "configmaps",
                namespace=settings.namespace,
                label_selector=f"{MANAGED_BY}={OPERATOR}",
                controller_owner=True,
            )
        ],
        finalizer=FINALIZER,
        max_leases=4,
        election=settings.election,
        election_namespace=settings.namespace,
    )


async def reconcile(
    client: consistd.Client, peer: consistd.Destination | None, item: consistd.WorkItem, greeting: consistd.Object
) -> None:
    """One pass over a Greeting: unless its ConfigMap already says its message and names it as its controller,
    applies the ConfigMap, records the Published event and notifies the peer; then sets Ready. Raising hands the
    Greeting back for a retry."""
    print(f"reconciling {item.key} attempt={item.attempt} term={item.term} {item.consistency.name}")
    message = greeting.json["spec"]["message"]
    note = f"ConfigMap {item.name} holds the message"
    if not publishes(await read_configmap(item), greeting, message):
        with step(f"applying the ConfigMap {item.key}"):
            applied = await item.objects.patch(
                "configmaps",
                item.name,
                configmap_for(greeting, message),
                namespace=item.namespace,
                patch_type=consistd.PatchType.APPLY,
                field_manager=OPERATOR,
                force=True,
                guard=item.guard,
            )
        generation = greeting.json["metadata"]["generation"]
        print(
            f"published {item.key} generation={generation} configmap={applied.name} "
            f"resourceVersion={applied.resource_version}"
        )
        with step(f"recording the Published event about {item.key}"):
            await item.record_event(consistd.EventSeverity.NORMAL, "Published", "Publish", note)
        if peer is not None:
            await notify(client, peer, item, applied.resource_version, message)
    with step(f"setting the Ready condition of {item.key}"):
        await item.set_condition("Ready", consistd.ConditionStatus.TRUE, "Published", note)


async def read_configmap(item: consistd.WorkItem) -> consistd.Object | None:
    """The ConfigMap named as the item's Greeting, or None when there is none."""
    try:
        return await item.objects.get("configmaps", item.name, namespace=item.namespace, read_your_writes=True)
    except consistd.ConsistdError as e:
        if e.code == grpc.StatusCode.NOT_FOUND:
            return None
        raise StepError(f"reading the ConfigMap {item.key}") from e


def publishes(configmap: consistd.Object | None, greeting: consistd.Object, message: str) -> bool:
    """Whether the ConfigMap says the message and names the Greeting as its controller."""
    if configmap is None or (configmap.json.get("data") or {}).get("message") != message:
        return False
    owners = configmap.json["metadata"].get("ownerReferences") or []
    return any(owner.get("controller") and owner.get("uid") == greeting.uid for owner in owners)


def configmap_for(greeting: consistd.Object, message: str) -> dict[str, Any]:
    """The Greeting's ConfigMap as the operator applies it: the message, owned by the Greeting as its controller."""
    owner = {
        "apiVersion": GREETING_API_VERSION,
        "kind": "Greeting",
        "name": greeting.name,
        "uid": greeting.uid,
        "controller": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": greeting.name,
            "namespace": greeting.namespace,
            "labels": {MANAGED_BY: OPERATOR},
            "ownerReferences": [owner],
        },
        "data": {"message": message},
    }


async def notify(
    client: consistd.Client, peer: consistd.Destination, item: consistd.WorkItem, version: str, message: str
) -> None:
    """Sends the peer an ACK-tracked notification of the published message and waits for its ACK."""
    payload = {"namespace": item.namespace, "name": item.name, "message": message}
    with step(f"notifying {described(peer)} of {item.key}"):
        sent = await client.send(peer, f"greetings/{item.key}", version, payload)
        ack = await sent.ack()
    print(f"notified {described(peer)} {ack.outcome.name} {sent.message_id}")


async def finalize(item: consistd.WorkItem) -> None:
    """The finalize pass of a Greeting being deleted: deletes its ConfigMap (already gone is fine); returning
    lets the sidecar remove the finalizer."""
    print(f"finalizing {item.key} term={item.term}")
    try:
        await item.objects.delete("configmaps", item.name, namespace=item.namespace, guard=item.guard)
    except consistd.ConsistdError as e:
        if e.code != grpc.StatusCode.NOT_FOUND:
            raise StepError(f"deleting the ConfigMap {item.key}") from e
    print(f"finalized {item.key}")


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
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # each line flushed as it is printed
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1]))
