#!/usr/bin/env bash
# End-to-end test of hack/node.sh: two real nodes run a Deployment across both and a native-sidecar pod, then leave the host as it was.
#
#   CONSISTD_CP_NODE=1 hack/with-control-plane.sh hack/test-node.sh     (what `make e2e` runs; root)
#
# First starts a node from another state directory, runs a pod on it and SIGKILLs every node process (a
# run cut off), so that the real start has to put that node's host changes back. Then starts the node, waits for it Ready, runs a Deployment of 2 busybox replicas behind a Service (its
# ReplicaSet and EndpointSlice must appear) and a pod whose native sidecar (an init container with
# restartPolicy: Always) has passed its startup probe before the app starts; the app finds its ServiceAccount token and reaches the
# apiserver through the `kubernetes` Service IP, and that token authenticates there as the pod's account. Then stops the node, stops it again, and compares
# the host (hack/host-snapshot.sh) with how it was before. Needs target/images/{pause,busybox}.tar
# (hack/image.sh pause busybox). Prints timings.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cp_state=${CONSISTD_CP_DIR:-$repo/target/control-plane}
node=$repo/hack/node.sh
out=$repo/target/test-node
ns=node-test-$$

log() { printf 'test-node: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
ms() { date +%s%3N; }

[ -f "$cp_state/node-mode" ] ||
  die "the control plane was started without CONSISTD_CP_NODE=1 (pods would get no ServiceAccount); run: CONSISTD_CP_NODE=1 hack/with-control-plane.sh hack/test-node.sh"
for i in pause busybox; do
  [ -f "$repo/target/images/$i.tar" ] || die "target/images/$i.tar is missing: hack/image.sh pause busybox"
done

mkdir -p "$out"
"$node" prepare # packages and binaries first, so that installing them is not counted as a host change
"$repo/hack/host-snapshot.sh" >"$out/host.before"
k() { "$KUBECTL" -n "$ns" "$@"; }
serviceaccount() { # the controller-manager's serviceaccount controller makes `default`; admission needs it
  for _ in $(seq 1 100); do k get serviceaccount default >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "no ServiceAccount default in $ns"
}

# First a node whose run is killed, as a CI job cut off mid-run is: from another state directory, with a
# pod running, every node process SIGKILLed and its host changes left in place. The next start must find
# them and put them back before it starts its own node.
killed=$out/killed-node
trap 'CONSISTD_NODE_DIR=$killed "$node" stop; "$node" stop' EXIT
CONSISTD_NODE_DIR=$killed "$node" start
eval "$(CONSISTD_NODE_DIR=$killed "$node" env)"
k create namespace "$ns" >/dev/null
serviceaccount
k run left-behind --image localhost/busybox:local --image-pull-policy Never --restart Never \
  --overrides '{"spec": {"terminationGracePeriodSeconds": 1}}' -- sleep 3600 >/dev/null
k wait pod/left-behind --for condition=Ready --timeout 60s >/dev/null || die "the pod on the node to be killed is not Ready"
for f in "$killed"/*.pid "$killed"/*/kubelet.pid "$killed"/*/containerd.pid; do
  pid=$(cat "$f")
  kill -9 "$pid"
  # Gone, or a zombie nobody reaps (the script that started it has exited).
  for _ in $(seq 1 100); do case $(ps -o stat= -p "$pid" || echo Z) in Z*) break ;; esac; sleep 0.1; done
done
ip link show cnlink >/dev/null 2>&1 || die "the killed nodes' link is gone already; the test kills nothing"
log "killed the node started from $killed with its pod running"

t=$(ms)
"$node" start
trap '"$node" stop' EXIT
log "nodes Ready $(($(ms) - t)) ms after hack/node.sh start, the killed nodes' host changes put back first"
eval "$("$node" env)"
k delete pod left-behind --grace-period 1 --wait=false >/dev/null

t_deploy=$(ms)
k apply -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: sleepers}
spec:
  replicas: 2
  selector: {matchLabels: {app: sleepers}}
  template:
    metadata: {labels: {app: sleepers}}
    spec:
      terminationGracePeriodSeconds: 1
      # One on each node.
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
         labelSelector: {matchLabels: {app: sleepers}}}
      containers:
      - name: sleep
        image: localhost/busybox:local
        imagePullPolicy: Never
        command: [sh, -c, 'mkdir -p /tmp/w && hostname >/tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w']
---
apiVersion: v1
kind: Service
metadata: {name: sleepers}
spec:
  selector: {app: sleepers}
  ports: [{port: 80}]
YAML

t=$(ms)
k apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: sidecar}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: shared, emptyDir: {}}]
  initContainers:
  - name: side
    image: localhost/busybox:local
    imagePullPolicy: Never
    restartPolicy: Always
    command: [sh, -c, 'sleep 1; touch /shared/side-ready; exec sleep 3600']
    # The app starts once the sidecar's startup probe passes (readiness only gates the pod's Ready).
    startupProbe: {exec: {command: [test, -f, /shared/side-ready]}, periodSeconds: 1}
    readinessProbe: {exec: {command: [test, -f, /shared/side-ready]}, periodSeconds: 1}
    volumeMounts: [{name: shared, mountPath: /shared}]
  containers:
  - name: app
    image: localhost/busybox:local
    imagePullPolicy: Never
    volumeMounts: [{name: shared, mountPath: /shared}]
    readinessProbe: {exec: {command: [test, -f, /tmp/ok]}, periodSeconds: 1}
    command:
    - sh
    - -c
    - |
      set -e
      sa=/var/run/secrets/kubernetes.io/serviceaccount
      test -f /shared/side-ready && echo "sidecar had started before the app"
      test -s $sa/token && test -s $sa/ca.crt && echo "token for namespace $(cat $sa/namespace)"
      # busybox's own TLS cannot talk to a Go 1.26 server (handshake_failure, alert 40), so plain HTTP to the
      # TLS port: the answer is the apiserver's own. The token is checked with TLS from the test itself.
      printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT |
        grep -q 'Client sent an HTTP request to an HTTPS server' &&
        echo "apiserver answered at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
      touch /tmp/ok
      exec sleep 3600
YAML
k wait --for=condition=Ready pod/sidecar --timeout=120s >/dev/null || {
  k describe pod sidecar >&2
  k logs sidecar -c app >&2 || true
  die "the native-sidecar pod did not get Ready"
}
log "native-sidecar pod Ready $(($(ms) - t)) ms after create"
logs=$(k logs sidecar -c app)
printf '%s\n' "$logs" | sed 's/^/  app: /' >&2
grep -q "sidecar had started before the app" <<<"$logs" || die "the app started before its sidecar's startup probe passed"
grep -qF "apiserver answered at 10.96.0.1:443" <<<"$logs" || die "the app did not reach the apiserver through the kubernetes Service"
# The pod's token, used through the Service IP with TLS verified against the cluster CA (from the host:
# the OUTPUT twin of the pods' DNAT rule), must authenticate as the pod's ServiceAccount.
token=$(k exec sidecar -c app -- cat /var/run/secrets/kubernetes.io/serviceaccount/token)
user=$(curl -sf --cacert "$cp_state/pki/ca.crt" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
  -d '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' \
  https://10.96.0.1/apis/authentication.k8s.io/v1/selfsubjectreviews | sed -n 's/.*"username": *"\([^"]*\)".*/\1/p') ||
  die "the pod's token did not authenticate at https://10.96.0.1"
[ "$user" = "system:serviceaccount:$ns:default" ] || die "the pod's token is for '$user'"
log "the pod's token authenticates as $user at https://10.96.0.1 (certificate verified)"

k rollout status deployment/sleepers --timeout=120s >/dev/null || { k get pods -o wide >&2; die "Deployment not available"; }
log "Deployment 2/2 available $(($(ms) - t_deploy)) ms after create"
rs=$(k get replicasets -l app=sleepers -o jsonpath='{.items[*].metadata.ownerReferences[0].name}')
[ "$rs" = sleepers ] || die "no ReplicaSet owned by Deployment sleepers (got '$rs')"
ready=""
for _ in $(seq 1 50); do
  ready=$(k get endpointslices -l kubernetes.io/service-name=sleepers \
    -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{" "}{end}')
  [ "$(wc -w <<<"$ready")" = 2 ] && break
  sleep 0.2
done
[ "$(wc -w <<<"$ready")" = 2 ] || die "EndpointSlice for Service sleepers lists '$ready', not 2 ready pods"
log "ReplicaSet and EndpointSlice present: ready endpoints $ready"
# One replica on each node, and the pod network routed between them: the sidecar pod (on one node) and the
# host reach each replica by its pod IP, and each answers with its own name.
nodes=$(k get pods -l app=sleepers -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | xargs)
[ "$nodes" = "$CONSISTD_NODE_NAMES" ] || die "the Deployment's replicas run on '$nodes', not one on each of $CONSISTD_NODE_NAMES"
here=$(k get pod sidecar -o jsonpath='{.spec.nodeName}')
for pod in $(k get pods -l app=sleepers -o name); do
  ip=$(k get "$pod" -o jsonpath='{.status.podIP}') name=${pod#pod/}
  answer=$(k exec sidecar -c app -- sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 $ip 8080 | tail -1") || true
  [ "$answer" = "$name" ] || die "$name ($ip, on $(k get "$pod" -o jsonpath='{.spec.nodeName}')) answered '$answer' to the pod on $here"
  answer=$(curl -sf -m 5 "http://$ip:8080/") || true
  [ "$answer" = "$name" ] || die "$name ($ip) answered '$answer' to the host"
done
log "one replica on each node ($nodes); each reached by its pod IP from the pod on $here and from the host"

t=$(ms)
k delete pod sidecar --wait=true >/dev/null
log "native-sidecar pod deleted and gone in $(($(ms) - t)) ms"
# While the controller-manager still runs, or the namespace would stay Terminating in the control plane.
t=$(ms)
"$KUBECTL" delete namespace "$ns" --timeout=60s >/dev/null || die "namespace $ns was not deleted"
log "namespace deleted (Deployment's pods gone) in $(($(ms) - t)) ms"

trap - EXIT
t=$(ms)
"$node" stop
log "nodes stopped in $(($(ms) - t)) ms"
"$node" stop # idempotent
"$repo/hack/host-snapshot.sh" >"$out/host.after"
if ! diff -u "$out/host.before" "$out/host.after" >"$out/host.diff"; then
  cat "$out/host.diff" >&2
  die "the host is not as it was before the nodes started (diff above; $out/host.diff)"
fi
log "PASS: host restored (sysctls, links, routes, iptables, mounts, cgroups, /etc/hosts, netns as before)"
