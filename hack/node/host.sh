# Sourced by hack/node.sh: records what starting a node changes on the host, and puts all of it back.
# shellcheck shell=bash disable=SC2154 # state, link, tag, ... are hack/node.sh's

# Sysctls kubelet sets (pkg/kubelet/cm setupKernelTunables) and the bridge plugin's ip_forward.
sysctls="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
kernel.keys.root_maxbytes net.ipv4.ip_forward"
# Host paths containerd (shim sockets in /run/containerd/s), CNI (its result cache) and kubelet (symlinks to
# container logs) use whatever their config says. Another containerd may share them: stop removes only this
# node's files there, and the directories themselves only if start made them and they are empty.
host_dirs="/run/containerd/s /run/containerd /var/lib/cni/results /var/lib/cni /var/log/containers /var/lib/kubelet
/usr/libexec/kubernetes /run/netns"

# Everything start changes on the host is recorded first, so stop can put it back even after a crash; stop
# deletes the record last. The record is host-wide (one node per host), not in $state, and names the state
# directory it belongs to: a run killed before it could stop leaves it for the next start to find, even if
# that run's checkout is gone.
host_record=/run/consistd-node

save_host() {
  local h=$host_record k d
  if ip link show "$link" >/dev/null 2>&1; then die "a link named $link exists already; not touching it"; fi
  mkdir -p "$h"
  echo "$state" >"$h/owner"
  for k in $sysctls; do echo "$k=$(sysctl -n "$k")"; done >"$h/sysctls"
  for d in $host_dirs; do if [ -e "$d" ]; then echo "$d"; fi; done >"$h/dirs"
  # `ip netns add` bind-mounts /run/netns on itself the first time.
  if mountpoint -q /run/netns 2>/dev/null; then touch "$h/netns-mounted"; fi
  # Each node: its network namespace (with its end of the link, its bridge and rules) and its cgroup trees.
  local i
  for i in $(indices); do echo "$(netns "$i") $(node_name "$i")"; done >"$h/nodes"
  touch "$h/link"
  # iptables (nft backend) creates the nat table for the DNAT rules; it stays, empty, once they are gone.
  if ! nft list table ip nat >/dev/null 2>&1; then touch "$h/no-nat-table"; fi
}

# A node started from another state directory whose processes are all gone (its run was killed) is stopped
# from that directory, which puts the host back; one that still runs is left alone.
recover_host() {
  local owner p
  [ -f "$host_record/owner" ] || return 0
  owner=$(cat "$host_record/owner")
  [ "$owner" != "$state" ] || return 0 # these nodes' own: their stop puts it back
  # A run killed while a node was frozen leaves its tasks frozen, where no SIGKILL takes them.
  local ns name
  if [ -f "$host_record/nodes" ]; then
    while read -r ns name; do
      [ ! -f "/sys/fs/cgroup/freezer/$name/freezer.state" ] || echo THAWED >"/sys/fs/cgroup/freezer/$name/freezer.state"
    done <"$host_record/nodes"
  fi
  for p in "$owner"/*.pid "$owner"/*/*.pid; do
    if pid_alive "$p"; then
      die "nodes started from $owner run on this host (one set per host): CONSISTD_NODE_DIR=$owner hack/node.sh stop"
    fi
  done
  log "the nodes started from $owner were killed without stopping: putting back what they changed on the host"
  CONSISTD_NODE_DIR=$owner "$repo/hack/node.sh" stop
}

restore_host() {
  local h=$host_record line k v d
  [ "$(cat "$h/owner" 2>/dev/null)" = "$state" ] || return 0
  local ns name
  # A namespace goes with its links (the node's end of the link, its pods' bridge), routes and rules.
  if [ -f "$h/nodes" ]; then
    while read -r ns name; do
      if [ -e "/run/netns/$ns" ]; then ip netns delete "$ns"; fi
    done <"$h/nodes"
  fi
  if [ ! -f "$h/netns-mounted" ] && mountpoint -q /run/netns 2>/dev/null; then umount /run/netns || umount -l /run/netns; fi
  # The host's end of each veth goes with the namespace; the link's routes go with the link.
  if [ -f "$h/link" ] && ip link show "$link" >/dev/null 2>&1; then ip link delete "$link"; fi
  # iptables rules carry $tag as their comment; kubelet's own chains are off (makeIPTablesUtilChains: false).
  for t in nat filter mangle; do
    { iptables-save -t "$t" 2>/dev/null || true; } | { grep -F -- "$tag" || true; } | sed -n 's/^-A /-D /p' |
      while read -r line; do eval "iptables -t $t $line" || true; done
  done
  if [ -f "$h/no-nat-table" ] && ! iptables-save -t nat 2>/dev/null | grep -q '^-A'; then
    nft delete table ip nat 2>/dev/null || true
  fi
  # Each node's cgroup trees (its root and what kubelet made under it): leaves first; they are empty once
  # every container and daemon of the node is gone.
  if [ -f "$h/nodes" ]; then
    while read -r ns name; do
      for d in /sys/fs/cgroup/*/"$name"; do
        if [ -d "$d" ]; then find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
      done
    done <"$h/nodes"
  fi
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
