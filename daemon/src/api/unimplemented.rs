//! The services whose behaviour is not built yet. Each RPC answers UNIMPLEMENTED naming itself, so the
//! full protocol is served (and reflected) from the first release and later work only fills it in.

use consistd_proto::v1::{self as pb, rollout_service_server::RolloutService};
use futures::stream::BoxStream;
use tonic::{Request, Response, Status};

use super::status::unimplemented;

/// Answers every RPC of the services it is registered for with UNIMPLEMENTED.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Unimplemented;

type Stream<T> = BoxStream<'static, Result<T, Status>>;
type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl RolloutService for Unimplemented {
    type SubscribeVersionsStream = Stream<pb::SubscribeVersionsResponse>;
    async fn publish(&self, _: Request<pb::PublishRequest>) -> Answer<pb::PublishResponse> {
        Err(unimplemented("RolloutService.Publish"))
    }
    async fn subscribe_versions(
        &self,
        _: Request<pb::SubscribeVersionsRequest>,
    ) -> Answer<Self::SubscribeVersionsStream> {
        Err(unimplemented("RolloutService.SubscribeVersions"))
    }
    async fn report_applied(&self, _: Request<pb::ReportAppliedRequest>) -> Answer<pb::ReportAppliedResponse> {
        Err(unimplemented("RolloutService.ReportApplied"))
    }
    async fn get_rollout_status(
        &self,
        _: Request<pb::GetRolloutStatusRequest>,
    ) -> Answer<pb::GetRolloutStatusResponse> {
        Err(unimplemented("RolloutService.GetRolloutStatus"))
    }
    async fn wait_applied(&self, _: Request<pb::WaitAppliedRequest>) -> Answer<pb::WaitAppliedResponse> {
        Err(unimplemented("RolloutService.WaitApplied"))
    }
}
