//! consistd: a sidecar that owns a pod's Kubernetes watches, leader elections and ACK-tracked sends, and
//! serves them to the pod's app containers over gRPC on a Unix socket.
//!
//! The binary (`main.rs`) only parses flags and calls into these modules:

pub mod cli;
pub mod inject;
pub mod reload;
pub mod run;
