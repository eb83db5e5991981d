//! The inbox's stored form: its tables, an inbound message's record, the deduplication record of every
//! (sender, resource_id, event_id) and how much of it is kept, and the newest claim of each election.

use std::{collections::HashMap, time::SystemTime};

use bytes::Bytes;
use consistd_core::claim::Claim;
use consistd_observe::telemetry::TraceContext;
use prost::Message as _;
use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::{DedupKey, InboxMessage};
use crate::store::{META, Store, StoreError, from_millis, to_millis};

/// Messages waiting for the app, by inbox id.
const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("inbox_messages");
/// (sender, resource_id, event_id) -> (inbox id, ACK time in ms since the epoch; 0 while pending).
pub(super) const SEEN: TableDefinition<(&str, &str, &str), (u64, u64)> = TableDefinition::new("inbox_seen");
const NEXT_ID: &str = "inbox.next_id";
/// Election (`<lease namespace>/<lease name>`) -> the highest term of a claim a stored message carried.
const CLAIMS: TableDefinition<&str, u64> = TableDefinition::new("inbox_claims");

/// ACKed events remembered per (sender, resource_id) for deduplication. A sender resends only the
/// newest event of a resource, so an event this far back is never sent again.
pub(super) const REMEMBERED_ACKS: usize = 16;

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
    /// The claim it was sent under, as `Claim` writes it; empty for none.
    #[prost(string, tag = "10")]
    claim: String,
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
            claim: Claim::carried(m.claim.as_ref()),
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
            claim: Claim::parse_carried(&self.claim).ok().flatten(),
            received_at: from_millis(self.received_at_ms),
        }
    }
}

/// What the store holds for the inbox: the messages still waiting for an ACK, the next inbox id, and the
/// newest term of each election a stored message claimed.
pub(super) struct Loaded {
    pub(super) messages: Vec<InboxMessage>,
    pub(super) next_id: u64,
    pub(super) claims: HashMap<String, u64>,
}

/// Reads the messages still waiting; an unreadable record is logged and stays on disk, not delivered.
pub(super) fn load(store: &Store) -> Result<Loaded, StoreError> {
    let (records, next_id, claims) = store.read("load the inbox", |txn| {
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
        let mut claims = HashMap::new();
        if let Ok(table) = txn.open_table(CLAIMS) {
            for entry in table.iter()? {
                let (election, term) = entry?;
                claims.insert(election.value().to_owned(), term.value());
            }
        }
        Ok((records, next, claims))
    })?;
    let messages = records
        .into_iter()
        .filter_map(|(id, bytes)| match InboxRecord::decode(bytes.as_slice()) {
            Ok(record) => Some(record.into_message(id)),
            Err(_) => {
                tracing::error!(message_id = id, "unreadable inbox record kept on disk, not delivered");
                None
            }
        })
        .collect();
    Ok(Loaded { messages, next_id: next_id.max(1), claims })
}

/// Writes a received message, its pending deduplication record, the next id past it, and its claim's term
/// when it is the newest of its election.
pub(super) fn write_received(txn: &WriteTransaction, message: &InboxMessage) -> Result<(), redb::Error> {
    let (id, record) = (message.id, InboxRecord::of(message).encode_to_vec());
    if let Some(claim) = &message.claim {
        let mut claims = txn.open_table(CLAIMS)?;
        let election = claim.election();
        if claims.get(election.as_str())?.is_none_or(|t| t.value() < claim.term) {
            claims.insert(election.as_str(), claim.term)?;
        }
    }
    let seen_key = (message.sender.as_str(), message.resource_id.as_str(), message.event_id.as_str());
    txn.open_table(SEEN)?.insert(seen_key, (id, 0))?;
    txn.open_table(MESSAGES)?.insert(id, record.as_slice())?;
    let mut meta = txn.open_table(META)?;
    if meta.get(NEXT_ID)?.map_or(0, |v| v.value()) <= id {
        meta.insert(NEXT_ID, id + 1)?;
    }
    Ok(())
}

/// Writes the app's ACK of `message`: the message goes, its deduplication record says when it was
/// ACKed, and only the newest [`REMEMBERED_ACKS`] ACKed events of its resource are remembered.
pub(super) fn write_ack(txn: &WriteTransaction, message: &InboxMessage) -> Result<(), redb::Error> {
    let (sender, resource_id) = (message.sender.as_str(), message.resource_id.as_str());
    txn.open_table(MESSAGES)?.remove(message.id)?;
    let mut seen = txn.open_table(SEEN)?;
    seen.insert((sender, resource_id, message.event_id.as_str()), (message.id, to_millis(SystemTime::now()).max(1)))?;
    forget_old_acks(&mut seen, sender, resource_id)
}

/// Whether the app ACKed the message of `key` before (an ACK in progress is for a message still in memory).
pub(super) fn acked_before(store: &Store, key: &DedupKey) -> Result<bool, StoreError> {
    store.read("read deduplication record", |txn| {
        let seen = match txn.open_table(SEEN) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        Ok(seen
            .get((key.sender.as_str(), key.resource_id.as_str(), key.event_id.as_str()))?
            .is_some_and(|v| v.value().1 > 0))
    })
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
