//! What the outbox holds in memory, as state without I/O: per (destination, resource_id) the one current
//! message, per destination its peers and how many slots it holds, per peer its link's deliveries and
//! their schedule; the bounds `Send` checks. Each change returns the [`Effects`] it calls for (delete a
//! stored message, record a group ACK, start a link, follow a group, publish an outcome); the outbox
//! carries them out.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::SystemTime,
};

use consistd_core::{
    claim::Claim,
    config::{BackoffConfig, OutboxConfig},
};
use consistd_proto::peer::v1::{self as peer_pb, ExchangeRequest, exchange_request::Frame};
use tokio::{sync::Notify, time::Instant};

use super::{
    Bound, Destination, Message, OutcomeKind, backoff,
    link::{LINK_LINGER, Link, LinkUse, PeerDelivery},
    members,
    settled::Settled,
};

/// A slot's key: per destination and resource_id, only the newest message is kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SlotKey {
    pub(super) destination: Destination,
    pub(super) resource_id: String,
}

impl SlotKey {
    /// The slot of (`destination`, `resource_id`).
    pub(super) fn new(destination: &Destination, resource_id: &str) -> Self {
        Self { destination: destination.clone(), resource_id: resource_id.to_owned() }
    }

    /// The slot of a stored message.
    pub(super) fn of(message: &Message) -> Self {
        Self::new(&message.destination, &message.resource_id)
    }
}

/// The message of one (destination, resource_id).
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// The newest stored message of the slot; None once a peer destination's message is ACKed.
    pub(super) current: Option<Arc<Message>>,
    /// `Send` calls for this slot whose write is still being committed.
    pub(super) storing: u32,
    /// Group destinations: peers that ACKed `current`.
    pub(super) acked_by: BTreeSet<String>,
}

/// Who a destination reaches now, and how many of the outbox's slots it holds.
#[derive(Debug)]
pub(super) struct Recipients {
    /// The peer addresses: the one peer, a Service's ready endpoints, or a group's live members.
    pub(super) peers: BTreeSet<String>,
    /// Slots of this destination (held messages and reservations).
    pub(super) held: usize,
    /// Following the group's members, set by the outbox as it carries out [`Effects::follow`]; dropping
    /// the destination stops it.
    pub(super) following: Option<members::Following>,
    /// Why the group's members cannot be read (e.g. RBAC grants no list on endpointslices), until they are.
    pub(super) unresolved: Option<String>,
}

/// What a change to the state calls for, beyond the state itself.
#[derive(Debug, Default)]
#[must_use = "the outbox must carry out what a change calls for"]
pub(super) struct Effects {
    /// Outcomes to publish on WatchAcks (and to count): (message, peer or "" for all, what happened).
    pub(super) outcomes: Vec<(Arc<Message>, String, OutcomeKind)>,
    /// Stored messages to delete; `true` when their group ACKs go too.
    pub(super) delete: Vec<(u64, bool)>,
    /// Group ACKs to record: (sequence, peer).
    pub(super) group_acks: Vec<(u64, String)>,
    /// Link tasks to start: (peer, link id, its wake-up).
    pub(super) start_links: Vec<(String, u64, Arc<Notify>)>,
    /// Group destinations whose members to start following.
    pub(super) follow: Vec<Destination>,
    /// Change in the number of connected peers.
    pub(super) connections: i64,
    /// Deliveries sent again.
    pub(super) resends: u64,
}

impl Effects {
    fn outcome(&mut self, message: &Arc<Message>, peer: &str, kind: OutcomeKind) {
        self.outcomes.push((message.clone(), peer.to_owned(), kind));
    }
}

/// What [`OutboxState::take_due`] took from a link.
#[derive(Debug)]
pub(super) struct Due {
    /// The frames to send now.
    pub(super) frames: Vec<ExchangeRequest>,
    /// When the next delivery is due, if any is scheduled.
    pub(super) next: Option<Instant>,
    /// What taking them calls for (resends counted).
    pub(super) effects: Effects,
}

/// Everything the outbox holds in memory, under one lock: the truth while the daemon runs (the store is
/// read back only at startup).
#[derive(Debug, Default)]
pub(super) struct OutboxState {
    /// The current message of each (destination, resource_id).
    pub(super) slots: HashMap<SlotKey, Slot>,
    /// Each destination in use: who it reaches and how many slots it holds.
    pub(super) destinations: HashMap<Destination, Recipients>,
    /// The connection and pending deliveries of each peer address, shared by every destination that
    /// includes it.
    pub(super) links: HashMap<String, Link>,
    /// Slots held in all destinations, against outbox.maxPending.
    pub(super) held: usize,
    /// Payload bytes of every current message and of those being stored, against outbox.maxPendingBytes.
    bytes: usize,
    /// The id of the newest link: a link task whose id no longer matches was replaced and stops.
    next_link: u64,
    /// Messages waiting for their first outcome, and the first outcomes kept for WaitOutcome.
    pub(super) settled: Settled,
}

impl OutboxState {
    /// Checks `config`'s bounds and reserves the slot of `key` and a message of `bytes` payload bytes.
    pub(super) fn reserve(&mut self, key: &SlotKey, bytes: usize, config: &OutboxConfig) -> Result<Effects, Bound> {
        let mut effects = Effects::default();
        // A message that supersedes one frees that one's bytes once it is stored (both are held meanwhile:
        // at most one payload more per Send in flight), so a full outbox can still replace its messages.
        let replaced = self.slots.get(key).and_then(|s| s.current.as_ref()).map_or(0, |m| m.payload.len());
        if (self.bytes + bytes).saturating_sub(replaced) > config.max_pending_bytes {
            return Err(Bound::PendingBytes { held: self.bytes, bytes, max: config.max_pending_bytes });
        }
        let occupied = self.slots.get(key).is_some_and(|s| s.current.is_some() || s.storing > 0);
        if !occupied {
            let in_destination = self.destinations.get(&key.destination).map_or(0, |d| d.held);
            if in_destination >= config.max_pending_per_destination {
                return Err(Bound::PerDestination { destination: key.destination.to_string(), held: in_destination });
            }
            if self.held >= config.max_pending {
                return Err(Bound::Pending { held: self.held });
            }
            self.ensure_destination(&key.destination, &mut effects);
            self.held += 1;
            if let Some(d) = self.destinations.get_mut(&key.destination) {
                d.held += 1;
            }
        }
        self.slots.entry(key.clone()).or_default().storing += 1;
        self.bytes += bytes;
        Ok(effects)
    }

    /// Ends the storing of `message` into its reserved slot: once `durable` it becomes the slot's current
    /// message (see [`Self::install`]); otherwise its reservation is given back.
    pub(super) fn end_storing(&mut self, message: Arc<Message>, durable: bool) -> Effects {
        let key = SlotKey::of(&message);
        if let Some(slot) = self.slots.get_mut(&key) {
            slot.storing -= 1;
        }
        let mut effects = Effects::default();
        if durable {
            self.install(message, &mut effects);
        } else {
            self.bytes -= message.payload.len();
            self.release_if_empty(&key);
        }
        effects
    }

    /// Puts messages read back from the store into their slots, each with the peers that ACKed it.
    pub(super) fn restore(&mut self, messages: Vec<(Arc<Message>, BTreeSet<String>)>) -> Effects {
        let mut effects = Effects::default();
        for (message, acked_by) in messages {
            let target = message.destination.clone();
            self.ensure_destination(&target, &mut effects);
            let slot = Slot { current: None, storing: 0, acked_by };
            self.slots.insert(SlotKey::of(&message), slot);
            self.held += 1;
            self.bytes += message.payload.len();
            if let Some(d) = self.destinations.get_mut(&target) {
                d.held += 1;
            }
            self.install(message, &mut effects);
        }
        effects
    }

    /// Makes a stored message its slot's current one, superseding an older current message; a message
    /// older than the current one is itself superseded at once. The message's bytes were counted in
    /// `self.bytes` before; a superseded message's are taken out.
    fn install(&mut self, message: Arc<Message>, effects: &mut Effects) {
        let key = SlotKey::of(&message);
        let Some(slot) = self.slots.get_mut(&key) else {
            self.bytes -= message.payload.len();
            return;
        };
        if slot.current.as_ref().is_some_and(|c| c.sequence > message.sequence) {
            self.bytes -= message.payload.len();
            effects.outcome(&message, "", OutcomeKind::Superseded);
            effects.delete.push((message.sequence, message.destination.is_group()));
            return;
        }
        let restored_acks = std::mem::take(&mut slot.acked_by);
        let old = slot.current.replace(message.clone());
        self.settled.expect(message.sequence);
        // Acks loaded from the store belong to the message being restored, not to a new one.
        slot.acked_by = if old.is_none() { restored_acks } else { BTreeSet::new() };
        let acked_by = slot.acked_by.clone();
        let peers = self.destinations.get(&message.destination).map(|d| d.peers.clone()).unwrap_or_default();
        for peer in peers {
            let Some(link) = self.links.get_mut(&peer) else { continue };
            if let Some(old) = &old {
                link.remove(old.sequence);
            }
            if !acked_by.contains(&peer) {
                link.add(PeerDelivery::new(message.clone()));
            }
        }
        if let Some(old) = old {
            self.bytes -= old.payload.len();
            tracing::debug!(
                message_id = old.sequence,
                destination = %old.destination,
                resource_id = %old.resource_id,
                event_id = %old.event_id,
                superseded_by = %message.event_id,
                "message superseded"
            );
            effects.outcome(&old, "", OutcomeKind::Superseded);
            effects.delete.push((old.sequence, old.destination.is_group()));
        }
    }

    /// Frees a slot that holds nothing and is not being stored into.
    fn release_if_empty(&mut self, key: &SlotKey) {
        let empty = self.slots.get(key).is_some_and(|s| s.current.is_none() && s.storing == 0);
        if !empty {
            return;
        }
        self.slots.remove(key);
        self.held -= 1;
        let drop_destination = match self.destinations.get_mut(&key.destination) {
            Some(d) => {
                d.held -= 1;
                d.held == 0
            }
            None => false,
        };
        if drop_destination && let Some(d) = self.destinations.remove(&key.destination) {
            for peer in d.peers {
                self.unuse_link(&peer);
            }
        }
    }

    /// Creates the destination (and its peer's link) on first use; a group's members are followed.
    fn ensure_destination(&mut self, target: &Destination, effects: &mut Effects) {
        if self.destinations.contains_key(target) {
            return;
        }
        let peers = match target {
            Destination::Peer(p) => BTreeSet::from([p.clone()]),
            group => {
                effects.follow.push(group.clone());
                BTreeSet::new()
            }
        };
        for peer in &peers {
            self.use_link(peer, effects);
        }
        self.destinations.insert(target.clone(), Recipients { peers, held: 0, following: None, unresolved: None });
    }

    /// A group destination's peers changed: new peers get every current message of the destination,
    /// peers that left are reported FAILED for what they had not ACKed.
    pub(super) fn set_peers(&mut self, target: &Destination, peers: BTreeSet<String>) -> Effects {
        let mut effects = Effects::default();
        let Some(destination) = self.destinations.get_mut(target) else { return effects };
        destination.unresolved = None;
        let old = std::mem::replace(&mut destination.peers, peers.clone());
        let messages: Vec<(Arc<Message>, BTreeSet<String>)> = self
            .slots
            .iter()
            .filter(|(key, _)| key.destination == *target)
            .filter_map(|(_, s)| s.current.clone().map(|m| (m, s.acked_by.clone())))
            .collect();
        for peer in old.difference(&peers) {
            if let Some(link) = self.links.get_mut(peer) {
                for (m, _) in &messages {
                    if link.remove(m.sequence).is_some() {
                        let reason = format!("{peer} is no longer part of {target}");
                        effects.outcome(m, peer, OutcomeKind::Failed(reason));
                    }
                }
            }
            self.unuse_link(peer);
        }
        for peer in peers.difference(&old) {
            self.use_link(peer, &mut effects);
            let Some(link) = self.links.get_mut(peer) else { continue };
            for (m, acked_by) in &messages {
                if !acked_by.contains(peer) {
                    link.add(PeerDelivery::new(m.clone()));
                }
            }
        }
        if old != peers {
            tracing::info!(destination = %target, peers = ?peers, "destination members changed");
        }
        effects
    }

    /// A group destination's members cannot be read: `why`, for GetOutboxStatus, until they are.
    pub(super) fn set_unresolved(&mut self, target: &Destination, why: String) {
        if let Some(destination) = self.destinations.get_mut(target) {
            destination.unresolved = Some(why);
        }
    }

    /// A peer's app ACKed (sequence, resource_id, event_id). An ACK that does not match the message
    /// the peer still has to ACK (older, superseded, or from another sender store) changes nothing.
    pub(super) fn acked(&mut self, peer: &str, sequence: u64, resource_id: &str, event_id: &str) -> Effects {
        self.settled_at(peer, sequence, resource_id, event_id, OutcomeKind::Acked)
    }

    /// `peer` refused message `sequence` for good (its claim is older than one the peer stored): no more
    /// deliveries of it to that peer, and its outcome there is FAILED with the peer's reason.
    pub(super) fn fenced(
        &mut self,
        peer: &str,
        sequence: u64,
        resource_id: &str,
        event_id: &str,
        why: &str,
    ) -> Effects {
        tracing::info!(peer, message_id = sequence, resource_id, event_id, why, "peer refused message for good");
        let reason = format!("{peer} refused it for good: {why}");
        self.settled_at(peer, sequence, resource_id, event_id, OutcomeKind::Failed(reason))
    }

    /// Message `sequence` is done at `peer` with `kind`: its delivery there ends, and a peer destination's
    /// message goes (a group's stays for members that join later).
    fn settled_at(
        &mut self,
        peer: &str,
        sequence: u64,
        resource_id: &str,
        event_id: &str,
        kind: OutcomeKind,
    ) -> Effects {
        let mut effects = Effects::default();
        let Some(link) = self.links.get_mut(peer) else { return effects };
        let matches = link
            .deliveries
            .get(&sequence)
            .is_some_and(|d| d.message.resource_id == resource_id && d.message.event_id == event_id);
        if !matches {
            tracing::debug!(
                peer,
                message_id = sequence,
                resource_id,
                event_id,
                ?kind,
                "answer for no pending message ignored"
            );
            return effects;
        }
        let Some(delivery) = link.remove(sequence) else { return effects };
        let message = delivery.message;
        if kind == OutcomeKind::Acked {
            tracing::debug!(
                message_id = sequence,
                destination = %message.destination,
                peer,
                resource_id,
                event_id,
                attempt = delivery.attempts,
                "message ACKed"
            );
        }
        effects.outcome(&message, peer, kind);
        let key = SlotKey::of(&message);
        let Some(slot) = self.slots.get_mut(&key) else { return effects };
        if slot.current.as_ref().map(|c| c.sequence) != Some(sequence) {
            return effects;
        }
        if message.destination.is_group() {
            // The newest message of a group destination stays for members that join later.
            slot.acked_by.insert(peer.to_owned());
            effects.group_acks.push((sequence, peer.to_owned()));
        } else {
            slot.current = None;
            self.bytes -= message.payload.len();
            self.release_if_empty(&key);
            effects.delete.push((sequence, false));
        }
        effects
    }

    /// A destination includes `peer`: its link is used (created, with a task to start, if new).
    fn use_link(&mut self, peer: &str, effects: &mut Effects) {
        if let Some(link) = self.links.get_mut(peer) {
            link.uses += 1;
            link.unused_since = None;
            return;
        }
        self.next_link += 1;
        let link = Link::new(self.next_link);
        effects.start_links.push((peer.to_owned(), link.id, link.wake.clone()));
        self.links.insert(peer.to_owned(), link);
    }

    /// A destination no longer includes `peer`; when none does, its link lingers, then closes.
    fn unuse_link(&mut self, peer: &str) {
        let Some(link) = self.links.get_mut(peer) else { return };
        link.uses -= 1;
        if link.uses == 0 {
            // Its task closes the link after the linger, unless a destination uses the peer again.
            link.unused_since = Some(Instant::now());
            link.wake.notify_one();
        }
    }

    /// Closes link `id` if no destination has used it for [`LINK_LINGER`] (or at all, while it is not
    /// connected).
    pub(super) fn retire_unused(&mut self, peer: &str, id: u64, connected: bool) -> (LinkUse, Effects) {
        let mut effects = Effects::default();
        let Some(link) = self.links.get(peer).filter(|l| l.id == id) else { return (LinkUse::Gone, effects) };
        let Some(since) = link.unused_since.filter(|_| link.uses == 0 && link.deliveries.is_empty()) else {
            return (LinkUse::InUse, effects);
        };
        let until = since + LINK_LINGER;
        if !connected || Instant::now() >= until {
            if link.connected {
                effects.connections -= 1;
            }
            self.links.remove(peer);
            tracing::debug!(peer, "closing the connection to an unused peer");
            return (LinkUse::Gone, effects);
        }
        (LinkUse::Lingering(until), effects)
    }

    /// Link `id`'s connection is up: everything the peer has not confirmed storing is due now. Messages it
    /// stored keep their schedule: it sends their ACKs on this connection (also those its app gave
    /// while disconnected), and the resend at the backoff cap covers a peer that lost its store.
    pub(super) fn link_up(&mut self, peer: &str, id: u64) -> Effects {
        let mut effects = Effects::default();
        let Some(link) = self.links.get_mut(peer).filter(|l| l.id == id) else { return effects };
        link.connected = true;
        let now = Instant::now();
        let sequences: Vec<u64> = link.deliveries.iter().filter(|(_, d)| !d.stored).map(|(s, _)| *s).collect();
        for s in sequences {
            link.reschedule(s, now);
        }
        effects.connections += 1;
        tracing::info!(peer, pending = link.deliveries.len(), "connected to peer");
        effects
    }

    /// Link `id`'s connection broke with `error`.
    pub(super) fn link_down(&mut self, peer: &str, id: u64, error: &str) -> Effects {
        let mut effects = Effects::default();
        let Some(link) = self.links.get_mut(peer).filter(|l| l.id == id) else { return effects };
        if link.connected {
            effects.connections -= 1;
            tracing::info!(peer, error, "peer connection lost");
        }
        link.connected = false;
        for d in link.deliveries.values_mut() {
            d.last_error = Some(error.to_owned());
        }
        effects
    }

    /// Up to `max` frames for link `id`'s deliveries that are due, each counted as an attempt and
    /// rescheduled with `backoff`; also when the next one is due. None when the link is gone.
    pub(super) fn take_due(&mut self, peer: &str, id: u64, max: usize, backoff: &BackoffConfig) -> Option<Due> {
        let mut effects = Effects::default();
        let link = self.links.get_mut(peer).filter(|l| l.id == id)?;
        let now = Instant::now();
        let mut frames = Vec::new();
        while frames.len() < max {
            let Some(&(due, sequence)) = link.schedule.first() else { break };
            if due > now {
                break;
            }
            let Some(d) = link.deliveries.get_mut(&sequence) else {
                link.schedule.pop_first();
                continue;
            };
            d.attempts += 1;
            let attempt = d.attempts;
            let m = d.message.clone();
            if attempt > 1 {
                effects.resends += 1;
                tracing::debug!(
                    message_id = sequence,
                    destination = %m.destination,
                    peer,
                    resource_id = %m.resource_id,
                    event_id = %m.event_id,
                    attempt,
                    "resending"
                );
            }
            link.reschedule(sequence, now + backoff::delay(backoff, attempt));
            frames.push(ExchangeRequest {
                frame: Some(Frame::Message(peer_pb::PeerMessage {
                    sequence,
                    resource_id: m.resource_id.clone(),
                    event_id: m.event_id.clone(),
                    payload: m.payload.clone(),
                    content_type: m.content_type.clone(),
                    sent_at: Some(m.enqueued_at.into()),
                    attempt,
                    traceparent: m.trace.traceparent.clone(),
                    tracestate: m.trace.tracestate.clone(),
                    claim: Claim::carried(m.claim.as_ref()),
                })),
            });
        }
        let next = link.schedule.first().map(|(due, _)| *due);
        Some(Due { frames, next, effects })
    }

    /// The peer of link `id` answered STORED: it holds the message durably and sends ACKED when its app
    /// acknowledges it; resend only if that takes longer than the backoff `cap`, or at once after a
    /// reconnect.
    pub(super) fn stored(&mut self, peer: &str, id: u64, answer: &peer_pb::ExchangeResponse, cap: std::time::Duration) {
        let Some(link) = self.links.get_mut(peer).filter(|l| l.id == id) else { return };
        let matches = link
            .deliveries
            .get(&answer.sequence)
            .is_some_and(|d| d.message.resource_id == answer.resource_id && d.message.event_id == answer.event_id);
        if matches {
            link.reschedule(answer.sequence, Instant::now() + cap);
            if let Some(d) = link.deliveries.get_mut(&answer.sequence) {
                d.last_error = None;
                d.stored = true;
            }
        }
    }

    /// The peer of link `id` refused message `sequence` for `reason`; it is resent on its schedule.
    pub(super) fn refused(&mut self, peer: &str, id: u64, sequence: u64, reason: &str) {
        let Some(link) = self.links.get_mut(peer).filter(|l| l.id == id) else { return };
        if let Some(d) = link.deliveries.get_mut(&sequence) {
            tracing::debug!(peer, message_id = sequence, reason, "peer refused message; will retry");
            d.last_error = Some(format!("{peer} refused it: {reason}"));
        }
    }

    /// When the oldest message waiting for a peer's ACK was sent.
    pub(super) fn oldest_pending(&self) -> Option<SystemTime> {
        self.links.values().flat_map(|l| l.deliveries.values().map(|d| d.message.enqueued_at)).min()
    }

    /// The current messages of `target`, oldest first.
    pub(super) fn current_of(&self, target: &Destination) -> Vec<Arc<Message>> {
        let mut messages: Vec<Arc<Message>> = self
            .slots
            .iter()
            .filter(|(key, _)| key.destination == *target)
            .filter_map(|(_, s)| s.current.clone())
            .collect();
        messages.sort_by_key(|m| m.sequence);
        messages
    }

    /// Deliveries of `target` waiting at `peer`, oldest first.
    pub(super) fn deliveries_of<'a>(
        &'a self,
        target: &'a Destination,
        peer: &str,
    ) -> Option<(&'a Link, impl Iterator<Item = &'a PeerDelivery>)> {
        let link = self.links.get(peer)?;
        Some((link, link.deliveries.values().filter(move |d| &d.message.destination == target)))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn message(sequence: u64, destination: &Destination, event: &str) -> Arc<Message> {
        Arc::new(Message {
            sequence,
            destination: destination.clone(),
            resource_id: "r".into(),
            event_id: event.into(),
            payload: Bytes::from_static(b"12345"),
            content_type: String::new(),
            trace: Default::default(),
            claim: None,
            enqueued_at: SystemTime::UNIX_EPOCH,
        })
    }

    fn kinds(effects: &Effects) -> Vec<(u64, OutcomeKind)> {
        effects.outcomes.iter().map(|(m, _, k)| (m.sequence, k.clone())).collect()
    }

    #[test]
    fn a_newer_message_supersedes_the_older_which_is_deleted_and_the_ack_of_the_newer_frees_the_slot() {
        let (config, peer) = (OutboxConfig::default(), Destination::Peer("10.0.0.1:7000".into()));
        let key = SlotKey::new(&peer, "r");
        let mut state = OutboxState::default();
        let first = state.reserve(&key, 5, &config).expect("room");
        assert_eq!(first.start_links.len(), 1, "the peer's link starts with its first message");
        let stored = state.end_storing(message(1, &peer, "e1"), true);
        assert!(stored.outcomes.is_empty() && stored.delete.is_empty());

        assert!(state.reserve(&key, 5, &config).expect("the same slot").start_links.is_empty());
        let newer = state.end_storing(message(2, &peer, "e2"), true);
        assert_eq!(kinds(&newer), [(1, OutcomeKind::Superseded)]);
        assert_eq!(newer.delete, [(1, false)]);

        let late = state.acked("10.0.0.1:7000", 1, "r", "e1");
        assert!(late.outcomes.is_empty() && late.delete.is_empty(), "an ACK of the superseded one changes nothing");
        let acked = state.acked("10.0.0.1:7000", 2, "r", "e2");
        assert_eq!(kinds(&acked), [(2, OutcomeKind::Acked)]);
        assert_eq!(acked.delete, [(2, false)]);
        assert_eq!((state.held, state.bytes), (0, 0));
        assert!(state.links["10.0.0.1:7000"].unused_since.is_some(), "no destination uses the peer: it lingers");
    }

    #[test]
    fn a_failed_write_gives_its_reservation_back_and_bounds_name_what_is_full() {
        let config = OutboxConfig { max_pending: 1, ..OutboxConfig::default() };
        let peer = Destination::Peer("10.0.0.1:7000".into());
        let mut state = OutboxState::default();
        let _ = state.reserve(&SlotKey::new(&peer, "r"), 5, &config).expect("room");
        let refused = state.reserve(&SlotKey::new(&peer, "other"), 5, &config).expect_err("one slot at most");
        assert_eq!(refused, Bound::Pending { held: 1 });
        let _ = state.end_storing(message(1, &peer, "e1"), false);
        assert_eq!((state.held, state.bytes), (0, 0));
        let _ = state.reserve(&SlotKey::new(&peer, "other"), 5, &config).expect("its room is free again");
    }

    #[test]
    fn a_group_is_followed_its_new_members_get_the_current_message_and_one_that_leaves_is_told_failed() {
        let config = OutboxConfig::default();
        let group = Destination::Election { namespace: "ns".into(), name: "e".into() };
        let mut state = OutboxState::default();
        let reserved = state.reserve(&SlotKey::new(&group, "r"), 5, &config).expect("room");
        assert_eq!(reserved.follow, std::slice::from_ref(&group));
        let _ = state.end_storing(message(1, &group, "e1"), true);
        let joined = state.set_peers(&group, BTreeSet::from(["a:1".to_owned(), "b:1".to_owned()]));
        assert_eq!(joined.start_links.len(), 2);
        assert_eq!(state.links["a:1"].deliveries.len(), 1);

        let acked = state.acked("a:1", 1, "r", "e1");
        assert_eq!(acked.group_acks, [(1, "a:1".to_owned())], "a group's message stays for later members");
        assert!(acked.delete.is_empty());
        let left = state.set_peers(&group, BTreeSet::from(["a:1".to_owned()]));
        assert_eq!(kinds(&left), [(1, OutcomeKind::Failed("b:1 is no longer part of election ns/e".into()))]);
    }

    #[test]
    fn a_message_a_peer_refuses_for_good_is_failed_there_and_not_sent_to_it_again() {
        let config = OutboxConfig::default();
        let peer = Destination::Peer("10.0.0.1:7000".into());
        let mut state = OutboxState::default();
        let _ = state.reserve(&SlotKey::new(&peer, "r"), 5, &config).expect("room");
        let _ = state.end_storing(message(1, &peer, "e1"), true);
        let why = "election ns/e sent this daemon a message in term 8, and this was guarded by term 7";
        let fenced = state.fenced("10.0.0.1:7000", 1, "r", "e1", why);
        let failed = format!("10.0.0.1:7000 refused it for good: {why}");
        assert_eq!(kinds(&fenced), [(1, OutcomeKind::Failed(failed))]);
        assert_eq!(fenced.delete, [(1, false)], "a peer's message goes");
        assert!(state.links["10.0.0.1:7000"].deliveries.is_empty());
        assert_eq!((state.held, state.bytes), (0, 0));

        let group = Destination::Election { namespace: "ns".into(), name: "g".into() };
        let _ = state.reserve(&SlotKey::new(&group, "r"), 5, &config).expect("room");
        let _ = state.end_storing(message(2, &group, "e2"), true);
        let _ = state.set_peers(&group, BTreeSet::from(["a:1".to_owned(), "b:1".to_owned()]));
        let fenced = state.fenced("a:1", 2, "r", "e2", why);
        assert_eq!(fenced.outcomes.len(), 1);
        assert!(state.links["a:1"].deliveries.is_empty(), "not sent to the peer that refused it again");
        assert_eq!(state.links["b:1"].deliveries.len(), 1, "the other member still gets it");
    }
}
