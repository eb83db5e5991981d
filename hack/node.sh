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
# Needs root and a running hack/control-plane.sh. State lives in $CONSISTD_NODE_DIR (default target/node);
# images come from $CONSISTD_IMAGES (default target/images, every *.tar there; pause.tar is required).
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
# Sysctls kubelet sets (pkg/kubelet/cm setupKernelTunables) and the bridge plugin's ip_forward.
sysctls="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
kernel.keys.root_maxbytes net.ipv4.ip_forward"
# Host paths containerd (shim sockets in /run/containerd/s), CNI (its result cache) and kubelet (symlinks to
# container logs) use whatever their config says. Another containerd may share them: stop removes only this
# node's files there, and the directories themselves only if start made them and they are empty.
host_dirs="/run/containerd/s /run/containerd /var/lib/cni/results /var/lib/cni /var/log/containers /var/lib/kubelet
/usr/libexec/kubernetes"

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
running() {
  local p
  for p in containerd kubelet controller-manager scheduler; do pid_alive "$state/$p.pid" || return 1; done
}

stop_pid() {
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
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

# Everything start changes on the host is recorded in $state/host first, so stop can put it back even
# after a crash; stop deletes the record last.
save_host() {
  local h=$state/host k d
  mkdir -p "$h"
  for k in $sysctls; do echo "$k=$(sysctl -n "$k")"; done >"$h/sysctls"
  for d in $host_dirs; do if [ -e "$d" ]; then echo "$d"; fi; done >"$h/dirs"
  if ip link show "$bridge" >/dev/null 2>&1; then die "a link named $bridge exists already; not touching it"; fi
  touch "$h/bridge"
  # iptables (nft backend) creates the nat table for the DNAT rules; it stays, empty, once they are gone.
  if ! nft list table ip nat >/dev/null 2>&1; then touch "$h/no-nat-table"; fi
}

restore_host() {
  local h=$state/host line k v d
  [ -d "$h" ] || return 0
  if [ -f "$h/bridge" ] && ip link show "$bridge" >/dev/null 2>&1; then ip link delete "$bridge"; fi
  # iptables rules carry $tag as their comment; kubelet's own chains are off (makeIPTablesUtilChains: false).
  for t in nat filter mangle; do
    { iptables-save -t "$t" 2>/dev/null || true; } | { grep -F -- "$tag" || true; } | sed -n 's/^-A /-D /p' |
      while read -r line; do eval "iptables -t $t $line" || true; done
  done
  if [ -f "$h/no-nat-table" ] && ! iptables-save -t nat 2>/dev/null | grep -q '^-A'; then
    nft delete table ip nat 2>/dev/null || true
  fi
  # cgroups kubelet made (cgroupfs driver): leaves first; they are empty once every container is gone.
  for d in /sys/fs/cgroup/*/kubepods; do
    if [ -d "$d" ]; then find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  if [ -f "$h/sysctls" ]; then
    while IFS='=' read -r k v; do
      [ "$(sysctl -n "$k")" = "$v" ] || sysctl -qw "$k=$v"
    done <"$h/sysctls"
  fi
  if grep -qF -- "# $tag" /etc/hosts; then
    # Rewritten in place: /etc/hosts may be a bind mount that a rename would not replace.
    local hosts
    hosts=$(grep -vF -- "# $tag" /etc/hosts)
    printf '%s\n' "$hosts" >/etc/hosts
  fi
  rm -f /var/lib/cni/results/consistd-*
  if [ -d /var/log/containers ]; then find /var/log/containers -maxdepth 1 -type l -lname "$state/*" -delete; fi
  if [ -f "$h/dirs" ]; then
    # kubelet's device-plugin socket has a fixed path; removed only if no kubelet dir was there before.
    grep -qxF /var/lib/kubelet "$h/dirs" || rm -f /var/lib/kubelet/device-plugins/kubelet.sock
    for d in $host_dirs; do
      grep -qxF "$d" "$h/dirs" || [ ! -d "$d" ] || find "$d" -depth -type d -empty -delete
    done
  fi
  rm -rf "$h"
}

unmount_state() {
  local m
  # Deepest first; lazily, as a dead shim may still hold one.
  awk -v s="$state/" 'index($2, s) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

write_configs() {
  mkdir -p "$state/cni/net.d" "$state/logs" "$state/pod-logs" "$state/kubelet"
  cat >"$state/containerd.toml" <<EOF
version = 2
root = "$state/containerd/root"
state = "$state/containerd/state"
[grpc]
  address = "$state/containerd.sock"
[ttrpc]
  address = "$state/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$state/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:3.10"
  disable_apparmor = true
  # No CAP_SYS_RESOURCE here: runc cannot lower oom_score_adj below the daemon's own.
  restrict_oom_score_adj = true
  # Pods' network namespaces are pinned under the state directory, not /run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$state/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni/net.d"
EOF
  cat >"$state/cni/net.d/10-consistd.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "consistd", "plugins": [{
  "type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_subnet"}]], "routes": [{"dst": "0.0.0.0/0"}],
           "dataDir": "$state/cni/ipam"}}]}
EOF
  cat >"$state/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $(free_port)
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(free_port)
# The apiserver has no kubelet client certificate; the kubelet listens on loopback only.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$state/containerd.sock
podLogsDir: $state/pod-logs
registerNode: true
makeIPTablesUtilChains: false
# Hand-imported images must never be collected, and a busy shared disk must not evict test pods.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
clusterDomain: cluster.local
EOF
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
  [ -f "$cp_state/kubeconfig" ] && [ -f "$cp_state/server" ] || die "the control plane is not running: hack/control-plane.sh start"
  if running; then log "already running"; return 0; fi
  local t0=$SECONDS
  ensure_packages
  cmd_build
  cmd_stop >/dev/null 2>&1 || true
  rm -rf "$state"
  mkdir -p "$state"
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
  local images_dir=$images f
  if [ -f "$images_dir/pause.tar" ]; then
    cmd_load "$images_dir"/*.tar
  else
    log "WARNING: $images_dir/pause.tar is missing (hack/image.sh pause): the node gets Ready but runs no pods"
  fi

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
    while [ $SECONDS -lt $deadline ] && [ -n "$(kubectl get pods -A --field-selector "spec.nodeName=$node_name" -o name 2>/dev/null)" ]; do
      sleep 0.5
    done
    kubectl delete node "$node_name" --wait=false >/dev/null 2>&1 || true
  fi
  stop_pid "$state/scheduler.pid"
  stop_pid "$state/controller-manager.pid"
  stop_pid "$state/kubelet.pid"
  # Containers left running (a kubelet that died, a control plane already gone): kill them and their shims.
  local d p
  for d in /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/memory/kubepods; do
    if [ -d "$d" ]; then find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true; fi
  done
  if [ -d "$state/containerd/state" ]; then
    for p in $(find "$state/containerd/state" -name shim.pid -exec cat {} + 2>/dev/null); do
      kill "$p" 2>/dev/null || true
    done
  fi
  stop_pid "$state/containerd.pid"
  # The shims' sockets live in /run/containerd/s whatever containerd's state says; each bundle names its own.
  if [ -d "$state/containerd/state" ]; then
    find "$state/containerd/state" -path '*io.containerd.runtime.v2.task*' -name address -exec cat {} + 2>/dev/null |
      sed -n 's|^unix://||p' | xargs -r rm -f
  fi
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
  echo "usage: $0 build|start|load FILE...|stop|status|env" >&2
  exit 2
  ;;
esac
