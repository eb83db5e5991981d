//! First outcomes, for WaitOutcome: which stored messages still wait for their first outcome, who waits
//! for it, and the first outcome of the last [`KEPT`] messages that had one.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use tokio::sync::oneshot;

use super::{Message, Outcome};

/// First outcomes kept in memory; an older one is forgotten (WaitOutcome answers NOT_FOUND for it).
pub const KEPT: usize = 10_000;

/// What is known of one message's first outcome.
#[derive(Debug, Clone)]
pub(super) enum FirstOutcome {
    /// It had one: this (the message without its payload).
    Known(Outcome),
    /// It is stored and has had none yet.
    Awaited,
    /// It had one that is no longer kept, or it was never stored.
    Unknown,
}

/// The messages waiting for their first outcome and the first outcomes kept.
#[derive(Debug, Default)]
pub(super) struct Settled {
    /// Stored messages that have had no outcome yet.
    awaited: HashSet<u64>,
    /// First outcomes by message, without payloads.
    first: HashMap<u64, Outcome>,
    /// The keys of `first`, oldest first.
    order: VecDeque<u64>,
    /// Callers waiting for an awaited message's first outcome.
    waiters: HashMap<u64, Vec<oneshot::Sender<Outcome>>>,
}

impl Settled {
    /// Message `sequence` is stored and its first outcome is still to come.
    pub(super) fn expect(&mut self, sequence: u64) {
        if !self.first.contains_key(&sequence) {
            self.awaited.insert(sequence);
        }
    }

    /// Keeps `outcome` if it is its message's first, hands it to those waiting for it, and forgets the
    /// oldest kept beyond [`KEPT`].
    pub(super) fn record(&mut self, outcome: &Outcome) {
        let sequence = outcome.message.sequence;
        if !self.awaited.remove(&sequence) && self.first.contains_key(&sequence) {
            return;
        }
        for waiter in self.waiters.remove(&sequence).unwrap_or_default() {
            let _ = waiter.send(outcome.clone());
        }
        let message = Arc::new(Message { payload: bytes::Bytes::new(), ..(*outcome.message).clone() });
        self.first.insert(sequence, Outcome { message, ..outcome.clone() });
        self.order.push_back(sequence);
        while self.order.len() > KEPT {
            if let Some(oldest) = self.order.pop_front() {
                self.first.remove(&oldest);
            }
        }
    }

    /// A receiver of awaited message `sequence`'s first outcome; waiters that gave up are dropped here.
    pub(super) fn wait(&mut self, sequence: u64) -> oneshot::Receiver<Outcome> {
        let (tx, rx) = oneshot::channel();
        let waiters = self.waiters.entry(sequence).or_default();
        waiters.retain(|w| !w.is_closed());
        waiters.push(tx);
        rx
    }

    /// What is known of message `sequence`'s first outcome.
    pub(super) fn of(&self, sequence: u64) -> FirstOutcome {
        if let Some(outcome) = self.first.get(&sequence) {
            FirstOutcome::Known(outcome.clone())
        } else if self.awaited.contains(&sequence) {
            FirstOutcome::Awaited
        } else {
            FirstOutcome::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::outbox::{Destination, OutcomeKind};

    fn outcome(sequence: u64, kind: OutcomeKind) -> Outcome {
        let message = Arc::new(Message {
            sequence,
            destination: Destination::Peer("peer:1".into()),
            resource_id: "r".into(),
            event_id: format!("e{sequence}"),
            payload: bytes::Bytes::from_static(b"body"),
            content_type: String::new(),
            trace: Default::default(),
            claim: None,
            enqueued_at: SystemTime::now(),
        });
        Outcome { message, peer: "peer:1".into(), kind, at: SystemTime::now() }
    }

    #[test]
    fn the_first_outcome_is_kept_without_its_payload_and_later_ones_do_not_replace_it() {
        let mut settled = Settled::default();
        settled.expect(1);
        assert!(matches!(settled.of(1), FirstOutcome::Awaited));
        assert!(matches!(settled.of(2), FirstOutcome::Unknown));
        let mut waiting = settled.wait(1);
        drop(settled.wait(1));
        assert_eq!(settled.waiters[&1].len(), 2);
        drop(settled.wait(1));
        assert_eq!(settled.waiters[&1].len(), 2, "a waiter that gave up is dropped when another comes");
        settled.record(&outcome(1, OutcomeKind::Acked));
        assert_eq!(waiting.try_recv().expect("the waiter got the outcome").kind, OutcomeKind::Acked);
        assert!(settled.waiters.is_empty());
        settled.record(&outcome(1, OutcomeKind::Failed("left".into())));
        settled.expect(1);
        let FirstOutcome::Known(first) = settled.of(1) else { panic!("message 1 has an outcome") };
        assert_eq!(first.kind, OutcomeKind::Acked);
        assert!(first.message.payload.is_empty());
    }

    #[test]
    fn only_the_last_kept_first_outcomes_are_remembered() {
        let mut settled = Settled::default();
        for sequence in 1..=(KEPT as u64 + 1) {
            settled.expect(sequence);
            settled.record(&outcome(sequence, OutcomeKind::Superseded));
        }
        assert!(matches!(settled.of(1), FirstOutcome::Unknown));
        assert!(matches!(settled.of(2), FirstOutcome::Known(_)));
        assert!(matches!(settled.of(KEPT as u64 + 1), FirstOutcome::Known(_)));
    }
}
