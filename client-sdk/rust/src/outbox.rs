//! ACK-tracked sends: `send` returns once the sidecar stored the message; awaiting the [`Sent`] asks the
//! sidecar for its outcome at the receiving app (`OutboxService.WaitOutcome`), so the SDK keeps no
//! outcome stream and no table of outcomes.

use std::{
    future::{Future, IntoFuture},
    pin::Pin,
};

use tokio::sync::OnceCell;

use crate::{
    Client, Error,
    proto::{
        AckOutcome, Destination, Refusal, SendRequest, SendStreamRequest, WaitOutcomeRequest, WatchAcksResponse,
        destination::Target,
    },
    retry::{Backoff, cut_off, is_retryable},
};

/// How a sent message ended at a receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// ACKED, SUPERSEDED or FAILED.
    pub kind: AckOutcome,
    /// The peer address that answered.
    pub peer: String,
    /// Why, for FAILED.
    pub reason: String,
}

impl Outcome {
    fn from_proto(r: &WatchAcksResponse) -> Self {
        Self { kind: r.outcome(), peer: r.peer.clone(), reason: r.reason.clone() }
    }

    /// Whether the receiving app acknowledged the message.
    pub fn is_acked(&self) -> bool {
        self.kind == AckOutcome::Acked
    }
}

/// A message the sidecar has stored. `.await` it, or call [`Sent::outcome`], for its [`Outcome`]; for a
/// Service or election destination that is the first receiver's.
#[derive(Debug)]
pub struct Sent {
    /// The sidecar's id for the message.
    pub message_id: String,
    client: Client,
    outcome: OnceCell<Outcome>,
}

impl Sent {
    /// The message's first outcome: the sidecar answers it when it comes, or at once if it came
    /// already. A lost connection to the sidecar is retried with backoff, so an outcome that came
    /// meanwhile is still seen. Bound the wait with a timeout around this call; calling again after it
    /// goes on waiting, and once the outcome is known it is answered without asking the sidecar again.
    /// NOT_FOUND: the sidecar no longer knows the outcome (it restarted since, or 10,000 later outcomes
    /// came).
    pub async fn outcome(&self) -> Result<Outcome, Error> {
        self.outcome.get_or_try_init(|| wait_outcome(&self.client, &self.message_id)).await.cloned()
    }
}

impl IntoFuture for Sent {
    type Output = Result<Outcome, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.outcome().await })
    }
}

/// Asks the sidecar for message `id`'s first outcome until it answers, again after a lost connection.
async fn wait_outcome(client: &Client, id: &str) -> Result<Outcome, Error> {
    let mut backoff = Backoff::new();
    loop {
        let request = WaitOutcomeRequest { message_id: id.to_owned() };
        match client.outbox().wait_outcome(request).await {
            Ok(answer) => {
                let outcome = answer.into_inner().outcome.ok_or_else(|| {
                    tonic::Status::internal(format!("outcome of message {id}: the sidecar answered none"))
                })?;
                return Ok(Outcome::from_proto(&outcome));
            }
            Err(status) if is_retryable(&status) => backoff.wait().await,
            Err(status) => return Err(Error::Status(cut_off(status))),
        }
    }
}

/// A destination naming one peer sidecar by address ("host:port").
pub fn to_peer(address: impl Into<String>) -> Destination {
    Destination { target: Some(Target::Peer(address.into())) }
}

/// A destination naming every member of an election group.
pub fn to_election(election: impl Into<String>) -> Destination {
    Destination { target: Some(Target::Election(election.into())) }
}

impl Client {
    /// Stores `request` in the sidecar's outbox and returns once it is durable; the sidecar delivers
    /// and resends it until the receiving app ACKs. Await the returned [`Sent`] for the outcome (a send
    /// never awaited costs nothing more).
    ///
    /// Sends from one client share one `SendStream` call, so sends made concurrently share the
    /// sidecar's disk flush; a refused message fails only its own send.
    ///
    /// The message carries the W3C trace context of the current OpenTelemetry span to the receiving
    /// app, unless `request` names one already ([`crate::trace::inject`]).
    pub async fn send(&self, mut request: SendRequest) -> Result<Sent, Error> {
        crate::trace::inject(&mut request, &opentelemetry::Context::current());
        let outbox = self.outbox();
        let answer = self
            .sends
            .call(SendStreamRequest { message: Some(request) }, |requests| {
                let mut outbox = outbox.clone();
                async move { Ok(outbox.send_stream(requests).await?.into_inner()) }
            })
            .await?;
        if let Some(refusal) = answer.refusal {
            return Err(refused(refusal));
        }
        Ok(Sent { message_id: answer.message_id, client: self.clone(), outcome: OnceCell::new() })
    }
}

/// The error of a request a streaming call refused: the status the unary call would have answered.
pub(crate) fn refused(refusal: Refusal) -> Error {
    Error::Status(tonic::Status::new(tonic::Code::from(refusal.code), refusal.message))
}
