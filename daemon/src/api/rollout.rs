//! RolloutService, being built: ReportApplied records the version this replica's app applied on its
//! member Lease; GetRolloutStatus and WaitApplied (the barrier) read every member's from the cluster, so
//! any replica answers the same. Publish and SubscribeVersions answer UNIMPLEMENTED for now.

use std::{sync::Arc, time::Duration};

use consistd_proto::v1::{self as pb, rollout_service_server::RolloutService};
use futures::stream::BoxStream;
use tonic::{Request, Response, Status};

use super::status;
use crate::{
    leadership::{Key, Leadership},
    rollout::{
        barrier::{Barrier, Standing},
        versions::Versions,
    },
};

/// How long ReportApplied waits for the member Lease to hold the version.
const RECORD_WAIT: Duration = Duration::from_secs(10);
/// The longest WaitApplied accepted.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The RolloutService implementation.
#[derive(Debug, Clone)]
pub(crate) struct RolloutApi {
    leadership: Arc<Leadership>,
    barrier: Barrier,
    /// Versions of channels in the daemon's namespace (where channel elections live).
    versions: Versions,
}

impl RolloutApi {
    pub(crate) fn new(leadership: Arc<Leadership>, barrier: Barrier, versions: Versions) -> Self {
        Self { leadership, barrier, versions }
    }

    /// The channel's election (same name, this daemon's namespace).
    fn channel(&self, channel: &str) -> Result<Key, Status> {
        self.leadership.key(channel, "").map_err(|e| match e {
            crate::leadership::LeadershipError::InvalidArgument { message, .. } => {
                status::invalid_argument("channel", message)
            }
            other => status::leadership_error(other),
        })
    }
}

fn members(standing: &Standing) -> Vec<pb::MemberStatus> {
    standing
        .members
        .iter()
        .map(|m| pb::MemberStatus {
            member: m.identity.clone(),
            applied_version: m.applied,
            live: m.live,
            last_seen: m.last_seen.map(Into::into),
        })
        .collect()
}

type Stream<T> = BoxStream<'static, Result<T, Status>>;

#[tonic::async_trait]
impl RolloutService for RolloutApi {
    type SubscribeVersionsStream = Stream<pb::SubscribeVersionsResponse>;

    async fn publish(&self, _: Request<pb::PublishRequest>) -> Result<Response<pb::PublishResponse>, Status> {
        Err(status::unimplemented("RolloutService.Publish"))
    }

    async fn subscribe_versions(
        &self,
        _: Request<pb::SubscribeVersionsRequest>,
    ) -> Result<Response<Self::SubscribeVersionsStream>, Status> {
        Err(status::unimplemented("RolloutService.SubscribeVersions"))
    }

    async fn report_applied(
        &self,
        request: Request<pb::ReportAppliedRequest>,
    ) -> Result<Response<pb::ReportAppliedResponse>, Status> {
        let r = request.into_inner();
        let key = self.channel(&r.channel)?;
        if r.version == 0 {
            return Err(status::invalid_argument("version", "must be at least 1"));
        }
        self.leadership.report_applied(&key, r.version, RECORD_WAIT).await.map_err(status::leadership_error)?;
        Ok(Response::new(pb::ReportAppliedResponse {}))
    }

    async fn get_rollout_status(
        &self,
        request: Request<pb::GetRolloutStatusRequest>,
    ) -> Result<Response<pb::GetRolloutStatusResponse>, Status> {
        let r = request.into_inner();
        let key = self.channel(&r.channel)?;
        let latest = self.versions.latest(&r.channel).await.map_err(status::versions_error)?.map_or(0, |v| v.version);
        let version = if r.version == 0 { latest } else { r.version };
        let standing = self.barrier.standing(&key.namespace, &key.name, version).await.map_err(status::watch_error)?;
        Ok(Response::new(pb::GetRolloutStatusResponse {
            channel: r.channel,
            version,
            latest_version: latest,
            members: members(&standing),
            all_applied: version > 0 && standing.all_applied,
        }))
    }

    async fn wait_applied(
        &self,
        request: Request<pb::WaitAppliedRequest>,
    ) -> Result<Response<pb::WaitAppliedResponse>, Status> {
        let r = request.into_inner();
        let key = self.channel(&r.channel)?;
        if r.version == 0 {
            return Err(status::invalid_argument("version", "must be at least 1"));
        }
        let timeout = r
            .timeout
            .and_then(|t| Duration::try_from(t).ok())
            .filter(|t| *t <= MAX_WAIT)
            .ok_or_else(|| status::invalid_argument("timeout", "is required, between 0s and 1h"))?;
        let deadline = tokio::time::Instant::now() + timeout;
        let standing =
            self.barrier.wait(&key.namespace, &key.name, r.version, deadline).await.map_err(status::watch_error)?;
        Ok(Response::new(pb::WaitAppliedResponse {
            all_applied: standing.all_applied,
            members: members(&standing),
            lagging: standing.lagging,
        }))
    }
}
