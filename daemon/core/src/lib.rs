//! consistd's core: what the daemon's parts share and `kubectl consistd` reads, with no sockets and no
//! store of its own: the config and its checks, names Kubernetes accepts, errors as people read them, the
//! memory the process may use, the admin report, the labels and annotations of consistd's Leases, a rollout channel's versions in the
//! cluster, the one mutation that adds the sidecar to a pod, files mounted from ConfigMaps and Secrets, watched
//! for kubelet's swap, and the groups that own every task the daemon starts.

pub mod claim;
pub mod config;
pub mod error;
pub mod inject;
pub mod lease;
pub mod memory;
pub mod mounted;
pub mod names;
pub mod report;
pub mod tasks;
pub mod versions;
