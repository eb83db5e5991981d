//! One peer's connection: dial it (mutual TLS unless configured plaintext), say who we are, send every
//! delivery that is due, apply the peer's answers (STORED, ACKED, REFUSED), and when the connection
//! breaks dial again with backoff; on every new connection everything the peer has not confirmed
//! storing is due at once.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, SystemTime},
};

use consistd_core::error::chain as error_chain;
use consistd_proto::peer::v1::{self as peer_pb, ExchangeRequest, exchange_request::Frame};
use tokio::{
    sync::{Notify, mpsc},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;

use super::{Message, Outbox, backoff, destination::split_member};
use crate::transport::Transport;

/// Frames queued towards one peer before waiting for the connection to take them.
const SEND_WINDOW: usize = 512;
/// How long a connection to a peer no destination includes any more is kept open.
pub(super) const LINK_LINGER: Duration = Duration::from_secs(60);
/// How long dialling a peer and opening the exchange (until the peer answers its Hello) may take: dialling
/// is bounded by the transport (3 s) and the peer answers within its Hello timeout (10 s), but a request
/// waiting for its answer on a connection that answers pings is bounded by nothing else.
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// The delivery state of one peer address.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) id: u64,
    /// Destinations that include this peer.
    pub(super) uses: usize,
    /// Since when no destination includes this peer: the connection is kept for [`LINK_LINGER`], so
    /// sparse sends do not pay for a new connection (and TLS handshake) each time.
    pub(super) unused_since: Option<Instant>,
    pub(super) connected: bool,
    pub(super) deliveries: BTreeMap<u64, PeerDelivery>,
    /// (due, sequence) of every delivery, earliest first.
    pub(super) schedule: BTreeSet<(Instant, u64)>,
    pub(super) wake: Arc<Notify>,
}

impl Link {
    /// A new link, used by one destination and not connected yet.
    pub(super) fn new(id: u64) -> Self {
        Self {
            id,
            uses: 1,
            unused_since: None,
            connected: false,
            deliveries: BTreeMap::new(),
            schedule: BTreeSet::new(),
            wake: Arc::new(Notify::new()),
        }
    }

    pub(super) fn add(&mut self, delivery: PeerDelivery) {
        self.schedule.insert((delivery.due, delivery.message.sequence));
        if let Some(old) = self.deliveries.insert(delivery.message.sequence, delivery) {
            self.schedule.remove(&(old.due, old.message.sequence));
        }
        self.wake.notify_one();
    }

    pub(super) fn remove(&mut self, sequence: u64) -> Option<PeerDelivery> {
        let d = self.deliveries.remove(&sequence)?;
        self.schedule.remove(&(d.due, sequence));
        Some(d)
    }

    pub(super) fn reschedule(&mut self, sequence: u64, due: Instant) {
        if let Some(d) = self.deliveries.get_mut(&sequence) {
            self.schedule.remove(&(d.due, sequence));
            d.due = due;
            d.due_wall = SystemTime::now() + due.saturating_duration_since(Instant::now());
            self.schedule.insert((due, sequence));
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct PeerDelivery {
    pub(super) message: Arc<Message>,
    pub(super) attempts: u32,
    pub(super) due: Instant,
    pub(super) due_wall: SystemTime,
    pub(super) last_error: Option<String>,
    /// The peer answered STORED: it holds the message durably and sends ACKED when its app ACKs.
    pub(super) stored: bool,
}

impl PeerDelivery {
    pub(super) fn new(message: Arc<Message>) -> Self {
        Self { message, attempts: 0, due: Instant::now(), due_wall: SystemTime::now(), last_error: None, stored: false }
    }
}

/// Runs the link `id` to `peer` until it is removed from the outbox or the daemon stops.
pub(super) async fn run(outbox: Outbox, transport: Transport, peer: String, id: u64, wake: Arc<Notify>) {
    let shutdown = outbox.inner.tasks.signal().clone();
    let mut failures = 0u32;
    loop {
        if shutdown.is_cancelled() || outbox.retire_unused(&peer, id, false) == LinkUse::Gone {
            return;
        }
        let error = match exchange(&outbox, &transport, &peer, id, &wake).await {
            Ok(()) => {
                tracing::debug!(peer, link = id, "peer link ended: its peer is no longer used, or the daemon stops");
                return;
            }
            Err(Broken { error, connected }) => {
                if connected {
                    failures = 0;
                }
                error
            }
        };
        failures += 1;
        outbox.link_down(&peer, id, &error);
        let wait = backoff::delay(&outbox.inner.config.get().backoff, failures);
        tracing::debug!(peer, error, retry_in = ?wait, "peer connection down");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Whether a link is still wanted.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LinkUse {
    /// Removed (unused past the linger, or replaced): its task ends.
    Gone,
    /// Some destination includes the peer.
    InUse,
    /// Unused; closed at this instant unless used again.
    Lingering(Instant),
}

/// Why a connection ended; `connected` when it got as far as exchanging frames.
struct Broken {
    error: String,
    connected: bool,
}

fn broken(error: String, connected: bool) -> Broken {
    Broken { error, connected }
}

/// Dials, then exchanges frames until the connection breaks (Err) or the link is gone (Ok).
async fn exchange(outbox: &Outbox, t: &Transport, peer: &str, id: u64, wake: &Notify) -> Result<(), Broken> {
    let (recipient, address) = split_member(peer);
    let (requests, frames) = mpsc::channel(SEND_WINDOW);
    let hello = peer_pb::Hello { sender: t.identity.clone(), recipient: recipient.unwrap_or_default().to_owned() };
    let hello = ExchangeRequest { frame: Some(Frame::Hello(hello)) };
    requests.send(hello).await.map_err(|_| broken("queue hello".to_owned(), false))?;
    let open = async {
        let mut client = t.connect(address, None).await.map_err(|e| broken(error_chain(&e), false))?;
        client
            .exchange(ReceiverStream::new(frames))
            .await
            .map_err(|s| broken(format!("open exchange with {peer}: {}", s.message()), false))
    };
    let mut responses = tokio::time::timeout(OPEN_TIMEOUT, open)
        .await
        .map_err(|_| broken(format!("open exchange with {peer}: no answer within {OPEN_TIMEOUT:?}"), false))??
        .into_inner();
    outbox.link_up(peer, id);
    let shutdown = outbox.inner.tasks.signal().clone();
    loop {
        let linger_until = match outbox.retire_unused(peer, id, true) {
            LinkUse::Gone => return Ok(()),
            LinkUse::InUse => None,
            LinkUse::Lingering(until) => Some(until),
        };
        let capacity = requests.capacity();
        let Some((due, next)) = outbox.take_due(peer, id, capacity) else { return Ok(()) };
        // The queue towards the connection is full (more may be due): wait for room, not for a due time
        // that has already passed, which would spin while a stalled connection takes nothing.
        let blocked = due.len() == capacity;
        for frame in due {
            // Capacity was checked above; a full queue here means the connection is gone.
            requests.try_send(frame).map_err(|_| broken(format!("send to {peer}: connection closed"), true))?;
        }
        let next = match (next, linger_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sleep = if blocked { None } else { next.map(tokio::time::sleep_until) };
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            answer = responses.message() => match answer {
                Ok(Some(r)) => outbox.disposition(peer, id, r),
                Ok(None) => return Err(broken(format!("{peer} closed the connection"), true)),
                Err(s) => return Err(broken(format!("exchange with {peer}: {}", s.message()), true)),
            },
            () = wake.notified() => {}
            () = async { if let Some(s) = sleep { s.await } else { std::future::pending().await } } => {}
            _ = requests.reserve(), if blocked => {}
        }
    }
}
