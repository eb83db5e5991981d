//! The outbox: messages the app sends to other pods, stored durably before `Send` answers, delivered to
//! every peer of their destination and resent with backoff until each peer's app ACKs them. Per
//! (destination, resource_id) only the newest message is kept: a newer event supersedes an older one
//! that is not ACKed yet, and an ACK for the older one never clears the newer.
//!
//! `state` is the bookkeeping, as state without I/O: each change returns the effects it calls for, and
//! the one `impl Outbox` here carries them out (store writes, link tasks, group followers, outcomes).
//! `link` runs each peer's connection, `record` is the stored form, `status` the view of what is held,
//! `settled` the first outcomes WaitOutcome answers.

mod backoff;
pub mod destination;
mod link;
mod members;
mod record;
mod settled;
mod state;
pub mod status;

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use consistd_core::{
    claim::Claim,
    config::{Live, OutboxConfig},
    tasks::Tasks,
};
use consistd_observe::{metrics::Metrics, telemetry::TraceContext};
use consistd_proto::peer::v1::{Disposition, ExchangeRequest, ExchangeResponse};
use tokio::{sync::broadcast, time::Instant};

pub use self::{destination::Destination, members::Members, settled::KEPT as OUTCOMES_KEPT};
use self::{
    link::LinkUse,
    settled::FirstOutcome,
    state::{Effects, OutboxState, SlotKey},
    status::DestinationStatus,
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
    /// The claim it was sent under (a guarded send): a receiver that stored a later term of its election
    /// refuses it for good.
    pub claim: Option<Claim>,
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
    /// The claim it is sent under, checked by the caller: this daemon led that election in that term.
    pub claim: Option<Claim>,
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

/// Why [`Outbox::first_outcome`] has no outcome to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutcomeError {
    /// The id was never given out.
    #[error("message_id: {0} is not the id of a message this daemon stored")]
    NeverSent(u64),
    /// The message settled before the outcomes kept, or before this daemon started, or was never stored.
    #[error(
        "message {0}: its outcome is not known: it settled before the last {kept} outcomes or before this \
         daemon started, or it was never stored",
        kept = settled::KEPT
    )]
    Forgotten(u64),
    /// The outbox closed while the caller waited.
    #[error("message {0}: the outbox closed before its outcome came")]
    Closed(u64),
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
        let record::Restored { messages, stale } = record::decode(stored, &outbox.inner.namespace);
        let restored = messages.len();
        outbox.change(|state| state.restore(messages));
        if !stale.is_empty() {
            // Stale leftovers of any destination: delete their group ACKs too.
            record::delete(&outbox.inner.store, stale, true);
        }
        if restored > 0 {
            tracing::info!(messages = restored, "outbox restored from the store");
        }
        outbox.spawn_gauges();
        Ok(outbox)
    }

    fn lock(&self) -> MutexGuard<'_, OutboxState> {
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the state and carries out what the change calls for.
    fn change(&self, f: impl FnOnce(&mut OutboxState) -> Effects) {
        let mut state = self.lock();
        let effects = f(&mut state);
        self.apply(&mut state, effects);
    }

    /// Carries out what a change to `state` calls for, still under its lock: nothing here waits (tasks
    /// are spawned, store writes queued, outcomes broadcast), and a group's follower is attached to its
    /// destination before anyone can see the destination without it.
    fn apply(&self, state: &mut OutboxState, effects: Effects) {
        let Effects { outcomes, delete, group_acks, start_links, follow, connections, resends } = effects;
        let inner = &self.inner;
        for (peer, id, wake) in start_links {
            if let Some(transport) = &inner.transport {
                inner.tasks.spawn(link::run(self.clone(), transport.clone(), peer, id, wake));
            }
        }
        for target in follow {
            let following = inner.members.follow(&target, self.clone());
            if let Some(destination) = state.destinations.get_mut(&target) {
                destination.following = Some(following);
            }
        }
        for (message, peer, kind) in outcomes {
            let counted = match kind {
                OutcomeKind::Acked => &inner.metrics.outbox_acks,
                OutcomeKind::Superseded => &inner.metrics.outbox_superseded,
                OutcomeKind::Failed(_) => &inner.metrics.outbox_failed,
            };
            counted.inc();
            let outcome = Outcome { message, peer, kind, at: SystemTime::now() };
            state.settled.record(&outcome);
            let _ = inner.outcomes.send(outcome);
        }
        for (sequence, peer) in group_acks {
            record::record_group_ack(&inner.store, sequence, peer);
        }
        let (group, single): (Vec<_>, Vec<_>) = delete.into_iter().partition(|(_, group)| *group);
        for (sequences, group) in [(single, false), (group, true)] {
            if !sequences.is_empty() {
                record::delete(&inner.store, sequences.into_iter().map(|(s, _)| s).collect(), group);
            }
        }
        if connections != 0 {
            inner.metrics.peer_connections.inc_by(connections);
        }
        if resends > 0 {
            inner.metrics.outbox_retries.inc_by(resends);
        }
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
        let key = SlotKey::new(&out.destination, &out.resource_id);
        let config = inner.config.get();
        let sequence = {
            let mut state = self.lock();
            let effects = state.reserve(&key, out.payload.len(), &config).map_err(OutboxError::Exhausted)?;
            self.apply(&mut state, effects);
            inner.next_sequence.fetch_add(1, Ordering::SeqCst)
        };
        let message = Arc::new(Message {
            sequence,
            destination: out.destination,
            resource_id: out.resource_id,
            event_id: out.event_id,
            payload: out.payload,
            content_type: out.content_type,
            trace: out.trace,
            claim: out.claim,
            enqueued_at: SystemTime::now(),
        });
        Ok(Admitted { outbox: self.clone(), message })
    }

    /// Writes an admitted message and hands it to its links, or gives its slot back if the write failed.
    async fn commit(&self, message: Arc<Message>) -> Result<u64, OutboxError> {
        let stored = record::store_message(&self.inner.store, &message).await;
        let (sequence, durable) = (message.sequence, stored.is_ok());
        if durable {
            self.inner.metrics.outbox_sends.inc();
            tracing::debug!(
                message_id = sequence,
                destination = %message.destination,
                resource_id = %message.resource_id,
                event_id = %message.event_id,
                bytes = message.payload.len(),
                "message stored"
            );
        }
        self.change(|state| state.end_storing(message, durable));
        stored.map(|()| sequence).map_err(OutboxError::Store)
    }

    /// A peer's app ACKed (sequence, resource_id, event_id); an ACK that does not match the message the
    /// peer still has to ACK changes nothing.
    pub(crate) fn acked(&self, peer: &str, sequence: u64, resource_id: &str, event_id: &str) {
        self.change(|state| state.acked(peer, sequence, resource_id, event_id));
    }

    /// A group destination's peers are now `peers`.
    pub(crate) fn set_peers(&self, target: &Destination, peers: BTreeSet<String>) {
        self.change(|state| state.set_peers(target, peers));
    }

    /// A group destination's members cannot be read: `why`, for GetOutboxStatus, until they are.
    fn set_unresolved(&self, target: &Destination, why: String) {
        self.lock().set_unresolved(target, why);
    }

    /// Whether link `id` to `peer` is still wanted (closing it if unused past the linger).
    fn retire_unused(&self, peer: &str, id: u64, connected: bool) -> LinkUse {
        let mut state = self.lock();
        let (link_use, effects) = state.retire_unused(peer, id, connected);
        self.apply(&mut state, effects);
        link_use
    }

    fn link_up(&self, peer: &str, id: u64) {
        self.change(|state| state.link_up(peer, id));
    }

    fn link_down(&self, peer: &str, id: u64, error: &str) {
        self.change(|state| state.link_down(peer, id, error));
    }

    /// Up to `max` frames due on link `id`, and when the next one is due; None when the link is gone.
    fn take_due(&self, peer: &str, id: u64, max: usize) -> Option<(Vec<ExchangeRequest>, Option<Instant>)> {
        let backoff = self.inner.config.get().backoff;
        let mut state = self.lock();
        let due = state.take_due(peer, id, max, &backoff)?;
        self.apply(&mut state, due.effects);
        Some((due.frames, due.next))
    }

    /// Applies a peer's answer about one message.
    fn disposition(&self, peer: &str, id: u64, r: ExchangeResponse) {
        match Disposition::try_from(r.disposition) {
            Ok(Disposition::Acked) => self.acked(peer, r.sequence, &r.resource_id, &r.event_id),
            Ok(Disposition::Stored) => {
                let cap = self.inner.config.get().backoff.cap;
                self.lock().stored(peer, id, &r, cap);
            }
            Ok(Disposition::Refused) => self.lock().refused(peer, id, r.sequence, &r.reason),
            Ok(Disposition::Fenced) => {
                self.change(|state| state.fenced(peer, r.sequence, &r.resource_id, &r.event_id, &r.reason));
            }
            Ok(Disposition::Unspecified) | Err(_) => {
                tracing::warn!(peer, disposition = r.disposition, "unknown answer from peer ignored");
            }
        }
    }

    /// Pending messages per destination and peer, and the slots held in all.
    pub fn status(&self) -> (Vec<DestinationStatus>, usize) {
        status::of(&self.lock())
    }

    /// Waits up to `within` until no message is held (each ACKed, superseded or failed) and returns how
    /// many still are. On shutdown: the app's last sends get their chance to leave before the pod's store
    /// goes with the pod.
    pub async fn settle(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let held = self.lock().held;
            if held == 0 || Instant::now() >= deadline {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Updates the pending and oldest-pending gauges every second.
    fn spawn_gauges(&self) {
        let outbox = self.clone();
        self.inner.tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = outbox.inner.tasks.stopping() => return,
                }
                let (pending, oldest) = {
                    let state = outbox.lock();
                    (state.held, state.oldest_pending())
                };
                let metrics = &outbox.inner.metrics;
                metrics.outbox_pending.set(i64::try_from(pending).unwrap_or(i64::MAX));
                let age = oldest.and_then(|t| t.elapsed().ok()).map_or(0.0, |d| d.as_secs_f64());
                metrics.outbox_oldest_pending_seconds.set(age);
            }
        });
    }

    /// The first outcome of message `sequence` (for a Service or election, its first receiver's): at
    /// once when it had one (of the last [`OUTCOMES_KEPT`]), else when it comes. The message in it
    /// has no payload when it was kept.
    pub async fn first_outcome(&self, sequence: u64) -> Result<Outcome, OutcomeError> {
        let waiting = {
            let mut state = self.lock();
            match state.settled.of(sequence) {
                FirstOutcome::Known(outcome) => return Ok(outcome),
                FirstOutcome::Awaited => state.settled.wait(sequence),
                FirstOutcome::Unknown if sequence >= self.inner.next_sequence.load(Ordering::SeqCst) => {
                    return Err(OutcomeError::NeverSent(sequence));
                }
                FirstOutcome::Unknown => return Err(OutcomeError::Forgotten(sequence)),
            }
        };
        waiting.await.map_err(|_| OutcomeError::Closed(sequence))
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
    message: Arc<Message>,
}

impl Admitted {
    /// Stores the message and starts its delivery in a task of its own, so a caller that stops waiting
    /// (a cancelled call) cannot leave the slot reserved or the stored message undelivered; resolves to
    /// the message's sequence number once it is durable.
    pub fn store(self) -> impl Future<Output = Result<u64, OutboxError>> + Send + 'static {
        let Self { outbox, message } = self;
        let tasks = outbox.inner.tasks.clone();
        let task = tasks.spawn(async move { outbox.commit(message).await });
        async move { task.await.unwrap_or(Err(OutboxError::Store(StoreError::Closed))) }
    }
}

#[cfg(test)]
mod tests;
