//! RolloutService: Publish goes to the channel's leader, which assigns the next version and sends it to
//! every member; SubscribeVersions joins the channel (campaigning in its election) and streams the
//! latest version, then newer ones; ReportApplied ACKs them, which tells the channel's leader, and the
//! leader records what every member applied on its member Lease (a version that came some other way is
//! recorded on the reporting member's Lease at once); GetRolloutStatus and WaitApplied (the barrier) read
//! every member's from the cluster, so any replica answers the same.

use std::time::Duration;

use consistd_cluster::leadership::{Key, Role};
use consistd_core::{
    config::{Service, Timing},
    tasks::Tasks,
};
use consistd_messages::rollout::{Arrived, Publication, Rollout, barrier::Standing};
use consistd_proto::v1::{self as pb, rollout_service_server::RolloutService};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::ResponseStream;
use super::{
    access::{Access, Ask, Resource},
    caller::Caller,
    guard, status,
};

/// How long ReportApplied waits for the member Lease to hold the version.
const RECORD_WAIT: Duration = Duration::from_secs(10);
/// The longest WaitApplied accepted.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The RolloutService implementation.
#[derive(Debug, Clone)]
pub(crate) struct RolloutApi {
    rollout: Rollout,
    access: Access,
    /// The serving group: per-call tasks run in it; its stop signal ends open streams.
    tasks: Tasks,
}

impl RolloutApi {
    pub(crate) fn new(rollout: Rollout, access: Access, tasks: Tasks) -> Self {
        Self { rollout, access, tasks }
    }

    /// The channel's election (same name, this daemon's namespace), once access.rules grant `verb` on
    /// the channel to the caller.
    async fn channel<T>(&self, request: &Request<T>, verb: &'static str, channel: &str) -> Result<Key, Status> {
        let key = self.rollout.channel(channel).map_err(|e| match e {
            consistd_cluster::leadership::LeadershipError::InvalidArgument { message, .. } => {
                status::invalid_argument("channel", message)
            }
            other => status::leadership_error(other),
        })?;
        let ask = Ask {
            service: Service::Rollout,
            verb,
            resource: Resource::Named(&key.name),
            namespace: Some(&key.namespace),
        };
        self.access.check(&Caller::from_request(request), ask).await?;
        Ok(key)
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

#[tonic::async_trait]
impl RolloutService for RolloutApi {
    type SubscribeVersionsStream = ResponseStream<pb::SubscribeVersionsResponse>;

    async fn publish(&self, request: Request<pb::PublishRequest>) -> Result<Response<pb::PublishResponse>, Status> {
        let key = self.channel(&request, "publish", &request.get_ref().channel).await?;
        let r = request.into_inner();
        let claim = guard::claim(self.rollout.leadership(), r.guard.as_ref())?;
        let publication = Publication { payload: r.payload.into(), content_type: r.content_type, claim };
        let version = self.rollout.publish(&key, publication).await.map_err(status::rollout_error)?;
        Ok(Response::new(pb::PublishResponse { version }))
    }

    async fn subscribe_versions(
        &self,
        request: Request<pb::SubscribeVersionsRequest>,
    ) -> Result<Response<Self::SubscribeVersionsStream>, Status> {
        let key = self.channel(&request, "subscribe", &request.get_ref().channel).await?;
        let leadership = self.rollout.leadership().clone();
        if !leadership.announces() {
            return Err(status::failed_precondition(
                "RolloutService.SubscribeVersions",
                "this daemon has no peer address (set peer.listen, and peer.advertise or POD_IP), so the \
                 channel's leader cannot send it versions",
            ));
        }
        // The app takes part in the channel for as long as the stream is open.
        let (campaign, states) = leadership.campaign(&key, "", Timing::default()).map_err(status::leadership_error)?;
        let (tx, rx) = mpsc::channel(16);
        let (rollout, shutdown) = (self.rollout.clone(), self.tasks.signal().clone());
        self.tasks.spawn(async move {
            let _candidacy = campaign;
            stream_versions(rollout, key, states, tx, shutdown).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report_applied(
        &self,
        request: Request<pb::ReportAppliedRequest>,
    ) -> Result<Response<pb::ReportAppliedResponse>, Status> {
        let key = self.channel(&request, "report", &request.get_ref().channel).await?;
        let r = request.into_inner();
        if r.version == 0 {
            return Err(status::invalid_argument("version", "must be at least 1"));
        }
        if !self.rollout.leadership().is_member(&key) {
            let not_member = consistd_cluster::leadership::LeadershipError::NotMember {
                election: format!("{}/{}", key.namespace, key.name),
            };
            return Err(status::leadership_error(not_member));
        }
        // A version that was never published must not count towards any barrier. One that arrived from
        // the leader (it sends only published versions) needs no read of the channel's ConfigMap: at 100
        // replicas, that read was 100 requests per version.
        let arrived = self.rollout.arrived(&key).iter().map(|a| a.version).max().unwrap_or(0);
        let latest = if r.version <= arrived {
            arrived
        } else {
            self.rollout.versions().latest(&r.channel).await.map_err(status::versions_error)?.map_or(0, |v| v.version)
        };
        if r.version > latest {
            return Err(status::failed_precondition(
                "version",
                format!("{} of channel {} was never published (the latest is {latest})", r.version, r.channel),
            ));
        }
        let leadership = self.rollout.leadership();
        if r.version == arrived {
            // The ACK of the leader's message tells the leader, which records it for the whole group; the
            // member Lease carries it from its next renewal on, in case that ACK goes to a leader since
            // gone.
            leadership.note_applied(&key, r.version).map_err(status::leadership_error)?;
        } else {
            // No message of this version waits to be ACKed (the app applied the version it read from the
            // cluster, or an older one): the member Lease says it now.
            leadership.report_applied(&key, r.version, RECORD_WAIT).await.map_err(status::leadership_error)?;
        }
        self.rollout.ack_applied(&key, r.version).await.map_err(status::rollout_error)?;
        Ok(Response::new(pb::ReportAppliedResponse {}))
    }

    async fn get_rollout_status(
        &self,
        request: Request<pb::GetRolloutStatusRequest>,
    ) -> Result<Response<pb::GetRolloutStatusResponse>, Status> {
        let key = self.channel(&request, "status", &request.get_ref().channel).await?;
        let r = request.into_inner();
        let latest =
            self.rollout.versions().latest(&r.channel).await.map_err(status::versions_error)?.map_or(0, |v| v.version);
        let version = if r.version == 0 { latest } else { r.version };
        let standing = self
            .rollout
            .barrier()
            .standing(&key.namespace, &key.name, version)
            .await
            .map_err(status::resource_error)?;
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
        let key = self.channel(&request, "status", &request.get_ref().channel).await?;
        let r = request.into_inner();
        if r.version == 0 {
            return Err(status::invalid_argument("version", "must be at least 1"));
        }
        let timeout = r
            .timeout
            .and_then(|t| Duration::try_from(t).ok())
            .filter(|t| *t <= MAX_WAIT)
            .ok_or_else(|| status::invalid_argument("timeout", "is required, between 0s and 1h"))?;
        let deadline = tokio::time::Instant::now() + timeout;
        let standing = self
            .rollout
            .barrier()
            .wait(&key.namespace, &key.name, r.version, deadline)
            .await
            .map_err(status::resource_error)?;
        Ok(Response::new(pb::WaitAppliedResponse {
            all_applied: standing.all_applied,
            members: members(&standing),
            lagging: standing.lagging,
        }))
    }
}

/// Streams `key`'s versions to one subscriber: the latest from the cluster first, then each newer one
/// that arrives from the leader; ACKs arrivals the app already applied; as the channel's new leader,
/// sends the latest version again (and starts recording the members' progress). Ends with UNAVAILABLE
/// when the daemon stops.
async fn stream_versions(
    rollout: Rollout,
    key: Key,
    mut states: tokio::sync::watch::Receiver<consistd_cluster::leadership::Observation>,
    tx: mpsc::Sender<Result<pb::SubscribeVersionsResponse, Status>>,
    shutdown: CancellationToken,
) {
    let mut arrivals = rollout.inbox().arrivals();
    let mut last = 0;
    match rollout.versions().latest(&key.name).await {
        Ok(Some(v)) => {
            last = v.version;
            let published_at = v
                .published_at
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
                .map(|t| prost_types::Timestamp { seconds: t.as_second(), nanos: t.subsec_nanosecond() });
            let first = pb::SubscribeVersionsResponse {
                channel: key.name.clone(),
                version: v.version,
                payload: v.payload,
                content_type: v.content_type,
                published_at,
            };
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
        }
        Ok(None) => {}
        Err(e) => {
            let _ = tx.send(Err(status::versions_error(e))).await;
            return;
        }
    }
    let mut leading = false;
    loop {
        let applied = rollout.leadership().applied(&key);
        for Arrived { version, message: m } in rollout.arrived(&key) {
            if version > last {
                last = version;
                let next = pb::SubscribeVersionsResponse {
                    channel: key.name.clone(),
                    version,
                    payload: m.payload.to_vec(),
                    content_type: m.content_type.clone(),
                    published_at: Some(m.received_at.into()),
                };
                if tx.send(Ok(next)).await.is_err() {
                    return;
                }
            } else if version <= applied
                && let Err(error) = rollout.inbox().ack(m.id).await
            {
                tracing::warn!(error = %consistd_core::error::chain(&error), channel = %key.name, version, "could not ACK an applied version");
            }
        }
        tokio::select! {
            _ = arrivals.changed() => {}
            changed = states.changed() => {
                if changed.is_err() {
                    return;
                }
                let now_leading = states.borrow_and_update().role == Role::Leader;
                if now_leading && !leading && let Err(error) = rollout.resend_latest(&key).await {
                    tracing::warn!(error = %consistd_core::error::chain(&error), channel = %key.name, "could not resend the latest version as new leader");
                }
                leading = now_leading;
            }
            () = tx.closed() => return,
            () = shutdown.cancelled() => {
                let _ = tx.send(Err(status::shutting_down("RolloutService.SubscribeVersions"))).await;
                return;
            }
        }
    }
}
