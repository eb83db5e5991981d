# Proves stock Python grpcio (C-core, default channel options, no authority override) can call consistd on its socket.
"""Usage: client.py TARGET   (e.g. unix:/path/consistd.sock or unix:///abs/path/consistd.sock)

Three calls with the generated stubs in client-sdk/python/src/consistd/v1 and grpcio-health-checking's
stubs; one line per call; exit 1 if any failed.
"""

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from consistd.v1 import objects_pb2, objects_pb2_grpc, watch_pb2, watch_pb2_grpc

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
