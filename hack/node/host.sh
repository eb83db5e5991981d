# Sourced by hack/node.sh: records what starting a node changes on the host, and puts all of it back.
# shellcheck shell=bash disable=SC2154 # state, bridge, pod_subnet, ... are hack/node.sh's

# Sysctls kubelet sets (pkg/kubelet/cm setupKernelTunables) and the bridge plugin's ip_forward.
sysctls="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
kernel.keys.root_maxbytes net.ipv4.ip_forward"
# Host paths containerd (shim sockets in /run/containerd/s), CNI (its result cache) and kubelet (symlinks to
# container logs) use whatever their config says. Another containerd may share them: stop removes only this
# node's files there, and the directories themselves only if start made them and they are empty.
host_dirs="/run/containerd/s /run/containerd /var/lib/cni/results /var/lib/cni /var/log/containers /var/lib/kubelet
/usr/libexec/kubernetes"

# Everything start changes on the host is recorded first, so stop can put it back even after a crash; stop
# deletes the record last. The record is host-wide (one node per host), not in $state, and names the state
# directory it belongs to: a run killed before it could stop leaves it for the next start to find, even if
# that run's checkout is gone.
host_record=/run/consistd-node

save_host() {
  local h=$host_record k d
  if ip link show "$bridge" >/dev/null 2>&1; then die "a link named $bridge exists already; not touching it"; fi
  mkdir -p "$h"
  echo "$state" >"$h/owner"
  for k in $sysctls; do echo "$k=$(sysctl -n "$k")"; done >"$h/sysctls"
  for d in $host_dirs; do if [ -e "$d" ]; then echo "$d"; fi; done >"$h/dirs"
  touch "$h/bridge"
  # iptables (nft backend) creates the nat table for the DNAT rules; it stays, empty, once they are gone.
  if ! nft list table ip nat >/dev/null 2>&1; then touch "$h/no-nat-table"; fi
}

# A node started from another state directory whose processes are all gone (its run was killed) is stopped
# from that directory, which puts the host back; one that still runs is left alone.
recover_host() {
  local owner p
  [ -f "$host_record/owner" ] || return 0
  owner=$(cat "$host_record/owner")
  [ "$owner" != "$state" ] || return 0 # this node's own: its stop puts it back
  for p in containerd kubelet controller-manager scheduler; do
    if pid_alive "$owner/$p.pid"; then
      die "a node started from $owner runs on this host (one per host): CONSISTD_NODE_DIR=$owner hack/node.sh stop"
    fi
  done
  log "the node started from $owner was killed without stopping: putting back what it changed on the host"
  CONSISTD_NODE_DIR=$owner "$repo/hack/node.sh" stop
}

restore_host() {
  local h=$host_record line k v d
  [ "$(cat "$h/owner" 2>/dev/null)" = "$state" ] || return 0
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
