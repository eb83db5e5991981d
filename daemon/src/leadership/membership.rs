//! Election groups: while a daemon campaigns in an election it announces itself as a member with a
//! Lease of its own (`<election>.member.<identity>`, labelled `consistd.io/member-of=<election>`,
//! annotated with its peer address), renewed every third of the membership TTL and deleted when it
//! stops campaigning. A member that stops renewing (kill -9, lost apiserver) counts until its TTL has
//! passed since it was last seen renewing, then it is dropped. Outbox election destinations and
//! replica barriers read the group from these Leases.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Key;

/// Label every member Lease of an election carries: its value is [`group_label`].
pub const MEMBER_OF_LABEL: &str = "consistd.io/member-of";
/// Annotation with the member's peer address ("host:port").
pub const PEER_ADDRESS_ANNOTATION: &str = "consistd.io/peer-address";
/// Annotation with the election's full name (labels are limited to 63 characters).
pub const ELECTION_ANNOTATION: &str = "consistd.io/election";

/// How this daemon announces itself.
#[derive(Debug, Clone)]
pub struct Announce {
    /// The address peers reach this daemon at.
    pub address: String,
    /// How long a member counts after its last renewal.
    pub ttl: Duration,
}

/// The member Leases this daemon keeps, one per election it campaigns in.
pub(super) struct Membership {
    client: kube::Client,
    identity: String,
    announce: Option<Announce>,
    held: Mutex<HashMap<Key, Held>>,
}

#[derive(Debug)]
struct Held {
    uses: usize,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Keeps this daemon in an election group while held.
#[derive(Debug)]
pub(super) struct Member {
    membership: std::sync::Arc<Membership>,
    key: Key,
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut held = self.membership.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.get_mut(&self.key) {
            h.uses -= 1;
            if h.uses == 0 {
                // The task deletes the Lease on its way out.
                h.stop.cancel();
                held.remove(&self.key);
            }
        }
    }
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership").field("announce", &self.announce).finish_non_exhaustive()
    }
}

impl Membership {
    pub(super) fn new(client: kube::Client, identity: String, announce: Option<Announce>) -> Self {
        Self { client, identity, announce, held: Mutex::new(HashMap::new()) }
    }

    /// Joins `key`'s group until the returned guard drops; None when this daemon has no peer address.
    pub(super) fn join(self: &std::sync::Arc<Self>, key: &Key) -> Option<Member> {
        let announce = self.announce.clone()?;
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        match held.get_mut(key) {
            Some(h) => h.uses += 1,
            None => {
                let stop = CancellationToken::new();
                let api: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
                let task = tokio::spawn(keep(api, key.name.clone(), self.identity.clone(), announce, stop.clone()));
                held.insert(key.clone(), Held { uses: 1, stop, task });
            }
        }
        Some(Member { membership: self.clone(), key: key.clone() })
    }

    /// Leaves every group (deleting the member Leases), waiting at most `grace`.
    pub(super) async fn shutdown(&self, grace: Duration) {
        let tasks: Vec<JoinHandle<()>> = {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            held.drain()
                .map(|(_, h)| {
                    h.stop.cancel();
                    h.task
                })
                .collect()
        };
        let _ = tokio::time::timeout(grace, futures::future::join_all(tasks)).await;
    }
}

/// The member Lease's name: readable when it fits, else a hash.
pub fn lease_name(election: &str, identity: &str) -> String {
    let readable = format!("{election}.member.{identity}");
    if super::is_dns_subdomain(&readable) {
        readable
    } else {
        format!("consistd-member-{:016x}", fnv1a(&format!("{election}/{identity}")))
    }
}

/// The value of [`MEMBER_OF_LABEL`] for an election: its name when it is a valid label value.
pub fn group_label(election: &str) -> String {
    if election.len() <= 63 { election.to_owned() } else { format!("h-{:016x}", fnv1a(election)) }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Creates and renews the member Lease until `stop`, then deletes it.
async fn keep(api: Api<Lease>, election: String, identity: String, announce: Announce, stop: CancellationToken) {
    let name = lease_name(&election, &identity);
    let renew_every = announce.ttl / 3;
    let ttl_seconds = i32::try_from(announce.ttl.as_secs().max(1)).unwrap_or(i32::MAX);
    loop {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "labels": { MEMBER_OF_LABEL: group_label(&election) },
                "annotations": { PEER_ADDRESS_ANNOTATION: announce.address, ELECTION_ANNOTATION: election },
            },
            "spec": { "holderIdentity": identity, "leaseDurationSeconds": ttl_seconds, "renewTime": now },
        });
        let applied = api.patch(&name, &PatchParams::apply("consistd-membership").force(), &Patch::Apply(&lease)).await;
        if let Err(error) = applied {
            tracing::warn!(%error, election, lease = name, "could not renew group membership; retrying");
        }
        tokio::select! {
            () = tokio::time::sleep(renew_every) => {}
            () = stop.cancelled() => break,
        }
    }
    match tokio::time::timeout(Duration::from_secs(2), api.delete(&name, &DeleteParams::default())).await {
        Ok(Ok(_)) => tracing::info!(election, lease = name, "left the election group"),
        Ok(Err(error)) => tracing::warn!(%error, election, lease = name, "could not delete member Lease; it expires"),
        Err(_) => tracing::warn!(election, lease = name, "deleting member Lease timed out; it expires"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_readable_when_valid_and_hashed_otherwise() {
        assert_eq!(lease_name("web", "web-0"), "web.member.web-0");
        let hashed = lease_name("web", "Web_0");
        assert!(hashed.starts_with("consistd-member-") && super::super::is_dns_subdomain(&hashed), "{hashed}");
        assert_ne!(lease_name("web", "Web_0"), lease_name("web", "Web_1"));
        assert_eq!(group_label("web"), "web");
        let long = "a".repeat(100);
        assert!(group_label(&long).len() <= 63);
    }
}
