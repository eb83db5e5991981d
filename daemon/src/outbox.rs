//! The outbox: messages the app sends to other pods, stored durably before `Send` answers, delivered to
//! every peer of their destination and resent with backoff until each peer's app ACKs them. Per
//! (destination, resource_id) only the newest message is kept: a newer event supersedes an older one
//! that is not ACKed yet, and an ACK for the older one never clears the newer.

mod backoff;
mod link;
mod members;
mod target;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use consistd_proto::v1 as pb;
use redb::{ReadableTable, TableDefinition};
use tokio::{
    sync::{Notify, broadcast},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

pub use self::{
    members::{Members, PEER_PORT_NAME},
    target::{BadTarget, Target},
};
use crate::{
    config::OutboxConfig,
    transport::Transport,
    metrics::Metrics,
    store::{META, Store, StoreError, from_millis, to_millis},
};

/// Stored messages by sequence number.
const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox_messages");
/// Which peers ACKed a Service or election message: (sequence, peer address).
const GROUP_ACKS: TableDefinition<(u64, &str), ()> = TableDefinition::new("outbox_group_acks");
const NEXT_SEQUENCE: &str = "outbox.next_sequence";

/// How long a connection to a peer no destination includes any more is kept open.
const LINK_LINGER: Duration = Duration::from_secs(60);

/// Outcomes a WatchAcks subscriber may fall behind by before it is cut off.
const OUTCOME_BUFFER: usize = 16_384;

/// One message as the app sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The outbox's id for it, strictly increasing (the API's message_id).
    pub sequence: u64,
    /// Where it goes.
    pub target: Target,
    /// The resource it is about.
    pub resource_id: String,
    /// Which event of that resource.
    pub event_id: String,
    /// The body.
    pub payload: Bytes,
    /// The body's MIME type.
    pub content_type: String,
    /// When `Send` stored it.
    pub enqueued_at: SystemTime,
}

/// What `Send` is asked to store.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Where it goes.
    pub target: Target,
    /// The resource it is about.
    pub resource_id: String,
    /// Which event of that resource.
    pub event_id: String,
    /// The body.
    pub payload: Bytes,
    /// The body's MIME type.
    pub content_type: String,
}

/// The end of a message's life at one peer (or everywhere, for SUPERSEDED).
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The message.
    pub message: Arc<Message>,
    /// The peer that answered; empty when the outcome is not about one peer.
    pub peer: String,
    /// What happened.
    pub kind: OutcomeKind,
    /// When.
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

/// Why `Send` refused a message.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// A bound was reached; nothing was stored.
    #[error("{0}")]
    Exhausted(String),
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

/// One peer's view of a message it still has to ACK.
#[derive(Debug, Clone)]
pub struct PendingDelivery {
    /// The message.
    pub message: Arc<Message>,
    /// Attempts so far.
    pub attempts: u32,
    /// When the next attempt is due.
    pub next_attempt_at: SystemTime,
    /// The last error, if any.
    pub last_error: Option<String>,
}

/// The pending messages of one destination at one peer.
#[derive(Debug, Clone)]
pub struct DestinationStatus {
    /// The destination.
    pub target: Target,
    /// The peer address; empty while the destination has no peer.
    pub peer: String,
    /// Whether a connection to the peer is up.
    pub connected: bool,
    /// Messages that peer has not ACKed, oldest first.
    pub pending: Vec<PendingDelivery>,
}

/// The outbox; clones share it.
#[derive(Debug, Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    config: OutboxConfig,
    /// None when no peer transport is configured: `Send` is refused.
    transport: Option<Transport>,
    members: Members,
    namespace: String,
    next_sequence: AtomicU64,
    state: Mutex<State>,
    outcomes: broadcast::Sender<Outcome>,
    metrics: Metrics,
    shutdown: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<(Target, String), Slot>,
    destinations: HashMap<Target, Destination>,
    links: HashMap<String, Link>,
    /// Slots held in all destinations.
    held: usize,
    next_link: u64,
}

/// The message of one (destination, resource_id).
#[derive(Debug, Default)]
struct Slot {
    current: Option<Arc<Message>>,
    /// `Send` calls for this slot whose write is still being committed.
    storing: u32,
    /// Group destinations: peers that ACKed `current`.
    acked_by: BTreeSet<String>,
}

#[derive(Debug)]
struct Destination {
    peers: BTreeSet<String>,
    /// Slots of this destination (held messages and reservations).
    held: usize,
    /// Stops following the group's members when the destination is dropped.
    _members: Option<members::Following>,
}

/// The delivery state of one peer address.
#[derive(Debug)]
struct Link {
    id: u64,
    /// Destinations that include this peer.
    uses: usize,
    /// Since when no destination includes this peer: the connection is kept for [`LINK_LINGER`], so
    /// sparse sends do not pay for a new connection (and TLS handshake) each time.
    unused_since: Option<Instant>,
    connected: bool,
    deliveries: BTreeMap<u64, Delivery>,
    /// (due, sequence) of every delivery, earliest first.
    schedule: BTreeSet<(Instant, u64)>,
    wake: Arc<Notify>,
}

impl Link {
    fn add(&mut self, delivery: Delivery) {
        self.schedule.insert((delivery.due, delivery.message.sequence));
        if let Some(old) = self.deliveries.insert(delivery.message.sequence, delivery) {
            self.schedule.remove(&(old.due, old.message.sequence));
        }
        self.wake.notify_one();
    }

    fn remove(&mut self, sequence: u64) -> Option<Delivery> {
        let d = self.deliveries.remove(&sequence)?;
        self.schedule.remove(&(d.due, sequence));
        Some(d)
    }

    fn reschedule(&mut self, sequence: u64, due: Instant) {
        if let Some(d) = self.deliveries.get_mut(&sequence) {
            self.schedule.remove(&(d.due, sequence));
            d.due = due;
            d.due_wall = SystemTime::now() + due.saturating_duration_since(Instant::now());
            self.schedule.insert((due, sequence));
        }
    }
}

#[derive(Debug, Clone)]
struct Delivery {
    message: Arc<Message>,
    attempts: u32,
    due: Instant,
    due_wall: SystemTime,
    last_error: Option<String>,
    /// The peer answered STORED: it holds the message durably and sends ACKED when its app ACKs.
    stored: bool,
}

impl Delivery {
    fn new(message: Arc<Message>) -> Self {
        Self { message, attempts: 0, due: Instant::now(), due_wall: SystemTime::now(), last_error: None, stored: false }
    }
}

/// The on-disk form of a message.
#[derive(Clone, PartialEq, prost::Message)]
struct Record {
    #[prost(message, optional, tag = "1")]
    destination: Option<pb::Destination>,
    #[prost(string, tag = "2")]
    resource_id: String,
    #[prost(string, tag = "3")]
    event_id: String,
    #[prost(bytes = "bytes", tag = "4")]
    payload: Bytes,
    #[prost(string, tag = "5")]
    content_type: String,
    #[prost(uint64, tag = "6")]
    enqueued_at_ms: u64,
}

/// What the outbox needs besides its store.
#[derive(Debug)]
pub struct Parts {
    /// Bounds and backoff.
    pub config: OutboxConfig,
    /// Client TLS for peers, or plaintext; None: no transport configured.
    pub transport: Option<Transport>,
    /// Resolves Service and election destinations to peer addresses.
    pub members: Members,
    /// The namespace of destinations that name none.
    pub namespace: String,
    /// Counters and gauges.
    pub metrics: Metrics,
    /// Cancelled when the daemon stops: links close.
    pub shutdown: CancellationToken,
}

impl Outbox {
    /// Loads the stored messages and starts delivering them.
    pub fn open(store: Store, parts: Parts) -> Result<Self, StoreError> {
        let (records, acks, next) = store.read("load the outbox", |txn| {
            let mut records = Vec::new();
            if let Ok(table) = txn.open_table(MESSAGES) {
                for entry in table.iter()? {
                    let (k, v) = entry?;
                    records.push((k.value(), v.value().to_vec()));
                }
            }
            let mut acks = Vec::new();
            if let Ok(table) = txn.open_table(GROUP_ACKS) {
                for entry in table.iter()? {
                    let (k, _) = entry?;
                    let (sequence, peer) = k.value();
                    acks.push((sequence, peer.to_owned()));
                }
            }
            let next = match txn.open_table(META) {
                Ok(t) => t.get(NEXT_SEQUENCE)?.map_or(1, |v| v.value()),
                Err(_) => 1,
            };
            Ok((records, acks, next))
        })?;
        let (outcomes, _) = broadcast::channel(OUTCOME_BUFFER);
        let outbox = Self {
            inner: Arc::new(Inner {
                store,
                config: parts.config,
                transport: parts.transport,
                members: parts.members,
                namespace: parts.namespace,
                next_sequence: AtomicU64::new(next.max(1)),
                state: Mutex::new(State::default()),
                outcomes,
                metrics: parts.metrics,
                shutdown: parts.shutdown,
            }),
        };
        outbox.restore(records, acks);
        outbox.spawn_gauges();
        Ok(outbox)
    }

    /// Puts stored messages back: per slot the newest wins, older ones (left by a crash between storing
    /// a newer event and deleting the older) are deleted.
    fn restore(&self, records: Vec<(u64, Vec<u8>)>, acks: Vec<(u64, String)>) {
        use prost::Message as _;
        let mut acked: HashMap<u64, BTreeSet<String>> = HashMap::new();
        for (seq, peer) in acks {
            acked.entry(seq).or_default().insert(peer);
        }
        let mut newest: BTreeMap<(Target, String), Arc<Message>> = BTreeMap::new();
        let mut stale = Vec::new();
        for (sequence, bytes) in records {
            let record = match Record::decode(bytes.as_slice()) {
                Ok(r) => r,
                Err(error) => {
                    tracing::error!(sequence, %error, "unreadable outbox record kept on disk, not delivered");
                    continue;
                }
            };
            let target = match Target::from_pb(record.destination.as_ref(), &self.inner.namespace) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(sequence, field = e.field, error = %e.message, "outbox record with a bad destination kept on disk, not delivered");
                    continue;
                }
            };
            let message = Arc::new(Message {
                sequence,
                target: target.clone(),
                resource_id: record.resource_id,
                event_id: record.event_id,
                payload: record.payload,
                content_type: record.content_type,
                enqueued_at: from_millis(record.enqueued_at_ms),
            });
            let key = (target, message.resource_id.clone());
            match newest.get(&key) {
                Some(m) if m.sequence > sequence => stale.push(sequence),
                Some(m) => {
                    stale.push(m.sequence);
                    newest.insert(key, message);
                }
                None => {
                    newest.insert(key, message);
                }
            }
        }
        let restored = newest.len();
        let mut state = self.lock();
        for ((target, resource_id), message) in newest {
            self.ensure_destination(&mut state, &target);
            let acked_by = acked.remove(&message.sequence).unwrap_or_default();
            let slot = Slot { current: None, storing: 0, acked_by };
            state.slots.insert((target.clone(), resource_id), slot);
            state.held += 1;
            if let Some(d) = state.destinations.get_mut(&target) {
                d.held += 1;
            }
            self.install(&mut state, message);
        }
        drop(state);
        if !stale.is_empty() {
            // Stale leftovers of any destination: delete their group ACKs too.
            self.delete(stale, true);
        }
        if restored > 0 {
            tracing::info!(messages = restored, "outbox restored from the store");
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuses a payload larger than `outbox.maxPayloadBytes`.
    pub fn check_payload(&self, bytes: usize) -> Result<(), OutboxError> {
        let max = self.inner.config.max_payload_bytes;
        if bytes > max {
            return Err(OutboxError::Exhausted(format!(
                "payload: {bytes} bytes is more than outbox.maxPayloadBytes ({max})"
            )));
        }
        Ok(())
    }

    /// Stores a message durably and returns its sequence number; delivery starts right after.
    pub async fn send(&self, out: Outgoing) -> Result<u64, OutboxError> {
        let inner = &self.inner;
        if inner.transport.is_none() {
            return Err(OutboxError::NotConfigured);
        }
        self.check_payload(out.payload.len())?;
        if out.target.is_group() && !inner.members.available() {
            return Err(OutboxError::Unsupported(format!(
                "{} needs a Kubernetes connection to find its members",
                out.target
            )));
        }
        let key = (out.target.clone(), out.resource_id.clone());
        let sequence = self.reserve(&key)?;
        let message = Arc::new(Message {
            sequence,
            target: out.target,
            resource_id: out.resource_id,
            event_id: out.event_id,
            payload: out.payload,
            content_type: out.content_type,
            enqueued_at: SystemTime::now(),
        });
        let record = encode(&message);
        let stored = inner
            .store
            .write("store outbox message", move |txn| {
                txn.open_table(MESSAGES)?.insert(sequence, record.as_slice())?;
                let mut meta = txn.open_table(META)?;
                let next = meta.get(NEXT_SEQUENCE)?.map_or(0, |v| v.value());
                if next <= sequence {
                    meta.insert(NEXT_SEQUENCE, sequence + 1)?;
                }
                Ok(())
            })
            .await;
        let mut state = self.lock();
        if let Some(slot) = state.slots.get_mut(&key) {
            slot.storing -= 1;
        }
        if let Err(e) = stored {
            self.release_if_empty(&mut state, &key);
            return Err(OutboxError::Store(e));
        }
        inner.metrics.outbox_sends.inc();
        tracing::debug!(
            message_id = sequence,
            destination = %message.target,
            resource_id = %message.resource_id,
            event_id = %message.event_id,
            bytes = message.payload.len(),
            "message stored"
        );
        self.install(&mut state, message);
        Ok(sequence)
    }

    /// Checks the bounds and reserves the slot; returns the new message's sequence number.
    fn reserve(&self, key: &(Target, String)) -> Result<u64, OutboxError> {
        let config = &self.inner.config;
        let mut state = self.lock();
        let state = &mut *state;
        let occupied = state.slots.get(key).is_some_and(|s| s.current.is_some() || s.storing > 0);
        if !occupied {
            let in_destination = state.destinations.get(&key.0).map_or(0, |d| d.held);
            if in_destination >= config.max_pending_per_destination {
                return Err(OutboxError::Exhausted(format!(
                    "send: {} already holds {in_destination} messages (outbox.maxPendingPerDestination); \
                     wait for ACKs or raise the limit",
                    key.0
                )));
            }
            if state.held >= config.max_pending {
                return Err(OutboxError::Exhausted(format!(
                    "send: the outbox already holds {} messages (outbox.maxPending); wait for ACKs or raise the limit",
                    state.held
                )));
            }
            self.ensure_destination(state, &key.0);
            state.held += 1;
            if let Some(d) = state.destinations.get_mut(&key.0) {
                d.held += 1;
            }
        }
        state.slots.entry(key.clone()).or_default().storing += 1;
        Ok(self.inner.next_sequence.fetch_add(1, Ordering::SeqCst))
    }

    /// Makes a stored message its slot's current one, superseding an older current message; a message
    /// older than the current one is itself superseded at once.
    fn install(&self, state: &mut State, message: Arc<Message>) {
        let key = (message.target.clone(), message.resource_id.clone());
        let Some(slot) = state.slots.get_mut(&key) else { return };
        if slot.current.as_ref().is_some_and(|c| c.sequence > message.sequence) {
            self.outcome(&message, "", OutcomeKind::Superseded);
            self.delete(vec![message.sequence], message.target.is_group());
            return;
        }
        let restored_acks = std::mem::take(&mut slot.acked_by);
        let old = slot.current.replace(message.clone());
        // Acks loaded from the store belong to the message being restored, not to a new one.
        slot.acked_by = if old.is_none() { restored_acks } else { BTreeSet::new() };
        let acked_by = slot.acked_by.clone();
        let peers = state.destinations.get(&message.target).map(|d| d.peers.clone()).unwrap_or_default();
        for peer in peers {
            let Some(link) = state.links.get_mut(&peer) else { continue };
            if let Some(old) = &old {
                link.remove(old.sequence);
            }
            if !acked_by.contains(&peer) {
                link.add(Delivery::new(message.clone()));
            }
        }
        if let Some(old) = old {
            tracing::debug!(
                message_id = old.sequence,
                destination = %old.target,
                resource_id = %old.resource_id,
                event_id = %old.event_id,
                superseded_by = %message.event_id,
                "message superseded"
            );
            self.inner.metrics.outbox_superseded.inc();
            self.outcome(&old, "", OutcomeKind::Superseded);
            self.delete(vec![old.sequence], old.target.is_group());
        }
    }

    /// Frees a slot that holds nothing and is not being stored into.
    fn release_if_empty(&self, state: &mut State, key: &(Target, String)) {
        let empty = state.slots.get(key).is_some_and(|s| s.current.is_none() && s.storing == 0);
        if !empty {
            return;
        }
        state.slots.remove(key);
        state.held -= 1;
        let drop_destination = match state.destinations.get_mut(&key.0) {
            Some(d) => {
                d.held -= 1;
                d.held == 0
            }
            None => false,
        };
        if drop_destination && let Some(d) = state.destinations.remove(&key.0) {
            for peer in d.peers {
                self.unuse_link(state, &peer);
            }
        }
    }

    /// Creates the destination (and its peers' links) on first use.
    fn ensure_destination(&self, state: &mut State, target: &Target) {
        if state.destinations.contains_key(target) {
            return;
        }
        let (peers, following) = match target {
            Target::Peer(p) => (BTreeSet::from([p.clone()]), None),
            group => (BTreeSet::new(), Some(self.inner.members.follow(group, self.clone()))),
        };
        for peer in &peers {
            self.use_link(state, peer);
        }
        state.destinations.insert(target.clone(), Destination { peers, held: 0, _members: following });
    }

    fn use_link(&self, state: &mut State, peer: &str) {
        if let Some(link) = state.links.get_mut(peer) {
            link.uses += 1;
            link.unused_since = None;
            return;
        }
        state.next_link += 1;
        let link = Link {
            id: state.next_link,
            uses: 1,
            unused_since: None,
            connected: false,
            deliveries: BTreeMap::new(),
            schedule: BTreeSet::new(),
            wake: Arc::new(Notify::new()),
        };
        if let Some(transport) = &self.inner.transport {
            tokio::spawn(link::run(self.clone(), transport.clone(), peer.to_owned(), link.id, link.wake.clone()));
        }
        state.links.insert(peer.to_owned(), link);
    }

    fn unuse_link(&self, state: &mut State, peer: &str) {
        let Some(link) = state.links.get_mut(peer) else { return };
        link.uses -= 1;
        if link.uses == 0 {
            // Its task closes the link after the linger, unless a destination uses the peer again.
            link.unused_since = Some(Instant::now());
            link.wake.notify_one();
        }
    }

    /// A group destination's peers changed: new peers get every current message of the destination,
    /// peers that left are reported FAILED for what they had not ACKed.
    pub(crate) fn set_peers(&self, target: &Target, peers: BTreeSet<String>) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(destination) = state.destinations.get_mut(target) else { return };
        let old = std::mem::replace(&mut destination.peers, peers.clone());
        let messages: Vec<(Arc<Message>, BTreeSet<String>)> = state
            .slots
            .iter()
            .filter(|((t, _), _)| t == target)
            .filter_map(|(_, s)| s.current.clone().map(|m| (m, s.acked_by.clone())))
            .collect();
        for peer in old.difference(&peers) {
            if let Some(link) = state.links.get_mut(peer) {
                for (m, _) in &messages {
                    if link.remove(m.sequence).is_some() {
                        let reason = format!("{peer} is no longer part of {target}");
                        self.inner.metrics.outbox_failed.inc();
                        self.outcome(m, peer, OutcomeKind::Failed(reason));
                    }
                }
            }
            self.unuse_link(state, peer);
        }
        for peer in peers.difference(&old) {
            self.use_link(state, peer);
            let Some(link) = state.links.get_mut(peer) else { continue };
            for (m, acked_by) in &messages {
                if !acked_by.contains(peer) {
                    link.add(Delivery::new(m.clone()));
                }
            }
        }
        if old != peers {
            tracing::info!(destination = %target, peers = ?peers, "destination members changed");
        }
    }

    /// A peer's app ACKed (sequence, resource_id, event_id). An ACK that does not match the message
    /// the peer still has to ACK (older, superseded, or from another sender store) changes nothing.
    fn acked(&self, peer: &str, sequence: u64, resource_id: &str, event_id: &str) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(link) = state.links.get_mut(peer) else { return };
        let matches = link
            .deliveries
            .get(&sequence)
            .is_some_and(|d| d.message.resource_id == resource_id && d.message.event_id == event_id);
        if !matches {
            tracing::debug!(peer, message_id = sequence, resource_id, event_id, "ACK for no pending message ignored");
            return;
        }
        let Some(delivery) = link.remove(sequence) else { return };
        let message = delivery.message;
        self.inner.metrics.outbox_acks.inc();
        tracing::debug!(
            message_id = sequence,
            destination = %message.target,
            peer,
            resource_id,
            event_id,
            attempt = delivery.attempts,
            "message ACKed"
        );
        self.outcome(&message, peer, OutcomeKind::Acked);
        let key = (message.target.clone(), message.resource_id.clone());
        let Some(slot) = state.slots.get_mut(&key) else { return };
        if slot.current.as_ref().map(|c| c.sequence) != Some(sequence) {
            return;
        }
        if message.target.is_group() {
            // The newest message of a group destination stays for members that join later.
            slot.acked_by.insert(peer.to_owned());
            let peer = peer.to_owned();
            self.inner.store.write_detached("record group ACK", move |txn| {
                txn.open_table(GROUP_ACKS)?.insert((sequence, peer.as_str()), ())?;
                Ok(())
            });
        } else {
            slot.current = None;
            self.release_if_empty(state, &key);
            self.delete(vec![sequence], false);
        }
    }

    /// Deletes messages (and their group ACKs) from the store. Losing this write to a crash only means
    /// a resend, which the receiver answers with ACKED from its deduplication.
    fn delete(&self, sequences: Vec<u64>, group: bool) {
        self.inner.store.write_detached("delete finished outbox messages", move |txn| {
            let mut messages = txn.open_table(MESSAGES)?;
            for &s in &sequences {
                messages.remove(s)?;
            }
            if !group {
                return Ok(());
            }
            let mut acks = txn.open_table(GROUP_ACKS)?;
            for s in sequences {
                let peers: Vec<String> = acks
                    .range((s, "")..(s + 1, ""))?
                    .map(|e| e.map(|(k, _)| k.value().1.to_owned()))
                    .collect::<Result<_, _>>()?;
                for p in peers {
                    acks.remove((s, p.as_str()))?;
                }
            }
            Ok(())
        });
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

    /// Pending messages per destination and peer.
    pub fn status(&self) -> (Vec<DestinationStatus>, usize) {
        let state = self.lock();
        let mut out = Vec::new();
        let mut targets: Vec<&Target> = state.destinations.keys().collect();
        targets.sort();
        for target in targets {
            let destination = &state.destinations[target];
            let unsent: Vec<PendingDelivery> = if destination.peers.is_empty() {
                let mut messages: Vec<Arc<Message>> = state
                    .slots
                    .iter()
                    .filter(|((t, _), _)| t == target)
                    .filter_map(|(_, s)| s.current.clone())
                    .collect();
                messages.sort_by_key(|m| m.sequence);
                messages
                    .into_iter()
                    .map(|message| PendingDelivery {
                        message,
                        attempts: 0,
                        next_attempt_at: SystemTime::now(),
                        last_error: Some(format!("{target} has no members yet")),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            if destination.peers.is_empty() {
                out.push(DestinationStatus {
                    target: target.clone(),
                    peer: String::new(),
                    connected: false,
                    pending: unsent,
                });
            }
            for peer in &destination.peers {
                let Some(link) = state.links.get(peer) else { continue };
                let pending = link
                    .deliveries
                    .values()
                    .filter(|d| &d.message.target == target)
                    .map(|d| PendingDelivery {
                        message: d.message.clone(),
                        attempts: d.attempts,
                        next_attempt_at: d.due_wall,
                        last_error: d.last_error.clone(),
                    })
                    .collect();
                out.push(DestinationStatus {
                    target: target.clone(),
                    peer: peer.clone(),
                    connected: link.connected,
                    pending,
                });
            }
        }
        (out, state.held)
    }

    /// Updates the pending and oldest-pending gauges every second.
    fn spawn_gauges(&self) {
        let outbox = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = outbox.inner.shutdown.cancelled() => return,
                }
                let (pending, oldest) = {
                    let state = outbox.lock();
                    let oldest =
                        state.links.values().flat_map(|l| l.deliveries.values().map(|d| d.message.enqueued_at)).min();
                    (state.held, oldest)
                };
                let metrics = &outbox.inner.metrics;
                metrics.outbox_pending.set(i64::try_from(pending).unwrap_or(i64::MAX));
                let age = oldest.and_then(|t| t.elapsed().ok()).map_or(0.0, |d| d.as_secs_f64());
                metrics.outbox_oldest_pending_seconds.set(age);
            }
        });
    }
}

fn encode(m: &Message) -> Vec<u8> {
    use prost::Message as _;
    Record {
        destination: Some(m.target.to_pb()),
        resource_id: m.resource_id.clone(),
        event_id: m.event_id.clone(),
        payload: m.payload.clone(),
        content_type: m.content_type.clone(),
        enqueued_at_ms: to_millis(m.enqueued_at),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests;
