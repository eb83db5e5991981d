#!/usr/bin/env bash
# Prints the host state hack/node.sh must leave as it found it, normalized for diffing before and after.
#
#   hack/host-snapshot.sh > before; ...; hack/host-snapshot.sh > after; diff before after
#
# Sections: sysctls (less the counters that move on their own), links, routes, iptables rules, mounts, cgroup
# directories, /etc/hosts, network namespaces, and the host paths kubelet, containerd, CNI and kubectl
# default to (whether each exists and how many entries it holds).
set -euo pipefail
volatile='^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr)|kernel\.(random\.|ns_last_pid|pty\.nr)|net\.netfilter\.nf_conntrack_count|net\.ipv4\.tcp_mem|net\.ipv4\.udp_mem|fs\.quota\.)'
echo '## sysctl'
sysctl -a 2>/dev/null | { grep -Ev "$volatile" || true; } | sort
echo '## links'
ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
echo '## routes'
ip -4 route show table all | sort
echo '## iptables'
if command -v iptables-save >/dev/null; then iptables-save 2>/dev/null | { grep -Ev '^#' || true; } | sed 's/ \[[0-9:]*\]$//'; fi
echo '## mounts'
awk '{print $2, $3}' /proc/self/mounts | sort
echo '## cgroups'
find /sys/fs/cgroup -maxdepth 2 -mindepth 2 -type d | sort
echo '## hosts'
cat /etc/hosts
echo '## netns'
ip netns list 2>/dev/null | sort
echo '## paths'
for p in /run/containerd /run/containerd/s /var/lib/containerd /opt/containerd /var/lib/cni /etc/cni /run/netns \
  /var/lib/kubelet /var/log/pods /var/log/containers /usr/libexec/kubernetes /etc/kubernetes /var/run/kubernetes \
  "$HOME/.kube"; do
  if [ -e "$p" ]; then echo "$p $(find "$p" 2>/dev/null | wc -l)"; else echo "$p absent"; fi
done
