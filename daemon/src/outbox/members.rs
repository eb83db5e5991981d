//! Who is in a group destination: the ready endpoints of a Service (its EndpointSlices, watched through
//! the hub, so endpoints that appear later are found at once), or the members of an election group
//! (their member Leases, see [`crate::leadership::membership`]).

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use serde::Deserialize;
use tokio::task::JoinHandle;

use super::{Outbox, Target};
use crate::{
    leadership::membership::{MEMBER_OF_LABEL, MemberRecord, group_label},
    watch::{
        Hub, Query,
        object::{Obj, ObjKey},
        shared::{Change, Item},
    },
};

/// The port name an EndpointSlice uses for consistd's peer port; a slice with a single port may leave
/// it unnamed.
pub const PEER_PORT_NAME: &str = "consistd-peer";

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

    /// No group destinations (peer addresses only).
    pub fn none() -> Self {
        Self { hub: None }
    }

    /// Whether group destinations can be resolved.
    pub fn available(&self) -> bool {
        self.hub.is_some()
    }

    /// Starts telling `outbox` the peers of `target` whenever they change.
    pub(super) fn follow(&self, target: &Target, outbox: Outbox) -> Following {
        let hub = self.hub.clone();
        let target = target.clone();
        Following(tokio::spawn(async move {
            let Some(hub) = hub else { return };
            match &target {
                Target::Service { namespace, name } => follow_service(&hub, &target, namespace, name, &outbox).await,
                Target::Election { namespace, name } => {
                    follow_election(&hub, &target, namespace, name, &outbox).await;
                }
                Target::Peer(_) => {}
            }
        }))
    }
}

/// The endpoints of one EndpointSlice.
type Endpoints = BTreeSet<String>;

async fn follow_service(hub: &Arc<Hub>, target: &Target, namespace: &str, name: &str, outbox: &Outbox) {
    let query = Query {
        resource: "discovery.k8s.io/v1/endpointslices".to_owned(),
        namespace: namespace.to_owned(),
        label_selector: format!("kubernetes.io/service-name={name}"),
        ..Query::default()
    };
    let group = Group {
        read: |obj: &Obj, _: Option<&Endpoints>| Some(ready_peers(obj)),
        peers: |slices: &HashMap<ObjKey, Endpoints>| slices.values().flatten().cloned().collect(),
        expires: |_: &HashMap<ObjKey, Endpoints>| None,
    };
    follow(hub, target, query, outbox, group).await;
}

/// One member Lease as last seen.
struct Seen {
    peer: String,
    renew_time: String,
    /// When this daemon saw it renewed (or first saw it, if its renewal looked recent then).
    renewed: Option<Instant>,
    ttl: Duration,
}

async fn follow_election(hub: &Arc<Hub>, target: &Target, namespace: &str, name: &str, outbox: &Outbox) {
    let query = Query {
        resource: "coordination.k8s.io/v1/leases".to_owned(),
        namespace: namespace.to_owned(),
        label_selector: format!("{MEMBER_OF_LABEL}={}", group_label(name)),
        ..Query::default()
    };
    let group = Group {
        read: |obj: &Obj, old: Option<&Seen>| read_member(obj, name, old),
        peers: live,
        // Members expire without any event: look again when the next one would.
        expires: |members: &HashMap<ObjKey, Seen>| members.values().filter_map(|m| m.renewed.map(|r| r + m.ttl)).min(),
    };
    follow(hub, target, query, outbox, group).await;
}

/// How to turn a group's objects into peers.
struct Group<R, P, E> {
    /// What one object says (given what it said before); None to ignore it.
    read: R,
    /// The peers of all objects.
    peers: P,
    /// When the peers change without an event.
    expires: E,
}

/// Watches `query` through the hub and tells the outbox `target`'s peers after every change once the
/// list is complete (and at each expiry); subscribes again, with backoff, when the watch fails or ends.
async fn follow<V, R, P, E>(hub: &Arc<Hub>, target: &Target, query: Query, outbox: &Outbox, group: Group<R, P, E>)
where
    R: Fn(&Obj, Option<&V>) -> Option<V>,
    P: Fn(&HashMap<ObjKey, V>) -> BTreeSet<String>,
    E: Fn(&HashMap<ObjKey, V>) -> Option<Instant>,
{
    let mut backoff = Duration::from_secs(1);
    loop {
        let mut subscription = match hub.subscribe(query.clone()).await {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(%error, destination = %target, resource = %query.resource, "cannot watch the group; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        let mut objects: HashMap<ObjKey, V> = HashMap::new();
        let mut synced = false;
        let note = |objects: &mut HashMap<ObjKey, V>, obj: &Obj| match (group.read)(obj, objects.get(&obj.key())) {
            Some(v) => {
                objects.insert(obj.key(), v);
            }
            None => {
                objects.remove(&obj.key());
            }
        };
        loop {
            let item = tokio::select! {
                item = subscription.next() => match item { Some(i) => i, None => break },
                () = sleep_until((group.expires)(&objects)) => {
                    if synced {
                        outbox.set_peers(target, (group.peers)(&objects));
                    }
                    continue;
                }
            };
            match item {
                Item::ResyncRequired => {
                    objects.clear();
                    synced = false;
                }
                Item::Snapshot(obj, _) => note(&mut objects, &obj),
                Item::Synced(_) => synced = true,
                Item::Entry(entry) => match &entry.change {
                    Change::Added(obj) | Change::Modified(obj) => note(&mut objects, obj),
                    Change::Deleted(obj) => {
                        objects.remove(&obj.key());
                    }
                    Change::Synced => synced = true,
                },
            }
            if synced {
                outbox.set_peers(target, (group.peers)(&objects));
            }
        }
        // The hub ended the subscription (the daemon is stopping, or the watch was restarted).
        tokio::time::sleep(backoff).await;
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn live(members: &HashMap<ObjKey, Seen>) -> BTreeSet<String> {
    let now = Instant::now();
    members.values().filter(|m| m.renewed.is_some_and(|r| now < r + m.ttl)).map(|m| m.peer.clone()).collect()
}

/// What a member Lease of `election` says, with when this daemon saw it renewed.
fn read_member(obj: &Obj, election: &str, old: Option<&Seen>) -> Option<Seen> {
    let member = MemberRecord::parse(obj, election)?;
    let renewed = match old {
        Some(old) if old.renew_time == member.renew_time => old.renewed,
        Some(_) => Some(Instant::now()),
        // First sight: trust a renewal that looks recent by the wall clock; a stale one is dead.
        None => member.renewed_recently().then(Instant::now),
    };
    Some(Seen { peer: member.peer, renew_time: member.renew_time, renewed, ttl: member.ttl })
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
struct Endpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Option<Conditions>,
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

/// "address:port" of every ready endpoint of a slice (a missing `ready` means ready, as the API says).
pub(crate) fn ready_peers(obj: &Obj) -> BTreeSet<String> {
    let slice: Slice = match serde_json::from_slice(&obj.json) {
        Ok(s) => s,
        Err(error) => {
            tracing::warn!(slice = %obj.name, %error, "unreadable EndpointSlice ignored");
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
        tracing::warn!(slice = %obj.name, "EndpointSlice has no port named {PEER_PORT_NAME:?}; its endpoints are not peers");
        return BTreeSet::new();
    };
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| e.addresses.first())
        .map(|a| if a.contains(':') { format!("[{a}]:{port}") } else { format!("{a}:{port}") })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(json: serde_json::Value) -> Obj {
        Obj {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "web-abc".into(),
            resource_version: "1".into(),
            json: serde_json::to_vec(&json).expect("json").into(),
        }
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
