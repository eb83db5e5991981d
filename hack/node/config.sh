# Sourced by hack/node.sh: one node's containerd, CNI and kubelet configuration, written under its directory.
# shellcheck shell=bash disable=SC2154 # bridge, ... are hack/node.sh's

# write_configs DIR NAME POD_SUBNET NODE_IP: the configuration of node NAME, whose kubelet listens on NODE_IP
# (in the node's network namespace), whose pods get POD_SUBNET and whose cgroups live under /NAME.
write_configs() {
  local state=$1 name=$2 pod_subnet=$3 node_ip=$4
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
  cni_conflist consistd "$bridge" "\"subnet\": \"$pod_subnet\"" "$state/cni/ipam" >"$state/cni/net.d/10-consistd.conflist"
  cat >"$state/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# The apiserver has no kubelet client certificate; the kubelet listens only on the nodes' link, which only
# this host and the other nodes reach.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
# Each node's pods in a cgroup tree of its own (created by hack/node.sh, beside its daemons' freezer cgroup).
cgroupRoot: /$name
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

# cni_conflist NAME BRIDGE RANGE IPAM_DIR: the CNI network NAME, pods on BRIDGE (in the node's namespace, their
# gateway) with addresses from the host-local range RANGE (its JSON members: "subnet", maybe "rangeStart", ...).
cni_conflist() {
  cat <<EOF
{"cniVersion": "0.4.0", "name": "$1", "plugins": [{
  "type": "bridge", "bridge": "$2", "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "ranges": [[{$3}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$4"}}]}
EOF
}
