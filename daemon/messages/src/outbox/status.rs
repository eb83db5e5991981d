//! What the outbox holds, for GetOutboxStatus, `consistd status` and the pending gauges.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::{Destination, Message, Outbox};

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

impl Outbox {
    /// Pending messages per destination and peer.
    pub fn status(&self) -> (Vec<DestinationStatus>, usize) {
        let state = self.lock();
        let mut out = Vec::new();
        let mut targets: Vec<&Destination> = state.destinations.keys().collect();
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
                        last_error: Some(match &destination.unresolved {
                            Some(why) => format!("{target}: {why}"),
                            None => format!("{target} has no members yet"),
                        }),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            if destination.peers.is_empty() {
                out.push(DestinationStatus {
                    destination: target.clone(),
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
                    .filter(|d| &d.message.destination == target)
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

    /// Waits up to `within` until no message is held (each ACKed, superseded or failed) and returns how
    /// many still are. On shutdown: the app's last sends get their chance to leave before the pod's store
    /// goes with the pod.
    pub async fn settle(&self, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let held = self.lock().held;
            if held == 0 || tokio::time::Instant::now() >= deadline {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Updates the pending and oldest-pending gauges every second.
    pub(super) fn spawn_gauges(&self) {
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
