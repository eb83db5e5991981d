//! How the outbox keeps messages on disk: the record of each message by sequence number, the peers
//! that ACKed a group message, and the next sequence number; read back at startup, where per slot the
//! newest message wins.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use bytes::Bytes;
use consistd_core::claim::Claim;
use consistd_observe::telemetry::TraceContext;
use consistd_proto::v1 as pb;
use redb::{ReadableTable, TableDefinition};

use super::{Destination, Message};
use crate::store::{META, Store, StoreError, from_millis, to_millis};

/// Stored messages by sequence number.
const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox_messages");
/// Which peers ACKed a Service or election message: (sequence, peer address).
const GROUP_ACKS: TableDefinition<(u64, &str), ()> = TableDefinition::new("outbox_group_acks");
/// The key in [`META`] of the next sequence number, which never goes back.
const NEXT_SEQUENCE: &str = "outbox.next_sequence";

/// The on-disk form of a message.
#[derive(Clone, PartialEq, prost::Message)]
struct OutboxRecord {
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
    #[prost(string, tag = "7")]
    traceparent: String,
    #[prost(string, tag = "8")]
    tracestate: String,
    /// The claim it was sent under, as `Claim` writes it; empty for none.
    #[prost(string, tag = "9")]
    claim: String,
}

fn encode(m: &Message) -> Vec<u8> {
    use prost::Message as _;
    OutboxRecord {
        destination: Some(m.destination.to_pb()),
        resource_id: m.resource_id.clone(),
        event_id: m.event_id.clone(),
        payload: m.payload.clone(),
        content_type: m.content_type.clone(),
        enqueued_at_ms: to_millis(m.enqueued_at),
        traceparent: m.trace.traceparent.clone(),
        tracestate: m.trace.tracestate.clone(),
        claim: Claim::carried(m.claim.as_ref()),
    }
    .encode_to_vec()
}

/// What the store held at startup.
#[derive(Debug)]
pub(super) struct Stored {
    /// Every message record by sequence number, undecoded.
    records: Vec<(u64, Vec<u8>)>,
    /// (sequence, peer) of every group ACK.
    acks: Vec<(u64, String)>,
    /// The next sequence number to give out: above every one ever given.
    pub(super) next_sequence: u64,
}

/// Reads every stored message, the group ACKs and the next sequence number.
pub(super) fn load(store: &Store) -> Result<Stored, StoreError> {
    store.read("load the outbox", |txn| {
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
        let next_sequence = match txn.open_table(META) {
            Ok(t) => t.get(NEXT_SEQUENCE)?.map_or(1, |v| v.value()),
            Err(_) => 1,
        };
        Ok(Stored { records, acks, next_sequence: next_sequence.max(1) })
    })
}

/// Stores `message` durably, and moves the next sequence number past it.
pub(super) fn store_message(store: &Store, message: &Message) -> impl Future<Output = Result<(), StoreError>> + use<> {
    let sequence = message.sequence;
    let record = encode(message);
    store.write("store outbox message", move |txn| {
        txn.open_table(MESSAGES)?.insert(sequence, record.as_slice())?;
        let mut meta = txn.open_table(META)?;
        let next = meta.get(NEXT_SEQUENCE)?.map_or(0, |v| v.value());
        if next <= sequence {
            meta.insert(NEXT_SEQUENCE, sequence + 1)?;
        }
        Ok(())
    })
}

/// Records that `peer` ACKed group message `sequence`. Losing this write to a crash only means a
/// resend to that peer, which its inbox answers with ACKED.
pub(super) fn record_group_ack(store: &Store, sequence: u64, peer: String) {
    store.write_detached("record group ACK", move |txn| {
        txn.open_table(GROUP_ACKS)?.insert((sequence, peer.as_str()), ())?;
        Ok(())
    });
}

/// What [`decode`] found in the store.
#[derive(Debug)]
pub(super) struct Restored {
    /// The newest message of each slot, with the peers that ACKed it.
    pub(super) messages: Vec<(Arc<Message>, BTreeSet<String>)>,
    /// Older messages of a slot, left by a crash between storing a newer event and deleting the older:
    /// to delete.
    pub(super) stale: Vec<u64>,
}

/// The stored messages to put back (per slot the newest wins) and the stale ones. A record that cannot
/// be read is logged and stays on disk, not delivered.
pub(super) fn decode(stored: Stored, namespace: &str) -> Restored {
    use prost::Message as _;
    let Stored { records, acks, .. } = stored;
    let mut acked: HashMap<u64, BTreeSet<String>> = HashMap::new();
    for (seq, peer) in acks {
        acked.entry(seq).or_default().insert(peer);
    }
    let mut newest: BTreeMap<(Destination, String), Arc<Message>> = BTreeMap::new();
    let mut stale = Vec::new();
    for (sequence, bytes) in records {
        let record = match OutboxRecord::decode(bytes.as_slice()) {
            Ok(r) => r,
            Err(error) => {
                tracing::error!(sequence, %error, "unreadable outbox record kept on disk, not delivered");
                continue;
            }
        };
        let target = match Destination::from_pb(record.destination.as_ref(), namespace) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(sequence, field = e.field, error = %e.message, "outbox record with a bad destination kept on disk, not delivered");
                continue;
            }
        };
        let claim = match Claim::parse_carried(&record.claim) {
            Ok(claim) => claim,
            Err(error) => {
                tracing::error!(sequence, %error, "outbox record with a bad claim kept on disk, not delivered");
                continue;
            }
        };
        let message = Arc::new(Message {
            sequence,
            destination: target.clone(),
            resource_id: record.resource_id,
            event_id: record.event_id,
            payload: record.payload,
            content_type: record.content_type,
            trace: TraceContext { traceparent: record.traceparent, tracestate: record.tracestate },
            claim,
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
    let messages = newest
        .into_values()
        .map(|message| {
            let acked_by = acked.remove(&message.sequence).unwrap_or_default();
            (message, acked_by)
        })
        .collect();
    Restored { messages, stale }
}

/// Deletes messages (and, with `group`, their group ACKs) from the store. Losing this write to a crash
/// only means a resend, which the receiver answers with ACKED from its deduplication.
pub(super) fn delete(store: &Store, sequences: Vec<u64>, group: bool) {
    store.write_detached("delete finished outbox messages", move |txn| {
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
