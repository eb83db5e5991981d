//! ACK-tracked sends: `send` returns once the sidecar stored the message; awaiting the result gives its
//! outcome at the receiving app.

use std::{
    collections::{HashMap, VecDeque},
    future::{Future, IntoFuture},
    pin::Pin,
    sync::{Arc, Weak},
};

use futures::StreamExt as _;
use tokio::sync::{Mutex, oneshot};

use crate::{
    Client, Error,
    proto::{
        AckOutcome, Destination, Refusal, SendRequest, SendStreamRequest, WatchAcksRequest, WatchAcksResponse,
        destination::Target,
    },
    retry::cut_off,
};

/// Outcomes that arrive before their `Send` has answered are kept, up to this many.
const EARLY_OUTCOMES: usize = 10_000;

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

/// A message the sidecar has stored. `.await` it for its [`Outcome`]; for a Service or election
/// destination that is the first receiver's outcome.
#[derive(Debug)]
pub struct Sent {
    /// The sidecar's id for the message.
    pub message_id: String,
    outcome: oneshot::Receiver<Result<Outcome, Error>>,
}

impl IntoFuture for Sent {
    type Output = Result<Outcome, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        let id = self.message_id;
        Box::pin(async move {
            self.outcome.await.unwrap_or_else(|_| {
                Err(Error::Status(tonic::Status::unavailable(format!("outcome of message {id}: client dropped"))))
            })
        })
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

/// Matches outcomes from one `WatchAcks` stream to the sends waiting for them.
#[derive(Debug, Default)]
pub(crate) struct AckTracker {
    state: Mutex<Tracked>,
}

#[derive(Debug, Default)]
struct Tracked {
    /// Whether a `WatchAcks` stream is open.
    watching: bool,
    waiting: HashMap<String, oneshot::Sender<Result<Outcome, Error>>>,
    early: HashMap<String, Outcome>,
    early_order: VecDeque<String>,
}

impl Tracked {
    fn settle(&mut self, id: &str, outcome: Outcome) {
        match self.waiting.remove(id) {
            Some(waiter) => {
                let _ = waiter.send(Ok(outcome));
            }
            None => {
                if self.early.len() >= EARLY_OUTCOMES
                    && let Some(oldest) = self.early_order.pop_front()
                {
                    self.early.remove(&oldest);
                }
                self.early.insert(id.to_owned(), outcome);
                self.early_order.push_back(id.to_owned());
            }
        }
    }
}

impl Client {
    /// Stores `request` in the sidecar's outbox and returns once it is durable; the sidecar delivers
    /// and resends it until the receiving app ACKs. Await the returned [`Sent`] for the outcome.
    ///
    /// Sends from one client share one `SendStream` call, so sends made concurrently share the
    /// sidecar's disk flush; a refused message fails only its own send.
    ///
    /// The message carries the W3C trace context of the current OpenTelemetry span to the receiving
    /// app, unless `request` names one already ([`crate::trace::inject`]).
    pub async fn send(&self, mut request: SendRequest) -> Result<Sent, Error> {
        crate::trace::inject(&mut request, &opentelemetry::Context::current());
        self.watch_outcomes().await?;
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
        let message_id = answer.message_id;
        let (tx, outcome) = oneshot::channel();
        let mut state = self.acks.state.lock().await;
        match state.early.remove(&message_id) {
            Some(early) => {
                state.early_order.retain(|id| id != &message_id);
                let _ = tx.send(Ok(early));
            }
            None if !state.watching => {
                let _ = tx.send(Err(Error::Status(tonic::Status::unavailable(format!(
                    "outcome of message {message_id}: lost the outcome stream"
                )))));
            }
            None => {
                state.waiting.insert(message_id.clone(), tx);
            }
        }
        Ok(Sent { message_id, outcome })
    }

    /// Opens the `WatchAcks` stream unless it is open, so no outcome of a later send is missed.
    async fn watch_outcomes(&self) -> Result<(), Error> {
        let mut state = self.acks.state.lock().await;
        if state.watching {
            return Ok(());
        }
        let outcomes = self.outbox().watch_acks(WatchAcksRequest::default()).await?.into_inner();
        state.watching = true;
        tokio::spawn(pump(Arc::downgrade(&self.acks), outcomes));
        Ok(())
    }
}

/// The error of a request a streaming call refused: the status the unary call would have answered.
pub(crate) fn refused(refusal: Refusal) -> Error {
    Error::Status(tonic::Status::new(tonic::Code::from(refusal.code), refusal.message))
}

/// Hands each outcome to its waiter until the stream ends or every client is gone; then fails the
/// sends still waiting (their outcomes can no longer be seen) so none waits forever.
async fn pump(tracker: Weak<AckTracker>, mut outcomes: tonic::Streaming<WatchAcksResponse>) {
    let ended = loop {
        let next = outcomes.next().await;
        let Some(tracker) = tracker.upgrade() else { return };
        match next {
            Some(Ok(r)) => tracker.state.lock().await.settle(&r.message_id, Outcome::from_proto(&r)),
            Some(Err(status)) => break cut_off(status),
            None => break tonic::Status::unavailable("the sidecar ended the outcome stream"),
        }
    };
    let Some(tracker) = tracker.upgrade() else { return };
    let mut state = tracker.state.lock().await;
    state.watching = false;
    for (id, waiter) in state.waiting.drain() {
        let status = tonic::Status::new(ended.code(), format!("outcome of message {id}: {}", ended.message()));
        let _ = waiter.send(Err(Error::Status(status)));
    }
}
