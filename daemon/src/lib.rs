//! consistd: a sidecar that owns a pod's Kubernetes watches, leader elections and ACK-tracked sends, and
//! serves them to the pod's app containers over gRPC on a Unix socket.
//!
//! The binary (`main.rs`) only parses flags and calls into these modules:

pub mod admin;
pub mod api;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod error;
pub mod health;
pub mod inbox;
pub mod leadership;
pub mod metrics;
pub mod names;
pub mod objects;
pub mod outbox;
pub mod peer;
pub mod rollout;
pub mod run;
pub mod socket;
pub mod store;
pub mod telemetry;
pub mod transport;
pub mod watch;
