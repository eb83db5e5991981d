//! consistd: a sidecar that owns a pod's Kubernetes watches, leader elections and ACK-tracked sends, and
//! serves them to the pod's app containers over gRPC on a Unix socket.
//!
//! The binary (`main.rs`) only parses flags and calls into these modules:

pub mod admin;
pub(crate) mod api;
pub(crate) mod authority;
pub mod cli;
pub(crate) mod connections;
pub mod health;
pub(crate) mod inbox;
pub mod inject;
pub(crate) mod outbox;
pub(crate) mod peer;
pub mod reload;
pub(crate) mod rollout;
pub mod run;
pub(crate) mod socket;
pub(crate) mod store;
pub(crate) mod transport;

pub use api::SERVICE_NAMES;
