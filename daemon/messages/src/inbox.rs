//! The inbox: messages peers sent to this pod, stored durably and deduplicated by (sender, resource_id,
//! event_id), handed to the app's receivers one at a time until the app ACKs (or NACKs with a delay),
//! and each ACK sent back to the sender's connection. `state` is what it holds in memory, without I/O,
//! with the app's queue (`queue`: leases and NACK delays) and the ACK path back (`acks`) as parts of
//! their own; `record` is its stored form and deduplication record; this module does the storing,
//! waking and sending around them.

use std::{
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use consistd_core::{
    claim::Claim,
    config::{InboxConfig, Live},
    error,
    tasks::Tasks,
};
use consistd_observe::{metrics::Metrics, telemetry::TraceContext};
use consistd_proto::peer::v1::{Disposition, ExchangeResponse, PeerMessage};
use tokio::{
    sync::{Notify, mpsc, watch},
    time::Instant,
};

use self::{
    claims::Newest,
    state::{DedupKey, InboxState, Known, Next},
};
use crate::store::{Store, StoreError};

mod acks;
mod claims;
mod queue;
mod record;
mod state;

/// One message for the app.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxMessage {
    /// The inbox's id (the API's message_id).
    pub id: u64,
    /// The sending daemon's identity, from its Hello: part of the deduplication key, and where the ACK goes.
    pub sender: String,
    /// The sender's id for it, echoed in the ACK.
    pub sender_sequence: u64,
    /// What it is about, as the sender names it; ids under a held prefix (`consistd.rollout/`) are the daemon's own.
    pub resource_id: String,
    /// Which event of that resource; with sender and resource_id, the deduplication key.
    pub event_id: String,
    /// The sender's bytes, unchanged.
    pub payload: Bytes,
    /// The payload's MIME type, as the sender gave it (may be empty).
    pub content_type: String,
    /// The trace the sending app sent it under (empty for none).
    pub trace: TraceContext,
    /// The claim it was sent under (a guarded send or publish), newest of its election when it arrived.
    pub claim: Option<Claim>,
    /// When this daemon received it (wall clock; the API's received_at).
    pub received_at: SystemTime,
}

/// Why an Ack or Nack was refused.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// No such message was ever received.
    #[error("message_id: {0} was never received by this inbox")]
    NotFound(u64),
    /// The store failed; the ACK was not recorded (the store error names the operation).
    #[error(transparent)]
    Store(StoreError),
}

/// The inbox; clones share it.
#[derive(Debug, Clone)]
pub struct Inbox {
    inner: Arc<InboxShared>,
}

#[derive(Debug)]
struct InboxShared {
    store: Store,
    identity: String,
    /// The `inbox` config section (its bounds), as reloads change it.
    config: Live<InboxConfig>,
    next_id: AtomicU64,
    state: Mutex<InboxState>,
    ready: Notify,
    /// Bumped on every new message, for the parts of the daemon that wait for their own.
    arrivals: watch::Sender<u64>,
    metrics: Metrics,
    /// Runs the stores and ACKs that must finish even when their caller stops waiting.
    tasks: Tasks,
}

impl Inbox {
    /// Loads the messages still waiting. Messages whose resource_id starts with one of `held_prefixes`
    /// are the daemon's own (rollout versions, for one): they are not handed to the app's receivers but
    /// wait, per resource_id, for the part of the daemon that reads them with [`Inbox::held`] and ACKs
    /// them.
    pub fn open(
        store: Store,
        identity: String,
        config: Live<InboxConfig>,
        held_prefixes: &[&'static str],
        metrics: Metrics,
        tasks: &Tasks,
    ) -> Result<Self, StoreError> {
        let stored = record::load(&store)?;
        let state = InboxState::new(held_prefixes, stored.messages, Newest::new(stored.claims));
        if state.pending() > 0 {
            tracing::info!(messages = state.pending(), "inbox restored from the store");
        }
        metrics.inbox_pending.set(i64::try_from(state.pending()).unwrap_or(i64::MAX));
        Ok(Self {
            inner: Arc::new(InboxShared {
                store,
                identity,
                config,
                next_id: AtomicU64::new(stored.next_id),
                state: Mutex::new(state),
                ready: Notify::new(),
                arrivals: watch::channel(0).0,
                metrics,
                tasks: tasks.clone(),
            }),
        })
    }

    /// This daemon's identity: whom its peers' messages are for.
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A sender connected; ACKs for it go to `tx` until the returned guard is dropped.
    pub fn connect(&self, sender: &str, tx: mpsc::Sender<ExchangeResponse>) -> Connection {
        let (id, unsent) = self.lock().acks.connect(sender, tx.clone());
        for ack in unsent {
            self.send_ack(&tx, ack);
        }
        Connection { inbox: self.clone(), sender: sender.to_owned(), id }
    }

    /// Stores a message from `sender` (unless it is a duplicate) and says what became of it; None for a
    /// resend of a message that is being stored right now (that one is answered).
    ///
    /// The message is shown to the app, and STORED answered, only once its write is durable: every id
    /// the app is given names a stored message, which no later run gives to another (the stored next
    /// id only grows), so an Ack retried against a restarted daemon either finds its message or was
    /// recorded before.
    pub async fn accept(&self, sender: &str, m: PeerMessage) -> Option<ExchangeResponse> {
        let answer = |disposition: Disposition, reason: String| ExchangeResponse {
            sequence: m.sequence,
            resource_id: m.resource_id.clone(),
            event_id: m.event_id.clone(),
            disposition: disposition.into(),
            reason,
        };
        let key = DedupKey::new(sender, &m.resource_id, &m.event_id);
        match self.lock().known(&key) {
            Known::No => {}
            Known::Storing => {
                self.inner.metrics.inbox_duplicates.inc();
                return None;
            }
            Known::Stored => {
                self.inner.metrics.inbox_duplicates.inc();
                return Some(answer(Disposition::Stored, String::new()));
            }
        }
        // ACKed before? The record is on disk (an ACK in progress is for a message still in memory).
        match record::acked_before(&self.inner.store, &key) {
            Ok(false) => {}
            Ok(true) => {
                self.inner.metrics.inbox_duplicates.inc();
                return Some(answer(Disposition::Acked, String::new()));
            }
            Err(error) => return Some(answer(Disposition::Refused, error::chain(&error))),
        }
        let claim = match Claim::parse_carried(&m.claim) {
            Ok(claim) => claim,
            Err(why) => return Some(answer(Disposition::Fenced, why)),
        };
        let (message, written) = {
            let mut state = self.lock();
            // Taken in meanwhile by a resend on another connection: that one is answered.
            if state.known(&key) != Known::No {
                return None;
            }
            // A later term of the claim's election reached this daemon first: the sender's authority is over.
            if let Some(claim) = &claim
                && let Err(why) = state.claims.check(claim)
            {
                self.inner.metrics.inbox_fenced.inc();
                tracing::info!(sender, resource_id = %m.resource_id, event_id = %m.event_id, why, "message refused for good");
                return Some(answer(Disposition::Fenced, why));
            }
            let config = self.inner.config.get();
            if let Err(full) = state.begin_storing(&key, m.payload.len(), &config, &self.inner.identity) {
                return Some(answer(Disposition::Refused, full.to_string()));
            }
            if let Some(claim) = &claim {
                state.claims.raise(claim);
            }
            let message = Arc::new(InboxMessage {
                id: self.inner.next_id.fetch_add(1, Ordering::SeqCst),
                sender: sender.to_owned(),
                sender_sequence: m.sequence,
                resource_id: m.resource_id.clone(),
                event_id: m.event_id.clone(),
                payload: m.payload.clone(),
                content_type: m.content_type.clone(),
                trace: TraceContext::given(m.traceparent.clone(), m.tracestate.clone()).unwrap_or_default(),
                claim,
                received_at: SystemTime::now(),
            });
            let stored = message.clone();
            let written =
                self.inner.store.write("store inbound message", move |txn| record::write_received(txn, &stored));
            (message, written)
        };
        // The rest runs in a task of its own, so a caller that stops waiting cannot leave a stored
        // message unseen and its key marked as being stored (its resends unanswered) for good.
        let inbox = self.clone();
        let attempt = m.attempt;
        let stored = self.inner.tasks.spawn(async move {
            let result = written.await;
            inbox.stored(message, attempt, result)
        });
        let (disposition, reason) =
            stored.await.unwrap_or_else(|e| (Disposition::Refused, format!("store inbound message: {e}")));
        Some(answer(disposition, reason))
    }

    /// Ends the storing of `message`: once its write is durable, shows it to the app (or holds it for
    /// the daemon) and answers STORED; if the write failed, forgets it (never shown; the sender still
    /// holds it and sends it again) and answers REFUSED with why.
    fn stored(
        &self,
        message: Arc<InboxMessage>,
        attempt: u32,
        result: Result<(), StoreError>,
    ) -> (Disposition, String) {
        let m = message.clone();
        let (id, sender, resource_id, event_id) = (m.id, &m.sender, &m.resource_id, &m.event_id);
        let mut state = self.lock();
        state.end_storing(message, result.is_ok());
        if let Err(error) = result {
            drop(state);
            let error = error::chain(&error);
            tracing::warn!(%error, sender, resource_id, event_id, "inbound message not stored");
            return (Disposition::Refused, error);
        }
        self.set_pending_gauge(&state);
        drop(state);
        self.inner.ready.notify_waiters();
        self.inner.arrivals.send_modify(|n| *n += 1);
        self.inner.metrics.inbox_received.inc();
        tracing::debug!(message_id = id, sender, resource_id, event_id, attempt, "message received");
        (Disposition::Stored, String::new())
    }

    /// A new receiver for the app.
    pub fn receiver(&self) -> Receiver {
        let id = self.lock().queue.new_receiver();
        Receiver { inbox: self.clone(), id }
    }

    /// Records the app's ACK durably, then sends it back to the sender. ACKing a message that is no
    /// longer pending (ACKed before) succeeds.
    ///
    /// The work starts at once in a task of its own: a caller that stops waiting (a cancelled Ack
    /// call) cannot leave the ACK written but not applied, the message still held as pending and its
    /// sender resending it, answered STORED, for as long as the daemon runs.
    pub fn ack(&self, id: u64) -> impl Future<Output = Result<(), InboxError>> + Send + use<> {
        let inbox = self.clone();
        let task = self.inner.tasks.spawn(async move { inbox.record_ack(id).await });
        async move { task.await.unwrap_or(Err(InboxError::Store(StoreError::Closed))) }
    }

    async fn record_ack(&self, id: u64) -> Result<(), InboxError> {
        let message = {
            let state = self.lock();
            match state.get(id) {
                Some(p) => p.message.clone(),
                None if id > 0 && id < self.inner.next_id.load(Ordering::SeqCst) => return Ok(()),
                None => return Err(InboxError::NotFound(id)),
            }
        };
        let m = message.clone();
        self.inner.store.write("record ACK", move |txn| record::write_ack(txn, &m)).await.map_err(InboxError::Store)?;
        let mut state = self.lock();
        if let Some(p) = state.remove(id) {
            self.inner.metrics.inbox_acks.inc();
            self.set_pending_gauge(&state);
            tracing::debug!(
                message_id = id,
                sender = %message.sender,
                resource_id = %message.resource_id,
                event_id = %message.event_id,
                attempt = p.attempts,
                "message ACKed by the app"
            );
        }
        let ack = ExchangeResponse {
            sequence: message.sender_sequence,
            resource_id: message.resource_id.clone(),
            event_id: message.event_id.clone(),
            disposition: Disposition::Acked.into(),
            reason: String::new(),
        };
        if let Some((tx, ack)) = state.acks.route(&message.sender, ack) {
            self.send_ack(&tx, ack);
        }
        Ok(())
    }

    /// Hands a message back for another delivery after `delay`.
    pub fn nack(&self, id: u64, delay: Duration, reason: &str) -> Result<(), InboxError> {
        let mut state = self.lock();
        let Some(p) = state.nack(id, delay, Instant::now()) else {
            return if id > 0 && id < self.inner.next_id.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(InboxError::NotFound(id))
            };
        };
        self.inner.metrics.inbox_nacks.inc();
        tracing::debug!(
            message_id = id,
            sender = %p.message.sender,
            resource_id = %p.message.resource_id,
            event_id = %p.message.event_id,
            retry_after = ?delay,
            reason,
            "message NACKed by the app"
        );
        drop(state);
        self.inner.ready.notify_waiters();
        Ok(())
    }

    /// The daemon's own messages about `resource_id` not ACKed yet, oldest first.
    pub(crate) fn held(&self, resource_id: &str) -> Vec<Arc<InboxMessage>> {
        self.lock().held(resource_id)
    }

    /// Changes whenever a message arrives.
    pub fn arrivals(&self) -> watch::Receiver<u64> {
        self.inner.arrivals.subscribe()
    }

    /// Messages waiting for the app's ACK.
    pub fn pending(&self) -> usize {
        self.lock().pending()
    }

    fn set_pending_gauge(&self, state: &InboxState) {
        self.inner.metrics.inbox_pending.set(i64::try_from(state.pending()).unwrap_or(i64::MAX));
    }

    /// Queues an ACK on a sender's connection without waiting on it.
    fn send_ack(&self, tx: &mpsc::Sender<ExchangeResponse>, ack: ExchangeResponse) {
        if let Err(mpsc::error::TrySendError::Full(ack)) = tx.try_send(ack) {
            let tx = tx.clone();
            self.inner.tasks.spawn(async move {
                let _ = tx.send(ack).await;
            });
        }
    }
}

/// A sender's connection; while it is the newest, ACKs for that sender go to it.
#[derive(Debug)]
pub struct Connection {
    inbox: Inbox,
    sender: String,
    id: u64,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.inbox.lock().acks.disconnect(&self.sender, self.id);
    }
}

/// One app receiver: takes messages one at a time; what it holds un-ACKed when dropped is handed to
/// the next receiver.
#[derive(Debug)]
pub struct Receiver {
    inbox: Inbox,
    id: u64,
}

impl Receiver {
    /// The next message for the app and its delivery attempt (1 for the first); waits for one.
    pub async fn next(&mut self) -> (Arc<InboxMessage>, u32) {
        let inner = &self.inbox.inner;
        loop {
            let notified = inner.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake_at = match self.inbox.lock().next(self.id, Instant::now()) {
                Next::Message(message, attempt) => return (message, attempt),
                Next::Wait(at) => at,
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let returned = self.inbox.lock().queue.return_leases(self.id);
        if returned {
            self.inbox.inner.ready.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests;
