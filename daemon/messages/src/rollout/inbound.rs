//! A member's side of a channel: the leader sends each version as a message whose resource_id is
//! `consistd.rollout/<channel>` and whose event_id is the version. The inbox holds these apart from what
//! `Inbox.Receive` hands the app; they wait there until the member's app reports the version applied,
//! which ACKs them, so the leader's outbox sees them applied.

use std::sync::Arc;

use consistd_cluster::leadership::Key;

use super::{Rollout, RolloutError};
use crate::inbox::InboxMessage;

/// The resource_id prefix of rollout versions; the inbox holds messages under it for the rollout.
pub const RESOURCE_PREFIX: &str = "consistd.rollout/";

/// The resource_id of `channel`'s versions.
pub(super) fn resource_id(channel: &str) -> String {
    format!("{RESOURCE_PREFIX}{channel}")
}

/// A version that arrived from the channel's leader and waits in the inbox.
#[derive(Debug, Clone)]
pub struct Arrived {
    /// The version, parsed from the message's event_id.
    pub version: u64,
    /// The message that carried it (payload, content type, when it arrived).
    pub message: Arc<InboxMessage>,
}

impl Rollout {
    /// The versions of `key`'s channel waiting in the inbox, oldest first.
    pub fn arrived(&self, key: &Key) -> Vec<Arrived> {
        self.inbox
            .held(&resource_id(&key.name))
            .into_iter()
            .filter_map(|message| Some(Arrived { version: message.event_id.parse().ok()?, message }))
            .collect()
    }

    /// ACKs the versions of `key`'s channel waiting in the inbox that are at most `applied` (so the
    /// leader's outbox sees them applied).
    pub async fn ack_applied(&self, key: &Key, applied: u64) -> Result<(), RolloutError> {
        for arrived in self.arrived(key) {
            if arrived.version <= applied {
                self.inbox.ack(arrived.message.id).await?;
            }
        }
        Ok(())
    }
}
