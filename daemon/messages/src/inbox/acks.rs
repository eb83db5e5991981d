//! The ACK path back, with no I/O: each sender's open connection, to send its ACKs on, and the ACKs
//! given while it was away, kept for its next connection.

use std::collections::{HashMap, VecDeque};

use consistd_proto::peer::v1::ExchangeResponse;
use tokio::sync::mpsc;

/// ACKs kept per disconnected sender; beyond that the oldest wait for the sender's next resend,
/// which is answered ACKED from the deduplication record.
const UNSENT_ACKS: usize = 65_536;

/// Where each sender's ACKs go.
#[derive(Debug, Default)]
pub(super) struct AckRoutes {
    /// The newest open connection of each sender: (its id, where its answers go).
    senders: HashMap<String, (u64, mpsc::Sender<ExchangeResponse>)>,
    /// ACKs given while their sender was not connected, sent when it connects again.
    unsent: HashMap<String, VecDeque<ExchangeResponse>>,
    next_connection: u64,
}

impl AckRoutes {
    /// `sender` connected on `tx`: its id (ACKs go there while it is the sender's newest), and the
    /// ACKs kept while the sender was away, to send on it now.
    pub(super) fn connect(
        &mut self,
        sender: &str,
        tx: mpsc::Sender<ExchangeResponse>,
    ) -> (u64, VecDeque<ExchangeResponse>) {
        self.next_connection += 1;
        let id = self.next_connection;
        self.senders.insert(sender.to_owned(), (id, tx));
        (id, self.unsent.remove(sender).unwrap_or_default())
    }

    /// `sender`'s connection `id` closed; a newer one of the same sender stays.
    pub(super) fn disconnect(&mut self, sender: &str, id: u64) {
        if self.senders.get(sender).is_some_and(|(newest, _)| *newest == id) {
            self.senders.remove(sender);
        }
    }

    /// Where an ACK for `sender` goes: its open connection, to send it on; or, with none open, it is
    /// kept (the oldest of more than [`UNSENT_ACKS`] dropped) for when the sender connects again.
    pub(super) fn route(
        &mut self,
        sender: &str,
        ack: ExchangeResponse,
    ) -> Option<(mpsc::Sender<ExchangeResponse>, ExchangeResponse)> {
        match self.senders.get(sender) {
            Some((_, tx)) if !tx.is_closed() => Some((tx.clone(), ack)),
            _ => {
                let unsent = self.unsent.entry(sender.to_owned()).or_default();
                if unsent.len() >= UNSENT_ACKS {
                    unsent.pop_front();
                }
                unsent.push_back(ack);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_for_an_absent_sender_wait_for_its_next_connection() {
        let mut routes = AckRoutes::default();
        let ack = ExchangeResponse { sequence: 7, ..Default::default() };
        assert!(routes.route("sender", ack).is_none(), "no connection: kept");
        let (tx, _rx) = mpsc::channel(1);
        let (old, unsent) = routes.connect("sender", tx.clone());
        assert_eq!(unsent.iter().map(|a| a.sequence).collect::<Vec<_>>(), [7]);
        let (new, _) = routes.connect("sender", tx);
        routes.disconnect("sender", old);
        assert!(routes.route("sender", ExchangeResponse::default()).is_some(), "the newer connection stays");
        routes.disconnect("sender", new);
        assert!(routes.route("sender", ExchangeResponse::default()).is_none());
    }

    #[test]
    fn a_closed_connection_keeps_its_acks_and_the_oldest_go_past_the_bound() {
        let mut routes = AckRoutes::default();
        let (tx, rx) = mpsc::channel(1);
        routes.connect("sender", tx);
        drop(rx);
        for sequence in 0..=UNSENT_ACKS as u64 {
            assert!(routes.route("sender", ExchangeResponse { sequence, ..Default::default() }).is_none());
        }
        let (tx, _rx) = mpsc::channel(1);
        let (_, unsent) = routes.connect("sender", tx);
        assert_eq!(unsent.len(), UNSENT_ACKS);
        assert_eq!(unsent.front().map(|a| a.sequence), Some(1), "the oldest went");
    }
}
