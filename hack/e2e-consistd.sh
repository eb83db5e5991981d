#!/usr/bin/env bash
# End-to-end test of consistd in a pod on a real node: the injector runs in the cluster from its image and
# adds the sidecar to a labelled Deployment, whose pods all become Ready with consistd reaching the apiserver.
#
#   CONSISTD_CP_NODE=1 hack/with-control-plane.sh hack/e2e-consistd.sh     (part of `make e2e`; root)
#
# Needs target/images/{consistd,pause,busybox}.tar (hack/image.sh consistd pause busybox). Starts the node
# (hack/node.sh), applies manifests/injector through the overlay hack/e2e/injector (local image, one replica),
# waits until the injector has published its caBundle, then applies hack/e2e/app.yaml with manifests/base's
# ServiceAccount and RBAC in a fresh namespace and checks that every replica runs the injected native sidecar,
# Ready, and that `consistd status` inside it reports the apiserver reachable through the `kubernetes`
# Service. Stops the node and checks the host is as it was. Prints timings.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cp_state=${CONSISTD_CP_DIR:-$repo/target/control-plane}
node=$repo/hack/node.sh
out=$repo/target/e2e-consistd
ns=e2e-consistd-$$

log() { printf 'e2e-consistd: %s\n' "$*" >&2; }
die() {
  log "FAIL: $*"
  [ -z "${KUBECTL:-}" ] || {
    "$KUBECTL" get pods -A -o wide >&2 || true
    "$KUBECTL" -n consistd-system logs deployment/consistd-injector --tail=30 >&2 || true
    "$KUBECTL" -n "$ns" get events --sort-by=.lastTimestamp >&2 || true
  }
  exit 1
}
ms() { date +%s%3N; }

[ -f "$cp_state/node-mode" ] ||
  die "the control plane was started without CONSISTD_CP_NODE=1; run: CONSISTD_CP_NODE=1 hack/with-control-plane.sh $0"
for i in consistd pause busybox; do
  [ -f "$repo/target/images/$i.tar" ] || die "target/images/$i.tar is missing: hack/image.sh consistd pause busybox"
done

mkdir -p "$out"
"$node" prepare
"$repo/hack/host-snapshot.sh" >"$out/host.before"
trap '"$node" stop' EXIT
"$node" start
eval "$("$node" env)"
k() { "$KUBECTL" "$@"; }

# 1. The injector, in the cluster, from its image.
t=$(ms)
k apply -k "$repo/hack/e2e/injector" >/dev/null
k -n consistd-system rollout status deployment/consistd-injector --timeout=120s >/dev/null ||
  die "the injector did not become available"
bundle=
for _ in $(seq 1 150); do
  bundle=$(k get mutatingwebhookconfiguration consistd-injector -o jsonpath='{.webhooks[0].clientConfig.caBundle}')
  [ -n "$bundle" ] && break
  sleep 0.2
done
[ -n "$bundle" ] || die "the injector never published its caBundle"
log "injector Ready and caBundle published $(($(ms) - t)) ms after kubectl apply"

# 2. A labelled Deployment with manifests/base's ServiceAccount and RBAC.
k create namespace "$ns" >/dev/null
for _ in $(seq 1 100); do k -n "$ns" get serviceaccount default >/dev/null 2>&1 && break; sleep 0.2; done
k -n "$ns" apply -f "$repo/manifests/base/serviceaccount.yaml" -f "$repo/manifests/base/rbac.yaml" >/dev/null
t=$(ms)
k -n "$ns" apply -f "$repo/hack/e2e/app.yaml" >/dev/null
k -n "$ns" rollout status deployment/app --timeout=180s >/dev/null || die "the app's pods did not become Ready"
log "3 replicas with the injected sidecar Ready $(($(ms) - t)) ms after kubectl apply"

pods=$(k -n "$ns" get pods -l app.kubernetes.io/name=e2e-app -o jsonpath='{.items[*].metadata.name}')
[ "$(wc -w <<<"$pods")" = 3 ] || die "expected 3 pods, got: $pods"
for pod in $pods; do
  get() { k -n "$ns" get pod "$pod" -o jsonpath="$1"; }
  [ "$(get '{.spec.initContainers[0].name}')" = consistd ] || die "$pod has no consistd sidecar"
  [ "$(get '{.spec.initContainers[0].restartPolicy}')" = Always ] || die "$pod: the sidecar is not a native sidecar"
  [ "$(get '{.metadata.annotations.consistd\.io/status}')" = injected ] || die "$pod: no consistd.io/status"
  [ "$(get '{.status.initContainerStatuses[0].ready}')" = true ] || die "$pod: the sidecar is not Ready"
  status=$(k -n "$ns" exec "$pod" -c consistd -- /consistd status) || die "$pod: consistd status failed: $status"
  grep -q "reachable" <<<"$status" || die "$pod: the apiserver is not reachable from the sidecar: $status"
done
log "every replica runs consistd as an injected native sidecar; consistd status in each: ready, apiserver reachable"
k -n "$ns" exec "${pods%% *}" -c consistd -- /consistd status >&2

# 3. Clean up, and leave the host as it was.
k delete namespace "$ns" --wait=true --timeout=120s >/dev/null
k delete -k "$repo/hack/e2e/injector" --wait=true --timeout=120s >/dev/null
trap - EXIT
"$node" stop
"$repo/hack/host-snapshot.sh" >"$out/host.after"
diff -u "$out/host.before" "$out/host.after" >&2 || die "the host differs from before the node started"
log "PASS: host restored"
