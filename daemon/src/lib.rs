//! consistd: a sidecar that owns a pod's Kubernetes watches, leader elections and ACK-tracked sends, and
//! serves them to the pod's app containers over gRPC on a Unix socket.
//!
//! The binary (`main.rs`) only parses flags and calls into these modules:

pub mod admin;
pub(crate) mod api;
pub(crate) mod authority;
pub mod cli;
pub(crate) mod cluster;
pub(crate) mod connections;
pub(crate) mod fencing;
pub mod health;
pub(crate) mod inbox;
pub mod inject;
pub(crate) mod leadership;
pub(crate) mod metrics;
pub(crate) mod mounted;
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
