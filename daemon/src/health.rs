//! The daemon's view of its own health: is the gRPC socket served, can the apiserver be reached, and
//! what the watches, elections, outbox and inbox hold.
//! /readyz, /debug/state and `consistd status` all read this one report.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{Instant, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::{inbox::Inbox, leadership::Leadership, outbox::Outbox, watch::Hub};

/// What `/debug/state` answers and `consistd status` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// consistd's version.
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_seconds: u64,
    /// The gRPC socket path.
    pub socket: PathBuf,
    /// Whether the gRPC server accepts calls.
    pub serving: bool,
    /// The apiserver as last probed.
    pub apiserver: Apiserver,
    /// Upstream apiserver watches running, one per distinct query however many subscribers share it.
    #[serde(default)]
    pub upstream_watches: usize,
    /// Every election this daemon runs, campaigning or only observing, sorted by Lease.
    #[serde(default)]
    pub elections: Vec<ElectionReport>,
    /// Messages the outbox holds, one per (destination, resource_id), including a group's newest kept
    /// for members that join later.
    #[serde(default)]
    pub outbox_pending: usize,
    /// Per destination and peer: the connection and what that peer has not ACKed.
    #[serde(default)]
    pub peers: Vec<PeerReport>,
    /// Messages waiting for the app's ACK.
    #[serde(default)]
    pub inbox_pending: usize,
    /// Ready for traffic: serving, and the apiserver was reached.
    pub ready: bool,
    /// Why not ready; empty when ready.
    pub not_ready_reasons: Vec<String>,
}

/// One election as this daemon sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElectionReport {
    /// "namespace/name" of the Lease.
    pub election: String,
    /// LEADER, FOLLOWER or UNKNOWN.
    pub role: String,
    /// The Lease holder's identity; empty when nobody holds it or its Lease expired.
    pub holder: String,
    /// The fencing term: the Lease's leaseTransitions + 1, growing on every change of holder.
    pub term: u64,
}

/// One destination's peer as this daemon's outbox sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    /// The destination ("peer 10.0.0.1:7070", "service ns/web", "election ns/group").
    pub destination: String,
    /// The peer address; empty while a group has no member.
    pub peer: String,
    /// Whether a connection is up.
    pub connected: bool,
    /// Messages the peer has not ACKed.
    pub pending: usize,
}

/// The apiserver as last probed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Apiserver {
    /// The apiserver URL the daemon's client uses (in-cluster, or from KUBECONFIG).
    pub url: String,
    /// Whether the last probe succeeded.
    pub reachable: bool,
    /// Its gitVersion, from /version.
    pub version: Option<String>,
    /// The last probe's error, when it failed.
    pub last_error: Option<String>,
    /// When it was last probed (RFC 3339).
    pub last_checked: Option<String>,
}

/// Shared, cheaply cloned handle on the daemon's health.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    started: Instant,
    socket: PathBuf,
    inner: Arc<Mutex<HealthState>>,
}

#[derive(Debug, Default)]
struct HealthState {
    serving: bool,
    apiserver: Apiserver,
    parts: Option<(Arc<Hub>, Arc<Leadership>)>,
    messages: Option<(Outbox, Inbox)>,
}

impl Health {
    /// A daemon that serves `socket` and talks to the apiserver at `apiserver_url`.
    pub(crate) fn new(socket: PathBuf, apiserver_url: String) -> Self {
        let apiserver = Apiserver { url: apiserver_url, ..Apiserver::default() };
        Self {
            started: Instant::now(),
            socket,
            inner: Arc::new(Mutex::new(HealthState { serving: false, apiserver, parts: None, messages: None })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        // The data is plain values; a panic elsewhere cannot leave it half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The parts whose state the report includes.
    pub(crate) fn attach(&self, hub: Arc<Hub>, leadership: Arc<Leadership>) {
        self.lock().parts = Some((hub, leadership));
    }

    /// The outbox and inbox whose state the report includes.
    pub(crate) fn attach_messages(&self, outbox: Outbox, inbox: Inbox) {
        self.lock().messages = Some((outbox, inbox));
    }

    /// Records whether the gRPC server accepts calls.
    pub(crate) fn set_serving(&self, serving: bool) {
        self.lock().serving = serving;
    }

    /// Records a probe's result: the apiserver's version, or why it could not be reached.
    pub(crate) fn record_probe(&self, result: Result<String, String>) {
        let mut inner = self.lock();
        let a = &mut inner.apiserver;
        a.last_checked = Some(humantime::format_rfc3339_seconds(SystemTime::now()).to_string());
        match result {
            Ok(version) => {
                a.reachable = true;
                a.version = Some(version);
                a.last_error = None;
            }
            Err(error) => {
                a.reachable = false;
                a.last_error = Some(error);
            }
        }
    }

    /// Whether the apiserver answered the last probe.
    pub(crate) fn apiserver_reachable(&self) -> bool {
        self.lock().apiserver.reachable
    }

    /// Builds the report from the parts' state now; readiness needs serving and the apiserver reached.
    pub(crate) fn report(&self) -> Report {
        let inner = self.lock();
        let mut reasons = Vec::new();
        if !inner.serving {
            reasons.push("the gRPC socket is not served".to_owned());
        }
        if !inner.apiserver.reachable {
            let why = inner.apiserver.last_error.as_deref().unwrap_or("not probed yet");
            reasons.push(format!("the apiserver is not reachable: {why}"));
        }
        let (upstream_watches, elections) = match &inner.parts {
            Some((hub, leadership)) => (
                hub.upstream_watches(),
                leadership
                    .snapshot()
                    .into_iter()
                    .map(|(k, s)| ElectionReport {
                        election: format!("{}/{}", k.namespace, k.name),
                        role: format!("{:?}", s.role).to_uppercase(),
                        holder: s.holder,
                        term: s.term,
                    })
                    .collect(),
            ),
            None => (0, Vec::new()),
        };
        let (outbox_pending, peers, inbox_pending) = match &inner.messages {
            Some((outbox, inbox)) => {
                let (destinations, held) = outbox.status();
                let peers = destinations
                    .into_iter()
                    .map(|d| PeerReport {
                        destination: d.destination.to_string(),
                        peer: d.peer,
                        connected: d.connected,
                        pending: d.pending.len(),
                    })
                    .collect();
                (held, peers, inbox.pending())
            }
            None => (0, Vec::new(), 0),
        };
        Report {
            outbox_pending,
            peers,
            inbox_pending,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            upstream_watches,
            elections,
            uptime_seconds: self.started.elapsed().as_secs(),
            socket: self.socket.clone(),
            serving: inner.serving,
            apiserver: inner.apiserver.clone(),
            ready: reasons.is_empty(),
            not_ready_reasons: reasons,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_serving_and_the_apiserver_answered() {
        let health = Health::new("/s.sock".into(), "https://127.0.0.1:6443".into());
        let report = health.report();
        assert!(!report.ready);
        assert_eq!(report.not_ready_reasons.len(), 2);

        health.set_serving(true);
        health.record_probe(Ok("v1.35.4".into()));
        let report = health.report();
        assert!(report.ready, "{report:?}");
        assert_eq!(report.apiserver.version.as_deref(), Some("v1.35.4"));

        health.record_probe(Err("connection refused".into()));
        let report = health.report();
        assert!(!report.ready);
        assert!(report.not_ready_reasons[0].contains("connection refused"));
        assert_eq!(report.apiserver.version.as_deref(), Some("v1.35.4"), "last known version kept");
    }
}
