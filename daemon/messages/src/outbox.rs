//! The outbox: messages the app sends to other pods, stored durably before `Send` answers, delivered to
//! every peer of their destination and resent with backoff until each peer's app ACKs them. Per
//! (destination, resource_id) only the newest message is kept: a newer event supersedes an older one
//! that is not ACKed yet, and an ACK for the older one never clears the newer.

mod backoff;
pub mod destination;
mod link;
mod members;
mod record;
mod state;
pub mod status;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, atomic::AtomicU64},
    time::SystemTime,
};

use bytes::Bytes;
use consistd_core::{
    config::{Live, OutboxConfig},
    tasks::Tasks,
};
use consistd_observe::{metrics::Metrics, telemetry::TraceContext};
use tokio::sync::broadcast;

pub use self::{destination::Destination, members::Members};
use self::{
    link::Link,
    state::{Recipients, Slot},
};
use crate::{
    store::{Store, StoreError},
    transport::Transport,
};

/// Outcomes a WatchAcks subscriber may fall behind by before it is cut off.
const OUTCOME_BUFFER: usize = 16_384;

/// One message as the app sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The outbox's id for it, strictly increasing (the API's message_id).
    pub sequence: u64,
    /// The peer, Service or election group it is delivered to.
    pub destination: Destination,
    /// What it is about, as the sender names it; per (destination, resource_id) only the newest message is kept.
    pub resource_id: String,
    /// Which event of that resource; receivers deduplicate by (sender, resource_id, event_id).
    pub event_id: String,
    /// The app's bytes, delivered unchanged (at most outbox.maxPayloadBytes).
    pub payload: Bytes,
    /// The payload's MIME type, as the app gave it (may be empty).
    pub content_type: String,
    /// The trace it was sent under, handed to the receiving app.
    pub trace: TraceContext,
    /// When `Send` stored it.
    pub enqueued_at: SystemTime,
}

/// What `Send` is asked to store.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The peer, Service or election group to deliver it to.
    pub destination: Destination,
    /// What it is about, as the sender names it; per (destination, resource_id) only the newest message is kept.
    pub resource_id: String,
    /// Which event of that resource; receivers deduplicate by (sender, resource_id, event_id).
    pub event_id: String,
    /// The app's bytes; `send` refuses more than outbox.maxPayloadBytes.
    pub payload: Bytes,
    /// The payload's MIME type, as the app gave it (may be empty).
    pub content_type: String,
    /// The trace it is sent under (empty for none).
    pub trace: TraceContext,
}

/// The end of a message's life at one peer (or everywhere, for SUPERSEDED).
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The message the outcome is about, as stored.
    pub message: Arc<Message>,
    /// The peer that answered; empty when the outcome is not about one peer.
    pub peer: String,
    /// ACKED, SUPERSEDED, or FAILED with the reason.
    pub kind: OutcomeKind,
    /// When this daemon learned the outcome (wall clock), for WatchAcks.
    pub at: SystemTime,
}

/// What happened to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutcomeKind {
    /// The peer's app acknowledged it.
    Acked,
    /// A newer event for the same (destination, resource_id) replaced it.
    Superseded,
    /// Delivery to that peer was given up; the reason says why.
    Failed(String),
}

/// The outbox bound a `Send` would pass: nothing was stored. Displays what the app is told, naming the
/// setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Bound {
    /// The payload alone is larger than `outbox.maxPayloadBytes`.
    #[error("payload: {bytes} bytes is more than outbox.maxPayloadBytes ({max})")]
    Payload {
        /// The payload's size.
        bytes: usize,
        /// `outbox.maxPayloadBytes`.
        max: usize,
    },
    /// The payload bytes held would pass `outbox.maxPendingBytes`.
    #[error(
        "send: the outbox already holds {held} payload bytes, and {bytes} more would pass outbox.maxPendingBytes \
         ({max}); wait for ACKs or raise the limit"
    )]
    PendingBytes {
        /// Payload bytes held now.
        held: usize,
        /// The new payload's size.
        bytes: usize,
        /// `outbox.maxPendingBytes`.
        max: usize,
    },
    /// The destination already holds `outbox.maxPendingPerDestination` messages.
    #[error(
        "send: {destination} already holds {held} messages (outbox.maxPendingPerDestination); wait for ACKs or \
         raise the limit"
    )]
    PerDestination {
        /// The destination, as it displays.
        destination: String,
        /// Messages it holds.
        held: usize,
    },
    /// The outbox already holds `outbox.maxPending` messages.
    #[error("send: the outbox already holds {held} messages (outbox.maxPending); wait for ACKs or raise the limit")]
    Pending {
        /// Messages held.
        held: usize,
    },
}

/// Why `Send` refused a message.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// A bound was reached; nothing was stored.
    #[error(transparent)]
    Exhausted(Bound),
    /// The daemon has no peer transport configured.
    #[error(
        "send: no peer transport is configured; set peer.tls (mutual TLS), or peer.insecure: true for local development"
    )]
    NotConfigured,
    /// Group destinations need a Kubernetes view that is not available.
    #[error("send: {0}")]
    Unsupported(String),
    /// The store failed; nothing was stored.
    #[error("send")]
    Store(#[source] StoreError),
}

/// The outbox; clones share it.
#[derive(Debug, Clone)]
pub struct Outbox {
    inner: Arc<OutboxShared>,
}

#[derive(Debug)]
struct OutboxShared {
    store: Store,
    config: Live<OutboxConfig>,
    /// None when no peer transport is configured: `Send` is refused.
    transport: Option<Transport>,
    members: Members,
    namespace: String,
    next_sequence: AtomicU64,
    state: Mutex<OutboxState>,
    outcomes: broadcast::Sender<Outcome>,
    metrics: Metrics,
    /// Runs the links, the stores of accepted messages and the gauges; its stop signal closes the links.
    tasks: Tasks,
}

/// Everything the outbox holds in memory, under one lock: the truth while the daemon runs (the store is
/// read back only at startup).
#[derive(Debug, Default)]
struct OutboxState {
    /// The current message of each (destination, resource_id).
    slots: HashMap<(Destination, String), Slot>,
    /// Each destination in use: who it reaches and how many slots it holds.
    destinations: HashMap<Destination, Recipients>,
    /// The connection and pending deliveries of each peer address, shared by every destination that
    /// includes it.
    links: HashMap<String, Link>,
    /// Slots held in all destinations, against outbox.maxPending.
    held: usize,
    /// Payload bytes of every current message and of those being stored, against outbox.maxPendingBytes.
    bytes: usize,
    /// The id of the newest link: a link task whose id no longer matches was replaced and stops.
    next_link: u64,
}

/// What the outbox needs besides its store.
#[derive(Debug)]
pub struct OutboxParts {
    /// The `outbox` config section, as reloads change it: `Send` checks its payload and pending bounds,
    /// links back off by it.
    pub config: Live<OutboxConfig>,
    /// Client TLS for peers, or plaintext; None: no transport configured.
    pub transport: Option<Transport>,
    /// Resolves Service and election destinations to peer addresses.
    pub members: Members,
    /// The namespace of destinations that name none.
    pub namespace: String,
    /// Where the outbox counts sends, ACKs, resends, failures and peer connections, and sets the pending gauges.
    pub metrics: Metrics,
    /// The group the outbox's tasks run in; when it stops, links close.
    pub tasks: Tasks,
}

impl Outbox {
    /// Loads the stored messages and starts delivering them.
    pub fn open(store: Store, parts: OutboxParts) -> Result<Self, StoreError> {
        let stored = record::load(&store)?;
        let (outcomes, _) = broadcast::channel(OUTCOME_BUFFER);
        let outbox = Self {
            inner: Arc::new(OutboxShared {
                store,
                config: parts.config,
                transport: parts.transport,
                members: parts.members,
                namespace: parts.namespace,
                next_sequence: AtomicU64::new(stored.next_sequence),
                state: Mutex::new(OutboxState::default()),
                outcomes,
                metrics: parts.metrics,
                tasks: parts.tasks,
            }),
        };
        outbox.restore(stored);
        outbox.spawn_gauges();
        Ok(outbox)
    }

    fn lock(&self) -> MutexGuard<'_, OutboxState> {
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuses a payload larger than `outbox.maxPayloadBytes`.
    pub(crate) fn check_payload(&self, bytes: usize) -> Result<(), OutboxError> {
        let max = self.inner.config.get().max_payload_bytes;
        if bytes > max {
            return Err(OutboxError::Exhausted(Bound::Payload { bytes, max }));
        }
        Ok(())
    }

    /// Stores a message durably and returns its sequence number; delivery starts right after.
    pub(crate) async fn send(&self, out: Outgoing) -> Result<u64, OutboxError> {
        self.admit(out)?.store().await
    }

    /// Checks a message against the outbox's bounds and reserves its slot and sequence number, so that
    /// messages admitted one after another supersede one another in that order however their writes
    /// finish; [`Admitted::store`] then stores it.
    pub fn admit(&self, out: Outgoing) -> Result<Admitted, OutboxError> {
        let inner = &self.inner;
        if inner.transport.is_none() {
            return Err(OutboxError::NotConfigured);
        }
        self.check_payload(out.payload.len())?;
        if out.destination.is_group() && !inner.members.available() {
            return Err(OutboxError::Unsupported(format!(
                "{} needs a Kubernetes connection to find its members",
                out.destination
            )));
        }
        let key = (out.destination.clone(), out.resource_id.clone());
        let sequence = self.reserve(&key, out.payload.len())?;
        let message = Arc::new(Message {
            sequence,
            destination: out.destination,
            resource_id: out.resource_id,
            event_id: out.event_id,
            payload: out.payload,
            content_type: out.content_type,
            trace: out.trace,
            enqueued_at: SystemTime::now(),
        });
        Ok(Admitted { outbox: self.clone(), key, message })
    }

    /// Writes an admitted message and hands it to its links, or gives its slot back if the write failed.
    async fn commit(&self, key: (Destination, String), message: Arc<Message>) -> Result<u64, OutboxError> {
        let stored = self.store_message(&message).await;
        let mut state = self.lock();
        if let Some(slot) = state.slots.get_mut(&key) {
            slot.storing -= 1;
        }
        if let Err(e) = stored {
            state.bytes -= message.payload.len();
            self.release_if_empty(&mut state, &key);
            return Err(OutboxError::Store(e));
        }
        self.inner.metrics.outbox_sends.inc();
        tracing::debug!(
            message_id = message.sequence,
            destination = %message.destination,
            resource_id = %message.resource_id,
            event_id = %message.event_id,
            bytes = message.payload.len(),
            "message stored"
        );
        let sequence = message.sequence;
        self.install(&mut state, message);
        Ok(sequence)
    }

    fn outcome(&self, message: &Arc<Message>, peer: &str, kind: OutcomeKind) {
        let _ = self.inner.outcomes.send(Outcome {
            message: message.clone(),
            peer: peer.to_owned(),
            kind,
            at: SystemTime::now(),
        });
    }

    /// Outcomes from now on; a receiver that falls [`OUTCOME_BUFFER`] behind gets `Lagged`.
    pub fn outcomes(&self) -> broadcast::Receiver<Outcome> {
        self.inner.outcomes.subscribe()
    }
}

/// A message [`Outbox::admit`] accepted, holding its reserved slot until it is stored.
#[derive(Debug)]
pub struct Admitted {
    outbox: Outbox,
    key: (Destination, String),
    message: Arc<Message>,
}

impl Admitted {
    /// Stores the message and starts its delivery in a task of its own, so a caller that stops waiting
    /// (a cancelled call) cannot leave the slot reserved or the stored message undelivered; resolves to
    /// the message's sequence number once it is durable.
    pub fn store(self) -> impl Future<Output = Result<u64, OutboxError>> + Send + 'static {
        let Self { outbox, key, message } = self;
        let tasks = outbox.inner.tasks.clone();
        let task = tasks.spawn(async move { outbox.commit(key, message).await });
        async move { task.await.unwrap_or(Err(OutboxError::Store(StoreError::Closed))) }
    }
}

#[cfg(test)]
mod tests;
