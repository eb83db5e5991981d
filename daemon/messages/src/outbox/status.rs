//! What the outbox holds, for GetOutboxStatus, `consistd status` and the pending gauges.

use std::{sync::Arc, time::SystemTime};

use super::{Destination, Message, state::OutboxState};

/// One peer's view of a message it still has to ACK.
#[derive(Debug, Clone)]
pub struct PendingDelivery {
    /// The message waiting for this peer's ACK.
    pub message: Arc<Message>,
    /// Times it was sent to this peer so far; 0 while the destination has no peer.
    pub attempts: u32,
    /// When the next attempt is due.
    pub next_attempt_at: SystemTime,
    /// The last error, if any.
    pub last_error: Option<String>,
}

/// The pending messages of one destination at one peer.
#[derive(Debug, Clone)]
pub struct DestinationStatus {
    /// The destination as the app named it (peer address, Service or election).
    pub destination: Destination,
    /// The peer address; empty while the destination has no peer.
    pub peer: String,
    /// Whether a connection to the peer is up.
    pub connected: bool,
    /// Messages that peer has not ACKed, oldest first.
    pub pending: Vec<PendingDelivery>,
}

/// Pending messages per destination and peer, and the slots held in all.
pub(super) fn of(state: &OutboxState) -> (Vec<DestinationStatus>, usize) {
    let mut out = Vec::new();
    let mut targets: Vec<&Destination> = state.destinations.keys().collect();
    targets.sort();
    for target in targets {
        let destination = &state.destinations[target];
        if destination.peers.is_empty() {
            let why = match &destination.unresolved {
                Some(why) => format!("{target}: {why}"),
                None => format!("{target} has no members yet"),
            };
            let pending = state
                .current_of(target)
                .into_iter()
                .map(|message| PendingDelivery {
                    message,
                    attempts: 0,
                    next_attempt_at: SystemTime::now(),
                    last_error: Some(why.clone()),
                })
                .collect();
            out.push(DestinationStatus { destination: target.clone(), peer: String::new(), connected: false, pending });
        }
        for peer in &destination.peers {
            let Some((link, deliveries)) = state.deliveries_of(target, peer) else { continue };
            let pending = deliveries
                .map(|d| PendingDelivery {
                    message: d.message.clone(),
                    attempts: d.attempts,
                    next_attempt_at: d.due_wall,
                    last_error: d.last_error.clone(),
                })
                .collect();
            out.push(DestinationStatus {
                destination: target.clone(),
                peer: peer.clone(),
                connected: link.connected,
                pending,
            });
        }
    }
    (out, state.held)
}
