//! What the inbox holds in memory, with no I/O: the messages waiting for an ACK by id and by
//! deduplication key, those being stored and the bounds on both, the daemon's own messages held apart;
//! with the app's queue (`queue`) and the ACK path back (`acks`) beside them. Each method says what
//! became of the call; the inbox does the storing, the waking and the sending.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use consistd_core::config::InboxConfig;
use tokio::time::Instant;

use super::{InboxMessage, acks::AckRoutes, claims::Newest, queue::AppQueue};

/// What makes a message the same message: who sent it, about what, and which event of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct DedupKey {
    pub(super) sender: String,
    pub(super) resource_id: String,
    pub(super) event_id: String,
}

impl DedupKey {
    /// The key of a message `sender` sent about (`resource_id`, `event_id`).
    pub(super) fn new(sender: &str, resource_id: &str, event_id: &str) -> Self {
        Self { sender: sender.to_owned(), resource_id: resource_id.to_owned(), event_id: event_id.to_owned() }
    }

    /// The key of a received message.
    pub(super) fn of(m: &InboxMessage) -> Self {
        Self::new(&m.sender, &m.resource_id, &m.event_id)
    }
}

/// Why the inbox refuses a message now: it is full. Displays what the sending daemon is told (it retries
/// with backoff), naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Full {
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

/// What an inbound message's key tells before it is stored.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Known {
    /// Not in memory: new, or ACKed before (the deduplication record on disk says which).
    No,
    /// Being stored now: the first send is answered, this resend is not.
    Storing,
    /// Stored and waiting for the app.
    Stored,
}

/// A message waiting for the app's ACK.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) message: Arc<InboxMessage>,
    /// Deliveries to the app so far.
    pub(super) attempts: u32,
}

/// What a receiver gets when it asks for the next message.
#[derive(Debug)]
pub(super) enum Next {
    /// This message, leased to the receiver, and its delivery attempt (1 for the first).
    Message(Arc<InboxMessage>, u32),
    /// Nothing ready: wait for a wake-up, or until this instant when a NACKed message becomes ready.
    Wait(Option<Instant>),
}

#[derive(Debug, Default)]
pub(super) struct InboxState {
    messages: BTreeMap<u64, Pending>,
    by_key: HashMap<DedupKey, u64>,
    /// Messages whose write is not committed yet, not shown to anyone (a resend of one gets no answer;
    /// the first will).
    storing: HashSet<DedupKey>,
    /// Payload bytes of `messages`, against inbox.maxPendingBytes.
    bytes: usize,
    /// Payload bytes of the messages being stored.
    storing_bytes: usize,
    /// Resource ids the daemon keeps for itself (see [`super::Inbox::open`]).
    held_prefixes: Vec<&'static str>,
    /// The daemon's own messages per resource_id, oldest first, until the part that reads them ACKs them.
    held: HashMap<String, BTreeSet<u64>>,
    /// The app's messages: ready, leased to a receiver, or waiting out a NACK's delay.
    pub(super) queue: AppQueue,
    /// Where each sender's ACKs go.
    pub(super) acks: AckRoutes,
    /// The newest claim stored per election.
    pub(super) claims: Newest,
}

impl InboxState {
    /// The state of an inbox whose store holds `messages`; those about a resource id under one of
    /// `held_prefixes` are the daemon's own.
    pub(super) fn new(held_prefixes: &[&'static str], messages: Vec<InboxMessage>, claims: Newest) -> Self {
        let mut state = Self { held_prefixes: held_prefixes.to_vec(), claims, ..Self::default() };
        for message in messages {
            state.add(Arc::new(message));
        }
        state
    }

    /// Messages waiting for an ACK.
    pub(super) fn pending(&self) -> usize {
        self.messages.len()
    }

    /// Whether a message about `resource_id` is the daemon's own rather than the app's.
    fn is_held(&self, resource_id: &str) -> bool {
        self.held_prefixes.iter().any(|p| resource_id.starts_with(p))
    }

    /// Takes in a message: for the app's receivers, or held for the part of the daemon that reads it.
    fn add(&mut self, message: Arc<InboxMessage>) {
        let id = message.id;
        self.by_key.insert(DedupKey::of(&message), id);
        if self.is_held(&message.resource_id) {
            self.held.entry(message.resource_id.clone()).or_default().insert(id);
        } else {
            self.queue.push(id);
        }
        self.bytes += message.payload.len();
        self.messages.insert(id, Pending { message, attempts: 0 });
    }

    /// Forgets a message wherever it waits.
    pub(super) fn remove(&mut self, id: u64) -> Option<Pending> {
        let p = self.messages.remove(&id)?;
        self.bytes -= p.message.payload.len();
        self.by_key.remove(&DedupKey::of(&p.message));
        self.queue.remove(id);
        if let Some(ids) = self.held.get_mut(&p.message.resource_id) {
            ids.remove(&id);
            if ids.is_empty() {
                self.held.remove(&p.message.resource_id);
            }
        }
        Some(p)
    }

    /// What is in memory of the message of `key`.
    pub(super) fn known(&self, key: &DedupKey) -> Known {
        if self.storing.contains(key) {
            Known::Storing
        } else if self.by_key.contains_key(key) {
            Known::Stored
        } else {
            Known::No
        }
    }

    /// Reserves room for storing a message of `bytes` payload bytes under `key`, or says why the inbox
    /// of `identity` is full under `config`'s bounds.
    pub(super) fn begin_storing(
        &mut self,
        key: &DedupKey,
        bytes: usize,
        config: &InboxConfig,
        identity: &str,
    ) -> Result<(), Full> {
        let held = self.messages.len() + self.storing.len();
        if held >= config.max_pending {
            return Err(Full::Messages { identity: identity.to_owned(), held });
        }
        let held = self.bytes + self.storing_bytes;
        if held + bytes > config.max_pending_bytes {
            return Err(Full::Bytes { identity: identity.to_owned(), held, bytes, max: config.max_pending_bytes });
        }
        self.storing.insert(key.clone());
        self.storing_bytes += bytes;
        Ok(())
    }

    /// Ends the storing of `message`: once `durable`, it waits for the app (or the daemon); otherwise it
    /// is forgotten (the sender still holds it and sends it again).
    pub(super) fn end_storing(&mut self, message: Arc<InboxMessage>, durable: bool) {
        self.storing.remove(&DedupKey::of(&message));
        self.storing_bytes -= message.payload.len();
        if durable {
            self.add(message);
        }
    }

    /// The message of `id` if it waits for an ACK.
    pub(super) fn get(&self, id: u64) -> Option<&Pending> {
        self.messages.get(&id)
    }

    /// The next message for `receiver` at `now`: the oldest ready one, leased to it.
    pub(super) fn next(&mut self, receiver: u64, now: Instant) -> Next {
        loop {
            match self.queue.lease_next(receiver, now) {
                Ok(id) => match self.messages.get_mut(&id) {
                    Some(p) => {
                        p.attempts += 1;
                        return Next::Message(p.message.clone(), p.attempts);
                    }
                    None => self.queue.remove(id),
                },
                Err(wake_at) => return Next::Wait(wake_at),
            }
        }
    }

    /// Makes the message of `id` ready again `delay` after `now` (a later NACK decides); its pending
    /// state, or None when it does not wait for an ACK.
    pub(super) fn nack(&mut self, id: u64, delay: Duration, now: Instant) -> Option<&Pending> {
        let p = self.messages.get(&id)?;
        self.queue.nack(id, delay, now);
        Some(p)
    }

    /// The daemon's own messages about `resource_id` not ACKed yet, oldest first.
    pub(super) fn held(&self, resource_id: &str) -> Vec<Arc<InboxMessage>> {
        self.held
            .get(resource_id)
            .map(|ids| ids.iter().filter_map(|id| self.messages.get(id).map(|p| p.message.clone())).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use bytes::Bytes;

    use super::*;

    fn message(id: u64, resource_id: &str) -> InboxMessage {
        InboxMessage {
            id,
            sender: "sender".into(),
            sender_sequence: id,
            resource_id: resource_id.into(),
            event_id: "e".into(),
            payload: Bytes::from_static(b"12345"),
            content_type: String::new(),
            trace: Default::default(),
            claim: None,
            received_at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_nacked_message_is_ready_again_after_its_delay_and_a_later_nack_decides() {
        let now = Instant::now();
        let mut state = InboxState::new(&[], vec![message(1, "r")], Newest::default());
        let receiver = state.queue.new_receiver();
        assert!(matches!(state.next(receiver, now), Next::Message(m, 1) if m.id == 1));
        assert!(state.nack(1, Duration::from_secs(10), now).is_some());
        assert!(state.nack(1, Duration::from_secs(5), now).is_some(), "the later NACK decides");
        assert!(matches!(state.next(receiver, now), Next::Wait(Some(at)) if at == now + Duration::from_secs(5)));
        assert!(matches!(state.next(receiver, now + Duration::from_secs(5)), Next::Message(m, 2) if m.id == 1));
    }

    #[test]
    fn a_dropped_receivers_leases_go_back_to_the_queue_and_held_messages_never_reach_the_app() {
        let now = Instant::now();
        let mut state = InboxState::new(&["own/"], vec![message(1, "r"), message(2, "own/x")], Newest::default());
        let first = state.queue.new_receiver();
        assert!(matches!(state.next(first, now), Next::Message(m, 1) if m.id == 1));
        assert!(matches!(state.next(first, now), Next::Wait(None)), "the daemon's own message is not the app's");
        assert_eq!(state.held("own/x").len(), 1);
        assert!(state.queue.return_leases(first));
        let second = state.queue.new_receiver();
        assert!(matches!(state.next(second, now), Next::Message(m, 2) if m.id == 1), "attempt 2");
    }

    #[test]
    fn storing_is_bounded_by_messages_and_bytes_and_a_failed_write_frees_its_room() {
        let config = InboxConfig { max_pending: 2, max_pending_bytes: 8 };
        let mut state = InboxState::new(&[], vec![message(1, "r")], Newest::default());
        let key = |e: &str| DedupKey::new("sender", "s", e);
        let full = state.begin_storing(&key("a"), 5, &config, "me").expect_err("5 + 5 bytes pass 8");
        assert_eq!(full, Full::Bytes { identity: "me".into(), held: 5, bytes: 5, max: 8 });
        state.begin_storing(&key("a"), 3, &config, "me").expect("room for 3 bytes");
        assert_eq!(state.known(&key("a")), Known::Storing);
        let full = state.begin_storing(&key("b"), 0, &config, "me").expect_err("two messages already");
        assert_eq!(full, Full::Messages { identity: "me".into(), held: 2 });
        let mut failed = message(2, "s");
        (failed.event_id, failed.payload) = ("a".into(), Bytes::from_static(b"123"));
        state.end_storing(Arc::new(failed), false);
        assert_eq!(state.known(&key("a")), Known::No, "forgotten: the sender sends it again");
        state.begin_storing(&key("b"), 3, &config, "me").expect("its room is free again");
    }
}
