"""A ConfigMap controller on the consistd Python SDK: acts only while it leads, writes fenced by its term,
notifies a peer and waits for the ACK; `receive` is that peer's side.

    python examples/python/configmap_controller.py controller   # campaign; while LEADER, annotate ConfigMaps
    python examples/python/configmap_controller.py receive      # print and ACK the notifications

Environment: CONSISTD_SOCKET (the sidecar; SDK default), EXAMPLE_NAMESPACE (default "default"),
EXAMPLE_ELECTION ("configmap-controller"), EXAMPLE_SELECTOR ("example.consistd.io/watch=true"),
EXAMPLE_PEER (whom to notify: "host:port" of a peer's sidecar, or "service/NAME" for every ready endpoint
of the Service NAME in the sidecar's namespace; unset: no notification), EXAMPLE_EXIT_AFTER (exit 0 after
this many ConfigMaps handled or messages received; unset: run until SIGTERM or SIGINT, then resign and
exit 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

import consistd

OBSERVED_KEYS = "example.consistd.io/observed-keys"
HANDLED_BY = "example.consistd.io/handled-by"

log = logging.getLogger("configmap-controller")


@dataclass(frozen=True)
class Settings:
    """What the environment asks for."""

    namespace: str
    election: str
    selector: str
    peer: consistd.Destination | None
    exit_after: int | None

    @classmethod
    def from_env(cls) -> Settings:
        exit_after = os.environ.get("EXAMPLE_EXIT_AFTER")
        return cls(
            namespace=os.environ.get("EXAMPLE_NAMESPACE", "default"),
            election=os.environ.get("EXAMPLE_ELECTION", "configmap-controller"),
            selector=os.environ.get("EXAMPLE_SELECTOR", "example.consistd.io/watch=true"),
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
    """Campaigns; while LEADER, reconciles the namespace's selected ConfigMaps; stops acting at once
    when it no longer leads. Returns after EXAMPLE_EXIT_AFTER ConfigMaps were handled."""
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    handled = 0
    worker: asyncio.Task[None] | None = None

    def counted() -> None:
        nonlocal handled
        handled += 1
        if settings.exit_after is not None and handled >= settings.exit_after and not finished.done():
            finished.set_result(None)

    def worker_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and not finished.done():
            finished.set_exception(task.exception())  # type: ignore[arg-type]

    async def follow(campaign: consistd.Campaign) -> None:
        nonlocal worker
        worker_term = -1
        async for status in campaign:
            print(f"leadership {status.state.name} holder={status.holder or '-'} term={status.term}")
            if worker is not None and not (status.is_leader and status.term == worker_term):
                worker.cancel()  # no longer leader (or leader in a new term): stop acting under the old one
                worker = None
            if status.is_leader and worker is None:
                worker, worker_term = (
                    asyncio.create_task(reconcile(client, settings, status.guard(), counted)),
                    status.term,
                )
                worker.add_done_callback(worker_done)

    async with client.campaign(settings.election, namespace=settings.namespace) as campaign:
        following = asyncio.create_task(follow(campaign))
        try:
            await asyncio.wait({following, finished}, return_when=asyncio.FIRST_COMPLETED)
            if following.done():
                following.result()  # the campaign failed: raise its error
            finished.result()
        finally:
            following.cancel()
            if worker is not None:
                worker.cancel()


async def reconcile(
    client: consistd.Client, settings: Settings, guard: consistd.Guard, counted: Callable[[], None]
) -> None:
    """Annotates each selected ConfigMap with its sorted data keys (fenced by ``guard``), then notifies
    the peer and waits for its ACK."""
    watch = client.watch(
        "configmaps", namespace=settings.namespace, label_selector=settings.selector, mode=consistd.Mode.CONSISTENT
    )
    async with watch:
        async for event in watch:
            if event.type not in (consistd.EventType.ADDED, consistd.EventType.MODIFIED) or event.object is None:
                continue
            cm = event.object
            keys = sorted((cm.json.get("data") or {}).keys())
            joined = ",".join(keys)
            if (cm.json["metadata"].get("annotations") or {}).get(OBSERVED_KEYS) == joined:
                continue  # already handled (this includes our own patch coming back)
            patch = {"metadata": {"annotations": {OBSERVED_KEYS: joined, HANDLED_BY: "python-example"}}}
            try:
                patched = await client.objects.patch("configmaps", cm.name, patch, namespace=cm.namespace, guard=guard)
            except consistd.ConsistdError as e:
                log.warning("patch of %s/%s refused: %s", cm.namespace, cm.name, e)
                continue
            print(f"patched {cm.namespace}/{cm.name} keys={joined} resourceVersion={patched.resource_version}")
            if settings.peer:
                payload = {"namespace": cm.namespace, "name": cm.name, "keys": keys}
                sent = await client.send(
                    settings.peer, f"configmaps/{cm.namespace}/{cm.name}", patched.resource_version, payload
                )
                ack = await sent.ack()
                print(f"notified {described(settings.peer)} {ack.outcome.name} {sent.message_id}")
            counted()


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
            await (controller if command == "controller" else receive)(client, settings)
    except asyncio.CancelledError:
        print("stopped")


def stop(job: asyncio.Task[None], name: str) -> None:
    """The signal handler: says so, and cancels the job."""
    print(f"stopping on {name}")
    job.cancel()


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("controller", "receive"):
        sys.exit(f"usage: {sys.argv[0]} controller|receive")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # each line as it is printed
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1]))
