#!/usr/bin/env bash
# Runs one language's ConfigMap controller example end to end (what `make test` does for each language):
#
#   hack/run-example.sh LANG 'CONTROLLER COMMAND' 'RECEIVER COMMAND'
#
# Runs under hack/with-daemons.sh. Creates a namespace and a labelled ConfigMap through daemon a, starts
# the receiver on daemon b (the peer), runs the controller on daemon a, and checks that the controller's
# work queue handed it the ConfigMap while it led, that it patched the ConfigMap through consistd, and that its notification reached the receiver
# and was ACKed. Then it starts the controller again without EXAMPLE_EXIT_AFTER, waits until it leads,
# sends it SIGTERM and checks that it said `stopping on SIGTERM` and `stopped`, exited 0 and resigned (the
# election's Lease has no holder). Both commands are run by bash from the repository root with
# EXAMPLE_NAMESPACE, EXAMPLE_ELECTION, EXAMPLE_PEER (controller) and EXAMPLE_EXIT_AFTER=1 set.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
lang=${1:?usage: $0 LANG CONTROLLER RECEIVER} controller=${2:?controller command} receiver=${3:?receiver command}
: "${CONSISTD_SOCKET:?run under hack/with-daemons.sh}" "${CONSISTD_TEST_PEER_SOCKET:?}" "${CONSISTD_TEST_PEER_ADDRESS:?}"
grpcurl=$("$repo/hack/tools.sh" grpcurl)
ns=example-$lang-$RANDOM$RANDOM
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
log() { printf 'example(%s): %s\n' "$lang" "$*" >&2; }
fail() {
  log "FAILED: $*"
  for f in "$out"/*.log; do echo "--- $(basename "$f")" >&2; cat "$f" >&2; done
  exit 1
}

objects() { # METHOD JSON: one ObjectsService call on daemon a
  "$grpcurl" -unix -plaintext -d "$2" "$CONSISTD_SOCKET" "consistd.v1.ObjectsService/$1"
}
b64() { printf '%s' "$1" | base64 -w0; }
object_json() { # RESOURCE NAME: the object's JSON in the example's namespace, through daemon a
  objects Get "{\"resource\":\"$1\",\"namespace\":\"$ns\",\"name\":\"$2\"}" |
    sed -n 's/^ *"json": "\(.*\)",\{0,1\}$/\1/p' | base64 -d
}

objects Create "{\"resource\":\"namespaces\",\"object\":\"$(b64 "{\"metadata\":{\"name\":\"$ns\"}}")\"}" >/dev/null
cm='{"metadata":{"name":"settings","labels":{"example.consistd.io/watch":"true"}},"data":{"b":"2","a":"1"}}'
objects Create "{\"resource\":\"configmaps\",\"namespace\":\"$ns\",\"object\":\"$(b64 "$cm")\"}" >/dev/null
log "created configmap $ns/settings"

export EXAMPLE_NAMESPACE=$ns EXAMPLE_ELECTION=configmap-controller-$lang EXAMPLE_EXIT_AFTER=1
cd "$repo"
CONSISTD_SOCKET=$CONSISTD_TEST_PEER_SOCKET timeout 120 bash -c "$receiver" >"$out/receiver.log" 2>&1 &
receiver_pid=$!
EXAMPLE_PEER=$CONSISTD_TEST_PEER_ADDRESS timeout 120 bash -c "$controller" >"$out/controller.log" 2>&1 ||
  fail "controller exited with $?"
wait "$receiver_pid" || fail "receiver exited with $?"

grep -Eq "^reconciling $ns/settings attempt=1 term=[1-9][0-9]* CONSISTENT$" "$out/controller.log" ||
  fail "controller was not handed $ns/settings by its queue while leading"
grep -q "^patched $ns/settings keys=a,b" "$out/controller.log" || fail "controller did not patch $ns/settings"
grep -q "ACKED" "$out/controller.log" || fail "controller saw no ACK"
grep -q "^received configmaps/$ns/settings " "$out/receiver.log" || fail "receiver got no notification"
json=$(object_json configmaps settings)
grep -q '"example.consistd.io/observed-keys":"a,b"' <<<"$json" || fail "annotation missing from $json"
log "patched while leading, notified the peer, ACKed"

# Run without EXAMPLE_EXIT_AFTER, the controller stops on SIGTERM: it says so, resigns and exits 0. bash
# execs it (so $! is the controller itself), and the loops below bound the wait instead of timeout(1),
# which would pass the signal on twice (to the process and to its group).
stop_log=$out/controller-sigterm.log
env -u EXAMPLE_EXIT_AFTER bash -c "exec $controller" >"$stop_log" 2>&1 &
pid=$!
leads() { grep -Eq '^(leadership LEADER|leader term=)' "$stop_log"; }
for _ in $(seq 1 300); do
  leads && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
leads || { kill -KILL "$pid" 2>/dev/null; fail "the second controller did not lead within 60s"; }
kill -TERM "$pid"
for _ in $(seq 1 100); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid"; fail "controller still running 20s after SIGTERM"; }
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "controller exited with $rc on SIGTERM"
grep -q '^stopping on SIGTERM$' "$stop_log" || fail "controller did not say 'stopping on SIGTERM'"
grep -q '^stopped$' "$stop_log" || fail "controller did not say 'stopped'"
# It left the campaign, so the sidecar resigns: it releases the Lease (clears its holder) just after.
for _ in $(seq 1 50); do
  lease=$(object_json leases "$EXAMPLE_ELECTION")
  grep -q '"holderIdentity"' <<<"$lease" || break
  sleep 0.2
done
if grep -q '"holderIdentity"' <<<"$lease"; then fail "the Lease still has a holder 10s after SIGTERM: $lease"; fi
objects Delete "{\"resource\":\"namespaces\",\"name\":\"$ns\"}" >/dev/null
log "passed: patched while leading, notified the peer, ACKed; stopped on SIGTERM, exited 0, released the Lease"
