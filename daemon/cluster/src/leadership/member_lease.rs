//! What a member Lease says and what it is called: the record read from it, its name, the label that groups
//! it with its election's other members, and the contacts a leader's roll call writes on its own. Read by the
//! group reader, the roll call and membership alike, below all three.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use consistd_core::{
    lease::{
        APPLIED_BY_ANNOTATION, APPLIED_VERSION_ANNOTATION, AppliedBy, DEFAULT_MEMBER_TTL_SECONDS, ELECTION_ANNOTATION,
        INCARNATION_ANNOTATION, PEER_ADDRESS_ANNOTATION, REACHED_ANNOTATION, Reached,
    },
    names,
};
use serde::Deserialize;
use tokio::time::Instant;

use crate::watch::object::Obj;

/// The members a leader's roll call reached, and when: identity to (incarnation, contact).
pub(crate) type Contacts = BTreeMap<String, (String, Instant)>;

/// What a member Lease says.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberRecord {
    /// The member's identity (its holderIdentity).
    pub identity: String,
    /// Its peer address, "host:port" (the `consistd.io/peer-address` annotation).
    pub peer: String,
    /// The newest rollout version its app applied; 0 for none.
    pub applied: u64,
    /// Its last renewal (RFC 3339, as written).
    pub renew_time: String,
    /// This run of the member (a random id per join); empty for a Lease written before incarnations.
    pub incarnation: String,
    /// On the channel leader's Lease: its record of what every member applied.
    pub applied_by: AppliedBy,
    /// On the election leader's Lease: the members its roll call reached, and how long before this
    /// renewal.
    pub reached: Reached,
    /// How long it counts after a renewal: its leaseDurationSeconds, 30 s when unset.
    pub ttl: Duration,
}

impl MemberRecord {
    /// Reads a member Lease of `election` (None for one of another election sharing a hashed label, or
    /// one without a valid peer address).
    pub(crate) fn parse(obj: &Obj, election: &str) -> Option<Self> {
        let lease: LeaseJson = match serde_json::from_slice(obj.json()) {
            Ok(l) => l,
            Err(error) => {
                tracing::warn!(lease = %obj.name(), %error, "unreadable member Lease ignored");
                return None;
            }
        };
        let annotations = &lease.metadata.annotations;
        if annotations.get(ELECTION_ANNOTATION).map(String::as_str) != Some(election) {
            return None;
        }
        let Some(peer) = annotations.get(PEER_ADDRESS_ANNOTATION).filter(|p| names::check_peer_address(p).is_ok())
        else {
            tracing::warn!(lease = %obj.name(), "member Lease without a valid {PEER_ADDRESS_ANNOTATION} ignored");
            return None;
        };
        Some(Self {
            identity: lease.spec.holder_identity.unwrap_or_default(),
            peer: peer.clone(),
            applied: annotations.get(APPLIED_VERSION_ANNOTATION).and_then(|v| v.parse().ok()).unwrap_or(0),
            renew_time: lease.spec.renew_time.unwrap_or_default(),
            incarnation: annotations.get(INCARNATION_ANNOTATION).cloned().unwrap_or_default(),
            applied_by: annotations.get(APPLIED_BY_ANNOTATION).map(|v| AppliedBy::parse(v)).unwrap_or_default(),
            reached: annotations.get(REACHED_ANNOTATION).map(|v| Reached::parse(v)).unwrap_or_default(),
            ttl: Duration::from_secs(
                lease.spec.lease_duration_seconds.unwrap_or(u64::from(DEFAULT_MEMBER_TTL_SECONDS)),
            ),
        })
    }

    /// `renew_time` as a timestamp; None when it is missing or not RFC 3339.
    pub fn renewed_at(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.renew_time.parse().ok()
    }
}

/// The parts of a Lease that group members' Leases (member Leases, a sharded queue's) are read by.
#[derive(Deserialize)]
pub(crate) struct LeaseJson {
    pub metadata: LeaseMeta,
    #[serde(default)]
    pub spec: LeaseSpecJson,
}

/// A Lease's metadata, as [`LeaseJson`] reads it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeaseMeta {
    #[serde(default)]
    pub annotations: HashMap<String, String>,
    pub creation_timestamp: Option<String>,
}

/// A Lease's spec, as [`LeaseJson`] reads it.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeaseSpecJson {
    pub holder_identity: Option<String>,
    pub renew_time: Option<String>,
    pub lease_duration_seconds: Option<u64>,
}

/// How long ago `at` (a Lease's renewTime) was by this machine's wall clock; a renewal in the future (a
/// fast clock elsewhere) is as fresh as one just now.
pub(crate) fn age_of(at: k8s_openapi::jiff::Timestamp) -> Duration {
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(at);
    if age.is_negative() { Duration::ZERO } else { age.unsigned_abs() }
}

/// The member Lease's name: readable when it fits, else a hash.
pub(crate) fn lease_name(election: &str, identity: &str) -> String {
    let readable = format!("{election}.member.{identity}");
    if consistd_core::names::is_dns_subdomain(&readable) {
        readable
    } else {
        format!("consistd-member-{:016x}", names::fnv1a64(&format!("{election}/{identity}")))
    }
}

/// The value of [`MEMBER_OF_LABEL`] for an election: its name when it is a valid label value.
pub(crate) fn group_label(election: &str) -> String {
    if election.len() <= 63 { election.to_owned() } else { format!("h-{:016x}", names::fnv1a64(election)) }
}
