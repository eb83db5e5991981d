//! consistd: a sidecar that owns a pod's Kubernetes watches, leader elections and ACK-tracked sends, and
//! serves them to the pod's app containers over gRPC on a Unix socket.
//!
//! The binary (`main.rs`) only parses flags and calls into these modules:

pub mod admin;
pub(crate) mod api;
pub(crate) mod authority;
pub mod cli;
pub(crate) mod cluster;
pub mod config;
pub(crate) mod connections;
pub mod error;
pub(crate) mod fencing;
pub mod health;
pub(crate) mod inbox;
pub mod inject;
pub(crate) mod leadership;
pub(crate) mod metrics;
pub(crate) mod mounted;
pub(crate) mod names;
pub(crate) mod objects;
pub(crate) mod outbox;
pub(crate) mod peer;
pub(crate) mod reconcile;
pub mod reload;
pub(crate) mod rollout;
pub mod run;
pub(crate) mod socket;
pub(crate) mod store;
pub mod telemetry;
pub(crate) mod transport;
pub(crate) mod watch;

pub use api::SERVICE_NAMES;
/// What consistd's Leases carry, public for `kubectl consistd`, which reads them.
pub use leadership::{
    MANAGED_BY, MANAGED_BY_LABEL,
    membership::{
        APPLIED_VERSION_ANNOTATION, DEFAULT_TTL_SECONDS as DEFAULT_MEMBER_TTL_SECONDS, ELECTION_ANNOTATION,
        MEMBER_OF_LABEL,
    },
};
/// A channel's versions in the cluster, public for the test that races publishers against a real
/// apiserver (`tests/rollout_versions.rs`).
pub use rollout::versions;
