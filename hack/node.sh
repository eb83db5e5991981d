#!/usr/bin/env bash
# A real Kubernetes node (containerd, kubelet, scheduler, controller-manager) attached to hack/control-plane.sh.
#
#   hack/node.sh build         build kubelet, kube-scheduler, kube-controller-manager, kubectl (once per version)
#   hack/node.sh prepare       install the Debian packages if missing, then build
#   hack/node.sh start         install host packages if missing, start containerd and the node, import images
#   hack/node.sh load FILE...  import OCI / docker-archive tarballs into the node's containerd (k8s.io namespace)
#   hack/node.sh stop          stop all of it by saved PID and restore the host as it was (idempotent)
#   hack/node.sh status        say whether it runs and whether the node is Ready
#   hack/node.sh env           print `export KUBECONFIG=...` and the kubectl to use
#
# Needs root and a running hack/control-plane.sh, started with CONSISTD_CP_NODE=1 for ServiceAccount tokens.
# State lives in $CONSISTD_NODE_DIR (default target/node); images come from $CONSISTD_IMAGES (default
# target/images, every *.tar there, e.g. from hack/image.sh; pause.tar is the sandbox image). One node per
# host: the bridge cn0, pod range 10.244.0.0/24 and the Service IP 10.96.0.1 rule are fixed. Pods reach the
# apiserver (on loopback) at https://10.96.0.1, whose certificate names that address.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=versions.env
source "$repo/hack/versions.env"
cache=${CONSISTD_CACHE:-$HOME/.cache/consistd}
state=${CONSISTD_NODE_DIR:-$repo/target/node}
images=${CONSISTD_IMAGES:-$repo/target/images}
bin() { echo "$cache/$1/$KUBERNETES_VERSION/$1"; }

log() { printf 'node: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# Same approach as hack/control-plane.sh: the wrapper module hack/tools/kube-node, built into a temp file
# and renamed, so two builds at once cannot corrupt the cache.
cmd_build() {
  local v=${KUBERNETES_VERSION#v} vpkg=k8s.io/component-base/version name out tmp
  local minor=${v#*.}
  minor=${minor%%.*}
  local ldflags="-s -w -X $vpkg.gitVersion=$KUBERNETES_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
  for name in kubelet kube-scheduler kube-controller-manager kubectl; do
    out=$(bin "$name")
    [ -x "$out" ] && continue
    command -v go >/dev/null || die "go is not installed; it is needed to build $name"
    mkdir -p "$(dirname "$out")"
    log "building $name into $out (once per version)"
    tmp=$(mktemp "$out.XXXXXX")
    (cd "$repo/hack/tools/kube-node" &&
      GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p 2 -trimpath -ldflags "$ldflags" -o "$tmp" \
        "k8s.io/kubernetes/cmd/$name") || { rm -f "$tmp"; die "building $name failed"; }
    mv -f "$tmp" "$out"
  done
}

cp_state=${CONSISTD_CP_DIR:-$repo/target/control-plane}
node_name=${CONSISTD_NODE_NAME:-consistd-node}
bridge=cn0                       # the CNI bridge; pods get 10.244.0.0/24, the host is 10.244.0.1
pod_subnet=10.244.0.0/24
service_ip=10.96.0.1             # the `kubernetes` Service (first address of the apiserver's service range)
tag="consistd-node:$state"       # comment on every iptables rule and /etc/hosts line this script adds
kubectl() { KUBECONFIG=$cp_state/kubeconfig KUBECACHEDIR=$state/kubectl-cache "$(bin kubectl)" "$@"; }
ctr() { command ctr --address "$state/containerd.sock" -n k8s.io "$@"; }

# A killed child of a script that has exited stays a zombie until PID 1 reaps it: that is not alive.
live() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${st#Z}" = "$st" ]; }
pid_alive() { [ -f "$1" ] && live "$(cat "$1")"; }
# shellcheck source=node/host.sh
source "$repo/hack/node/host.sh"
# shellcheck source=node/config.sh
source "$repo/hack/node/config.sh"
running() {
  local p
  for p in containerd kubelet controller-manager scheduler; do pid_alive "$state/$p.pid" || return 1; done
}

stop_pid() {
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if live "$pid"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do live "$pid" || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

ensure_packages() {
  local missing=0 c
  for c in containerd containerd-shim-runc-v2 runc ctr iptables iptables-save conntrack nft; do
    command -v "$c" >/dev/null || missing=1
  done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing=1
  [ "$missing" = 0 ] && return 0
  log "installing containerd runc containernetworking-plugins iptables conntrack nftables from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd runc containernetworking-plugins iptables conntrack \
    nftables >&2
}

free_port() { "$repo/hack/free-port.sh"; }

wait_for() { # wait_for SECONDS WHAT PIDFILE... -- COMMAND...: until COMMAND succeeds or a PID dies
  local deadline=$((SECONDS + $1)) what=$2 f
  shift 2
  local pids=()
  while [ "$1" != -- ]; do pids+=("$1"); shift; done
  shift
  until "$@" >/dev/null 2>&1; do
    for f in "${pids[@]}"; do
      pid_alive "$f" || { tail -n 30 "$state/logs/$(basename "$f" .pid).log" >&2; die "$(basename "$f" .pid) exited while waiting for $what"; }
    done
    [ $SECONDS -lt $deadline ] || die "no $what within $1 s"
    sleep 0.2
  done
}

node_ready() {
  [ "$(kubectl get node "$node_name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

cmd_load() {
  local f
  for f in "$@"; do
    ctr images import "$f" >/dev/null || die "importing $f failed"
    log "imported $f"
  done
}

cmd_start() {
  [ "$(id -u)" = 0 ] || die "must run as root (containerd, kubelet, a bridge and iptables)"
  if [ ! -f "$cp_state/kubeconfig" ] || [ ! -f "$cp_state/server" ]; then
    die "the control plane is not running: hack/control-plane.sh start"
  fi
  if running; then log "already running"; return 0; fi
  [ -f "$cp_state/node-mode" ] ||
    log "WARNING: the control plane was started without CONSISTD_CP_NODE=1: pods get no ServiceAccount token"
  local t0=$SECONDS
  ensure_packages
  cmd_build
  recover_host
  cmd_stop >/dev/null 2>&1 || true
  rm -rf "$state"
  mkdir -p "$state"
  # From here on a failed start undoes itself.
  trap 'log "start failed; undoing it"; cmd_stop' EXIT
  save_host
  local pki=$cp_state/pki server api_host api_port node_ip
  server=$(cat "$cp_state/server")
  api_host=${server#https://}
  api_port=${api_host##*:}
  api_host=${api_host%:*}
  node_ip=$(ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')

  # The bridge exists before the first pod so that route_localnet can be set on it: pods' packets to the
  # Service IP are DNATed to the apiserver on loopback, which the kernel drops as martian otherwise.
  ip link add "$bridge" type bridge
  ip link set "$bridge" up
  sysctl -qw "net.ipv4.conf.$bridge.route_localnet=1"
  # What kube-proxy would do for the `kubernetes` Service, from pods and from the host.
  iptables -t nat -A PREROUTING -i "$bridge" -d "$service_ip/32" -p tcp --dport 443 \
    -m comment --comment "$tag" -j DNAT --to-destination "$api_host:$api_port"
  iptables -t nat -A OUTPUT -d "$service_ip/32" -p tcp --dport 443 \
    -m comment --comment "$tag" -j DNAT --to-destination "$api_host:$api_port"
  # The apiserver reaches the kubelet (logs, exec) by the node's name.
  printf '127.0.0.1 %s # %s\n' "$node_name" "$tag" >>/etc/hosts

  write_configs
  containerd --config "$state/containerd.toml" >"$state/logs/containerd.log" 2>&1 &
  echo $! >"$state/containerd.pid"
  wait_for 30 "containerd" "$state/containerd.pid" -- ctr version
  if [ -f "$images/pause.tar" ]; then
    cmd_load "$images"/*.tar
  else
    log "WARNING: $images/pause.tar is missing (hack/image.sh pause): the node gets Ready but runs no pods"
  fi

  # A Node object left by a node that was killed still says Ready for a while: start from none.
  kubectl delete node "$node_name" --ignore-not-found >/dev/null
  "$(bin kubelet)" --config "$state/kubelet.yaml" --kubeconfig "$cp_state/kubeconfig" \
    --hostname-override "$node_name" --node-ip "$node_ip" --root-dir "$state/kubelet" \
    --cert-dir "$state/kubelet/pki" --volume-plugin-dir "$state/kubelet/volume-plugins" \
    --v 1 >"$state/logs/kubelet.log" 2>&1 &
  echo $! >"$state/kubelet.pid"
  # Tokens for pods and controllers are signed with the apiserver's key; kube-root-ca.crt carries its CA.
  "$(bin kube-controller-manager)" --kubeconfig "$cp_state/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" --cert-dir "$state/controller-manager" \
    --leader-elect=false --use-service-account-credentials \
    --flex-volume-plugin-dir "$state/controller-manager/flexvolume" \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --v 1 >"$state/logs/controller-manager.log" 2>&1 &
  echo $! >"$state/controller-manager.pid"
  "$(bin kube-scheduler)" --kubeconfig "$cp_state/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" --cert-dir "$state/scheduler" \
    --leader-elect=false --v 1 >"$state/logs/scheduler.log" 2>&1 &
  echo $! >"$state/scheduler.pid"

  local t1=$SECONDS
  wait_for 120 "Ready node $node_name" "$state/kubelet.pid" "$state/controller-manager.pid" \
    "$state/scheduler.pid" "$state/containerd.pid" -- node_ready
  local p
  for p in containerd kubelet controller-manager scheduler; do
    pid_alive "$state/$p.pid" || { tail -n 30 "$state/logs/$p.log" >&2; die "$p exited during start"; }
  done
  trap - EXIT
  log "node $node_name Ready $((SECONDS - t1)) s after kubelet start ($((SECONDS - t0)) s in all); logs in $state/logs"
}

# Stops everything start began, in an order that lets kubelet and containerd tear pods down themselves
# while they can, then removes by force whatever is left, then restores the host. Safe to repeat.
cmd_stop() {
  if pid_alive "$state/kubelet.pid" && kubectl get node "$node_name" >/dev/null 2>&1; then
    stop_pid "$state/scheduler.pid"
    stop_pid "$state/controller-manager.pid"
    kubectl delete pods -A --field-selector "spec.nodeName=$node_name" --grace-period=1 --wait=false >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 30))
    while [ $SECONDS -lt $deadline ] && pid_alive "$state/kubelet.pid" &&
      [ -n "$(kubectl get pods -A --field-selector "spec.nodeName=$node_name" -o name 2>/dev/null)" ]; do
      sleep 0.5
    done
    kubectl delete node "$node_name" --wait=false >/dev/null 2>&1 || true
  fi
  stop_pid "$state/scheduler.pid"
  stop_pid "$state/controller-manager.pid"
  stop_pid "$state/kubelet.pid"
  # Containers left running (a kubelet that died, a control plane already gone): kill them and their shims.
  local d
  for d in /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/memory/kubepods; do
    if [ -d "$d" ]; then find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true; fi
  done
  # Their shims, one per pod: containerd 1.6 writes no shim.pid, but each bundle names the shim's socket (in
  # /run/containerd/s whatever containerd's state says), and the socket's listener is the shim. libcni caches
  # results in /var/lib/cni/results by sandbox ID.
  local tasks=$state/containerd/state/io.containerd.runtime.v2.task/k8s.io id sock
  if [ -d "$tasks" ]; then
    for id in "$tasks"/*; do
      sock=$(sed -n 's|^unix://||p' "$id/address" 2>/dev/null || true)
      id=${id##*/}
      if [ -n "$sock" ]; then
        ss -xlpn 2>/dev/null | grep -F " $sock " | grep -o 'pid=[0-9]*' | cut -d= -f2 | xargs -r kill -9 2>/dev/null || true
        rm -f "$sock"
      fi
      rm -f /var/lib/cni/results/*-"$id"-*
    done
  fi
  stop_pid "$state/containerd.pid"
  sleep 0.2
  unmount_state
  restore_host
  if [ -d "$state" ]; then
    # Keep the logs for a post-mortem; everything else (image store, pod volumes) goes.
    find "$state" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
  fi
  log "stopped"
}

cmd_status() {
  if running; then
    if node_ready; then echo "running: node $node_name Ready"; else echo "running: node $node_name not Ready"; return 1; fi
  else
    echo "not running"
    return 1
  fi
}

cmd_env() {
  running || die "not running; start it with: hack/node.sh start"
  echo "export KUBECONFIG=$cp_state/kubeconfig"
  echo "export KUBECTL=$(bin kubectl)"
  echo "export KUBECACHEDIR=$state/kubectl-cache # not ~/.kube/cache"
  echo "export CONSISTD_NODE_NAME=$node_name"
  echo "export CONTAINERD_ADDRESS=$state/containerd.sock CONTAINERD_NAMESPACE=k8s.io # for ctr"
}

case "${1:-}" in
build) cmd_build ;;
prepare) ensure_packages; cmd_build ;;
start) cmd_start ;;
load) shift; cmd_load "$@" ;;
stop) cmd_stop ;;
status) cmd_status ;;
env) cmd_env ;;
*)
  echo "usage: $0 build|prepare|start|load FILE...|stop|status|env" >&2
  exit 2
  ;;
esac
