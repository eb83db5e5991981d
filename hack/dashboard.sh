#!/usr/bin/env bash
# Renders manifests/monitoring/dashboard.json with real data, headless, into docs/monitoring/dashboard.png
# (`make dashboard`; run under hack/with-control-plane.sh):
#
#  1. two consistd daemons with admin.listen on loopback, scraped every second by a real Prometheus
#     (hack/tools.sh prometheus, the same release as promtool);
#  2. traffic for $CONSISTD_DASHBOARD_SECONDS (default 120): the Python example operator on daemon a
#     (campaigns; while it leads, its queue hands it the Greeting, whose message it publishes in a ConfigMap,
#     and it notifies daemon b's receiver, which ACKs), a RAW watch of the namespace's ConfigMaps, and the
#     Greeting's message changed every second;
#  3. hack/dashboard/render.py asks Prometheus for every panel's queries over that window (Grafana's
#     $__rate_interval as 4 scrape intervals, $namespace as all) and draws the panels as the dashboard lays
#     them out. It fails when a panel's queries return no data: the dashboard would show nothing there.
#
# The venv (matplotlib and the Python SDK, from PyPI) lives in target/dashboard/venv.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
: "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
seconds=${CONSISTD_DASHBOARD_SECONDS:-120}
out=${CONSISTD_DASHBOARD_OUT:-$repo/docs/monitoring/dashboard.png}
work=$repo/target/dashboard
venv=$work/venv
prometheus=$("$repo/hack/tools.sh" prometheus)
grpcurl=$("$repo/hack/tools.sh" grpcurl)
kubectl=$("$repo/hack/tools.sh" kubectl)
export KUBECONFIG=$CONSISTD_TEST_KUBECONFIG KUBECACHEDIR=$work/kube-cache
log() { printf 'dashboard: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import matplotlib, consistd' 2>/dev/null; then
  log "installing matplotlib and the Python SDK into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q matplotlib "$repo/client-sdk/python" >&2
fi
(cd "$repo" && cargo build -q -p consistd --bin consistd)
bin=${CARGO_TARGET_DIR:-$repo/target}/debug/consistd

run=$work/run
rm -rf "$run"
mkdir -p "$run"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
port() { "$repo/hack/free-port.sh"; }
ns=dashboard-$RANDOM$RANDOM
"$kubectl" create namespace "$ns" >/dev/null

# start NAME CONFIG: a daemon in $run/NAME.
start() {
  mkdir -p "$run/$1"
  printf '%s\n' "$2" >"$run/$1/consistd.yaml"
  "$bin" run --config "$run/$1/consistd.yaml" --socket "$run/$1/consistd.sock" --admin-socket "$run/$1/admin.sock" \
    --store-dir "$run/$1/store" >"$run/$1/log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do [ -S "$run/$1/consistd.sock" ] && return 0; sleep 0.1; done
  die "daemon $1 did not start: $(tail -5 "$run/$1/log")"
}
a_admin=127.0.0.1:$(port) b_admin=127.0.0.1:$(port) b_peer=127.0.0.1:$(port) prom=127.0.0.1:$(port)
start a "identity: a
namespace: $ns
admin:
  listen: \"$a_admin\"
peer:
  insecure: true"
start b "identity: b
namespace: $ns
admin:
  listen: \"$b_admin\"
peer:
  listen: \"$b_peer\"
  insecure: true"

cat >"$run/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: consistd
    static_configs:
      - targets: ["$a_admin"]
        labels: {namespace: "$ns", pod: "a"}
      - targets: ["$b_admin"]
        labels: {namespace: "$ns", pod: "b"}
EOF
"$prometheus" --config.file="$run/prometheus.yml" --storage.tsdb.path="$run/tsdb" --web.listen-address="$prom" \
  >"$run/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://$prom/-/ready" >/dev/null && break; sleep 0.2; done
curl -sf "http://$prom/-/ready" >/dev/null || die "prometheus did not start: $(tail -5 "$run/prometheus.log")"
log "prometheus $prom scrapes daemons a ($a_admin) and b ($b_admin); traffic for ${seconds}s in namespace $ns"

"$kubectl" apply -f "$repo/examples/crd.yaml" >/dev/null
"$kubectl" wait --for=condition=Established --timeout=60s crd/greetings.example.consistd.io >/dev/null
greeting='{"apiVersion":"example.consistd.io/v1","kind":"Greeting","metadata":{"name":"hello"},"spec":{"message":"0"}}'
"$kubectl" -n "$ns" apply -f - <<<"$greeting" >/dev/null
start_time=$(date +%s)
example=$repo/examples/python/greeting_operator.py
CONSISTD_SOCKET=$run/b/consistd.sock EXAMPLE_NAMESPACE=$ns "$venv/bin/python" "$example" receive >"$run/receiver.log" 2>&1 &
pids+=($!)
CONSISTD_SOCKET=$run/a/consistd.sock EXAMPLE_NAMESPACE=$ns EXAMPLE_PEER=$b_peer "$venv/bin/python" "$example" controller \
  >"$run/controller.log" 2>&1 &
pids+=($!)
"$grpcurl" -plaintext -unix -max-time "$((seconds + 30))" \
  -d "{\"resource\":\"configmaps\",\"namespace\":\"$ns\",\"mode\":\"DELIVERY_MODE_RAW\"}" \
  "$run/a/consistd.sock" consistd.v1.WatchService/Subscribe >"$run/raw-watch.log" 2>&1 &
pids+=($!)
for i in $(seq 1 "$seconds"); do
  # A new message each second: the operator publishes it in the Greeting's ConfigMap and notifies b (a Send, an ACK).
  "$kubectl" -n "$ns" patch greeting hello --type merge -p "{\"spec\":{\"message\":\"$i\"}}" >/dev/null
  sleep 1
done
end_time=$(date +%s)
grep -q ACKED "$run/controller.log" || die "the example operator saw no ACK: $(tail -5 "$run/controller.log")"

mkdir -p "$(dirname "$out")"
"$venv/bin/python" "$repo/hack/dashboard/render.py" --prometheus "http://$prom" --dashboard "$repo/manifests/monitoring/dashboard.json" \
  --start "$start_time" --end "$end_time" --out "$out"
log "rendered $out"
