//! The inbox: messages peers sent to this pod, stored durably and deduplicated by (sender, resource_id,
//! event_id), handed to the app's receivers one at a time until the app ACKs (or NACKs with a delay),
//! and each ACK sent back to the sender's connection.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use consistd_core::{
    config::{InboxConfig, Live},
    error,
    tasks::Tasks,
};
use consistd_observe::{metrics::Metrics, telemetry::TraceContext};
use consistd_proto::peer::v1::{Disposition, ExchangeResponse, PeerMessage};
use redb::{ReadableTable, TableDefinition};
use tokio::{
    sync::{Notify, mpsc, watch},
    time::Instant,
};

use crate::store::{META, Store, StoreError, from_millis, to_millis};

/// Messages waiting for the app, by inbox id.
const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("inbox_messages");
/// (sender, resource_id, event_id) -> (inbox id, ACK time in ms since the epoch; 0 while pending).
const SEEN: TableDefinition<(&str, &str, &str), (u64, u64)> = TableDefinition::new("inbox_seen");
const NEXT_ID: &str = "inbox.next_id";

/// ACKed events remembered per (sender, resource_id) for deduplication. A sender resends only the
/// newest event of a resource, so an event this far back is never sent again.
pub(crate) const REMEMBERED_ACKS: usize = 16;

/// ACKs kept per disconnected sender; beyond that the oldest wait for the sender's next resend,
/// which is answered ACKED from the deduplication record.
const UNSENT_ACKS: usize = 65_536;

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

/// Why the inbox refuses a message now: it is full. Displays what the sending daemon is told (it retries
/// with backoff), naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Full {
    /// `inbox.maxPending` messages wait for the app.
    #[error("the inbox of {identity} is full: {held} messages wait for its app (inbox.maxPending)")]
    Messages { identity: String, held: usize },
    /// The payload would pass `inbox.maxPendingBytes`.
    #[error(
        "the inbox of {identity} is full: {held} payload bytes wait for its app, and {bytes} more would pass \
         inbox.maxPendingBytes ({max})"
    )]
    Bytes { identity: String, held: usize, bytes: usize, max: usize },
}

/// The inbox; clones share it.
#[derive(Debug, Clone)]
pub struct Inbox {
    inner: Arc<InboxShared>,
}

impl Inbox {
    /// This daemon's identity: whom its peers' messages are for.
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }
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

type DedupKey = (String, String, String);

#[derive(Debug, Default)]
struct InboxState {
    messages: BTreeMap<u64, Pending>,
    by_key: HashMap<DedupKey, u64>,
    /// Messages whose write is not committed yet, not shown to anyone (a resend of one gets no answer;
    /// the first will).
    storing: HashSet<DedupKey>,
    /// Ready for a receiver, oldest first.
    queue: BTreeSet<u64>,
    /// Payload bytes of `messages`, against inbox.maxPendingBytes.
    bytes: usize,
    /// Payload bytes of the messages being stored.
    storing_bytes: usize,
    /// Resource ids the daemon keeps for itself (see [`Inbox::open`]).
    held_prefixes: Vec<&'static str>,
    /// The daemon's own messages per resource_id, oldest first, until the part that reads them ACKs them.
    held: HashMap<String, BTreeSet<u64>>,
    /// NACKed: ready again at the instant.
    delayed: BTreeSet<(Instant, u64)>,
    /// The open connection of each sender, for sending ACKs back.
    senders: HashMap<String, (u64, mpsc::Sender<ExchangeResponse>)>,
    /// ACKs given while their sender was not connected, sent when it connects again.
    unsent_acks: HashMap<String, VecDeque<ExchangeResponse>>,
    next_connection: u64,
    next_receiver: u64,
}

impl InboxState {
    /// Whether a message about `resource_id` is the daemon's own rather than the app's.
    fn is_held(&self, resource_id: &str) -> bool {
        self.held_prefixes.iter().any(|p| resource_id.starts_with(p))
    }

    /// Takes in a message: for the app's receivers, or held for the part of the daemon that reads it.
    fn add(&mut self, message: Arc<InboxMessage>) {
        let id = message.id;
        self.by_key.insert(key_of(&message), id);
        if self.is_held(&message.resource_id) {
            self.held.entry(message.resource_id.clone()).or_default().insert(id);
        } else {
            self.queue.insert(id);
        }
        self.bytes += message.payload.len();
        self.messages.insert(id, Pending { message, attempts: 0, leased_to: None, ready_at: None });
    }

    /// Forgets a message wherever it waits.
    fn remove(&mut self, id: u64) -> Option<Pending> {
        let p = self.messages.remove(&id)?;
        self.bytes -= p.message.payload.len();
        self.by_key.remove(&key_of(&p.message));
        self.queue.remove(&id);
        if let Some(at) = p.ready_at {
            self.delayed.remove(&(at, id));
        }
        if let Some(ids) = self.held.get_mut(&p.message.resource_id) {
            ids.remove(&id);
            if ids.is_empty() {
                self.held.remove(&p.message.resource_id);
            }
        }
        Some(p)
    }
}

#[derive(Debug)]
struct Pending {
    message: Arc<InboxMessage>,
    /// Deliveries to the app so far.
    attempts: u32,
    /// The receiver holding it, waiting for its ACK.
    leased_to: Option<u64>,
    /// Set while NACKed.
    ready_at: Option<Instant>,
}

/// The on-disk form of an inbound message.
#[derive(Clone, PartialEq, prost::Message)]
struct InboxRecord {
    #[prost(string, tag = "1")]
    sender: String,
    #[prost(uint64, tag = "2")]
    sender_sequence: u64,
    #[prost(string, tag = "3")]
    resource_id: String,
    #[prost(string, tag = "4")]
    event_id: String,
    #[prost(bytes = "bytes", tag = "5")]
    payload: Bytes,
    #[prost(string, tag = "6")]
    content_type: String,
    #[prost(uint64, tag = "7")]
    received_at_ms: u64,
    #[prost(string, tag = "8")]
    traceparent: String,
    #[prost(string, tag = "9")]
    tracestate: String,
}

impl InboxRecord {
    fn of(m: &InboxMessage) -> Self {
        Self {
            sender: m.sender.clone(),
            sender_sequence: m.sender_sequence,
            resource_id: m.resource_id.clone(),
            event_id: m.event_id.clone(),
            payload: m.payload.clone(),
            content_type: m.content_type.clone(),
            received_at_ms: to_millis(m.received_at),
            traceparent: m.trace.traceparent.clone(),
            tracestate: m.trace.tracestate.clone(),
        }
    }

    fn into_message(self, id: u64) -> InboxMessage {
        InboxMessage {
            id,
            sender: self.sender,
            sender_sequence: self.sender_sequence,
            resource_id: self.resource_id,
            event_id: self.event_id,
            payload: self.payload,
            content_type: self.content_type,
            trace: TraceContext { traceparent: self.traceparent, tracestate: self.tracestate },
            received_at: from_millis(self.received_at_ms),
        }
    }
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
        use prost::Message as _;
        let (records, next) = store.read("load the inbox", |txn| {
            let mut records = Vec::new();
            if let Ok(table) = txn.open_table(MESSAGES) {
                for entry in table.iter()? {
                    let (k, v) = entry?;
                    records.push((k.value(), v.value().to_vec()));
                }
            }
            let next = match txn.open_table(META) {
                Ok(t) => t.get(NEXT_ID)?.map_or(1, |v| v.value()),
                Err(_) => 1,
            };
            Ok((records, next))
        })?;
        let mut state = InboxState { held_prefixes: held_prefixes.to_vec(), ..InboxState::default() };
        for (id, bytes) in records {
            let Ok(r) = InboxRecord::decode(bytes.as_slice()) else {
                tracing::error!(message_id = id, "unreadable inbox record kept on disk, not delivered");
                continue;
            };
            state.add(Arc::new(r.into_message(id)));
        }
        if !state.messages.is_empty() {
            tracing::info!(messages = state.messages.len(), "inbox restored from the store");
        }
        metrics.inbox_pending.set(i64::try_from(state.messages.len()).unwrap_or(i64::MAX));
        Ok(Self {
            inner: Arc::new(InboxShared {
                store,
                identity,
                config,
                next_id: AtomicU64::new(next.max(1)),
                state: Mutex::new(state),
                ready: Notify::new(),
                arrivals: watch::channel(0).0,
                metrics,
                tasks: tasks.clone(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A sender connected; ACKs for it go to `tx` until the returned guard is dropped.
    pub fn connect(&self, sender: &str, tx: mpsc::Sender<ExchangeResponse>) -> Connection {
        let mut state = self.lock();
        state.next_connection += 1;
        let id = state.next_connection;
        for ack in state.unsent_acks.remove(sender).unwrap_or_default() {
            self.send_ack(&tx, ack);
        }
        state.senders.insert(sender.to_owned(), (id, tx));
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
        use prost::Message as _;
        let answer = |disposition: Disposition, reason: String| ExchangeResponse {
            sequence: m.sequence,
            resource_id: m.resource_id.clone(),
            event_id: m.event_id.clone(),
            disposition: disposition.into(),
            reason,
        };
        let key: DedupKey = (sender.to_owned(), m.resource_id.clone(), m.event_id.clone());
        if let Some(known) = self.known(&key) {
            self.inner.metrics.inbox_duplicates.inc();
            return known.map(|d| answer(d, String::new()));
        }
        // ACKed before? The record is on disk (an ACK in progress is for a message still in memory).
        match self.acked_before(&key) {
            Ok(false) => {}
            Ok(true) => {
                self.inner.metrics.inbox_duplicates.inc();
                return Some(answer(Disposition::Acked, String::new()));
            }
            Err(error) => return Some(answer(Disposition::Refused, error::chain(&error))),
        }
        let (message, written) = {
            let mut state = self.lock();
            if state.by_key.contains_key(&key) || state.storing.contains(&key) {
                return None;
            }
            let config = self.inner.config.get();
            let held = state.messages.len() + state.storing.len();
            let identity = &self.inner.identity;
            if held >= config.max_pending {
                let full = Full::Messages { identity: identity.clone(), held };
                return Some(answer(Disposition::Refused, full.to_string()));
            }
            let bytes = state.bytes + state.storing_bytes;
            if bytes + m.payload.len() > config.max_pending_bytes {
                let full = Full::Bytes {
                    identity: identity.clone(),
                    held: bytes,
                    bytes: m.payload.len(),
                    max: config.max_pending_bytes,
                };
                return Some(answer(Disposition::Refused, full.to_string()));
            }
            let id = self.inner.next_id.fetch_add(1, Ordering::SeqCst);
            let message = Arc::new(InboxMessage {
                id,
                sender: sender.to_owned(),
                sender_sequence: m.sequence,
                resource_id: m.resource_id.clone(),
                event_id: m.event_id.clone(),
                payload: m.payload.clone(),
                content_type: m.content_type.clone(),
                trace: TraceContext::given(m.traceparent.clone(), m.tracestate.clone()).unwrap_or_default(),
                received_at: SystemTime::now(),
            });
            let record = InboxRecord::of(&message).encode_to_vec();
            let k = key.clone();
            let written = self.inner.store.write("store inbound message", move |txn| {
                txn.open_table(SEEN)?.insert((k.0.as_str(), k.1.as_str(), k.2.as_str()), (id, 0))?;
                txn.open_table(MESSAGES)?.insert(id, record.as_slice())?;
                let mut meta = txn.open_table(META)?;
                if meta.get(NEXT_ID)?.map_or(0, |v| v.value()) <= id {
                    meta.insert(NEXT_ID, id + 1)?;
                }
                Ok(())
            });
            state.storing.insert(key.clone());
            state.storing_bytes += message.payload.len();
            (message, written)
        };
        // The rest runs in a task of its own, so a caller that stops waiting cannot leave a stored
        // message unseen and its key marked as being stored (its resends unanswered) for good.
        let inbox = self.clone();
        let attempt = m.attempt;
        let stored = self.inner.tasks.spawn(async move {
            let result = written.await;
            inbox.stored(key, message, attempt, result)
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
        key: DedupKey,
        message: Arc<InboxMessage>,
        attempt: u32,
        result: Result<(), StoreError>,
    ) -> (Disposition, String) {
        let mut state = self.lock();
        state.storing.remove(&key);
        state.storing_bytes -= message.payload.len();
        let m = message.clone();
        let (id, sender, resource_id, event_id) = (m.id, &m.sender, &m.resource_id, &m.event_id);
        if let Err(error) = result {
            drop(state);
            let error = error::chain(&error);
            tracing::warn!(%error, sender, resource_id, event_id, "inbound message not stored");
            return (Disposition::Refused, error);
        }
        state.add(message);
        self.set_pending_gauge(&state);
        drop(state);
        self.inner.ready.notify_waiters();
        self.inner.arrivals.send_modify(|n| *n += 1);
        self.inner.metrics.inbox_received.inc();
        tracing::debug!(message_id = id, sender, resource_id, event_id, attempt, "message received");
        (Disposition::Stored, String::new())
    }

    /// For a message already in memory: STORED once durable, no answer while being stored.
    fn known(&self, key: &DedupKey) -> Option<Option<Disposition>> {
        let state = self.lock();
        if state.storing.contains(key) {
            return Some(None);
        }
        state.by_key.contains_key(key).then_some(Some(Disposition::Stored))
    }

    fn acked_before(&self, key: &DedupKey) -> Result<bool, StoreError> {
        self.inner.store.read("read deduplication record", |txn| {
            let seen = match txn.open_table(SEEN) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
                Err(e) => return Err(e.into()),
            };
            Ok(seen.get((key.0.as_str(), key.1.as_str(), key.2.as_str()))?.is_some_and(|v| v.value().1 > 0))
        })
    }

    /// A new receiver for the app.
    pub fn receiver(&self) -> Receiver {
        let mut state = self.lock();
        state.next_receiver += 1;
        Receiver { inbox: self.clone(), id: state.next_receiver }
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
            match state.messages.get(&id) {
                Some(p) => p.message.clone(),
                None if id > 0 && id < self.inner.next_id.load(Ordering::SeqCst) => return Ok(()),
                None => return Err(InboxError::NotFound(id)),
            }
        };
        let m = message.clone();
        self.inner
            .store
            .write("record ACK", move |txn| {
                txn.open_table(MESSAGES)?.remove(id)?;
                let mut seen = txn.open_table(SEEN)?;
                seen.insert(
                    (m.sender.as_str(), m.resource_id.as_str(), m.event_id.as_str()),
                    (id, to_millis(SystemTime::now()).max(1)),
                )?;
                forget_old_acks(&mut seen, &m.sender, &m.resource_id)
            })
            .await
            .map_err(InboxError::Store)?;
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
        match state.senders.get(&message.sender) {
            Some((_, tx)) if !tx.is_closed() => self.send_ack(tx, ack),
            _ => {
                let unsent = state.unsent_acks.entry(message.sender.clone()).or_default();
                if unsent.len() >= UNSENT_ACKS {
                    unsent.pop_front();
                }
                unsent.push_back(ack);
            }
        }
        Ok(())
    }

    /// Hands a message back for another delivery after `delay`.
    pub fn nack(&self, id: u64, delay: Duration, reason: &str) -> Result<(), InboxError> {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(p) = state.messages.get_mut(&id) else {
            return if id > 0 && id < self.inner.next_id.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(InboxError::NotFound(id))
            };
        };
        if p.ready_at.is_some() {
            // NACKed before: the later NACK decides.
            if let Some(at) = p.ready_at.take() {
                state.delayed.remove(&(at, id));
            }
        }
        p.leased_to = None;
        // It may sit in the queue already (NACKed while not held): one place only.
        state.queue.remove(&id);
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
        if delay.is_zero() {
            state.queue.insert(id);
        } else {
            let at = Instant::now() + delay;
            p.ready_at = Some(at);
            state.delayed.insert((at, id));
        }
        self.inner.ready.notify_waiters();
        Ok(())
    }

    /// The daemon's own messages about `resource_id` not ACKed yet, oldest first.
    pub(crate) fn held(&self, resource_id: &str) -> Vec<Arc<InboxMessage>> {
        let state = self.lock();
        state
            .held
            .get(resource_id)
            .map(|ids| ids.iter().filter_map(|id| state.messages.get(id).map(|p| p.message.clone())).collect())
            .unwrap_or_default()
    }

    /// Changes whenever a message arrives.
    pub fn arrivals(&self) -> watch::Receiver<u64> {
        self.inner.arrivals.subscribe()
    }

    /// Messages waiting for the app's ACK.
    pub fn pending(&self) -> usize {
        self.lock().messages.len()
    }

    fn set_pending_gauge(&self, state: &InboxState) {
        self.inner.metrics.inbox_pending.set(i64::try_from(state.messages.len()).unwrap_or(i64::MAX));
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

fn key_of(m: &InboxMessage) -> DedupKey {
    (m.sender.clone(), m.resource_id.clone(), m.event_id.clone())
}

/// Keeps the newest [`REMEMBERED_ACKS`] ACKed events of (sender, resource_id).
fn forget_old_acks(
    seen: &mut redb::Table<'_, (&'static str, &'static str, &'static str), (u64, u64)>,
    sender: &str,
    resource_id: &str,
) -> Result<(), redb::Error> {
    let mut acked: Vec<(u64, u64, String)> = Vec::new();
    for entry in seen.range((sender, resource_id, "")..)? {
        let (k, v) = entry?;
        let (s, r, e) = k.value();
        if s != sender || r != resource_id {
            break;
        }
        let (id, acked_at) = v.value();
        if acked_at > 0 {
            acked.push((acked_at, id, e.to_owned()));
        }
    }
    if acked.len() > REMEMBERED_ACKS {
        acked.sort();
        for (_, _, event) in &acked[..acked.len() - REMEMBERED_ACKS] {
            seen.remove((sender, resource_id, event.as_str()))?;
        }
    }
    Ok(())
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
        let mut state = self.inbox.lock();
        if state.senders.get(&self.sender).is_some_and(|(id, _)| *id == self.id) {
            state.senders.remove(&self.sender);
        }
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
            let wake_at = {
                let mut state = self.inbox.lock();
                let state = &mut *state;
                let now = Instant::now();
                while let Some(&(at, id)) = state.delayed.first() {
                    if at > now {
                        break;
                    }
                    state.delayed.pop_first();
                    if let Some(p) = state.messages.get_mut(&id) {
                        p.ready_at = None;
                        state.queue.insert(id);
                    }
                }
                while let Some(id) = state.queue.pop_first() {
                    if let Some(p) = state.messages.get_mut(&id) {
                        p.leased_to = Some(self.id);
                        p.attempts += 1;
                        return (p.message.clone(), p.attempts);
                    }
                }
                state.delayed.first().map(|(at, _)| *at)
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
        let mut state = self.inbox.lock();
        let state = &mut *state;
        let mut returned = false;
        for (id, p) in &mut state.messages {
            if p.leased_to == Some(self.id) {
                p.leased_to = None;
                state.queue.insert(*id);
                returned = true;
            }
        }
        if returned {
            self.inbox.inner.ready.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests;
