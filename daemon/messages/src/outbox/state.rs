//! The outbox's bookkeeping: per (destination, resource_id) the one current message, per destination
//! its peers and how many slots it holds; the bounds `Send` checks; installing a stored message over an
//! older one, an ACK settling it, and a group destination whose peers change.

use std::{
    collections::BTreeSet,
    sync::{Arc, atomic::Ordering},
};

use super::{Bound, Destination, Message, Outbox, OutboxError, OutboxState, OutcomeKind, link::PeerDelivery, members};

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
    /// Stops following the group's members when the destination is dropped.
    pub(super) _members: Option<members::Following>,
    /// Why the group's members cannot be read (e.g. RBAC grants no list on endpointslices), until they are.
    pub(super) unresolved: Option<String>,
}

impl Outbox {
    /// Checks the bounds and reserves the slot and the message's `bytes`; returns the new message's
    /// sequence number.
    pub(super) fn reserve(&self, key: &(Destination, String), bytes: usize) -> Result<u64, OutboxError> {
        let config = self.inner.config.get();
        let mut state = self.lock();
        let state = &mut *state;
        // A message that supersedes one frees that one's bytes once it is stored (both are held meanwhile:
        // at most one payload more per Send in flight), so a full outbox can still replace its messages.
        let replaced = state.slots.get(key).and_then(|s| s.current.as_ref()).map_or(0, |m| m.payload.len());
        if (state.bytes + bytes).saturating_sub(replaced) > config.max_pending_bytes {
            return Err(OutboxError::Exhausted(Bound::PendingBytes {
                held: state.bytes,
                bytes,
                max: config.max_pending_bytes,
            }));
        }
        let occupied = state.slots.get(key).is_some_and(|s| s.current.is_some() || s.storing > 0);
        if !occupied {
            let in_destination = state.destinations.get(&key.0).map_or(0, |d| d.held);
            if in_destination >= config.max_pending_per_destination {
                return Err(OutboxError::Exhausted(Bound::PerDestination {
                    destination: key.0.to_string(),
                    held: in_destination,
                }));
            }
            if state.held >= config.max_pending {
                return Err(OutboxError::Exhausted(Bound::Pending { held: state.held }));
            }
            self.ensure_destination(state, &key.0);
            state.held += 1;
            if let Some(d) = state.destinations.get_mut(&key.0) {
                d.held += 1;
            }
        }
        state.slots.entry(key.clone()).or_default().storing += 1;
        state.bytes += bytes;
        Ok(self.inner.next_sequence.fetch_add(1, Ordering::SeqCst))
    }

    /// Makes a stored message its slot's current one, superseding an older current message; a message
    /// older than the current one is itself superseded at once. The message's bytes were counted in
    /// `state.bytes` before; a superseded message's are taken out.
    pub(super) fn install(&self, state: &mut OutboxState, message: Arc<Message>) {
        let key = (message.destination.clone(), message.resource_id.clone());
        let Some(slot) = state.slots.get_mut(&key) else {
            state.bytes -= message.payload.len();
            return;
        };
        if slot.current.as_ref().is_some_and(|c| c.sequence > message.sequence) {
            state.bytes -= message.payload.len();
            self.outcome(&message, "", OutcomeKind::Superseded);
            self.delete(vec![message.sequence], message.destination.is_group());
            return;
        }
        let restored_acks = std::mem::take(&mut slot.acked_by);
        let old = slot.current.replace(message.clone());
        // Acks loaded from the store belong to the message being restored, not to a new one.
        slot.acked_by = if old.is_none() { restored_acks } else { BTreeSet::new() };
        let acked_by = slot.acked_by.clone();
        let peers = state.destinations.get(&message.destination).map(|d| d.peers.clone()).unwrap_or_default();
        for peer in peers {
            let Some(link) = state.links.get_mut(&peer) else { continue };
            if let Some(old) = &old {
                link.remove(old.sequence);
            }
            if !acked_by.contains(&peer) {
                link.add(PeerDelivery::new(message.clone()));
            }
        }
        if let Some(old) = old {
            state.bytes -= old.payload.len();
            tracing::debug!(
                message_id = old.sequence,
                destination = %old.destination,
                resource_id = %old.resource_id,
                event_id = %old.event_id,
                superseded_by = %message.event_id,
                "message superseded"
            );
            self.inner.metrics.outbox_superseded.inc();
            self.outcome(&old, "", OutcomeKind::Superseded);
            self.delete(vec![old.sequence], old.destination.is_group());
        }
    }

    /// Frees a slot that holds nothing and is not being stored into.
    pub(super) fn release_if_empty(&self, state: &mut OutboxState, key: &(Destination, String)) {
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
    pub(super) fn ensure_destination(&self, state: &mut OutboxState, target: &Destination) {
        if state.destinations.contains_key(target) {
            return;
        }
        let (peers, following) = match target {
            Destination::Peer(p) => (BTreeSet::from([p.clone()]), None),
            group => (BTreeSet::new(), Some(self.inner.members.follow(group, self.clone()))),
        };
        for peer in &peers {
            self.use_link(state, peer);
        }
        state.destinations.insert(target.clone(), Recipients { peers, held: 0, _members: following, unresolved: None });
    }

    /// A group destination's peers changed: new peers get every current message of the destination,
    /// peers that left are reported FAILED for what they had not ACKed.
    pub(crate) fn set_peers(&self, target: &Destination, peers: BTreeSet<String>) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(destination) = state.destinations.get_mut(target) else { return };
        destination.unresolved = None;
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
                    link.add(PeerDelivery::new(m.clone()));
                }
            }
        }
        if old != peers {
            tracing::info!(destination = %target, peers = ?peers, "destination members changed");
        }
    }

    /// A group destination's members cannot be read: `why`, for GetOutboxStatus, until they are.
    pub(super) fn set_unresolved(&self, target: &Destination, why: String) {
        if let Some(destination) = self.lock().destinations.get_mut(target) {
            destination.unresolved = Some(why);
        }
    }

    /// A peer's app ACKed (sequence, resource_id, event_id). An ACK that does not match the message
    /// the peer still has to ACK (older, superseded, or from another sender store) changes nothing.
    pub(super) fn acked(&self, peer: &str, sequence: u64, resource_id: &str, event_id: &str) {
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
            destination = %message.destination,
            peer,
            resource_id,
            event_id,
            attempt = delivery.attempts,
            "message ACKed"
        );
        self.outcome(&message, peer, OutcomeKind::Acked);
        let key = (message.destination.clone(), message.resource_id.clone());
        let Some(slot) = state.slots.get_mut(&key) else { return };
        if slot.current.as_ref().map(|c| c.sequence) != Some(sequence) {
            return;
        }
        if message.destination.is_group() {
            // The newest message of a group destination stays for members that join later.
            slot.acked_by.insert(peer.to_owned());
            self.record_group_ack(sequence, peer);
        } else {
            slot.current = None;
            state.bytes -= message.payload.len();
            self.release_if_empty(state, &key);
            self.delete(vec![sequence], false);
        }
    }
}
