#!/usr/bin/env bash
# Real Kubernetes nodes on this host, attached to hack/control-plane.sh: each node a network namespace of its own
# with its own containerd, kubelet, pod subnet and cgroup tree, all of them on one link as machines on a LAN,
# plus one kube-scheduler and kube-controller-manager for the cluster.
#
#   hack/node.sh build           build kubelet, kube-scheduler, kube-controller-manager, kubectl (once per version)
#   hack/node.sh prepare         install the Debian packages if missing, then build
#   hack/node.sh start           install host packages if missing, start the nodes, import images into each
#   hack/node.sh load FILE...    import OCI / docker-archive tarballs into every node's containerd (k8s.io)
#   hack/node.sh stop            stop all of it by saved PID and restore the host as it was (idempotent)
#   hack/node.sh status          say whether it runs and whether each node is Ready
#   hack/node.sh env             print `export KUBECONFIG=...`, the kubectl to use and the nodes' names
#   hack/node.sh ctr NODE ARG... run ctr against NODE's containerd (k8s.io namespace)
# Faults, as machines meet them (each undone by its opposite, partitions and cuts also by `heal`, all by stop):
#   hack/node.sh freeze NODE     power NODE off: its link goes down, kubelet, containerd and every pod freeze
#   hack/node.sh thaw NODE       power it on again where it stopped
#   hack/node.sh partition A B   drop every packet between nodes A and B (their addresses and pod subnets)
#   hack/node.sh cut NODE        drop every packet between NODE (and its pods) and the apiserver
#   hack/node.sh heal            undo every partition and cut
#   hack/node.sh claim-ip NODE IP  NODE's next pod gets IP, a pod address of another node that is down (as a pod
#                                network handing a lost machine's addresses out again): IP is routed to NODE,
#                                whose CNI hands out IP alone, on a bridge of its own, until release-ip
#   hack/node.sh release-ip      IP back to its node (delete the pod that got it first)
#
# Needs root and a running hack/control-plane.sh, started with CONSISTD_CP_NODE=1 for ServiceAccount tokens.
# State lives in $CONSISTD_NODE_DIR (default target/node), a directory per node; images come from
# $CONSISTD_IMAGES (default target/images, every *.tar there, e.g. from hack/image.sh; pause.tar is the
# sandbox image). $CONSISTD_NODES nodes (default 2), named $CONSISTD_NODE_NAME-1, -2, ... (default
# consistd-node). Node i is the network namespace consistd-n<i>, 10.250.0.<10+i> on the host's bridge cnlink
# (the host is 10.250.0.1), its pods 10.244.<i>.0/24 on a bridge cn0 inside it, its cgroups under /<name> in
# every hierarchy. One set of nodes per host: those names and ranges are fixed. Pods and kubelets reach the
# apiserver (on the host's loopback) at https://10.96.0.1, whose certificate names that address.
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
prefix=${CONSISTD_NODE_NAME:-consistd-node}
count=${CONSISTD_NODES:-2}
# Nodes that run were started with their own count and names: stop and the faults take those.
# shellcheck source=/dev/null
[ ! -f "$state/nodes.env" ] || source "$state/nodes.env"
link=cnlink                      # the host's bridge: the nodes' LAN
host_ip=10.250.0.1
bridge=cn0                       # each node's CNI bridge, inside its namespace; the node is 10.244.<i>.1 there
service_ip=10.96.0.1             # the `kubernetes` Service (first address of the apiserver's service range)
tag="consistd-node:$state"       # comment on every iptables rule and /etc/hosts line this script adds
kubectl() { KUBECONFIG=$cp_state/kubeconfig KUBECACHEDIR=$state/kubectl-cache "$(bin kubectl)" "$@"; }

indices() { seq 1 "$count"; }
node_name() { echo "$prefix-$1"; }
node_dir() { echo "$state/$(node_name "$1")"; }
node_ip() { echo "10.250.0.$((10 + $1))"; }
pod_subnet() { echo "10.244.$1.0/24"; }
netns() { echo "consistd-n$1"; }
in_node() { local i=$1; shift; nsenter --net="/run/netns/$(netns "$i")" -- "$@"; }
freezer() { echo "/sys/fs/cgroup/freezer/$(node_name "$1")"; }
# index NODE: the index of a node given by name (or index), or dies.
index() {
  local i
  for i in $(indices); do
    if [ "$1" = "$i" ] || [ "$1" = "$(node_name "$i")" ]; then echo "$i"; return 0; fi
  done
  die "no node $1 (the nodes are $(for i in $(indices); do node_name "$i"; done | xargs))"
}
node_ctr() { local d; d=$(node_dir "$1"); shift; command ctr --address "$d/containerd.sock" -n k8s.io "$@"; }

# A killed child of a script that has exited stays a zombie until PID 1 reaps it: that is not alive.
live() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${st#Z}" = "$st" ]; }
pid_alive() { [ -f "$1" ] && live "$(cat "$1")"; }
# shellcheck source=node/host.sh
source "$repo/hack/node/host.sh"
# shellcheck source=node/config.sh
source "$repo/hack/node/config.sh"
# pidfiles: every process this start runs, the cluster's and each node's.
pidfiles() {
  local i
  echo "$state/controller-manager.pid" "$state/scheduler.pid"
  for i in $(indices); do echo "$(node_dir "$i")/containerd.pid" "$(node_dir "$i")/kubelet.pid"; done
}
running() {
  local f
  for f in $(pidfiles); do pid_alive "$f" || return 1; done
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
  for c in containerd containerd-shim-runc-v2 runc ctr iptables iptables-save conntrack nft nsenter; do
    command -v "$c" >/dev/null || missing=1
  done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing=1
  [ "$missing" = 0 ] && return 0
  log "installing containerd runc containernetworking-plugins iptables conntrack nftables from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd runc containernetworking-plugins iptables conntrack \
    nftables util-linux >&2
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
      pid_alive "$f" || { tail -n 30 "$(dirname "$f")/logs/$(basename "$f" .pid).log" >&2; die "$(basename "$f" .pid) exited while waiting for $what"; }
    done
    [ $SECONDS -lt $deadline ] || die "no $what within $1 s"
    sleep 0.2
  done
}

node_ready() {
  [ "$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
all_ready() {
  local i
  for i in $(indices); do node_ready "$(node_name "$i")" || return 1; done
}

# load_into I FILE...: import the image tarballs into node I's containerd.
load_into() {
  local i=$1 f
  shift
  for f in "$@"; do
    node_ctr "$i" images import "$f" >/dev/null || die "importing $f into $(node_name "$i") failed"
  done
}
cmd_load() {
  local i
  for i in $(indices); do load_into "$i" "$@"; done
  log "imported $* into every node"
}

# run_in_node I PIDFILE LOG COMMAND...: COMMAND in node I's network namespace and its freezer cgroup (which
# its children, containerd's shims and so every container, inherit), in the background.
run_in_node() {
  local i=$1 pidfile=$2 logfile=$3
  shift 3
  # shellcheck disable=SC2016 # $$ is the inner shell's, which exec keeps as the daemon's PID
  setsid sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$(freezer "$i")" \
    nsenter --net="/run/netns/$(netns "$i")" -- "$@" >"$logfile" 2>&1 </dev/null &
  echo $! >"$pidfile"
}

# start_node I: node I's namespace on the link, its routes and Service rule, cgroups, containerd and kubelet.
start_node() {
  local i=$1 j name dir ip ns s
  name=$(node_name "$i") dir=$(node_dir "$i") ip=$(node_ip "$i") ns=$(netns "$i")
  mkdir -p "$dir/logs"
  ip netns add "$ns"
  ip link add "cnv$i" type veth peer name "cnp$i"
  ip link set "cnp$i" netns "$ns"
  ip link set "cnv$i" master "$link" up
  in_node "$i" ip link set lo up
  in_node "$i" ip link set "cnp$i" name eth0
  in_node "$i" ip addr add "$ip/24" dev eth0
  in_node "$i" ip link set eth0 up
  in_node "$i" ip route add default via "$host_ip"
  for j in $(indices); do
    [ "$j" = "$i" ] || in_node "$i" ip route add "$(pod_subnet "$j")" via "$(node_ip "$j")"
  done
  ip route add "$(pod_subnet "$i")" via "$ip" dev "$link"
  in_node "$i" sysctl -qw net.ipv4.ip_forward=1
  # What kube-proxy would do for the `kubernetes` Service, from the node's pods and from the node itself: to
  # the host's end of the link, which the host forwards to the apiserver on its loopback.
  in_node "$i" iptables -t nat -A PREROUTING -d "$service_ip/32" -p tcp --dport 443 -j DNAT --to-destination "$host_ip:$api_port"
  in_node "$i" iptables -t nat -A OUTPUT -d "$service_ip/32" -p tcp --dport 443 -j DNAT --to-destination "$host_ip:$api_port"
  # The kubelet's cgroup root must exist in every hierarchy; cpuset's must have cpus and mems to hold tasks.
  for s in /sys/fs/cgroup/*/; do
    [ "$s" = /sys/fs/cgroup/unified/ ] || mkdir -p "$s$name"
  done
  cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$name/cpuset.cpus"
  cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$name/cpuset.mems"
  # The apiserver reaches the kubelet (logs, exec) by the node's name.
  printf '%s %s # %s\n' "$ip" "$name" "$tag" >>/etc/hosts
  sed "s|server: .*|server: https://$service_ip:443|" "$cp_state/kubeconfig" >"$dir/kubeconfig"

  write_configs "$dir" "$name" "$(pod_subnet "$i")" "$ip"
  run_in_node "$i" "$dir/containerd.pid" "$dir/logs/containerd.log" containerd --config "$dir/containerd.toml"
  wait_for 30 "containerd of $name" "$dir/containerd.pid" -- node_ctr "$i" version
  if [ -f "$images/pause.tar" ]; then
    load_into "$i" "$images"/*.tar
  else
    log "WARNING: $images/pause.tar is missing (hack/image.sh pause): $name gets Ready but runs no pods"
  fi
  # A Node object left by a node that was killed still says Ready for a while: start from none.
  kubectl delete node "$name" --ignore-not-found >/dev/null
  run_in_node "$i" "$dir/kubelet.pid" "$dir/logs/kubelet.log" "$(bin kubelet)" --config "$dir/kubelet.yaml" \
    --kubeconfig "$dir/kubeconfig" --hostname-override "$name" --node-ip "$ip" --root-dir "$dir/kubelet" \
    --cert-dir "$dir/kubelet/pki" --volume-plugin-dir "$dir/kubelet/volume-plugins" --v 1
}

cmd_start() {
  [ "$(id -u)" = 0 ] || die "must run as root (containerd, kubelet, network namespaces and iptables)"
  if [ ! -f "$cp_state/kubeconfig" ] || [ ! -f "$cp_state/server" ]; then
    die "the control plane is not running: hack/control-plane.sh start"
  fi
  if running; then log "already running"; return 0; fi
  [ -f "$cp_state/node-mode" ] ||
    log "WARNING: the control plane was started without CONSISTD_CP_NODE=1: pods get no ServiceAccount token"
  local t0=$SECONDS i
  ensure_packages
  cmd_build
  recover_host
  cmd_stop >/dev/null 2>&1 || true
  rm -rf "$state"
  mkdir -p "$state/logs"
  count=${CONSISTD_NODES:-2} prefix=${CONSISTD_NODE_NAME:-consistd-node}
  printf 'count=%q prefix=%q\n' "$count" "$prefix" >"$state/nodes.env"
  # From here on a failed start undoes itself.
  trap 'log "start failed; undoing it"; cmd_stop' EXIT
  save_host
  local pki=$cp_state/pki server api_host api_port
  server=$(cat "$cp_state/server")
  api_host=${server#https://}
  api_port=${api_host##*:}
  api_host=${api_host%:*}

  # The link exists before any node so that route_localnet can be set on it: the nodes' packets to the
  # apiserver are DNATed to its loopback address, which the kernel drops as martian otherwise.
  ip link add "$link" type bridge
  ip addr add "$host_ip/24" dev "$link"
  ip link set "$link" up
  sysctl -qw "net.ipv4.conf.$link.route_localnet=1"
  iptables -t nat -A PREROUTING -i "$link" -d "$host_ip/32" -p tcp --dport "$api_port" \
    -m comment --comment "$tag" -j DNAT --to-destination "$api_host:$api_port"
  # The host's own twin of the nodes' Service rule (tests call https://10.96.0.1 from here).
  iptables -t nat -A OUTPUT -d "$service_ip/32" -p tcp --dport 443 \
    -m comment --comment "$tag" -j DNAT --to-destination "$api_host:$api_port"
  for i in $(indices); do start_node "$i"; done

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
  # shellcheck disable=SC2046 # one pidfile a word
  wait_for 120 "Ready nodes" $(pidfiles) -- all_ready
  local f
  for f in $(pidfiles); do
    pid_alive "$f" || { tail -n 30 "$(dirname "$f")/logs/$(basename "$f" .pid).log" >&2; die "$f exited during start"; }
  done
  trap - EXIT
  log "$count nodes ($(for i in $(indices); do node_name "$i"; done | xargs)) Ready $((SECONDS - t1)) s after their kubelets started ($((SECONDS - t0)) s in all); logs in $state/*/logs"
}

# Stops everything start began, in an order that lets kubelet and containerd tear pods down themselves
# while they can, then removes by force whatever is left, then restores the host. Safe to repeat.
cmd_stop() {
  local i name dir
  for i in $(indices); do [ ! -d "$(freezer "$i")" ] || cmd_thaw "$i" >/dev/null 2>&1 || true; done
  heal >/dev/null 2>&1 || true
  cmd_release_ip >/dev/null 2>&1 || true
  stop_pid "$state/scheduler.pid"
  stop_pid "$state/controller-manager.pid"
  for i in $(indices); do
    name=$(node_name "$i")
    if pid_alive "$(node_dir "$i")/kubelet.pid" && kubectl get node "$name" >/dev/null 2>&1; then
      kubectl delete pods -A --field-selector "spec.nodeName=$name" --grace-period=1 --wait=false >/dev/null 2>&1 || true
    fi
  done
  local deadline=$((SECONDS + 30))
  for i in $(indices); do
    name=$(node_name "$i")
    while [ $SECONDS -lt $deadline ] && pid_alive "$(node_dir "$i")/kubelet.pid" &&
      [ -n "$(kubectl get pods -A --field-selector "spec.nodeName=$name" -o name 2>/dev/null)" ]; do
      sleep 0.5
    done
    ! pid_alive "$(node_dir "$i")/kubelet.pid" || kubectl delete node "$name" --wait=false >/dev/null 2>&1 || true
  done
  for i in $(indices); do
    dir=$(node_dir "$i")
    stop_pid "$dir/kubelet.pid"
    # Containers left running (a kubelet that died, a control plane already gone) and their shims, which
    # share the node's freezer cgroup with containerd: all but containerd itself, then it.
    kill_node_tasks "$i" "$(cat "$dir/containerd.pid" 2>/dev/null || echo 0)"
    # libcni caches results in /var/lib/cni/results by sandbox ID.
    local tasks=$dir/containerd/state/io.containerd.runtime.v2.task/k8s.io id sock
    if [ -d "$tasks" ]; then
      for id in "$tasks"/*; do
        sock=$(sed -n 's|^unix://||p' "$id/address" 2>/dev/null || true)
        [ -z "$sock" ] || rm -f "$sock"
        rm -f /var/lib/cni/results/*-"${id##*/}"-*
      done
    fi
    stop_pid "$dir/containerd.pid"
    kill_node_tasks "$i" 0
  done
  sleep 0.2
  unmount_state
  restore_host
  if [ -d "$state" ]; then
    # Keep the logs for a post-mortem; everything else (image stores, pod volumes) goes.
    find "$state" -mindepth 1 -maxdepth 1 ! -name logs ! -name "$prefix-*" -exec rm -rf {} +
    for dir in "$state/$prefix"-*/; do
      [ ! -d "$dir" ] || find "$dir" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
    done
  fi
  log "stopped"
}

# kill_node_tasks I KEEP: SIGKILL every process in node I's freezer cgroup tree but the PID KEEP.
kill_node_tasks() {
  local d
  d=$(freezer "$1")
  [ -d "$d" ] || return 0
  find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | { grep -vx "$2" || true; } | xargs -r kill -9 2>/dev/null || true
}

cmd_status() {
  local i name rc=0
  if ! running; then echo "not running"; return 1; fi
  for i in $(indices); do
    name=$(node_name "$i")
    if node_ready "$name"; then echo "running: node $name Ready"; else echo "running: node $name not Ready"; rc=1; fi
  done
  return $rc
}

cmd_env() {
  running || die "not running; start it with: hack/node.sh start"
  echo "export KUBECONFIG=$cp_state/kubeconfig"
  echo "export KUBECTL=$(bin kubectl)"
  echo "export KUBECACHEDIR=$state/kubectl-cache # not ~/.kube/cache"
  echo "export CONSISTD_NODE_NAMES='$(for i in $(indices); do node_name "$i"; done | xargs)'"
  echo "# ctr for a node: $0 ctr NODE ARG..."
}

# Faults. freeze: the node's link down at the host, then every task in its freezer cgroup stopped where it is.
cmd_freeze() {
  local i
  i=$(index "$1")
  ip link set "cnv$i" down
  echo FROZEN >"$(freezer "$i")/freezer.state"
  for _ in $(seq 1 100); do [ "$(cat "$(freezer "$i")/freezer.state")" = FROZEN ] && return 0; sleep 0.1; done
  die "$(node_name "$i") did not freeze"
}
cmd_thaw() {
  local i
  i=$(index "$1")
  echo THAWED >"$(freezer "$i")/freezer.state"
  ip link set "cnv$i" up
}
# Partitions and cuts are nftables rules in the nodes' namespaces (table inet consistd-fault), gone with them.
fault_rules() { # fault_rules I MATCH...: drop packets from and to MATCH in node I, routed or its own
  local i=$1
  shift
  in_node "$i" nft add table inet consistd-fault
  local hook
  for hook in input output forward; do
    in_node "$i" nft add chain inet consistd-fault "$hook" "{ type filter hook $hook priority 0; }"
  done
  local m
  for m in "$@"; do
    for hook in input output forward; do
      in_node "$i" nft add rule inet consistd-fault "$hook" ip daddr "$m" drop
      in_node "$i" nft add rule inet consistd-fault "$hook" ip saddr "$m" drop
    done
  done
}
cmd_partition() {
  local a b
  a=$(index "$1") b=$(index "$2")
  fault_rules "$a" "$(node_ip "$b")" "$(pod_subnet "$b")"
  fault_rules "$b" "$(node_ip "$a")" "$(pod_subnet "$a")"
}
cmd_cut() {
  local i
  i=$(index "$1")
  # The host's end of the link is the apiserver's (DNAT); the node still reaches the other nodes directly.
  fault_rules "$i" "$host_ip"
}
heal() {
  local i
  for i in $(indices); do
    [ -e "/run/netns/$(netns "$i")" ] && in_node "$i" nft delete table inet consistd-fault 2>/dev/null || true
  done
}

# The claim of another node's pod address, "I IP" in $state/claimed-ip (gone with the nodes' state).
claim=$state/claimed-ip
claim_bridge=cr0
claim_conflist() { echo "$(node_dir "$1")/cni/net.d/05-claimed-ip.conflist"; } # before 10-consistd: used
claim_ipam() { echo "$(node_dir "$1")/cni/ipam-claimed-ip"; }
# subnet_owner IP: the index of the node whose pod subnet holds IP, or dies.
subnet_owner() {
  local i
  for i in $(indices); do
    [ "${1%.*}.0/24" != "$(pod_subnet "$i")" ] || { echo "$i"; return 0; }
  done
  die "$1 is in no node's pod subnet"
}
cmd_claim_ip() {
  local i j ip=$2
  i=$(index "$1")
  [[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "claim-ip: $ip is not an IPv4 address"
  j=$(subnet_owner "$ip")
  [ "$j" != "$i" ] || die "claim-ip: $ip is $(node_name "$i")'s own"
  [ "${ip##*.}" -gt 1 ] || die "claim-ip: $ip is $(node_name "$j")'s gateway, not a pod's"
  [ ! -f "$claim" ] || die "claim-ip: already claimed ($(cat "$claim")): release-ip first"
  echo "$i $ip" >"$claim"
  # Node I reaches the rest of J's pods no more (J is down): J's subnet is on I's new bridge instead, the
  # bridge's gateway address J's, so the pod's default route is as on J.
  in_node "$i" ip route del "$(pod_subnet "$j")" via "$(node_ip "$j")"
  ip route add "$ip/32" via "$(node_ip "$i")" dev "$link"
  cni_conflist consistd-claimed-ip "$claim_bridge" "\"subnet\": \"$(pod_subnet "$j")\", \"rangeStart\": \"$ip\", \"rangeEnd\": \"$ip\"" \
    "$(claim_ipam "$i")" >"$(claim_conflist "$i").tmp"
  # containerd reloads its CNI config when the directory changes: one rename, never a half-written file.
  mv "$(claim_conflist "$i").tmp" "$(claim_conflist "$i")"
}
cmd_release_ip() {
  local i ip j
  [ -f "$claim" ] || return 0
  read -r i ip <"$claim"
  j=$(subnet_owner "$ip")
  rm -f "$(claim_conflist "$i")"
  rm -rf "$(claim_ipam "$i")"
  in_node "$i" ip link del "$claim_bridge" 2>/dev/null || true
  in_node "$i" ip route replace "$(pod_subnet "$j")" via "$(node_ip "$j")"
  ip route del "$ip/32" via "$(node_ip "$i")" dev "$link" 2>/dev/null || true
  rm -f "$claim"
}

case "${1:-}" in
build) cmd_build ;;
prepare) ensure_packages; cmd_build ;;
start) cmd_start ;;
load) shift; cmd_load "$@" ;;
stop) cmd_stop ;;
status) cmd_status ;;
env) cmd_env ;;
ctr) shift; i=$(index "${1:?usage: $0 ctr NODE ARG...}"); shift; node_ctr "$i" "$@" ;;
freeze) cmd_freeze "${2:?usage: $0 freeze NODE}" ;;
thaw) cmd_thaw "${2:?usage: $0 thaw NODE}" ;;
partition) cmd_partition "${2:?usage: $0 partition NODE NODE}" "${3:?usage: $0 partition NODE NODE}" ;;
cut) cmd_cut "${2:?usage: $0 cut NODE}" ;;
heal) heal ;;
claim-ip) cmd_claim_ip "${2:?usage: $0 claim-ip NODE IP}" "${3:?usage: $0 claim-ip NODE IP}" ;;
release-ip) cmd_release_ip ;;
*)
  echo "usage: $0 build|prepare|start|load FILE...|stop|status|env|ctr NODE ARG...|freeze NODE|thaw NODE|partition A B|cut NODE|heal|claim-ip NODE IP|release-ip" >&2
  exit 2
  ;;
esac
