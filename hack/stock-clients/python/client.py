# Proves stock Python grpcio (C-core, default channel options, no authority override) can call consistd on its socket.
"""Usage: client.py TARGET   (e.g. unix:/path/consistd.sock or unix:///abs/path/consistd.sock)

Four calls with the generated stubs in client-sdk/python/src/consistd/v1 and grpcio-health-checking's
stubs (not the SDK's asyncio layer); one line per call; exit 1 if any failed.
"""

import os
import queue
import sys
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from consistd.v1 import objects_pb2, objects_pb2_grpc, reconcile_pb2, reconcile_pb2_grpc, watch_pb2, watch_pb2_grpc

DEADLINE = 30.0


def health(channel: grpc.Channel) -> str:
    response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        raise RuntimeError(f"status {status}, want SERVING")
    return status


def list_namespaces(channel: grpc.Channel) -> str:
    stub = objects_pb2_grpc.ObjectsServiceStub(channel)
    response = stub.List(objects_pb2.ListRequest(resource="namespaces"), timeout=DEADLINE)
    if not response.objects:
        raise RuntimeError("no namespaces listed")
    return f"{len(response.objects)} items ({', '.join(o.name for o in response.objects)})"


def subscribe_until_synced(channel: grpc.Channel) -> str:
    request = watch_pb2.SubscribeRequest(resource="namespaces", mode=watch_pb2.DELIVERY_MODE_RAW)
    call = watch_pb2_grpc.WatchServiceStub(channel).Subscribe(request, timeout=DEADLINE)
    before = 0
    for event in call:
        if event.type == watch_pb2.EVENT_TYPE_SYNCED:
            call.cancel()
            return f"SYNCED after {before} events, then cancelled"
        before += 1
    raise RuntimeError(f"stream ended after {before} events without SYNCED")


def reconcile_one_namespace(channel: grpc.Channel) -> str:
    """A work queue of namespaces with one lease: STARTED, a lease, DONE for it, then the next lease, which
    the daemon hands out only once it took the DONE (it answers a refused one with CompletionRefused)."""
    name = f"stock-python-{os.getpid()}"
    spec = reconcile_pb2.QueueSpec(name=name, primary=reconcile_pb2.ObjectQuery(resource="namespaces"), max_leases=1)
    # The request stream: grpcio's sync client sends what this queue yields, in a thread of its own; None ends it.
    requests: queue.Queue[reconcile_pb2.ReconcileRequest | None] = queue.Queue()
    requests.put(reconcile_pb2.ReconcileRequest(spec=spec))
    call = reconcile_pb2_grpc.ReconcileServiceStub(channel).Reconcile(iter(requests.get, None), timeout=DEADLINE)
    try:
        answer(call, "started")
        item = answer(call, "item").item
        done = reconcile_pb2.Completion(lease_id=item.lease_id, outcome=reconcile_pb2.OUTCOME_DONE)
        requests.put(reconcile_pb2.ReconcileRequest(complete=done))
        after = answer(call, "item").item
    finally:
        requests.put(None)
        call.cancel()
    return f"STARTED {name}, leased {item.name}, DONE taken (then leased {after.name}), closed"


def answer(call: Iterator[reconcile_pb2.ReconcileResponse], want: str) -> reconcile_pb2.ReconcileResponse:
    """The stream's next answer, which must be ``want`` (started, item)."""
    try:
        response = next(call)
    except StopIteration:
        raise RuntimeError(f"stream ended, want {want}") from None
    kind = response.WhichOneof("response")
    if kind == "refused":
        refusal = response.refused.refusal
        code = next((c.name for c in grpc.StatusCode if c.value[0] == refusal.code), str(refusal.code))
        raise RuntimeError(f"completion of {response.refused.lease_id} refused: {code}: {refusal.message}")
    if kind != want:
        raise RuntimeError(f"got {kind}, want {want}")
    return response


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    target = sys.argv[1]
    label = f"python-grpcio {target}"
    ok = True
    with grpc.insecure_channel(target) as channel:
        for name, call in [
            ("Health/Check", health),
            ("ObjectsService/List", list_namespaces),
            ("WatchService/Subscribe", subscribe_until_synced),
            ("ReconcileService/Reconcile", reconcile_one_namespace),
        ]:
            try:
                print(f"{label}: {name} {call(channel)}", flush=True)
            except grpc.RpcError as e:
                print(f"{label}: {name} FAILED: {e.code().name}: {e.details()}", file=sys.stderr, flush=True)
                ok = False
            except RuntimeError as e:
                print(f"{label}: {name} FAILED: {e}", file=sys.stderr, flush=True)
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
