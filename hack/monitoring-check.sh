#!/usr/bin/env bash
# Checks manifests/monitoring (run under hack/with-control-plane.sh, after hack/check-metrics.sh):
#  - the Prometheus Operator's PodMonitor CRD (hack/tools.sh prometheus-operator-crds) is installed on the real
#    apiserver, `kubectl apply -k manifests/monitoring --dry-run=server` passes, and a PodMonitor the CRD's
#    schema forbids is refused (so the dry run really validated);
#  - the Grafana dashboard is JSON with a title, description and data source on every panel; every panel's
#    PromQL parses (`promtool check rules`, Grafana's $__rate_interval and $namespace filled in); and every
#    metric a panel reads has samples in the real daemons' /metrics that hack/check-metrics.sh scraped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
: "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
scraped=${CONSISTD_METRICS_DIR:-$repo/target/check-metrics}
dashboard=$repo/manifests/monitoring/dashboard.json
kubectl=$("$repo/hack/tools.sh" kubectl)
promtool=$("$repo/hack/tools.sh" promtool)
crds=$("$repo/hack/tools.sh" prometheus-operator-crds)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KUBECONFIG=$CONSISTD_TEST_KUBECONFIG KUBECACHEDIR=$work/kube-cache

log() { printf 'monitoring-check: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

"$kubectl" apply --server-side -f "$crds/monitoring.coreos.com_podmonitors.yaml" >/dev/null
"$kubectl" wait --for=condition=Established --timeout=60s crd/podmonitors.monitoring.coreos.com >/dev/null
"$kubectl" apply -k "$repo/manifests/monitoring" -n default --dry-run=server >"$work/applied" 2>&1 ||
  { cat "$work/applied" >&2; die "kubectl apply -k manifests/monitoring --dry-run=server"; }
grep -q 'podmonitor.monitoring.coreos.com/consistd' "$work/applied" && grep -q 'configmap/consistd-dashboard' "$work/applied" ||
  die "the dry run did not create the PodMonitor and the dashboard ConfigMap: $(cat "$work/applied")"
# The CRD's schema is enforced: a PodMonitor whose endpoint names no port is refused.
sed 's/- port: consistd-admin/- portNumber: "7071"/' "$repo/manifests/monitoring/podmonitor.yaml" >"$work/bad.yaml"
if "$kubectl" apply -f "$work/bad.yaml" -n default --dry-run=server >"$work/bad.out" 2>&1; then
  die "a PodMonitor with a wrongly typed field was accepted: the CRD does not validate"
fi
log "PodMonitor CRD $(basename "$(dirname "$(dirname "$crds")")"): manifests/monitoring passes a server-side dry run; a bad PodMonitor is refused"

python3 - "$dashboard" "$work/rules.yaml" "$work/metrics" <<'EOF'
import json, re, sys
dashboard, rules, metrics = sys.argv[1:4]
d = json.load(open(dashboard))
assert d.get("title") and d.get("uid"), "the dashboard has a title and uid"
exprs, names = [], set()
for p in d["panels"]:
    if p["type"] == "row":
        continue
    for key in ("title", "description", "datasource", "targets"):
        assert p.get(key), f"panel {p.get('title')!r} has no {key}"
    for t in p["targets"]:
        expr = t["expr"].replace("$__rate_interval", "5m").replace("$namespace", ".*")
        exprs.append((p["title"], expr))
        names.update(re.findall(r"\bconsistd_[a-z_]+", expr))
with open(rules, "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (title, expr) in enumerate(exprs):
        f.write(f"      - record: dashboard:panel_{i}\n        expr: {json.dumps(expr)}\n")
open(metrics, "w").write("\n".join(sorted(names)) + "\n")
print(f"monitoring-check: dashboard: {len(exprs)} queries in {sum(p['type'] != 'row' for p in d['panels'])} panels reading {len(names)} metrics", file=sys.stderr)
EOF
"$promtool" check rules "$work/rules.yaml" >"$work/promtool.out" 2>&1 || { cat "$work/promtool.out" >&2; die "a panel's PromQL does not parse"; }
missing=()
while read -r name; do
  grep -qE "^${name}(\{| )" "$scraped"/a.txt "$scraped"/b.txt || missing+=("$name")
done <"$work/metrics"
[ "${#missing[@]}" = 0 ] || die "the dashboard reads metrics the daemons do not export: ${missing[*]}"
log "dashboard: every panel's PromQL parses, and every metric it reads has samples in the daemons' /metrics"
