#!/usr/bin/env bash
# Checks charts/consistd (`make chart-check`; run under hack/with-control-plane.sh): helm lint --strict, the values
# schema refusing bad values by name, server-side dry runs of its renderings (default values and
# hack/chart/test-values.yaml) whose injector arguments consistd accepts, and that by default it renders what
# manifests/injector holds. CONSISTD_BIN: the consistd binary to check against (default: cargo build's).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
: "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
chart=$repo/charts/consistd
values=$repo/hack/chart/test-values.yaml
helm=$("$repo/hack/tools.sh" helm)
kubectl=$("$repo/hack/tools.sh" kubectl)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# helm's and kubectl's caches and settings stay in $work, not in $HOME.
export HELM_CACHE_HOME=$work/helm/cache HELM_CONFIG_HOME=$work/helm/config HELM_DATA_HOME=$work/helm/data
export KUBECONFIG=$CONSISTD_TEST_KUBECONFIG KUBECACHEDIR=$work/kube-cache

log() { printf 'chart-check: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

bin=${CONSISTD_BIN:-}
if [ -z "$bin" ]; then
  (cd "$repo" && cargo build -q -p consistd --bin consistd)
  bin=${CARGO_TARGET_DIR:-$repo/target}/debug/consistd
fi

log "helm lint --strict, default and test values"
"$helm" lint --strict "$chart" >"$work/lint.out" 2>&1 || { cat "$work/lint.out" >&2; die "helm lint"; }
"$helm" lint --strict "$chart" -f "$values" >"$work/lint.out" 2>&1 || { cat "$work/lint.out" >&2; die "helm lint -f $values"; }

# refuse TEXT ARGS...: helm lint and helm template both fail with ARGS, saying TEXT (where the value is, or its name).
refuse() {
  local text=$1 cmd
  shift
  for cmd in lint template; do
    if "$helm" "$cmd" "$chart" "$@" >"$work/refuse.out" 2>&1; then die "helm $cmd accepted $*"; fi
    grep -qF "$text" "$work/refuse.out" || { cat "$work/refuse.out" >&2; die "helm $cmd refused $* without saying $text"; }
  done
}
log "the schema refuses bad values, naming them"
refuse "'/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'" --set webhook.failurePolicy=Sometimes
refuse "additional properties 'replica' not allowed" --set replica=3
refuse "additional properties 'failurePolicy' not allowed" --set failurePolicy=Ignore
refuse "'/sidecar/peerPort'" --set sidecar.peerPort=70000
refuse "'/webhook/certValidity'" --set webhook.certValidity=ninety
refuse "'/image/pullPolicy'" --set image.pullPolicy=Sometimes
refuse "'/webhook/secretName'" --set webhook.secretName=Not_A_Name
refuse "'/sidecar/otelEndpoint'" --set sidecar.otelEndpoint=otel-collector:4317
refuse "'/fencing/enabled'" --set fencing.enabled=maybe

# A fresh namespace for the namespaced objects, labelled as consistd-testkit labels its namespaces.
ns=consistd-chart-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
"$kubectl" create namespace "$ns" >/dev/null
"$kubectl" label namespace "$ns" consistd.io/test=true >/dev/null
for case in default test-values; do
  args=()
  [ "$case" = test-values ] && args=(-f "$values")
  log "server-side dry run of the $case rendering in $ns"
  "$helm" template consistd "$chart" --namespace "$ns" "${args[@]}" >"$work/$case.yaml"
  "$kubectl" apply --dry-run=server -n "$ns" -f "$work/$case.yaml" -o json >"$work/$case.json" ||
    die "the apiserver refused the $case rendering"
  count=$(python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("items", [])))' <"$work/$case.json")
  want=14 # the injector's 8 and fencing's 6; the test values turn fencing off
  [ "$case" = test-values ] && want=8
  [ "$count" = "$want" ] || die "the $case rendering has $count objects, want $want"
  # The injector's arguments parse: the binary gets as far as connecting (to no apiserver), not a usage error.
  mapfile -t args < <(python3 -c 'import json,sys
for o in json.load(sys.stdin)["items"]:
    if o["kind"] == "Deployment": print("\n".join(o["spec"]["template"]["spec"]["containers"][0]["args"]))' \
    <"$work/$case.json")
  rc=0
  env -u KUBERNETES_SERVICE_HOST KUBECONFIG=/nonexistent "$bin" "${args[@]}" --namespace "$ns" >"$work/run.out" 2>&1 || rc=$?
  [ "$rc" = 1 ] && grep -q "connect to the apiserver" "$work/run.out" ||
    { cat "$work/run.out" >&2; die "consistd refused the $case rendering's arguments (exit $rc)"; }
done
python3 "$repo/hack/chart/expect.py" "$work/test-values.json" "$ns" || die "the test values did not all take effect"

log "default values render what manifests/injector and manifests/fencing hold"
"$bin" inject webhook --help >"$work/help.txt"
{ "$kubectl" kustomize "$repo/manifests/injector" && echo --- && "$kubectl" kustomize "$repo/manifests/fencing"; } >"$work/kustomize.yaml"
"$kubectl" create --dry-run=client -o json -f "$work/kustomize.yaml" >"$work/kustomize.json"
"$helm" template consistd "$chart" --namespace consistd-system >"$work/chart.yaml"
"$kubectl" create --dry-run=client -o json -f "$work/chart.yaml" >"$work/chart.json"
python3 "$repo/hack/chart/compare.py" "$work/kustomize.json" "$work/chart.json" "$work/help.txt" ||
  die "charts/consistd and manifests/injector + manifests/fencing differ"
log "ok"
