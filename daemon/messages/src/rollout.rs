//! The replica barrier (versioned rollout): a channel is an election; the replicas whose apps subscribe
//! campaign in it and so are its members (member Leases). Publish on any replica goes to the channel's
//! leader, which takes the next version in the cluster (`consistd_core::versions`) and sends it to every member
//! through the ACK-tracked outbox; each member's app receives it on SubscribeVersions (the latest
//! first), applies it and reports so, which ACKs the message. The leader records what the ACKs tell it
//! on its member Lease (`progress`), once per version for the whole group; a member's own Lease carries
//! its applied version too (at its next renewal, or at once when no ACK of the leader's message says
//! it). `barrier` reads who has applied what from those Leases.

pub mod barrier;
mod inbound;
mod progress;

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use consistd_cluster::{
    leadership::{Key, Leadership, LeadershipError, Role},
    watch::ResourceError,
};
use consistd_core::{
    claim::Claim,
    tasks::Tasks,
    versions::{Version, Versions, VersionsError},
};
use consistd_observe::telemetry::TraceContext;
use consistd_proto::peer::v1 as peer_pb;

use self::barrier::{Barrier, Standing};
pub use self::inbound::{Arrived, RESOURCE_PREFIX};
use crate::{
    inbox::{Inbox, InboxError},
    outbox::{Destination, Outbox, OutboxError, Outgoing},
    transport::Transport,
};

/// How long a Publish waits to learn who leads a channel nothing here watched yet.
const FIRST_OBSERVATION: Duration = Duration::from_secs(2);
/// How long forwarding a Publish to the leader may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a rollout request failed.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// Nobody leads the channel (no replica subscribes to it), or its leader cannot be reached.
    #[error("channel {channel}: {why}")]
    NoLeader {
        /// The channel (its election's name).
        channel: String,
        /// Why no leader can be asked, e.g. no replica subscribes, or no peer transport is configured.
        why: String,
    },
    /// This daemon was asked to publish as leader but does not lead the channel.
    #[error("channel {channel}: this daemon does not lead it (holder: {holder:?})")]
    NotLeader {
        /// The channel (its election's name).
        channel: String,
        /// The Lease holder this daemon sees; empty when nobody holds it.
        holder: String,
    },
    /// The leader refused or failed the forwarded Publish.
    #[error("channel {channel}: its leader {identity} at {leader} answered {code:?}: {message}")]
    Forwarded {
        /// The channel (its election's name).
        channel: String,
        /// The leader's identity, the Lease's holder.
        identity: String,
        /// The leader's peer address, from its member Lease.
        leader: String,
        /// The gRPC code the leader answered with; the status this daemon answers keeps it.
        code: tonic::Code,
        /// The leader's status message, quoted in this error's.
        message: String,
    },
    /// The version could not be assigned.
    #[error(transparent)]
    Versions(#[from] VersionsError),
    /// The version could not be stored in the outbox.
    #[error("send version to the members")]
    Outbox(#[from] OutboxError),
    /// The channel's group could not be read.
    #[error("read the channel's members")]
    Resource(#[from] ResourceError),
    /// Joining or reporting in the channel's election failed.
    #[error(transparent)]
    Leadership(#[from] LeadershipError),
    /// An ACK of an applied version could not be recorded.
    #[error("ACK applied versions")]
    Inbox(#[from] InboxError),
}

/// One Publish: what the app sent, and the claim its guard made (checked where the app called).
#[derive(Debug, Clone)]
pub struct Publication {
    /// The app's bytes, unchanged.
    pub payload: Bytes,
    /// Their MIME type, as the app gave it (may be empty).
    pub content_type: String,
    /// The claim of a guarded Publish: the channel refuses it once its election published in a later term,
    /// and the members' daemons once they stored a later term.
    pub claim: Option<Claim>,
}

/// Rollouts of this daemon's channels.
#[derive(Debug, Clone)]
pub struct Rollout {
    leadership: Arc<Leadership>,
    versions: Versions,
    outbox: Outbox,
    inbox: Inbox,
    barrier: Barrier,
    namespace: String,
    /// How to reach other daemons (to forward a Publish to the leader); None: not configured.
    transport: Option<Transport>,
    /// Channels whose members' progress this daemon records as their leader.
    keeping: progress::Keeping,
    /// Runs the progress records.
    tasks: Tasks,
}

/// The parts [`Rollout::new`] is built from, as `run` wires them.
#[derive(Debug)]
pub struct RolloutParts {
    /// Elections (a channel is one).
    pub leadership: Arc<Leadership>,
    /// Channel versions in the daemon's namespace.
    pub versions: Versions,
    /// Delivers each version to the channel's members, keeping the newest for members that join later.
    pub outbox: Outbox,
    /// Receives versions from the leader.
    pub inbox: Inbox,
    /// Reads which member applied which version, from the member Leases.
    pub barrier: Barrier,
    /// The daemon's namespace (where channel elections live).
    pub namespace: String,
    /// Peer transport, for forwarding.
    pub transport: Option<Transport>,
    /// Where the leader's record of its members' progress runs.
    pub tasks: Tasks,
}

impl Rollout {
    /// Rollouts of every channel, over the daemon's elections, outbox, inbox and cluster access.
    pub fn new(p: RolloutParts) -> Self {
        Self {
            leadership: p.leadership,
            versions: p.versions,
            outbox: p.outbox,
            inbox: p.inbox,
            barrier: p.barrier,
            namespace: p.namespace,
            transport: p.transport,
            keeping: progress::Keeping::default(),
            tasks: p.tasks,
        }
    }

    /// The channel's election; validates the name.
    pub fn channel(&self, channel: &str) -> Result<Key, LeadershipError> {
        self.leadership.key(channel, &self.namespace)
    }

    /// Where channels' versions are kept: one ConfigMap per channel, in the daemon's namespace.
    pub fn versions(&self) -> &Versions {
        &self.versions
    }

    /// Reads which member applied which version, for GetRolloutStatus and WaitApplied.
    pub fn barrier(&self) -> &Barrier {
        &self.barrier
    }

    /// The daemon's elections; each channel is one.
    pub fn leadership(&self) -> &Arc<Leadership> {
        &self.leadership
    }

    /// The inbox (where versions arrive).
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// Publishes on the channel's leader: here if this daemon leads it, else forwarded to the leader's
    /// peer address (from its member Lease). Returns the assigned version. A guarded Publish carries its
    /// claim to the channel and with its version to every member.
    pub async fn publish(&self, key: &Key, publication: Publication) -> Result<u64, RolloutError> {
        let status = self.leadership.get(key, FIRST_OBSERVATION).await;
        if status.role == Role::Leader {
            return self.publish_as_leader(key, publication).await;
        }
        let no_leader = |why: String| RolloutError::NoLeader { channel: key.name.clone(), why };
        if status.holder.is_empty() {
            return Err(no_leader("no replica leads it; apps join a channel with SubscribeVersions".to_owned()));
        }
        // Forwarded, it would come back here and be refused: the Lease names this daemon's identity but
        // not this run as the leader (its previous run's holding, after a sidecar restart, or one this run
        // could not renew). Nobody else may lead until that holding lapses.
        if status.holder == status.identity {
            return Err(no_leader(format!(
                "its Lease names this daemon ({}) in term {}, which does not lead it now (a holding of its \
                 previous run, or one it could not renew): a leader is chosen once that holding lapses",
                status.holder, status.term
            )));
        }
        let standing: Standing = self.barrier.standing(&key.namespace, &key.name, 0).await?;
        let leader = standing
            .members
            .iter()
            .find(|m| m.identity == status.holder && m.live)
            .map(|m| m.peer.clone())
            .ok_or_else(|| no_leader(format!("its leader {:?} has no live member Lease", status.holder)))?;
        self.forward(key, (&status.holder, &leader), publication).await
    }

    /// Takes the next version in the cluster and sends it to every member; refused unless this daemon
    /// leads the channel, and (in the channel's own write) when the claim's election published on it in a
    /// later term.
    pub async fn publish_as_leader(&self, key: &Key, publication: Publication) -> Result<u64, RolloutError> {
        let Publication { payload, content_type, claim } = publication;
        let status = self.leadership.get(key, FIRST_OBSERVATION).await;
        if status.role != Role::Leader {
            return Err(RolloutError::NotLeader { channel: key.name.clone(), holder: status.holder });
        }
        // Checked before a version is taken, so a refused payload uses up no version.
        self.outbox.check_payload(payload.len())?;
        // Before the version goes out, so the record sees every member's ACK of it.
        self.keep_progress(key);
        let version = self.versions.publish(&key.name, payload.to_vec(), &content_type, claim.as_ref()).await?;
        self.deliver(key, &version, payload).await?;
        tracing::info!(channel = %key.name, version = version.version, "published");
        Ok(version.version)
    }

    /// Sends `version` to every member of the channel (the newest per channel is kept for members that
    /// join later).
    async fn deliver(&self, key: &Key, version: &Version, payload: Bytes) -> Result<(), RolloutError> {
        self.outbox
            .send(Outgoing {
                destination: Destination::Election { namespace: key.namespace.clone(), name: key.name.clone() },
                resource_id: inbound::resource_id(&key.name),
                event_id: version.version.to_string(),
                payload,
                content_type: version.content_type.clone(),
                // Read by the members' daemons, never handed to an app's Inbox.Receive.
                trace: TraceContext::default(),
                claim: version.claim.clone(),
            })
            .await?;
        Ok(())
    }

    /// A new leader sends the latest version again, in case its predecessor stored it in the cluster but
    /// died before sending it (members that have it answer from their deduplication).
    pub async fn resend_latest(&self, key: &Key) -> Result<(), RolloutError> {
        self.keep_progress(key);
        if let Some(latest) = self.versions.latest(&key.name).await? {
            let payload = Bytes::from(latest.payload.clone());
            self.deliver(key, &latest, payload).await?;
        }
        Ok(())
    }

    /// Forwards to the channel's leader, `(identity, peer address)`: a daemon now at that address with
    /// another identity (a new pod given the leader's old address) refuses it, assigning nothing.
    async fn forward(
        &self,
        key: &Key,
        (identity, leader): (&str, &str),
        publication: Publication,
    ) -> Result<u64, RolloutError> {
        let unreachable = |why: String| RolloutError::NoLeader { channel: key.name.clone(), why };
        let transport = self
            .transport
            .as_ref()
            .ok_or_else(|| unreachable("no peer transport is configured to reach its leader".to_owned()))?;
        let mut client = transport
            .connect(leader, Some(FORWARD_TIMEOUT))
            .await
            .map_err(|e| unreachable(format!("its leader: {}", consistd_core::error::chain(&e))))?;
        let request = peer_pb::PublishRequest {
            channel: key.name.clone(),
            payload: publication.payload,
            content_type: publication.content_type,
            claim: Claim::carried(publication.claim.as_ref()),
            leader: identity.to_owned(),
        };
        match client.publish(request).await {
            Ok(r) => Ok(r.into_inner().version),
            Err(s) => Err(RolloutError::Forwarded {
                channel: key.name.clone(),
                identity: identity.to_owned(),
                leader: leader.to_owned(),
                code: s.code(),
                message: s.message().to_owned(),
            }),
        }
    }
}
