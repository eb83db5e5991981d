//! The barrier: which members of a channel's group have applied which version, read from their member
//! Leases through the watch hub, so every replica gives the same answer from the same cluster state.
//! A member counts while its last renewal is less than its TTL ago (by this machine's clock); a member
//! whose Lease was deleted (it resigned) is gone; one that stopped renewing is listed as not live.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::time::Instant;

use crate::{
    leadership::membership::{MEMBER_OF_LABEL, MemberRecord, group_label},
    watch::{
        Hub, Query, WatchError,
        object::ObjKey,
        shared::{Change, Item},
    },
};

/// One member of a channel as the barrier sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Its identity.
    pub identity: String,
    /// Where peers reach it.
    pub peer: String,
    /// The newest version its app applied (0: none).
    pub applied: u64,
    /// Whether it still counts (renewed within its TTL).
    pub live: bool,
    /// Its last renewal.
    pub last_seen: Option<SystemTime>,
}

/// Where the barrier stands for one version.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    /// Every member with a Lease, live or not, sorted by identity.
    pub members: Vec<Member>,
    /// Live members that have not applied the version.
    pub lagging: Vec<String>,
    /// At least one live member, and every live member applied the version or newer.
    pub all_applied: bool,
}

impl Standing {
    fn of(records: &HashMap<ObjKey, MemberRecord>, version: u64) -> Self {
        let mut members: Vec<Member> = records
            .values()
            .map(|r| Member {
                identity: r.identity.clone(),
                peer: r.peer.clone(),
                applied: r.applied,
                live: r.renewed_recently(),
                last_seen: r.renewed_at().map(SystemTime::from),
            })
            .collect();
        members.sort_by(|a, b| a.identity.cmp(&b.identity));
        let lagging: Vec<String> =
            members.iter().filter(|m| m.live && m.applied < version).map(|m| m.identity.clone()).collect();
        let all_applied = members.iter().any(|m| m.live) && lagging.is_empty();
        Self { members, lagging, all_applied }
    }
}

/// Reads channel groups through the hub.
#[derive(Debug, Clone)]
pub struct Barrier {
    hub: Arc<Hub>,
}

impl Barrier {
    /// A barrier over `hub`'s watches.
    pub fn new(hub: Arc<Hub>) -> Self {
        Self { hub }
    }

    /// Where `channel` in `namespace` stands for `version` now.
    pub async fn standing(&self, namespace: &str, channel: &str, version: u64) -> Result<Standing, WatchError> {
        self.wait(namespace, channel, version, Instant::now()).await
    }

    /// Waits until every live member applied `version` or newer, or `deadline` passes; returns where it
    /// stands then. The group is read completely first, so a deadline already passed still answers.
    pub async fn wait(
        &self,
        namespace: &str,
        channel: &str,
        version: u64,
        deadline: Instant,
    ) -> Result<Standing, WatchError> {
        let query = Query {
            resource: "coordination.k8s.io/v1/leases".to_owned(),
            namespace: namespace.to_owned(),
            label_selector: format!("{MEMBER_OF_LABEL}={}", group_label(channel)),
            ..Query::default()
        };
        let mut subscription = self.hub.subscribe(query).await?;
        let mut records: HashMap<ObjKey, MemberRecord> = HashMap::new();
        let mut synced = false;
        loop {
            if synced {
                let standing = Standing::of(&records, version);
                if standing.all_applied || Instant::now() >= deadline {
                    return Ok(standing);
                }
            }
            // A live member may expire without any event: look again when the first would.
            let expiry = records
                .values()
                .filter(|r| r.renewed_recently())
                .filter_map(|r| {
                    let age = k8s_openapi::jiff::Timestamp::now().duration_since(r.renewed_at()?);
                    let age = if age.is_negative() { Duration::ZERO } else { age.unsigned_abs() };
                    Some(Instant::now() + r.ttl.saturating_sub(age))
                })
                .min();
            let wake = expiry.map_or(deadline, |e| (e + Duration::from_millis(1)).min(deadline));
            let item = tokio::select! {
                item = subscription.next() => item,
                () = tokio::time::sleep_until(wake), if synced => continue,
            };
            let Some(item) = item else {
                // The hub ended the watch (the daemon is stopping): answer with what is known.
                return Ok(Standing::of(&records, version));
            };
            let mut note = |obj: &crate::watch::object::Obj| match MemberRecord::parse(obj, channel) {
                Some(r) => {
                    records.insert(obj.key(), r);
                }
                None => {
                    records.remove(&obj.key());
                }
            };
            match item {
                Item::ResyncRequired => {
                    records.clear();
                    synced = false;
                }
                Item::Snapshot(obj, _) => note(&obj),
                Item::Synced(_) => synced = true,
                Item::Entry(entry) => match &entry.change {
                    Change::Added(obj) | Change::Modified(obj) => note(obj),
                    Change::Deleted(obj) => {
                        records.remove(&obj.key());
                    }
                    Change::Synced => synced = true,
                },
            }
        }
    }
}
