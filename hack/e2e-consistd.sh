#!/usr/bin/env bash
# End-to-end test of consistd in pods on two real nodes (hack/node.sh), the way a cluster runs it:
#
#   CONSISTD_CP_NODE=1 hack/with-control-plane.sh hack/e2e-consistd.sh     (part of `make e2e`; root)
#
#  1. The injector runs in the cluster from its image (manifests/injector through the overlay
#     hack/e2e/injector: local image, one replica) and publishes its caBundle.
#  2. hack/e2e/app.yaml, the Python example operator (examples/crd.yaml's Greetings, examples/rbac.yaml's Role) as a
#     3-replica Deployment over both nodes, taken through the README's
#     walkthrough (its "Run it in a cluster" blocks, run as printed): every pod runs the injected native
#     sidecar, Ready, and `consistd status` in it reports the apiserver reachable through the `kubernetes`
#     Service. hack/e2e/plain-app.yaml, a busybox container that only needs the socket, takes the same app
#     block in a namespace of its own.
#  3. Exactly one replica leads (the Lease names it), publishes the Greeting once (its ConfigMap applied by a
#     guarded write, Ready set), and its ACK-tracked notification to the headless Service reaches every
#     replica's receiver and is ACKed.
#  4. `kubectl apply` of a changed ConfigMap (an election added) reaches every running sidecar, which
#     applies it without a restart (time printed: kubelet's sync period).
#  5. `kubectl delete pod` of the leader: its app gets SIGTERM before the sidecar, the Lease is released,
#     another replica leads (handover time printed).
#  6. A version published on the rollout channel reaches every replica; `kubectl rollout restart`; the new
#     replicas catch up, and the barrier (Publish, WaitApplied) completes across exactly the 3 new pods.
#     Through the same restart, the example's `sharded` container in each replica works on its share of 24
#     ConfigMaps in one sharded queue while they change: every change handled, by old and new replicas, and
#     the audit of every pass (hack/e2e/shard_audit.py) finds no moment two pods held one key.
#  7. SIGKILL of one sidecar while its pod's app sends: kubelet restarts the sidecar, every message whose
#     Send returned reaches every replica, and no app container restarted (the SDK's loops outlive it).
#  8. Node faults (hack/e2e/faults.sh): the leader's node powered off (frozen, link down) and on again, and
#     while it is off a lost replica's pod IP given to a new pod on the other node, which takes and ACKs none
#     of its messages; the link between the nodes cut, then the leader's node cut from the apiserver, then
#     healed. In each: who leads next and when, no two LEADERs, every stored message delivered to every
#     replica exactly once.
#     Then the Greeting deleted: the leader's finalize pass deletes its ConfigMap, and the Greeting goes.
#  9. The Helm path: the README's `helm install --wait` with the local image, a plain busybox app through the
#     README's app block (as after step 1 with the kustomize injector), and `helm uninstall`, which leaves
#     only what the README says it leaves.
# Then stops the nodes and checks the host is as it was. Needs target/images/{consistd,example-python,pause,
# busybox}.tar (hack/image.sh consistd example-python pause busybox) and helm (hack/tools.sh helm). Prints timings.
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
    rm -rf "$out/logs" && mkdir -p "$out/logs"
    for pod in $("$KUBECTL" -n "$ns" get pods -o name 2>/dev/null); do
      for c in consistd controller receiver member; do
        echo "--- $pod $c (whole log: $out/logs/${pod#pod/}.$c.log)" >&2
        "$KUBECTL" -n "$ns" logs "$pod" -c "$c" >"$out/logs/${pod#pod/}.$c.log" 2>&1 || true
        tail -n 15 "$out/logs/${pod#pod/}.$c.log" >&2
        "$KUBECTL" -n "$ns" logs "$pod" -c "$c" --previous >"$out/logs/${pod#pod/}.$c.previous.log" 2>/dev/null ||
          rm -f "$out/logs/${pod#pod/}.$c.previous.log"
      done
    done
  }
  log "FAIL: $*" # again, last: CI shows the end of the output
  exit 1
}
ms() { date +%s%3N; }
# The README's "Run it in a cluster" blocks the walkthroughs run, by their place in the section.
KUSTOMIZE_BLOCK=1 HELM_BLOCK=2 APP_BLOCK=3
# readme_block N: the Nth ```sh block of the README's "Run it in a cluster" section, as printed.
readme_block() {
  awk -v want="$1" '/^## / { section = /^## Run it in a cluster/ } section && /^```sh/ { if (++n == want) { block = 1; next } }
    block && /^```/ { exit } block' "$repo/README.md"
}
# walkthrough NAME NS BLOCK...: runs those README blocks as a user would, literally but for three things: the
# app's namespace is NS, the image is the locally built one (REGISTRY/consistd -> localhost/consistd), and
# kustomize takes the overlay that uses it (manifests/injector -> hack/e2e/injector). Script and log in
# $out/NAME.{sh,log}; dies with the log's end if a command fails.
walkthrough() {
  local name=$1 namespace=$2 block
  shift 2
  {
    # shellcheck disable=SC2016 # expanded by the walkthrough's shell
    printf '%s\n' 'kubectl() { "$KUBECTL" "$@"; }' 'helm() { "$HELM" "$@"; }'
    for block in "$@"; do
      grep -q . <<<"$(readme_block "$block")" || die "README.md has no block $block in \"Run it in a cluster\""
      readme_block "$block"
    done
  } | sed -e "s/-n my-app/-n $namespace/g" -e 's|manifests/injector|hack/e2e/injector|' \
    -e 's|REGISTRY/consistd|localhost/consistd|g' >"$out/$name.sh"
  mkdir -p "$out/tmp" # the walkthrough's mktemp -d (the peer certificates) lands here, not in /tmp
  (cd "$repo" && TMPDIR=$out/tmp timeout 300 bash -ex "$out/$name.sh") >"$out/$name.log" 2>&1 ||
    die "the README's walkthrough ($name) failed: $(tail -8 "$out/$name.log")"
}
# plain_app NAME: a namespace with the plain app (hack/e2e/plain-app.yaml) taken through the README's app
# block; checks its container found the injected sidecar's socket and that consistd status in it is ready.
plain_app() {
  local namespace=$ns-$1
  k create namespace "$namespace" >/dev/null
  k -n "$namespace" apply -f "$repo/hack/e2e/plain-app.yaml" >/dev/null
  walkthrough "plain-$1" "$namespace" "$APP_BLOCK"
  socket() { grep -qx 'socket /var/run/consistd/consistd.sock' <<<"$(k -n "$namespace" logs deployment/my-app -c app 2>/dev/null)"; }
  wait_until 60 "the plain app ($1) never saw the sidecar's socket" socket
  grep -q '^consistd .*: ready$' "$out/plain-$1.log" || die "consistd status in the plain app's sidecar ($1) did not say ready"
  k delete namespace "$namespace" --wait=true --timeout=120s >/dev/null
}

[ -f "$cp_state/node-mode" ] ||
  die "the control plane was started without CONSISTD_CP_NODE=1; run: CONSISTD_CP_NODE=1 hack/with-control-plane.sh $0"
for i in consistd example-python pause busybox; do
  [ -f "$repo/target/images/$i.tar" ] || die "target/images/$i.tar is missing: hack/image.sh consistd example-python pause busybox"
done

mkdir -p "$out"
(cd "$repo" && cargo build -q -p kubectl-consistd) || die "building kubectl-consistd failed"
plugin=${CARGO_TARGET_DIR:-$repo/target}/debug/kubectl-consistd
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

# 2. The Python example operator, labelled for injection by the README's walkthrough ("Run it in a
#    cluster"), run as written: its namespace is ours and the injector is the local-image overlay. The
#    walkthrough applies manifests/base's config, ServiceAccount and RBAC, and makes the peers' mutual-TLS
#    Secret that the config names. A plain app in a namespace of its own takes the same walkthrough.
k create namespace "$ns" >/dev/null
for _ in $(seq 1 100); do k -n "$ns" get serviceaccount default >/dev/null 2>&1 && break; sleep 0.2; done
k -n "$ns" create configmap e2e-pod --from-file=pod.py="$repo/hack/e2e/pod.py" >/dev/null
# The operator's custom resource, and what its writes need beside consistd's own Role (examples/README.md).
k apply -f "$repo/examples/crd.yaml" >/dev/null
k wait --for=condition=Established --timeout=60s crd/greetings.example.consistd.io >/dev/null
k -n "$ns" apply -f "$repo/examples/rbac.yaml" -f "$repo/hack/e2e/app.yaml" >/dev/null
t=$(ms)
walkthrough kustomize "$ns" "$KUSTOMIZE_BLOCK" "$APP_BLOCK"
log "the README's walkthrough injected the sidecar; 3 replicas Ready $(($(ms) - t)) ms after it started"

kn() { k -n "$ns" "$@"; }
# The app's running pods that are not being deleted, space-separated.
pods() { kn get pods -l app.kubernetes.io/name=e2e-app --field-selector=status.phase=Running \
  -o go-template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}} {{end}}{{end}}' | xargs; }
nanos() { date -d "$1" +%s%N; } # an RFC 3339 timestamp of kubectl logs --timestamps, in ns
logs() { kn logs "$1" -c "$2" 2>/dev/null || true; }
# poll SECONDS COMMAND...: runs COMMAND every 0.2 s until it succeeds (status 0) or SECONDS pass (1).
poll() {
  local secs=$1 i
  shift
  for i in $(seq 1 $((secs * 5))); do "$@" && return 0; sleep 0.2; done
  return 1
}
# wait_until SECONDS WHAT COMMAND...: polls COMMAND; dies saying WHAT if it never succeeds.
wait_until() {
  local secs=$1 what=$2
  shift 2
  poll "$secs" "$@" || die "$what (after ${secs} s)"
}
# Every replica's sidecar fences guarded writes at the apiserver: the walkthrough installed the policy, and
# the base Role lets the sidecar impersonate its own ServiceAccount.
fenced() {
  local status
  status=$(kn exec "$1" -c consistd -- consistd status 2>/dev/null) &&
    grep -q 'guarded writes are fenced at the apiserver' <<<"$status"
}
for pod in $(pods); do
  wait_until 90 "$pod's sidecar does not fence guarded writes at the apiserver" fenced "$pod"
done
log "every replica's sidecar fences guarded writes at the apiserver (consistd status)"
# app_never_restarted POD: dies if an app container of POD restarted (the app's loops must outlive a
# sidecar restart), with the end of its previous run's log.
app_never_restarted() {
  local status name count
  for status in $(kn get pod "$1" -o jsonpath='{range .status.containerStatuses[*]}{.name}={.restartCount} {end}'); do
    name=${status%=*} count=${status#*=}
    [ "$count" = 0 ] ||
      die "$1's $name container restarted $count times; its previous run ended: $(kn logs "$1" -c "$name" --previous --tail=8 2>&1)"
  done
}
holder() { kn get lease greeting-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true; }

pods=$(pods)
[ "$(wc -w <<<"$pods")" = 3 ] || die "expected 3 pods, got: $pods"
for pod in $pods; do
  get() { kn get pod "$pod" -o jsonpath="$1"; }
  [ "$(get '{.spec.initContainers[0].name}')" = consistd ] || die "$pod has no consistd sidecar"
  [ "$(get '{.spec.initContainers[0].restartPolicy}')" = Always ] || die "$pod: the sidecar is not a native sidecar"
  [ "$(get '{.metadata.annotations.consistd\.io/status}')" = injected ] || die "$pod: no consistd.io/status"
  [ "$(get '{.status.initContainerStatuses[0].ready}')" = true ] || die "$pod: the sidecar is not Ready"
  status=$(kn exec "$pod" -c consistd -- consistd status) || die "$pod: consistd status failed: $status"
  grep -q "reachable" <<<"$status" || die "$pod: the apiserver is not reachable from the sidecar: $status"
done
log "every replica runs consistd as an injected native sidecar; consistd status in each: ready, apiserver reachable"
# spread: the replicas of PODS run on every node.
node_of() { kn get pod "$1" -o jsonpath='{.spec.nodeName}'; }
spread() {
  local on
  on=$(for pod in $1; do node_of "$pod"; echo; done | sort -u | xargs)
  [ "$on" = "$CONSISTD_NODE_NAMES" ] || die "the replicas $1 run on '$on', not on every node ($CONSISTD_NODE_NAMES)"
  echo "$on"
}
log "the replicas run on both nodes ($(spread "$pods"))"

plain_app kustomize
log "the README's app block on a plain container (busybox, the socket only): injected, the socket there, consistd status ready"

# 3. One leader, one guarded write, one notification to every replica, ACKed.
leader_is_a_pod() { local h; h=$(holder); [ -n "$h" ] && grep -qw -- "$h" <<<"$pods"; }
wait_until 60 "no replica leads greeting-operator" leader_is_a_pod
leader=$(holder)
notified() { grep -q '^notified service/app-peers ACKED ' <<<"$(logs "$leader" controller)"; }
wait_until 60 "the leader $leader did not report its notification ACKed" notified
leaders=0
for pod in $pods; do
  leaders=$((leaders + $(logs "$pod" controller | grep -c '^leadership LEADER ' || true)))
  if [ "$pod" != "$leader" ]; then
    follows() { grep -q "^leadership FOLLOWER holder=$leader " <<<"$(logs "$pod" controller)"; }
    wait_until 30 "$pod does not report FOLLOWER of $leader" follows
  fi
done
[ "$leaders" = 1 ] || die "$leaders replicas reported LEADER, expected exactly 1 ($leader)"
grep -q "^published $ns/hello generation=1 configmap=hello " <<<"$(logs "$leader" controller)" ||
  die "the leader did not publish the Greeting hello"
for pod in $pods; do
  got() { grep -q "^received greetings/$ns/hello " <<<"$(logs "$pod" receiver)"; }
  wait_until 30 "$pod's receiver got no notification" got
done
sleep 2 # time for a second, wrong write to show
[ "$(for pod in $pods; do logs "$pod" controller; done | grep -c '^published ')" = 1 ] ||
  die "expected exactly one guarded write across the replicas"
message=$(kn get configmap hello -o jsonpath='{.data.message}')
[ "$message" = "hello, world" ] || die "the Greeting's ConfigMap does not hold its message: '$message'"
ready() { [ "$(kn get greeting hello -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].observedGeneration}')" = True/1 ]; }
wait_until 30 "the Greeting is not Ready with observedGeneration 1" ready
# kubelet probes GET /readyz on the admin port; Prometheus scrapes /metrics there, with the leader gauge.
for pod in $pods; do
  [ "$(kn get pod "$pod" -o jsonpath='{.spec.initContainers[0].readinessProbe.httpGet.port}')" = consistd-admin ] ||
    die "$pod: the sidecar's readiness probe is not an httpGet of the admin port"
  ip=$(kn get pod "$pod" -o jsonpath='{.status.podIP}')
  want=0 && [ "$pod" != "$leader" ] || want=1
  # The sidecar runs the election (and has its gauge) once its app campaigns: a follower's app may
  # still be starting when the leader has written.
  campaigning() { grep -qE '^leadership (LEADER|FOLLOWER) ' <<<"$(logs "$pod" controller)"; }
  wait_until 60 "$pod's controller never saw who leads" campaigning
  gauge="consistd_leader_election_master_status{election=\"$ns/greeting-operator\"} $want"
  # Read whole before grep: under pipefail, `curl | grep -q` fails when grep stops reading at its match while
  # curl still writes (a scrape larger than the pipe's buffer), and that failure reads as a missing gauge.
  scrape=$(curl -sf "http://$ip:7071/metrics") || die "$pod ($ip:7071/metrics) did not answer"
  grep -qF "$gauge" <<<"$scrape" || die "$pod ($ip:7071/metrics) does not say $gauge"
done
log "exactly one leader ($leader): one guarded write (the Greeting published, Ready), its notification received by all 3 replicas through service/app-peers and ACKed; /metrics on each pod's port 7071 says who leads"
# kubectl consistd says the same from the cluster: who leads (Leases), and the leader's outbox, read from its
# sidecar's admin port through the apiserver's pod proxy: every replica reached, nothing left un-ACKed.
"$plugin" elections -n "$ns" -o json >"$out/elections.json" || die "kubectl consistd elections failed"
python3 -c 'import json, sys
rows = {r["election"]: r for r in json.load(open(sys.argv[1]))}
assert rows["greeting-operator"]["holder"] == sys.argv[2], rows' "$out/elections.json" "$leader" ||
  die "kubectl consistd elections does not name $leader: $(cat "$out/elections.json")"
"$plugin" outbox "$leader" -n "$ns" -o json >"$out/outbox.json" 2>&1 ||
  die "kubectl consistd outbox $leader failed: $(cat "$out/outbox.json")"
python3 -c 'import json, sys
report = json.load(open(sys.argv[1]))
peers = [p for p in report["peers"] if p["destination"] == "service " + sys.argv[2] + "/app-peers"]
assert len(peers) == 3 and all(p["pending"] == 0 for p in peers), report' "$out/outbox.json" "$ns" ||
  die "kubectl consistd outbox $leader: not 3 peers with nothing pending: $(cat "$out/outbox.json")"
# Each controller works on the queue greeting-operator, which hands out work only on the leader's sidecar.
queue_shown() { # POD ACTIVE: kubectl consistd queues POD shows the controller's queue, attached, ACTIVE
  "$plugin" queues "$1" -n "$ns" -o json >"$out/queues.json" 2>&1 && python3 -c 'import json, sys
queues = {q["name"]: q for q in json.load(open(sys.argv[1]))["queues"]}
queue = queues.get("greeting-operator", {})
sys.exit(not (queue.get("streams") == 1 and queue.get("keys", 0) >= 1 and str(queue.get("active")) == sys.argv[2]))' \
    "$out/queues.json" "$2"
}
for pod in $pods; do
  want=False && [ "$pod" != "$leader" ] || want=True
  poll 30 queue_shown "$pod" "$want" ||
    die "kubectl consistd queues $pod: not the controller's queue with active=$want: $(cat "$out/queues.json")"
done
log "kubectl consistd: elections names $leader; outbox $leader (through the pod proxy) shows 3 peers of service/app-peers, nothing un-ACKed; queues shows each controller's queue, handing out work only on $leader"

# 4. `kubectl apply` of a changed ConfigMap reaches every running sidecar (kubelet refreshes the mounted file
#    within its sync period): the election it adds is campaigned in without a restart.
{ cat "$repo/manifests/base/configmap.yaml"; printf '    elections:\n      - name: e2e-reload\n'; } >"$out/configmap.yaml"
t=$(ms)
kn apply -f "$out/configmap.yaml" >/dev/null
applied() {
  local pod
  for pod in $pods; do grep '"applied config change"' <<<"$(logs "$pod" consistd)" | grep elections >/dev/null || return 1; done
}
wait_until 180 "the changed ConfigMap did not reach every sidecar" applied
reload=$(($(ms) - t))
reload_holder=$(kn get lease e2e-reload -o jsonpath='{.spec.holderIdentity}')
grep -qw -- "$reload_holder" <<<"$pods" || die "nobody holds the Lease of the election the reload added: '$reload_holder'"
for pod in $pods; do
  [ "$(kn get pod "$pod" -o jsonpath='{.status.initContainerStatuses[0].restartCount}')" = 0 ] ||
    die "$pod: the sidecar restarted instead of reloading"
  status=$(kn exec "$pod" -c consistd -- consistd status) && grep -q 'consistd.yaml (applied' <<<"$status" ||
    die "$pod: consistd status does not show the config applied"
done
log "kubectl apply of a changed ConfigMap: applied by all 3 sidecars without a restart $reload ms later (kubelet's sync period); $reload_holder leads the added election"

# 5. Deleting the leader's pod: SIGTERM reaches the app before the sidecar, the Lease is released, another leads.
mkdir -p "$out/handover"
timeout 60 "$KUBECTL" -n "$ns" logs -f --timestamps "$leader" -c controller >"$out/handover/controller.log" 2>&1 &
follow_app=$!
timeout 60 "$KUBECTL" -n "$ns" logs -f --timestamps "$leader" -c consistd >"$out/handover/consistd.log" 2>&1 &
follow_sidecar=$!
kn get lease greeting-operator --watch \
  -o jsonpath='{.spec.holderIdentity}{"|"}{.spec.leaseDurationSeconds}{"\n"}' >"$out/handover/lease.log" 2>&1 &
watch_lease=$!
sleep 1 # the followers and the watch are attached
t=$(ms)
kn delete pod "$leader" --wait=false >/dev/null
new_leader() { local h; h=$(holder); [ -n "$h" ] && [ "$h" != "$leader" ]; }
wait_until 60 "no other replica took over from $leader" new_leader
handover=$(($(ms) - t))
successor=$(holder)
wait "$follow_app" "$follow_sidecar" || true
kill "$watch_lease" 2>/dev/null || true
sigterm_app=$(grep -m1 ' stopping on SIGTERM' "$out/handover/controller.log" | cut -d' ' -f1)
sigterm_sidecar=$(grep -m1 '"shutting down"' "$out/handover/consistd.log" | cut -d' ' -f1)
[ -n "$sigterm_app" ] || die "the leader's app never got SIGTERM: $(tail -3 "$out/handover/controller.log")"
[ -n "$sigterm_sidecar" ] || die "the leader's sidecar never shut down: $(tail -3 "$out/handover/consistd.log")"
[ "$(nanos "$sigterm_app")" -lt "$(nanos "$sigterm_sidecar")" ] ||
  die "the sidecar got SIGTERM ($sigterm_sidecar) before the app ($sigterm_app)"
grep -q '"released leadership"' "$out/handover/consistd.log" || die "the leader's sidecar did not release the Lease"
grep -q '^|1$' "$out/handover/lease.log" || die "the Lease was never seen released (no holder): $(cat "$out/handover/lease.log")"
log "leader pod deleted: app SIGTERM at $sigterm_app, sidecar at $sigterm_sidecar; Lease released; $successor leads $handover ms after kubectl delete"

# 6. The barrier: a version reaches every replica, survives `kubectl rollout restart`, and the next one is
#    applied by exactly the 3 new pods.
kn rollout status deployment/my-app --timeout=120s >/dev/null || die "the replacement of $leader did not become Ready"
# publish POD PAYLOAD [SECONDS]: POD's member publishes PAYLOAD on app-config and waits SECONDS (60) for its barrier.
publish() { kn exec "$1" -c member -- /usr/local/bin/python3 /e2e/pod.py publish app-config "$2" "${3:-60}"; }
sorted() { tr ' ' '\n' <<<"$1" | grep . | sort | xargs; }
# The channel's members are the replicas whose member Lease (labelled with the channel) is held.
members_are_pods() {
  [ "$(sorted "$(kn get leases -l consistd.io/member-of=app-config -o jsonpath='{.items[*].spec.holderIdentity}')")" = \
    "$(sorted "$pods")" ]
}
pods=$(pods)
wait_until 30 "the rollout channel's member Leases are not the pods $pods" members_are_pods
first=$(publish "${pods%% *}" one) || die "the barrier of version one did not complete: $first"
members=$(python3 -c 'import json,sys; print(" ".join(sorted(json.loads(sys.argv[1])["members"])))' "$first")
[ "$members" = "$(sorted "$pods")" ] || die "version one's members are $members, not the pods $pods"
v1=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["version"])' "$first")
# The sharded queue (issue 45): each replica's `sharded` container works on its share of 24 ConfigMaps, changed
# all through the rollout restart. Every pod's log of grants is kept from before its first pass to its end.
shards=24
mkdir -p "$out/sharded"
for i in $(seq 1 "$shards"); do
  printf -- '---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shard-%s\n  labels: {example.consistd.io/shard: "true"}\ndata: {k0: v}\n' "$i"
done | kn apply -f - >/dev/null
# shard_handled: every sharded ConfigMap's observed-keys annotation names its data keys.
shard_handled() {
  kn get configmaps -l example.consistd.io/shard=true -o json | python3 -c '
import json, sys
cms = json.load(sys.stdin)["items"]
behind = [c["metadata"]["name"] for c in cms
          if (c["metadata"].get("annotations") or {}).get("example.consistd.io/observed-keys") != ",".join(sorted(c.get("data") or {}))]
sys.exit(1 if behind or len(cms) != int(sys.argv[1]) else 0)' "$shards"
}
followers=
follow_sharded() {
  for pod in $1; do
    kn logs -f "$pod" -c sharded >"$out/sharded/$pod.log" 2>&1 &
    followers="$followers $!"
  done
}
follow_sharded "$pods"
wait_until 60 "the 3 replicas' sharded queue did not handle its $shards ConfigMaps" shard_handled
(for n in $(seq 1 60); do
  kn patch configmap "shard-$((n % shards + 1))" --type merge -p "{\"data\":{\"k$n\":\"v\"}}" >/dev/null 2>&1
  sleep 0.2
done) &
changer=$!
t=$(ms)
kn rollout restart deployment/my-app >/dev/null
kn rollout status deployment/my-app --timeout=180s >/dev/null || die "kubectl rollout restart did not complete"
old=$pods
pods=$(pods)
log "kubectl rollout restart: 3 new replicas Ready $(($(ms) - t)) ms after it, on both nodes ($(spread "$pods"))"
follow_sharded "$pods"
wait "$changer" || true
# One more change to each, for the new replicas alone.
for i in $(seq 1 "$shards"); do kn patch configmap "shard-$i" --type merge -p '{"data":{"after":"v"}}' >/dev/null; done
wait_until 90 "the sharded queue did not handle every change to its $shards ConfigMaps through the rollout restart" shard_handled
sleep 1
# shellcheck disable=SC2086 # the followers' PIDs, one word each
kill $followers 2>/dev/null || true
audit=$(python3 "$repo/hack/e2e/shard_audit.py" "$out/sharded") ||
  die "two pods held one key of the sharded queue through the rollout restart: $audit (logs in $out/sharded)"
served=$(python3 -c 'import json,sys; print(sum(1 for n in json.loads(sys.argv[1])["passes"].values() if n))' "$audit")
[ "$served" -ge 4 ] || die "the sharded queue's keys went to $served pods, not to old and new replicas both: $audit"
log "sharded queue through kubectl rollout restart: every change to its $shards ConfigMaps handled, never by two pods at once ($audit)"
for pod in $pods; do
  ! grep -qw -- "$pod" <<<"$old" || die "$pod survived the rollout restart"
  caught_up() { grep -q "^applied app-config $v1 one$" <<<"$(logs "$pod" member)"; }
  wait_until 30 "the new replica $pod did not catch up to version $v1" caught_up
done
wait_until 30 "the old replicas' member Leases were not removed: the members are not the new pods $pods" members_are_pods
t=$(ms)
second=$(publish "${pods##* }" two) || die "the barrier of version two did not complete: $second"
barrier=$(($(ms) - t))
members=$(python3 -c 'import json,sys; print(" ".join(sorted(json.loads(sys.argv[1])["members"])))' "$second")
[ "$members" = "$(sorted "$pods")" ] || die "version two's members are $members, not the new pods $pods"
log "rollout barrier: the new replicas caught up to version $v1; Publish + WaitApplied of the next across the 3 new pods: $barrier ms ($second)"
"$plugin" rollout status app-config -n "$ns" >"$out/rollout-status.txt" 2>&1 ||
  die "kubectl consistd rollout status app-config: exit $? after the barrier: $(cat "$out/rollout-status.txt")"
for pod in $pods; do grep -q "^$pod " "$out/rollout-status.txt" || die "kubectl consistd rollout status does not list $pod"; done
log "kubectl consistd rollout status app-config: exit 0, the 3 new pods applied the latest version"

# 7. SIGKILL of a sidecar while its app sends: kubelet restarts it, and every stored message reaches every replica.
sender=${pods%% *}
kn exec "$sender" -c member -- /usr/local/bin/python3 /e2e/pod.py burst app-peers 2000 k >"$out/burst.log" 2>&1 &
burst=$!
some_stored() { [ "$(grep -c '^stored ' "$out/burst.log" || true)" -ge 200 ]; }
wait_until 60 "the burst stored nothing: $(tail -3 "$out/burst.log")" some_stored
id=$(kn get pod "$sender" -o jsonpath='{.status.initContainerStatuses[?(@.name=="consistd")].containerID}')
received_at_kill=$(for pod in $pods; do logs "$pod" receiver; done | grep -c '^received burst/' || true)
"$node" ctr "$(node_of "$sender")" tasks kill -s SIGKILL "${id#containerd://}" >/dev/null ||
  die "could not SIGKILL the sidecar of $sender"
t=$(ms)
set +e
wait "$burst"
rc=$?
set -e
[ "$rc" = 0 ] || [ "$rc" = 3 ] || die "the burst failed (exit $rc): $(tail -3 "$out/burst.log")"
restarted() {
  [ "$(kn get pod "$sender" -o jsonpath='{.status.initContainerStatuses[?(@.name=="consistd")].restartCount}')" -ge 1 ] &&
    [ "$(kn get pod "$sender" -o jsonpath='{.status.initContainerStatuses[?(@.name=="consistd")].ready}')" = true ]
}
wait_until 60 "kubelet did not restart the killed sidecar of $sender" restarted
log "the killed sidecar of $sender restarted and Ready $(($(ms) - t)) ms after SIGKILL"
sed -n 's/^stored //p' "$out/burst.log" | sort >"$out/burst.stored"
stored=$(wc -l <"$out/burst.stored")
for pod in $pods; do
  everything() {
    app_never_restarted "$pod"
    logs "$pod" receiver | sed -n 's/^received \(burst\/[^ ]*\) .*/\1/p' | sort -u >"$out/burst.$pod"
    [ -z "$(comm -23 "$out/burst.stored" "$out/burst.$pod")" ]
  }
  poll 90 everything || die "$pod's receiver misses $(comm -23 "$out/burst.stored" "$out/burst.$pod" | wc -l) of the" \
    "$stored stored messages after 90 s (first: $(comm -23 "$out/burst.stored" "$out/burst.$pod" | head -1))"
done
log "SIGKILL of a sending sidecar: all $stored messages whose Send returned reached all 3 replicas ($((3 * stored - received_at_kill)) of $((3 * stored)) deliveries after the kill)"

# 8. Node faults, on the replicas the rollout restart left (figures also in $out/faults.txt).
# shellcheck source=e2e/faults.sh
source "$repo/hack/e2e/faults.sh"
rm -f "$out/faults.txt"
fault_node_lost
fault_partition

# The Greeting deleted while the operator runs: whoever leads now hands it out as a finalize pass, which deletes
# its ConfigMap, and the finalizer goes (deleting the namespace first would race the operator's own end).
kn delete greeting hello --wait=true --timeout=90s >/dev/null ||
  die "the Greeting was not finalized within 90 s: $(kn get greeting hello -o jsonpath='{.metadata.finalizers}' 2>&1)"
[ -z "$(kn get configmap hello --ignore-not-found -o name)" ] || die "the finalize pass left the Greeting's ConfigMap"
log "the Greeting deleted: the leader's finalize pass deleted its ConfigMap, and the finalizer went"

# 9. The Helm path: the kustomize injector removed as the README says (its namespace goes, with the Secret the
#    injector made), the README's `helm install --wait`, the plain app through the app block, then `helm
#    uninstall`, which leaves what the README says it leaves.
k delete namespace "$ns" --wait=true --timeout=120s >/dev/null
k delete -k "$repo/hack/e2e/injector" --wait=true --timeout=120s >/dev/null
k delete -k "$repo/manifests/fencing" --wait=true --timeout=120s >/dev/null
HELM=$("$repo/hack/tools.sh" helm)
export HELM HELM_CACHE_HOME=$out/helm/cache HELM_CONFIG_HOME=$out/helm/config HELM_DATA_HOME=$out/helm/data
t=$(ms)
walkthrough helm unused "$HELM_BLOCK"
log "the README's helm install --wait: deployed, the injector running, $(($(ms) - t)) ms"
plain_app helm
log "the README's app block on the plain container, injected by the Helm-installed injector: the socket there, consistd status ready"
"$HELM" uninstall consistd -n consistd-system --wait >/dev/null
k get mutatingwebhookconfiguration consistd-injector >/dev/null 2>&1 && die "helm uninstall left the webhook configuration"
k get validatingadmissionpolicy consistd-fence >/dev/null 2>&1 && die "helm uninstall left the fencing policy"
left=$(k -n consistd-system get deployments,services,secrets,roles,rolebindings -o name | xargs)
[ "$left" = secret/consistd-injector-tls ] ||
  die "helm uninstall left '$left' in consistd-system; the README says only secret/consistd-injector-tls stays"
k delete namespace consistd-system --wait=true --timeout=120s >/dev/null
log "helm uninstall left only the Secret the injector made (as the README says); kubectl delete namespace removed it"
# The README's promise for --wait: an image the node cannot pull fails the install instead of a release
# "deployed" with no injector running.
t=$(ms)
if "$HELM" install consistd "$repo/charts/consistd" --namespace consistd-system --create-namespace --wait \
  --timeout 20s --set image.repository=localhost/never-built >"$out/helm-unpullable.log" 2>&1; then
  die "helm install --wait of an image the node cannot pull said deployed: $(cat "$out/helm-unpullable.log")"
fi
release=$("$HELM" status consistd -n consistd-system 2>&1 || true)
grep -q '^STATUS: failed' <<<"$release" || die "the release of an unpullable image is not failed: $release"
"$HELM" uninstall consistd -n consistd-system --wait >/dev/null
k delete namespace consistd-system --wait=true --timeout=120s >/dev/null
log "helm install --wait of an image the node cannot pull: failed after its timeout ($(($(ms) - t)) ms), not deployed"

# 10. Leave the host as it was.
trap - EXIT
"$node" stop
"$repo/hack/host-snapshot.sh" >"$out/host.after"
diff -u "$out/host.before" "$out/host.after" >&2 || die "the host differs from before the nodes started"
log "PASS: host restored"
