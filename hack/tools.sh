#!/usr/bin/env bash
# Installs the command-line tools the Makefile uses, from package registries, into caches:
#   hack/tools.sh buf       buf (proto lint), from npm, into hack/tools/node/node_modules
#   hack/tools.sh grpcurl   grpcurl, from the Go module proxy, into $CONSISTD_CACHE/grpcurl/VERSION
#   hack/tools.sh helm      helm, from the Go module proxy, into $CONSISTD_CACHE/helm/VERSION
#   hack/tools.sh promtool  promtool (Prometheus' metrics linter), from the Go module proxy, into
#                           $CONSISTD_CACHE/promtool/VERSION
#   hack/tools.sh prometheus  the Prometheus server (same module and version as promtool), into
#                           $CONSISTD_CACHE/prometheus/VERSION, for rendering the dashboard (hack/dashboard.sh)
#   hack/tools.sh kubectl   kubectl $KUBERNETES_VERSION from hack/tools/kube-node, where hack/node.sh builds it
#   hack/tools.sh strace    Debian's strace (its fault injection fails the store's fsync in tests)
#   hack/tools.sh nft       Debian's nftables (black holes in the fault tests: testkit/src/blackhole.rs)
#   hack/tools.sh prometheus-operator-crds   the Prometheus Operator's CRDs (PodMonitor, ...), from its Go
#                           module on the module proxy (example/prometheus-operator-crd); prints their directory
# Prints the tool's path on stdout.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${CONSISTD_CACHE:-$HOME/.cache/consistd}
# shellcheck source=versions.env
source "$repo/hack/versions.env"
# v1.9.4: v1.9.3 ignores -unix and dials TCP.
GRPCURL_VERSION=v1.9.4
# Helm 4, the current major (Helm 3 gets security fixes only). charts/consistd is only tested with this version.
HELM_VERSION=v4.3.1
# Prometheus 3.16.0, the current release: its Go module is tagged v0.316.0 (3.x is published as v0.3xx.y).
PROMTOOL_VERSION=v0.316.0
# The Prometheus Operator whose PodMonitor CRD manifests/monitoring is checked against.
PROMETHEUS_OPERATOR_VERSION=v0.85.0

# debian_tool PACKAGE COMMAND: installs Debian's PACKAGE unless COMMAND is there; prints COMMAND's path.
debian_tool() {
  if ! command -v "$2" >/dev/null; then
    echo "tools: installing $1 (Debian package)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "$1" >&2 ||
      { DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "$1" >&2; }
  fi
  command -v "$2"
}

case "${1:-}" in
buf)
  bin=$repo/hack/tools/node/node_modules/.bin/buf
  if [ ! -x "$bin" ]; then
    echo "tools: installing buf from npm" >&2
    # Not `npm ci`: npm 11's lock omits other platforms' optional packages of @bufbuild/buf and then
    # refuses the lock as out of sync. The version is pinned exactly in package.json.
    (cd "$repo/hack/tools/node" && npm install --no-audit --no-fund --no-save --loglevel=error >&2)
  fi
  echo "$bin"
  ;;
grpcurl)
  dir=$cache/grpcurl/$GRPCURL_VERSION
  if [ ! -x "$dir/grpcurl" ]; then
    echo "tools: building grpcurl $GRPCURL_VERSION" >&2
    GOTOOLCHAIN=local GOBIN=$dir go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION" >&2
  fi
  echo "$dir/grpcurl"
  ;;
helm)
  dir=$cache/helm/$HELM_VERSION
  if [ ! -x "$dir/helm" ]; then
    echo "tools: building helm $HELM_VERSION (once; minutes on 2 cores)" >&2
    # The version is stamped as helm's own release build does, so `helm version` and chart checks see it.
    GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN=$dir go install -p 2 -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
      "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
  fi
  echo "$dir/helm"
  ;;
promtool | prometheus)
  # Both from Prometheus' Go module. The version is stamped as Prometheus' release build (promu) does, so
  # `--version` shows it: v0.316.0 is Prometheus 3.16.0. remove_all_sd leaves out the service discovery
  # plugins (AWS, Azure, GCE, Kubernetes, ...): `promtool check metrics` and hack/dashboard.sh's static
  # targets need none, and the build takes half the CPU time.
  dir=$cache/$1/$PROMTOOL_VERSION
  if [ ! -x "$dir/$1" ]; then
    echo "tools: building $1 $PROMTOOL_VERSION (once; minutes on 2 cores)" >&2
    IFS=. read -r _ mm patch <<<"${PROMTOOL_VERSION#v}"
    GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN=$dir go install -p 2 -trimpath -tags remove_all_sd \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=$((mm / 100)).$((mm % 100)).$patch" \
      "github.com/prometheus/prometheus/cmd/$1@$PROMTOOL_VERSION" >&2
  fi
  echo "$dir/$1"
  ;;
kubectl)
  # The same binary and path as hack/node.sh build, without its kubelet, scheduler and controller-manager.
  out=$cache/kubectl/$KUBERNETES_VERSION/kubectl
  if [ ! -x "$out" ]; then
    echo "tools: building kubectl $KUBERNETES_VERSION (once; minutes on 2 cores)" >&2
    v=${KUBERNETES_VERSION#v} vpkg=k8s.io/component-base/version
    minor=${v#*.}
    mkdir -p "$(dirname "$out")"
    tmp=$(mktemp "$out.XXXXXX")
    (cd "$repo/hack/tools/kube-node" &&
      GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p 2 -trimpath -o "$tmp" \
        -ldflags "-s -w -X $vpkg.gitVersion=$KUBERNETES_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=${minor%%.*} -X $vpkg.gitTreeState=clean" \
        k8s.io/kubernetes/cmd/kubectl >&2) || { rm -f "$tmp"; exit 1; }
    mv -f "$tmp" "$out"
  fi
  echo "$out"
  ;;
strace)
  # Debian's strace, for the store tests' fsync fault injection (daemon/tests/disk.rs).
  debian_tool strace strace
  ;;
nft)
  # Debian's nftables, for the black-hole fault tests (daemon/tests/blackhole.rs).
  debian_tool nftables nft
  ;;
prometheus-operator-crds)
  module=github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION
  dir=$(cd "$repo" && GOTOOLCHAIN=local go mod download -json "$module" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') || { echo "tools: go mod download $module failed" >&2; exit 1; }
  [ -f "$dir/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" ] ||
    { echo "tools: no PodMonitor CRD in $dir" >&2; exit 1; }
  echo "$dir/example/prometheus-operator-crd"
  ;;
*)
  echo "usage: $0 buf|grpcurl|helm|kubectl|promtool|prometheus|prometheus-operator-crds|strace|nft" >&2
  exit 2
  ;;
esac
