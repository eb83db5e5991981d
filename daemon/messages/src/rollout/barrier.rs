//! The barrier: which members of a channel's group have applied which version, read from their member
//! Leases through the watch hub (each member's own, and the channel leader's record of them all), so
//! every replica gives the same answer from the same cluster state.
//! A member counts while [`GroupReader`]'s liveness rule says so; a member whose Lease was deleted (it
//! resigned) is gone; one that stopped renewing is listed as not live.

use std::{sync::Arc, time::SystemTime};

use consistd_cluster::{
    leadership::group::GroupReader,
    watch::{Hub, ResourceError},
};
use tokio::time::Instant;

/// One member of a channel as the barrier sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberProgress {
    /// The member's election identity (its Lease's holderIdentity), as listed in `lagging`.
    pub identity: String,
    /// Its peer address, where a Publish is forwarded when it leads the channel.
    pub peer: String,
    /// The newest version its app applied (0: none).
    pub applied: u64,
    /// Whether it still counts (renewed within its TTL).
    pub live: bool,
    /// Its Lease's renewTime (the member's own clock), the API's last_seen; None when unreadable.
    pub last_seen: Option<SystemTime>,
}

/// Where the barrier stands for one version.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    /// Every member with a Lease, live or not, sorted by identity.
    pub members: Vec<MemberProgress>,
    /// Live members that have not applied the version.
    pub lagging: Vec<String>,
    /// At least one live member, and every live member applied the version or newer.
    pub all_applied: bool,
}

impl Standing {
    fn of(group: &GroupReader, version: u64) -> Self {
        let now = Instant::now();
        let applied = group.applied();
        let mut members: Vec<MemberProgress> = group
            .members()
            .map(|m| MemberProgress {
                identity: m.record.identity.clone(),
                peer: m.record.peer.clone(),
                applied: applied.get(m.record.identity.as_str()).copied().unwrap_or(m.record.applied),
                live: group.live_at(m, now),
                last_seen: group.last_seen(m),
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

    /// Starts reading `channel`'s group in `namespace`.
    pub(super) async fn group(&self, namespace: &str, channel: &str) -> Result<GroupReader, ResourceError> {
        GroupReader::open(&self.hub, namespace, channel).await
    }

    /// Where `channel` in `namespace` stands for `version` now.
    pub async fn standing(&self, namespace: &str, channel: &str, version: u64) -> Result<Standing, ResourceError> {
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
    ) -> Result<Standing, ResourceError> {
        let mut group = self.group(namespace, channel).await?;
        loop {
            if group.synced() {
                let standing = Standing::of(&group, version);
                if standing.all_applied || Instant::now() >= deadline {
                    return Ok(standing);
                }
            }
            let more = tokio::select! {
                more = group.changed() => more,
                () = tokio::time::sleep_until(deadline), if group.synced() => true,
            };
            if !more {
                // The hub ended the watch (the daemon is stopping): answer with what is known.
                return Ok(Standing::of(&group, version));
            }
        }
    }
}
