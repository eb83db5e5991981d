#!/usr/bin/env bash
# Runs one language's ConfigMap controller example end to end (what `make test` does for each language):
#
#   hack/run-example.sh LANG 'CONTROLLER COMMAND' 'RECEIVER COMMAND'
#
# Runs under hack/with-daemons.sh. Creates a namespace and a labelled ConfigMap through daemon a, starts
# the receiver on daemon b (the peer), runs the controller on daemon a, and checks that the controller
# patched the ConfigMap through consistd while leading, and that its notification reached the receiver
# and was ACKed. Both commands are run by bash from the repository root with EXAMPLE_NAMESPACE,
# EXAMPLE_ELECTION, EXAMPLE_PEER (controller) and EXAMPLE_EXIT_AFTER=1 set.
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

grep -q "^patched $ns/settings keys=a,b" "$out/controller.log" || fail "controller did not patch $ns/settings"
grep -q "ACKED" "$out/controller.log" || fail "controller saw no ACK"
grep -q "^received configmaps/$ns/settings " "$out/receiver.log" || fail "receiver got no notification"
json=$(objects Get "{\"resource\":\"configmaps\",\"namespace\":\"$ns\",\"name\":\"settings\"}" |
  sed -n 's/^ *"json": "\(.*\)",\{0,1\}$/\1/p' | base64 -d)
grep -q '"example.consistd.io/observed-keys":"a,b"' <<<"$json" || fail "annotation missing from $json"
objects Delete "{\"resource\":\"namespaces\",\"name\":\"$ns\"}" >/dev/null
log "passed: patched while leading, notified the peer, ACKed"
