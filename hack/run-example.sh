#!/usr/bin/env bash
# Runs one language's Greeting operator example end to end (what `make test` does for each language):
#
#   hack/run-example.sh LANG 'CONTROLLER COMMAND' 'RECEIVER COMMAND'
#
# Runs under hack/with-daemons.sh. Applies examples/crd.yaml, creates a namespace and a Greeting, starts the
# receiver on daemon b (the peer) and the operator on daemon a, and checks examples/README.md's behaviour
# with kubectl from outside:
#  1. the queue hands the Greeting out while the operator leads, CONSISTENT; it applies the Greeting's
#     ConfigMap (owned by it), records the Published event, sets Ready with observedGeneration 1, its
#     notification reaches the receiver and is ACKed, and the finalizer is on the Greeting;
#  2. a change of the Greeting's status and annotations only queues no pass (the generation filter); a change
#     of its spec queues exactly one, which publishes generation 2: one pass per change;
#  3. the ConfigMap deleted by someone else queues its owner (the related query), whose pass applies it again;
#  4. the Greeting deleted: a finalize pass deletes the ConfigMap, and the Greeting is gone (the finalizer
#     removed);
#  5. SIGTERM: the operator says `stopping on SIGTERM` and `stopped`, exits 0 and resigns (the election's Lease
#     has no holder).
# Both commands are run by bash from the repository root with EXAMPLE_NAMESPACE, EXAMPLE_ELECTION,
# EXAMPLE_PEER (controller) and EXAMPLE_EXIT_AFTER=3 (receiver) set.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
lang=${1:?usage: $0 LANG CONTROLLER RECEIVER} controller=${2:?controller command} receiver=${3:?receiver command}
: "${CONSISTD_SOCKET:?run under hack/with-daemons.sh}" "${CONSISTD_TEST_PEER_SOCKET:?}" "${CONSISTD_TEST_PEER_ADDRESS:?}"
: "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
kubectl=$("$repo/hack/tools.sh" kubectl)
ns=example-$lang-$RANDOM$RANDOM
out=$(mktemp -d)
pid=
cleanup() {
  [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
log() { printf 'example(%s): %s\n' "$lang" "$*" >&2; }
fail() {
  log "FAILED: $*"
  for f in "$out"/*.log; do echo "--- $(basename "$f")" >&2; cat "$f" >&2; done
  exit 1
}
k() { KUBECONFIG=$CONSISTD_TEST_KUBECONFIG "$kubectl" "$@"; }
kn() { k -n "$ns" "$@"; }
# until SECONDS WHAT COMMAND...: runs COMMAND every 0.2 s until it succeeds; fails saying WHAT otherwise.
until_ok() {
  local secs=$1 what=$2
  shift 2
  for _ in $(seq 1 $((secs * 5))); do "$@" && return 0; sleep 0.2; done
  fail "$what (after $secs s)"
}
logged() { grep -Eq "$1" "$out/controller.log"; }
passes() { grep -c '^reconciling ' "$out/controller.log" || true; }
greeting() { kn get greeting hello -o jsonpath="$1"; }
configmap() { kn get configmap hello -o jsonpath="$1" 2>/dev/null; }
ready() { # GENERATION: Ready=True with that observedGeneration, reason Published
  [ "$(greeting '{.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].observedGeneration}/{.status.conditions[?(@.type=="Ready")].reason}')" = "True/$1/Published" ]
}
published() { # MESSAGE: the ConfigMap says it, and the Greeting owns it as its controller
  local uid
  uid=$(greeting '{.metadata.uid}')
  [ "$(configmap '{.data.message}')" = "$1" ] &&
    [ "$(configmap '{.metadata.ownerReferences[?(@.controller==true)].uid}')" = "$uid" ] &&
    [ "$(configmap '{.metadata.labels.app\.kubernetes\.io/managed-by}')" = greeting-operator ]
}

k apply -f "$repo/examples/crd.yaml" >/dev/null
k wait --for=condition=Established --timeout=60s crd/greetings.example.consistd.io >/dev/null
k create namespace "$ns" >/dev/null
kn apply -f - >/dev/null <<YAML
apiVersion: example.consistd.io/v1
kind: Greeting
metadata:
  name: hello
spec:
  message: hello, world
YAML
log "created greeting $ns/hello"

export EXAMPLE_NAMESPACE=$ns EXAMPLE_ELECTION=greeting-operator-$lang
cd "$repo"
CONSISTD_SOCKET=$CONSISTD_TEST_PEER_SOCKET EXAMPLE_EXIT_AFTER=3 timeout 180 bash -c "$receiver" >"$out/receiver.log" 2>&1 &
receiver_pid=$!
# bash execs the operator (so $! is the operator itself, for the SIGTERM at the end).
EXAMPLE_PEER=$CONSISTD_TEST_PEER_ADDRESS bash -c "exec $controller" >"$out/controller.log" 2>&1 &
pid=$!

# 1. The first pass publishes generation 1.
until_ok 90 "the operator did not publish $ns/hello" logged "^published $ns/hello generation=1 configmap=hello resourceVersion=[0-9]+$"
logged "^reconciling $ns/hello attempt=1 term=[1-9][0-9]* CONSISTENT$" || fail "the queue did not hand $ns/hello out while leading"
until_ok 30 "no ACK for the notification" logged "^notified $CONSISTD_TEST_PEER_ADDRESS ACKED "
until_ok 30 "the receiver got no notification" grep -q "^received greetings/$ns/hello " "$out/receiver.log"
until_ok 30 "the Greeting is not Ready with observedGeneration 1" ready 1
published "hello, world" || fail "the ConfigMap is not the Greeting's: $(configmap '{.data} {.metadata.ownerReferences}')"
[ "$(greeting '{.metadata.finalizers}')" = '["example.consistd.io/cleanup"]' ] ||
  fail "the Greeting does not carry the queue's finalizer: $(greeting '{.metadata.finalizers}')"
event=$(kn get events.events.k8s.io -o jsonpath='{range .items[?(@.regarding.name=="hello")]}{.type}/{.reason}/{.action}/{.reportingController} {end}')
[ "$event" = "Normal/Published/Publish/greeting-operator-$lang " ] || fail "no one Published event about the Greeting: '$event'"
[ "$(passes)" = 1 ] || fail "expected one pass for the new Greeting, saw $(passes)"
log "published generation 1 while leading: ConfigMap owned, event recorded, Ready, finalizer on, peer notified and ACKed"

# 2. Status and annotations only: no pass. Then the spec: exactly one.
kn patch greeting hello --subresource=status --type=json \
  -p '[{"op":"add","path":"/status/conditions/-","value":{"type":"Audited","status":"True","reason":"Test","message":"a status-only change","lastTransitionTime":"2026-01-01T00:00:00Z"}}]' >/dev/null
kn annotate greeting hello example.consistd.io/note=annotation-only >/dev/null
sleep 3 # time for a wrong pass to show
[ "$(passes)" = 1 ] || fail "a change of status and annotations only queued a pass"
kn patch greeting hello --type=merge -p '{"spec":{"message":"hello again"}}' >/dev/null
until_ok 60 "the operator did not publish generation 2" logged "^published $ns/hello generation=2 configmap=hello "
until_ok 30 "the Greeting is not Ready with observedGeneration 2" ready 2
published "hello again" || fail "the ConfigMap does not say the new message: $(configmap '{.data}')"
sleep 2 # time for a second, wrong pass (the operator's own writes) to show
[ "$(passes)" = 2 ] || fail "expected one pass for the spec change (2 in all), saw $(passes)"
log "status and annotations alone queued nothing; the spec change one pass, which published generation 2"

# 3. The ConfigMap deleted by someone else: its owner's pass applies it again.
kn delete configmap hello >/dev/null
until_ok 60 "the deleted ConfigMap was not applied again" published "hello again"
[ "$(passes)" = 3 ] || fail "expected one pass for the ConfigMap's deletion (3 in all), saw $(passes)"
log "the ConfigMap deleted by someone else was applied again by its owner's pass"

# 4. The Greeting deleted: the finalize pass deletes the ConfigMap, then the finalizer goes.
kn delete greeting hello --wait=false >/dev/null
until_ok 60 "no finalize pass" logged "^finalized $ns/hello$"
logged "^finalizing $ns/hello term=[1-9][0-9]*$" || fail "the finalize pass did not say its term"
gone() { ! kn get "$1" hello >/dev/null 2>&1; }
until_ok 30 "the Greeting is still there after its finalize pass" gone greeting
until_ok 30 "the ConfigMap is still there after the finalize pass" gone configmap
wait "$receiver_pid" || fail "receiver exited with $?"
log "the finalize pass deleted the ConfigMap, and the Greeting went"

# 5. SIGTERM: the operator says so, resigns and exits 0. The loop bounds the wait instead of timeout(1), which
# would pass the signal on twice (to the process and to its group).
kill -TERM "$pid"
for _ in $(seq 1 100); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
kill -0 "$pid" 2>/dev/null && fail "operator still running 20s after SIGTERM"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "operator exited with $rc on SIGTERM"
grep -q '^stopping on SIGTERM$' "$out/controller.log" || fail "operator did not say 'stopping on SIGTERM'"
grep -q '^stopped$' "$out/controller.log" || fail "operator did not say 'stopped'"
# It left the campaign, so the sidecar resigns: it releases the Lease (clears its holder) just after.
holder() { kn get lease "$EXAMPLE_ELECTION" -o jsonpath='{.spec.holderIdentity}'; }
released() { [ -z "$(holder)" ]; }
until_ok 10 "the Lease still has a holder after SIGTERM: $(holder)" released
k delete namespace "$ns" --wait=false >/dev/null
log "passed: one pass per change, finalizer, event, condition, notification ACKed; stopped on SIGTERM, released the Lease"
