//! The app's queue, with no I/O: which waiting messages are ready for a receiver (oldest first), which
//! are leased to a receiver until it ACKs or goes away, and which wait out a NACK's delay. It knows
//! messages by id only; the inbox state keeps the messages themselves.

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

use tokio::time::Instant;

/// The app's queue of message ids.
#[derive(Debug, Default)]
pub(super) struct AppQueue {
    /// Ready for a receiver, oldest first.
    ready: BTreeSet<u64>,
    /// Handed to a receiver (by id) and not ACKed or NACKed yet.
    leased: HashMap<u64, u64>,
    /// NACKed: ready again at the instant.
    delayed: BTreeSet<(Instant, u64)>,
    /// When each NACKed message is ready again: its entry in `delayed`.
    ready_at: HashMap<u64, Instant>,
    next_receiver: u64,
}

impl AppQueue {
    /// A new message, ready for a receiver.
    pub(super) fn push(&mut self, id: u64) {
        self.ready.insert(id);
    }

    /// Forgets `id` wherever it waits (ACKed).
    pub(super) fn remove(&mut self, id: u64) {
        self.ready.remove(&id);
        self.leased.remove(&id);
        if let Some(at) = self.ready_at.remove(&id) {
            self.delayed.remove(&(at, id));
        }
    }

    /// A new receiver's id.
    pub(super) fn new_receiver(&mut self) -> u64 {
        self.next_receiver += 1;
        self.next_receiver
    }

    /// Leases the oldest ready message to `receiver` at `now`, NACKed messages whose delay is over being
    /// ready again; or, with none ready, when the next NACKed one will be (None: not before a new
    /// message).
    pub(super) fn lease_next(&mut self, receiver: u64, now: Instant) -> Result<u64, Option<Instant>> {
        while let Some(&(at, id)) = self.delayed.first() {
            if at > now {
                break;
            }
            self.delayed.pop_first();
            self.ready_at.remove(&id);
            self.ready.insert(id);
        }
        match self.ready.pop_first() {
            Some(id) => {
                self.leased.insert(id, receiver);
                Ok(id)
            }
            None => Err(self.delayed.first().map(|(at, _)| *at)),
        }
    }

    /// Hands what `receiver` holds back to the ready queue; whether it held anything.
    pub(super) fn return_leases(&mut self, receiver: u64) -> bool {
        let returned: Vec<u64> = self.leased.iter().filter(|(_, r)| **r == receiver).map(|(id, _)| *id).collect();
        for id in &returned {
            self.leased.remove(id);
            self.ready.insert(*id);
        }
        !returned.is_empty()
    }

    /// Makes `id` ready again `delay` after `now`, wherever it was (leased, ready, or delayed by an
    /// earlier NACK: the later NACK decides).
    pub(super) fn nack(&mut self, id: u64, delay: Duration, now: Instant) {
        self.remove(id);
        if delay.is_zero() {
            self.ready.insert(id);
        } else {
            let at = now + delay;
            self.ready_at.insert(id, at);
            self.delayed.insert((at, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nack_while_ready_or_delayed_leaves_the_message_in_one_place() {
        let now = Instant::now();
        let mut queue = AppQueue::default();
        queue.push(1);
        queue.nack(1, Duration::from_secs(3), now);
        queue.nack(1, Duration::ZERO, now);
        let receiver = queue.new_receiver();
        assert_eq!(queue.lease_next(receiver, now), Ok(1));
        assert_eq!(queue.lease_next(receiver, now), Err(None), "not ready twice, nor still delayed");
    }

    #[test]
    fn only_the_leases_of_the_receiver_that_went_are_returned() {
        let now = Instant::now();
        let mut queue = AppQueue::default();
        (1..=3).for_each(|id| queue.push(id));
        let (a, b) = (queue.new_receiver(), queue.new_receiver());
        assert_eq!(queue.lease_next(a, now), Ok(1));
        assert_eq!(queue.lease_next(b, now), Ok(2));
        assert!(queue.return_leases(a));
        assert!(!queue.return_leases(a), "nothing left to return");
        assert_eq!(queue.lease_next(b, now), Ok(1), "1 is ready again, before 3");
        queue.remove(2);
        assert!(queue.return_leases(b), "1 was b's");
        assert_eq!(queue.lease_next(a, now), Ok(1));
        assert_eq!(queue.lease_next(a, now), Ok(3));
    }
}
