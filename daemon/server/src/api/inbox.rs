//! InboxService: Receive streams messages from peers to the app one at a time per receiver, oldest
//! first; Ack records the app's ACK durably and sends it back to the sender (AckStream: many, answered
//! in order); Nack redelivers later.

use std::time::Duration;

use consistd_core::{config::Service, tasks::Tasks};
use consistd_messages::inbox::Inbox;
use consistd_proto::v1::{self as pb, inbox_service_server::InboxService};
use futures::FutureExt as _;
use tonic::{Request, Response, Status, Streaming};

use super::ResponseStream;
use super::{
    access::{Access, Ask, Resource},
    caller::Caller,
    ordered, status,
};

/// The longest NACK delay accepted.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// The InboxService implementation.
#[derive(Debug, Clone)]
pub(crate) struct InboxApi {
    inbox: Inbox,
    access: Access,
    /// The serving group: per-call tasks run in it; its stop signal ends open streams.
    tasks: Tasks,
}

impl InboxApi {
    pub(crate) fn new(inbox: Inbox, access: Access, tasks: Tasks) -> Self {
        Self { inbox, access, tasks }
    }

    /// Refuses the call unless access.rules grant the inbox to the caller.
    async fn allowed<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let ask = Ask { service: Service::Inbox, verb: "receive", resource: Resource::None, namespace: None };
        self.access.check(&Caller::from_request(request), ask).await
    }
}

fn message_id(id: &str) -> Result<u64, Status> {
    match id.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(status::invalid_argument("message_id", format!("{id:?} is not a message id from Receive"))),
    }
}

#[tonic::async_trait]
impl InboxService for InboxApi {
    type ReceiveStream = ResponseStream<pb::ReceiveResponse>;
    type AckStreamStream = ResponseStream<pb::AckStreamResponse>;

    async fn receive(&self, request: Request<pb::ReceiveRequest>) -> Result<Response<Self::ReceiveStream>, Status> {
        self.allowed(&request).await?;
        let receiver = self.inbox.receiver();
        let stream = futures::stream::unfold(receiver, |mut receiver| async move {
            let (m, attempt) = receiver.next().await;
            let message = pb::InboxMessage {
                message_id: m.id.to_string(),
                sender: m.sender.clone(),
                resource_id: m.resource_id.clone(),
                event_id: m.event_id.clone(),
                payload: m.payload.to_vec(),
                content_type: m.content_type.clone(),
                delivery_attempt: attempt,
                received_at: Some(m.received_at.into()),
                traceparent: m.trace.traceparent.clone(),
                tracestate: m.trace.tracestate.clone(),
                guard: m.claim.as_ref().map(|c| pb::WriteGuard {
                    election: c.lease.clone(),
                    namespace: c.namespace.clone(),
                    term: c.term,
                }),
            };
            Some((Ok(pb::ReceiveResponse { message: Some(message) }), receiver))
        });
        Ok(Response::new(super::until_shutdown(stream, self.tasks.signal(), "InboxService.Receive")))
    }

    async fn ack(&self, request: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        self.allowed(&request).await?;
        let id = message_id(&request.into_inner().message_id)?;
        self.inbox.ack(id).await.map_err(status::inbox_error)?;
        Ok(Response::new(pb::AckResponse {}))
    }

    async fn ack_stream(
        &self,
        request: Request<Streaming<pb::AckStreamRequest>>,
    ) -> Result<Response<Self::AckStreamStream>, Status> {
        self.allowed(&request).await?;
        let inbox = self.inbox.clone();
        let answers = ordered::answer_in_order(&self.tasks, request.into_inner(), move |r: pb::AckStreamRequest| {
            // Each ACK starts being recorded on arrival (Inbox::ack runs in a task of its own).
            let acked = message_id(&r.message_id).map(|id| inbox.ack(id));
            async move {
                async move {
                    let refused = match acked {
                        Err(refused) => Some(refused),
                        Ok(acked) => acked.await.err().map(status::inbox_error),
                    };
                    Ok(pb::AckStreamResponse {
                        message_id: r.message_id,
                        refusal: refused.as_ref().map(status::refusal),
                    })
                }
                .boxed()
            }
        });
        Ok(Response::new(super::answers_until_shutdown(answers, self.tasks.signal(), "InboxService.AckStream")))
    }

    async fn nack(&self, request: Request<pb::NackRequest>) -> Result<Response<pb::NackResponse>, Status> {
        self.allowed(&request).await?;
        let r = request.into_inner();
        let id = message_id(&r.message_id)?;
        let delay = match r.retry_after {
            None => Duration::ZERO,
            Some(d) => Duration::try_from(d)
                .ok()
                .filter(|d| *d <= MAX_RETRY_AFTER)
                .ok_or_else(|| status::invalid_argument("retry_after", "must be between 0s and 24h"))?,
        };
        if r.reason.len() > 4096 {
            return Err(status::invalid_argument("reason", "is longer than 4096 bytes"));
        }
        self.inbox.nack(id, delay, &r.reason).map_err(status::inbox_error)?;
        Ok(Response::new(pb::NackResponse {}))
    }
}
