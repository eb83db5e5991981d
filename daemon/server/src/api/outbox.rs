//! OutboxService: Send stores a message durably and answers with its id (SendStream: many, in order);
//! WaitOutcome answers one message's first outcome, WatchAcks streams outcomes (ACKED per peer,
//! SUPERSEDED, FAILED); GetOutboxStatus lists what each peer has not ACKed yet.

use std::sync::Arc;

use consistd_cluster::leadership::Leadership;
use consistd_core::{config::Service, tasks::Tasks};
use consistd_messages::outbox::{Admitted, Destination, Outbox, OutcomeKind, Outgoing};
use consistd_observe::telemetry::TraceContext;
use consistd_proto::v1::{self as pb, outbox_service_server::OutboxService};
use futures::{FutureExt as _, StreamExt};
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status, Streaming};

use super::ResponseStream;
use super::{
    access::{Access, Ask, Resource},
    caller::Caller,
    guard, ordered, status,
};

/// Longest resource_id or event_id accepted (a Kubernetes UID is 36 bytes, a resourceVersion ~20).
pub(crate) const MAX_ID_BYTES: usize = 1024;
/// Longest content_type accepted.
const MAX_CONTENT_TYPE_BYTES: usize = 256;

/// The OutboxService implementation.
#[derive(Debug, Clone)]
pub(crate) struct OutboxApi {
    outbox: Outbox,
    /// Checks a guarded send's claim.
    leadership: Arc<Leadership>,
    namespace: String,
    access: Access,
    /// The serving group: per-call tasks run in it; its stop signal ends open streams.
    tasks: Tasks,
}

impl OutboxApi {
    pub(crate) fn new(
        outbox: Outbox,
        leadership: Arc<Leadership>,
        namespace: String,
        access: Access,
        tasks: Tasks,
    ) -> Self {
        Self { outbox, leadership, namespace, access, tasks }
    }

    /// Refuses `verb` (on `destination`, for a send) unless access.rules grant it to `caller`.
    async fn allowed(
        &self,
        caller: &Caller,
        verb: &'static str,
        destination: Option<&Destination>,
    ) -> Result<(), Status> {
        let (resource, namespace) = match destination {
            None => (None, None),
            Some(Destination::Peer(address)) => (Some(format!("peer/{address}")), None),
            Some(Destination::Service { namespace, name }) => {
                (Some(format!("service/{name}")), Some(namespace.as_str()))
            }
            Some(Destination::Election { namespace, name }) => {
                (Some(format!("election/{name}")), Some(namespace.as_str()))
            }
        };
        let resource = resource.as_deref().map_or(Resource::None, Resource::Named);
        let ask = Ask { service: Service::Outbox, verb, resource, namespace };
        self.access.check(caller, ask).await
    }

    /// Checks one Send request from `caller` and admits it to the outbox: its slot and sequence number
    /// are taken now, in call order. `headers` is the trace context of the call's metadata, used when the
    /// request carries none.
    async fn admit(&self, caller: &Caller, r: pb::SendRequest, headers: &TraceContext) -> Result<Admitted, Status> {
        let destination = Destination::from_pb(r.destination.as_ref(), &self.namespace)
            .map_err(|e| status::invalid_argument(e.field, e.message))?;
        self.allowed(caller, "send", Some(&destination)).await?;
        check_id("resource_id", &r.resource_id)?;
        check_id("event_id", &r.event_id)?;
        if r.content_type.len() > MAX_CONTENT_TYPE_BYTES || r.content_type.chars().any(char::is_control) {
            return Err(status::invalid_argument(
                "content_type",
                format!("must be a MIME type of at most {MAX_CONTENT_TYPE_BYTES} bytes"),
            ));
        }
        let given = TraceContext::given(r.traceparent, r.tracestate)
            .map_err(|e| status::invalid_argument(e.field, e.message))?;
        let trace = if given.is_empty() { headers.clone() } else { given };
        let claim = guard::claim(&self.leadership, r.guard.as_ref())?;
        self.outbox
            .admit(Outgoing {
                destination,
                resource_id: r.resource_id,
                event_id: r.event_id,
                payload: r.payload.into(),
                content_type: r.content_type,
                trace,
                claim,
            })
            .map_err(status::outbox_error)
    }
}

/// Checks an identifier field: present, bounded, printable.
pub(crate) fn check_id(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(status::invalid_argument(field, "must not be empty"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(status::invalid_argument(field, format!("is {} bytes; at most {MAX_ID_BYTES}", value.len())));
    }
    if value.chars().any(char::is_control) {
        return Err(status::invalid_argument(field, "must not contain control characters"));
    }
    Ok(())
}

#[tonic::async_trait]
impl OutboxService for OutboxApi {
    type SendStreamStream = ResponseStream<pb::SendStreamResponse>;
    type WatchAcksStream = ResponseStream<pb::WatchAcksResponse>;

    async fn send(&self, request: Request<pb::SendRequest>) -> Result<Response<pb::SendResponse>, Status> {
        let caller = Caller::from_request(&request);
        let headers = TraceContext::of_headers(request.metadata().as_ref());
        let admitted = self.admit(&caller, request.into_inner(), &headers).await?;
        let sequence = admitted.store().await.map_err(status::outbox_error)?;
        Ok(Response::new(pb::SendResponse { message_id: sequence.to_string() }))
    }

    async fn send_stream(
        &self,
        request: Request<Streaming<pb::SendStreamRequest>>,
    ) -> Result<Response<Self::SendStreamStream>, Status> {
        let caller = Caller::from_request(&request);
        let headers = TraceContext::of_headers(request.metadata().as_ref());
        let api = Arc::new(self.clone());
        let answers = ordered::answer_in_order(&self.tasks, request.into_inner(), move |r: pb::SendStreamRequest| {
            let (api, headers) = (api.clone(), headers.clone());
            async move {
                let admitted = match r.message {
                    Some(message) => api.admit(&caller, message, &headers).await,
                    None => Err(status::invalid_argument("message", "must be set")),
                };
                let stored = match admitted {
                    Ok(admitted) => admitted.store().map(|s| s.map_err(status::outbox_error)).boxed(),
                    Err(refused) => futures::future::ready(Err(refused)).boxed(),
                };
                stored
                    .map(|stored| {
                        Ok(match stored {
                            Ok(sequence) => pb::SendStreamResponse { message_id: sequence.to_string(), refusal: None },
                            Err(refused) => pb::SendStreamResponse {
                                message_id: String::new(),
                                refusal: Some(status::refusal(&refused)),
                            },
                        })
                    })
                    .boxed()
            }
        });
        Ok(Response::new(super::answers_until_shutdown(answers, self.tasks.signal(), "OutboxService.SendStream")))
    }

    async fn wait_outcome(
        &self,
        request: Request<pb::WaitOutcomeRequest>,
    ) -> Result<Response<pb::WaitOutcomeResponse>, Status> {
        self.allowed(&Caller::from_request(&request), "status", None).await?;
        let id = request.into_inner().message_id;
        let sequence = id.parse::<u64>().map_err(|_| {
            status::invalid_argument("message_id", format!("{id:?} is not a message id (Send answers one)"))
        })?;
        let outcome = tokio::select! {
            outcome = self.outbox.first_outcome(sequence) => outcome.map_err(status::outcome_error)?,
            () = self.tasks.stopping() => return Err(status::shutting_down_call("OutboxService.WaitOutcome")),
        };
        Ok(Response::new(pb::WaitOutcomeResponse { outcome: Some(to_pb(&outcome)) }))
    }

    async fn watch_acks(
        &self,
        request: Request<pb::WatchAcksRequest>,
    ) -> Result<Response<Self::WatchAcksStream>, Status> {
        self.allowed(&Caller::from_request(&request), "status", None).await?;
        let only = request.into_inner().resource_id;
        let outcomes = self.outbox.outcomes();
        let stream = futures::stream::unfold(outcomes, move |mut outcomes| {
            let only = only.clone();
            async move {
                loop {
                    match outcomes.recv().await {
                        Ok(o) if only.is_empty() || o.message.resource_id == only => {
                            return Some((Ok(to_pb(&o)), outcomes));
                        }
                        Ok(_) => {}
                        Err(RecvError::Lagged(n)) => {
                            return Some((Err(status::acks_lagged(n)), outcomes));
                        }
                        Err(RecvError::Closed) => return None,
                    }
                }
            }
        })
        // A lagging subscriber gets its error and the stream ends there.
        .scan(false, |ended, item| {
            if *ended {
                return futures::future::ready(None);
            }
            *ended = item.is_err();
            futures::future::ready(Some(item))
        });
        Ok(Response::new(super::until_shutdown(stream, self.tasks.signal(), "OutboxService.WatchAcks")))
    }

    async fn get_outbox_status(
        &self,
        request: Request<pb::GetOutboxStatusRequest>,
    ) -> Result<Response<pb::GetOutboxStatusResponse>, Status> {
        self.allowed(&Caller::from_request(&request), "status", None).await?;
        let (destinations, total) = self.outbox.status();
        let destinations = destinations
            .into_iter()
            .map(|d| pb::DestinationStatus {
                peer: d.peer,
                connected: d.connected,
                destination: Some(d.destination.to_pb()),
                pending: d
                    .pending
                    .into_iter()
                    .map(|p| pb::PendingMessage {
                        message_id: p.message.sequence.to_string(),
                        resource_id: p.message.resource_id.clone(),
                        event_id: p.message.event_id.clone(),
                        attempts: p.attempts,
                        enqueued_at: Some(p.message.enqueued_at.into()),
                        next_attempt_at: Some(p.next_attempt_at.into()),
                        last_error: p.last_error.unwrap_or_default(),
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(pb::GetOutboxStatusResponse {
            destinations,
            total_pending: u64::try_from(total).unwrap_or(u64::MAX),
        }))
    }
}

fn to_pb(o: &consistd_messages::outbox::Outcome) -> pb::WatchAcksResponse {
    let (outcome, reason) = match &o.kind {
        OutcomeKind::Acked => (pb::AckOutcome::Acked, String::new()),
        OutcomeKind::Superseded => (pb::AckOutcome::Superseded, String::new()),
        OutcomeKind::Failed(reason) => (pb::AckOutcome::Failed, reason.clone()),
    };
    pb::WatchAcksResponse {
        message_id: o.message.sequence.to_string(),
        destination: Some(o.message.destination.to_pb()),
        peer: o.peer.clone(),
        resource_id: o.message.resource_id.clone(),
        event_id: o.message.event_id.clone(),
        outcome: outcome.into(),
        reason,
        at: Some(o.at.into()),
    }
}
