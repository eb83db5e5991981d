//! Who is in a group destination: the ready endpoints of a Service (its EndpointSlices, watched through
//! the hub, so endpoints that appear later are found at once), or the members of an election group
//! (their member Leases, read by [`GroupReader`]).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use consistd_cluster::{
    leadership::group::GroupReader,
    watch::{Hub, Mirror, Query, object::Obj},
};
use serde::Deserialize;
use tokio::task::JoinHandle;

use super::{Destination, Outbox, destination::member_key};

/// The port name an EndpointSlice uses for consistd's peer port; a slice with a single port may leave
/// it unnamed.
pub(crate) const PEER_PORT_NAME: &str = "consistd-peer";

/// Resolves group destinations; without a hub (unit tests) there are none.
#[derive(Debug, Clone)]
pub struct Members {
    hub: Option<Arc<Hub>>,
}

/// Following a group's members; stops when dropped.
#[derive(Debug)]
pub(super) struct Following(JoinHandle<()>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Members {
    /// Group destinations resolved through `hub`.
    pub fn new(hub: Arc<Hub>) -> Self {
        Self { hub: Some(hub) }
    }

    /// No group destinations (peer addresses only), for unit tests without a cluster.
    #[cfg(test)]
    pub(crate) fn none() -> Self {
        Self { hub: None }
    }

    /// Whether group destinations can be resolved.
    pub(crate) fn available(&self) -> bool {
        self.hub.is_some()
    }

    /// Starts telling `outbox` the peers of `target` whenever they change.
    pub(super) fn follow(&self, target: &Destination, outbox: Outbox) -> Following {
        let hub = self.hub.clone();
        let target = target.clone();
        let tasks = outbox.inner.tasks.clone();
        let stopping = tasks.signal().clone().cancelled_owned();
        Following(tasks.spawn(async move {
            let Some(hub) = hub else { return };
            let following = async {
                match &target {
                    Destination::Service { namespace, name } => {
                        follow_service(&hub, &target, namespace, name, &outbox).await
                    }
                    Destination::Election { namespace, name } => {
                        follow_election(&hub, &target, namespace, name, &outbox).await;
                    }
                    Destination::Peer(_) => {}
                }
            };
            // The hub's watches end when the daemon stops; without this the follower would subscribe again.
            tokio::select! {
                () = following => {}
                () = stopping => {}
            }
        }))
    }
}

/// How long to wait before subscribing again after a watch failed or ended; doubles up to a cap.
#[derive(Debug)]
struct Resubscribe(Duration);

impl Resubscribe {
    const FIRST: Duration = Duration::from_secs(1);
    const CAP: Duration = Duration::from_secs(30);

    async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Self::CAP);
    }
}

/// Tells the outbox a Service's ready endpoints after every change of its EndpointSlices once they are
/// read completely; subscribes again, with backoff, when the watch fails or ends.
async fn follow_service(hub: &Arc<Hub>, target: &Destination, namespace: &str, name: &str, outbox: &Outbox) {
    let query = Query {
        resource: "discovery.k8s.io/v1/endpointslices".to_owned(),
        namespace: namespace.to_owned(),
        label_selector: format!("kubernetes.io/service-name={name}"),
        own: true,
        ..Query::default()
    };
    let mut backoff = Resubscribe(Resubscribe::FIRST);
    loop {
        match Mirror::open(hub, query.clone()).await {
            Ok(mut slices) => {
                while slices.next(|obj, _| Some(ready_peers(obj))).await {
                    if slices.synced() {
                        outbox.set_peers(target, slices.values().values().flatten().cloned().collect());
                    }
                }
            }
            Err(error) => {
                let why = consistd_core::error::chain(&error);
                tracing::warn!(error = %why, destination = %target, "cannot watch the Service's endpoints; retrying");
                outbox.set_unresolved(target, format!("cannot watch its endpoints: {why}"));
            }
        }
        backoff.wait().await;
    }
}

/// Tells the outbox an election group's live members after every change once the group is read
/// completely (and whenever a member expires); subscribes again, with backoff, when the watch fails or
/// ends.
async fn follow_election(hub: &Arc<Hub>, target: &Destination, namespace: &str, name: &str, outbox: &Outbox) {
    let mut backoff = Resubscribe(Resubscribe::FIRST);
    loop {
        match GroupReader::open(hub, namespace, name).await {
            Ok(mut group) => {
                while group.changed().await {
                    if group.synced() {
                        let members = group.live_members().map(|m| member_key(Some(&m.identity), &m.peer));
                        outbox.set_peers(target, members.collect());
                    }
                }
            }
            Err(error) => {
                let why = consistd_core::error::chain(&error);
                tracing::warn!(error = %why, destination = %target, "cannot watch the election group; retrying");
                outbox.set_unresolved(target, format!("cannot watch its member Leases: {why}"));
            }
        }
        backoff.wait().await;
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slice {
    #[serde(default)]
    endpoints: Vec<Endpoint>,
    #[serde(default)]
    ports: Option<Vec<Port>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Endpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Option<Conditions>,
    #[serde(default)]
    target_ref: Option<TargetRef>,
}

/// What an endpoint is: for a Pod, its name is its sidecar's identity (consistd's default identity is
/// `POD_NAME`).
#[derive(Deserialize)]
struct TargetRef {
    kind: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct Conditions {
    ready: Option<bool>,
}

#[derive(Deserialize)]
struct Port {
    name: Option<String>,
    port: Option<u16>,
}

/// Every ready endpoint of a slice (a missing `ready` means ready, as the API says) as the outbox keys
/// peers: "pod@address:port" when the endpoint is a Pod, else "address:port".
pub(crate) fn ready_peers(obj: &Obj) -> BTreeSet<String> {
    let slice: Slice = match serde_json::from_slice(obj.json()) {
        Ok(s) => s,
        Err(error) => {
            tracing::warn!(slice = %obj.name(), %error, "unreadable EndpointSlice ignored");
            return BTreeSet::new();
        }
    };
    let ports = slice.ports.unwrap_or_default();
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some(PEER_PORT_NAME))
        .or_else(|| if ports.len() == 1 { ports.first() } else { None })
        .and_then(|p| p.port);
    let Some(port) = port else {
        tracing::warn!(slice = %obj.name(), "EndpointSlice has no port named {PEER_PORT_NAME:?}; its endpoints are not peers");
        return BTreeSet::new();
    };
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| {
            let a = e.addresses.first()?;
            let address = if a.contains(':') { format!("[{a}]:{port}") } else { format!("{a}:{port}") };
            let pod =
                e.target_ref.as_ref().filter(|t| t.kind.as_deref() == Some("Pod")).and_then(|t| t.name.as_deref());
            Some(member_key(pod, &address))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(json: serde_json::Value) -> Obj {
        Obj::new("u", "ns", "web-abc", "1", serde_json::to_vec(&json).expect("json"))
    }

    #[test]
    fn ready_endpoints_with_the_peer_port_are_peers() {
        let obj = slice(serde_json::json!({
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 80}, {"name": "consistd-peer", "port": 7070}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                {"addresses": ["10.0.0.3"]},
                {"addresses": []}
            ]
        }));
        let peers: Vec<String> = ready_peers(&obj).into_iter().collect();
        assert_eq!(peers, vec!["10.0.0.1:7070", "10.0.0.3:7070"]);
    }

    #[test]
    fn a_single_unnamed_port_is_the_peer_port_and_ipv6_is_bracketed() {
        let obj = slice(serde_json::json!({
            "ports": [{"port": 7070}],
            "endpoints": [{"addresses": ["fd00::1"]}]
        }));
        assert_eq!(ready_peers(&obj).into_iter().collect::<Vec<_>>(), vec!["[fd00::1]:7070"]);
        let ambiguous = slice(serde_json::json!({
            "ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}],
            "endpoints": [{"addresses": ["10.0.0.1"]}]
        }));
        assert!(ready_peers(&ambiguous).is_empty());
    }
}
