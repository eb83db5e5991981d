//! LeadershipService: Campaign and Observe stream an election's state (current first, then changes,
//! coalesced); GetLeadership answers at once. Closing a Campaign stream resigns.

use std::{sync::Arc, time::Duration};

use consistd_cluster::leadership::{Key, Leadership, Role};
use consistd_core::{
    config::{Service, Timing},
    tasks::Tasks,
};
use consistd_proto::v1::{self as pb, leadership_service_server::LeadershipService};
use futures::StreamExt;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use super::ResponseStream;
use super::{
    access::{Access, Ask, Resource},
    caller::Caller,
    status,
};

/// How long GetLeadership waits for a first read of a Lease nothing here watched yet.
const FIRST_OBSERVATION: Duration = Duration::from_secs(2);

/// The LeadershipService implementation.
#[derive(Debug, Clone)]
pub(crate) struct LeadershipApi {
    leadership: Arc<Leadership>,
    access: Access,
    /// The serving group: per-call tasks run in it; its stop signal ends open streams.
    tasks: Tasks,
}

impl LeadershipApi {
    pub(crate) fn new(leadership: Arc<Leadership>, access: Access, tasks: Tasks) -> Self {
        Self { leadership, access, tasks }
    }

    /// The election a request names, once access.rules grant `verb` on it to the caller.
    async fn key<T>(
        &self,
        request: &Request<T>,
        verb: &'static str,
        election: &str,
        namespace: &str,
    ) -> Result<Key, Status> {
        let key = self.leadership.key(election, namespace).map_err(status::leadership_error)?;
        let ask = Ask {
            service: Service::Leadership,
            verb,
            resource: Resource::Named(&key.name),
            namespace: Some(&key.namespace),
        };
        self.access.check(&Caller::from_request(request), ask).await?;
        Ok(key)
    }
}

#[tonic::async_trait]
impl LeadershipService for LeadershipApi {
    type CampaignStream = ResponseStream<pb::CampaignResponse>;
    type ObserveStream = ResponseStream<pb::ObserveResponse>;

    async fn campaign(&self, request: Request<pb::CampaignRequest>) -> Result<Response<Self::CampaignStream>, Status> {
        let key = self.key(&request, "campaign", &request.get_ref().election, &request.get_ref().namespace).await?;
        let r = request.into_inner();
        let timing = timing(r.timing.as_ref())?;
        let (campaign, states) =
            self.leadership.campaign(&key, &r.identity, timing).map_err(status::leadership_error)?;
        let stream = WatchStream::new(states).map(move |s| {
            // The candidacy lives exactly as long as the stream: dropped with it, it resigns.
            let _candidacy = &campaign;
            Ok(pb::CampaignResponse { status: Some(to_pb(&key, &s)) })
        });
        Ok(Response::new(super::until_shutdown(stream, self.tasks.signal(), "LeadershipService.Campaign")))
    }

    async fn observe(&self, request: Request<pb::ObserveRequest>) -> Result<Response<Self::ObserveStream>, Status> {
        let r = request.get_ref();
        let key = self.key(&request, "observe", &r.election, &r.namespace).await?;
        let states = self.leadership.observe(&key);
        let stream = WatchStream::new(states).map(move |s| Ok(pb::ObserveResponse { status: Some(to_pb(&key, &s)) }));
        Ok(Response::new(super::until_shutdown(stream, self.tasks.signal(), "LeadershipService.Observe")))
    }

    async fn get_leadership(
        &self,
        request: Request<pb::GetLeadershipRequest>,
    ) -> Result<Response<pb::GetLeadershipResponse>, Status> {
        let r = request.get_ref();
        let key = self.key(&request, "observe", &r.election, &r.namespace).await?;
        let s = self.leadership.get(&key, FIRST_OBSERVATION).await;
        Ok(Response::new(pb::GetLeadershipResponse { status: Some(to_pb(&key, &s)) }))
    }
}

/// The request's timing, unset fields defaulted, checked in client-go's order.
fn timing(t: Option<&pb::LeaseTiming>) -> Result<Timing, Status> {
    let mut timing = Timing::default();
    if let Some(t) = t {
        let field =
            |name: &'static str, d: &Option<prost_types::Duration>, into: &mut Duration| -> Result<(), Status> {
                if let Some(d) = d {
                    *into = Duration::try_from(*d)
                        .map_err(|_| status::invalid_argument(name, format!("{d:?} is not a non-negative duration")))?;
                }
                Ok(())
            };
        field("timing.lease_duration", &t.lease_duration, &mut timing.lease_duration)?;
        field("timing.renew_deadline", &t.renew_deadline, &mut timing.renew_deadline)?;
        field("timing.retry_period", &t.retry_period, &mut timing.retry_period)?;
    }
    timing.validate().map_err(|m| status::invalid_argument("timing", m))?;
    Ok(timing)
}

fn timestamp(t: Option<std::time::SystemTime>) -> Option<prost_types::Timestamp> {
    t.map(prost_types::Timestamp::from)
}

fn to_pb(key: &Key, s: &consistd_cluster::leadership::Observation) -> pb::LeadershipStatus {
    let state = match s.role {
        Role::Leader => pb::LeadershipState::Leader,
        Role::Follower => pb::LeadershipState::Follower,
        Role::Unknown => pb::LeadershipState::Unknown,
    };
    pb::LeadershipStatus {
        election: key.name.clone(),
        namespace: key.namespace.clone(),
        state: state.into(),
        holder: s.holder.clone(),
        term: s.term,
        timing: s.lease_duration.map(|d| pb::LeaseTiming {
            lease_duration: prost_types::Duration::try_from(d).ok(),
            renew_deadline: None,
            retry_period: None,
        }),
        acquired_at: timestamp(s.acquired_at),
        renewed_at: timestamp(s.renewed_at),
        observed_at: timestamp(Some(s.observed_at)),
        identity: s.identity.clone(),
        // The monotonic deadline told as wall-clock time, which the app shares with this daemon.
        leader_until: timestamp(s.until.map(|until| {
            let now = tokio::time::Instant::now();
            std::time::SystemTime::now() + until.saturating_duration_since(now)
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: i64) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds: s, nanos: 0 })
    }

    #[test]
    fn timing_defaults_and_order_are_checked_naming_the_field() {
        assert_eq!(timing(None).expect("defaults"), Timing::default());
        let t = pb::LeaseTiming { lease_duration: secs(4), renew_deadline: secs(3), retry_period: secs(1) };
        assert_eq!(timing(Some(&t)).expect("valid").lease_duration, Duration::from_secs(4));
        let bad = pb::LeaseTiming { lease_duration: secs(10), renew_deadline: secs(10), retry_period: None };
        assert!(timing(Some(&bad)).expect_err("out of order").message().starts_with("timing:"));
        let negative = pb::LeaseTiming { lease_duration: secs(-1), ..Default::default() };
        assert!(timing(Some(&negative)).expect_err("negative").message().starts_with("timing.lease_duration:"));
    }
}
