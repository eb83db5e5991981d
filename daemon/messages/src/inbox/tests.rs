use std::time::Duration;

use consistd_core::config::Live;

use super::*;

fn message(sequence: u64, resource: &str, event: &str) -> PeerMessage {
    PeerMessage {
        sequence,
        resource_id: resource.to_owned(),
        event_id: event.to_owned(),
        payload: Bytes::from_static(b"hello"),
        content_type: "text/plain".to_owned(),
        sent_at: None,
        attempt: 1,
        traceparent: String::new(),
        tracestate: String::new(),
        claim: String::new(),
    }
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn disposition(r: Option<ExchangeResponse>) -> Disposition {
    Disposition::try_from(r.expect("an answer").disposition).expect("known disposition")
}

async fn open(dir: &std::path::Path, max_pending: usize) -> Inbox {
    open_with(dir, consistd_core::config::InboxConfig { max_pending, ..Default::default() }).await
}

async fn open_with(dir: &std::path::Path, config: consistd_core::config::InboxConfig) -> Inbox {
    // A previous inbox on the same directory may still be letting go of the file.
    let store = crate::store::open_when_free(dir).await;
    Inbox::open(store, "receiver".to_owned(), Live::fixed(config), &["daemon.own/"], Metrics::new(), &Tasks::new())
        .expect("open inbox")
}

async fn next(receiver: &mut Receiver) -> (Arc<InboxMessage>, u32) {
    tokio::time::timeout(Duration::from_secs(5), receiver.next()).await.expect("a message in time")
}

#[tokio::test]
async fn a_message_is_stored_once_delivered_and_its_ack_goes_back_to_the_sender() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 100).await;
    let (tx, mut acks) = mpsc::channel(16);
    let _connection = inbox.connect("sender-a", tx);
    assert_eq!(disposition(inbox.accept("sender-a", message(7, "r", "e1")).await), Disposition::Stored);
    // A resend is recognised; the app gets the message once.
    assert_eq!(disposition(inbox.accept("sender-a", message(7, "r", "e1")).await), Disposition::Stored);
    // The same resource and event from another sender is another message.
    assert_eq!(disposition(inbox.accept("sender-b", message(7, "r", "e1")).await), Disposition::Stored);
    assert_eq!(inbox.pending(), 2);

    let mut receiver = inbox.receiver();
    let (m, attempt) = next(&mut receiver).await;
    assert_eq!((m.sender.as_str(), m.resource_id.as_str(), m.event_id.as_str(), attempt), ("sender-a", "r", "e1", 1));
    assert_eq!(&m.payload[..], b"hello");
    inbox.ack(m.id).await.expect("ack");
    let ack = acks.recv().await.expect("ACK sent back");
    assert_eq!((ack.sequence, ack.disposition), (7, Disposition::Acked as i32));
    // ACKing again is fine; a resend after the ACK is answered ACKED and not delivered again.
    inbox.ack(m.id).await.expect("ack again");
    assert_eq!(disposition(inbox.accept("sender-a", message(7, "r", "e1")).await), Disposition::Acked);
    let (m2, _) = next(&mut receiver).await;
    assert_eq!(m2.sender, "sender-b");
    assert!(matches!(inbox.ack(999).await, Err(InboxError::NotFound(999))));
}

#[tokio::test]
async fn an_ack_whose_caller_stops_waiting_is_still_applied_and_sent_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 100).await;
    let (tx, mut acks) = mpsc::channel(16);
    let _connection = inbox.connect("sender-a", tx);
    assert_eq!(disposition(inbox.accept("sender-a", message(7, "r", "e1")).await), Disposition::Stored);
    let mut receiver = inbox.receiver();
    let (m, _) = next(&mut receiver).await;
    // A cancelled Ack call: its future is polled once (its write queued) and dropped before the commit.
    let mut ack = Box::pin(inbox.ack(m.id));
    let _ = futures::poll!(ack.as_mut());
    drop(ack);
    let sent = tokio::time::timeout(Duration::from_secs(5), acks.recv()).await.expect("ACK sent back in time");
    assert_eq!(sent.map(|a| (a.sequence, a.disposition)), Some((7, Disposition::Acked as i32)));
    assert_eq!(inbox.pending(), 0, "the message is no longer held as pending");
    assert_eq!(disposition(inbox.accept("sender-a", message(7, "r", "e1")).await), Disposition::Acked);
}

#[tokio::test]
async fn the_app_is_shown_a_message_only_once_it_is_stored_and_never_one_whose_write_failed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 100).await;
    let store = inbox.inner.store.clone();
    // The writer is held inside a write, so the message's write and a failing one share the next batch,
    // as when the daemon dies before the commit (an id shown then would be given to another message by
    // the next run, and the app's retried Ack would ACK that one).
    let (entered, writer_held) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let hold = store.write("hold the writer", move |_txn| {
        let _ = entered.send(());
        let _ = released.recv();
        Ok(())
    });
    writer_held.recv_timeout(Duration::from_secs(5)).expect("the writer is held");
    let accepting = consistd_testkit::spawn({
        let inbox = inbox.clone();
        async move { inbox.accept("s", message(1, "r", "e")).await }
    });
    while inbox.lock().known(&state::DedupKey::new("s", "r", "e")) != state::Known::Storing {
        tokio::task::yield_now().await;
    }
    let mut receiver = inbox.receiver();
    let shown = tokio::time::timeout(Duration::from_millis(200), receiver.next()).await;
    assert!(shown.is_err(), "shown to the app before it was stored: {shown:?}");
    let dies = store.write("fail the batch", |_txn| -> Result<(), redb::Error> {
        Err(redb::Error::Corrupted("the disk said no".into()))
    });
    release.send(()).expect("release the writer");
    hold.await.expect("the held write");
    dies.await.expect_err("the batch fails");
    let refused = accepting.await.expect("accept").expect("an answer");
    assert_eq!(refused.disposition, Disposition::Refused as i32, "never stored");
    assert!(refused.reason.contains("the disk said no"), "{}", refused.reason);
    let shown = tokio::time::timeout(Duration::from_millis(200), receiver.next()).await;
    assert!(shown.is_err(), "shown although never stored: {shown:?}");
    assert_eq!(inbox.pending(), 0);

    // The sender's resend is stored and shown.
    assert_eq!(disposition(inbox.accept("s", message(1, "r", "e")).await), Disposition::Stored);
    let (m, attempt) = next(&mut receiver).await;
    assert_eq!((m.resource_id.as_str(), attempt), ("r", 1));
}

#[tokio::test]
async fn a_message_whose_caller_stops_waiting_is_still_shown_and_its_resend_answered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 100).await;
    // A connection's accept polled once (its write queued) and dropped before the commit.
    let mut accepting = Box::pin(inbox.accept("s", message(1, "r", "e")));
    let _ = futures::poll!(accepting.as_mut());
    drop(accepting);
    let (m, _) = next(&mut inbox.receiver()).await;
    assert_eq!(m.resource_id, "r", "the stored message is shown");
    assert_eq!(
        disposition(inbox.accept("s", message(1, "r", "e")).await),
        Disposition::Stored,
        "its resend is answered"
    );
}

#[tokio::test]
async fn the_daemons_own_messages_wait_apart_from_the_app_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 100).await;
    let arrivals = inbox.arrivals();
    inbox.accept("s", message(1, "daemon.own/x", "1")).await;
    inbox.accept("s", message(2, "daemon.own/x", "2")).await;
    inbox.accept("s", message(3, "app", "e")).await;
    assert!(arrivals.has_changed().expect("inbox alive"));
    let mut receiver = inbox.receiver();
    let (m, _) = next(&mut receiver).await;
    assert_eq!(m.resource_id, "app", "the app receives only its own messages");
    let held: Vec<String> = inbox.held("daemon.own/x").iter().map(|m| m.event_id.clone()).collect();
    assert_eq!(held, ["1", "2"], "oldest first");
    assert!(inbox.held("daemon.own/y").is_empty());
    let first = inbox.held("daemon.own/x")[0].id;
    inbox.ack(first).await.expect("ack");
    drop((receiver, inbox));
    let inbox = open(dir.path(), 100).await;
    let held: Vec<String> = inbox.held("daemon.own/x").iter().map(|m| m.event_id.clone()).collect();
    assert_eq!(held, ["2"], "restored apart from the app's, the ACKed one gone");
}

#[tokio::test]
async fn a_nacked_message_comes_back_after_its_delay_and_a_dropped_receiver_hands_its_messages_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 100).await;
    inbox.accept("s", message(1, "r", "e")).await;
    let mut first = inbox.receiver();
    let (m, attempt) = next(&mut first).await;
    assert_eq!(attempt, 1);
    let nacked = Instant::now();
    inbox.nack(m.id, Duration::from_millis(200), "busy").expect("nack");
    let (again, attempt) = next(&mut first).await;
    assert_eq!((again.id, attempt), (m.id, 2));
    assert!(nacked.elapsed() >= Duration::from_millis(200), "redelivered after {:?}", nacked.elapsed());
    // The receiver goes away without ACKing: the next one gets the message.
    drop(first);
    let mut second = inbox.receiver();
    let (again, attempt) = next(&mut second).await;
    assert_eq!((again.id, attempt), (m.id, 3));
}

#[tokio::test]
async fn a_full_inbox_refuses_and_pending_messages_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 2).await;
    inbox.accept("s", message(1, "r1", "e")).await;
    let traced =
        PeerMessage { traceparent: TRACEPARENT.to_owned(), tracestate: "a=1".to_owned(), ..message(2, "r2", "e") };
    inbox.accept("s", traced).await;
    let refused = inbox.accept("s", message(3, "r3", "e")).await.expect("answer");
    assert_eq!(refused.disposition, Disposition::Refused as i32);
    assert!(refused.reason.contains("inbox.maxPending"), "{}", refused.reason);
    let mut receiver = inbox.receiver();
    let (m, _) = next(&mut receiver).await;
    inbox.ack(m.id).await.expect("ack");
    drop(receiver);
    drop(inbox);

    let inbox = open(dir.path(), 2).await;
    assert_eq!(inbox.pending(), 1);
    let mut receiver = inbox.receiver();
    let (m, attempt) = next(&mut receiver).await;
    assert_eq!((m.resource_id.as_str(), attempt), ("r2", 1));
    assert_eq!((m.trace.traceparent.as_str(), m.trace.tracestate.as_str()), (TRACEPARENT, "a=1"), "its trace is kept");
    // The ACK of r1 survived too: its resend is not delivered again.
    assert_eq!(disposition(inbox.accept("s", message(1, "r1", "e")).await), Disposition::Acked);
}

#[tokio::test]
async fn the_inbox_refuses_past_its_byte_bound_until_the_app_acks_also_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    // "hello" is 5 bytes: two fit in 12, a third does not.
    let config = consistd_core::config::InboxConfig { max_pending: 100, max_pending_bytes: 12 };
    let inbox = open_with(dir.path(), config.clone()).await;
    assert_eq!(disposition(inbox.accept("s", message(1, "r1", "e")).await), Disposition::Stored);
    assert_eq!(disposition(inbox.accept("s", message(2, "r2", "e")).await), Disposition::Stored);
    let refused = inbox.accept("s", message(3, "r3", "e")).await.expect("answer");
    assert_eq!(refused.disposition, Disposition::Refused as i32);
    assert!(
        refused.reason.contains("10 payload bytes") && refused.reason.contains("inbox.maxPendingBytes (12)"),
        "{}",
        refused.reason
    );
    drop(inbox);
    // Reloaded messages count; an ACK frees its bytes.
    let inbox = open_with(dir.path(), config).await;
    assert_eq!(disposition(inbox.accept("s", message(3, "r3", "e")).await), Disposition::Refused);
    let mut receiver = inbox.receiver();
    let (m, _) = next(&mut receiver).await;
    inbox.ack(m.id).await.expect("ack");
    assert_eq!(disposition(inbox.accept("s", message(3, "r3", "e")).await), Disposition::Stored);
}

#[tokio::test]
async fn only_the_newest_acks_of_a_resource_are_remembered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 100).await;
    let mut receiver = inbox.receiver();
    use record::REMEMBERED_ACKS;
    for i in 0..(REMEMBERED_ACKS as u64 + 4) {
        inbox.accept("s", message(i + 1, "r", &format!("e{i}"))).await;
        let (m, _) = next(&mut receiver).await;
        inbox.ack(m.id).await.expect("ack");
        // Distinct ACK times keep the order unambiguous.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let remembered = inbox
        .inner
        .store
        .read("count", |txn| {
            let seen = txn.open_table(record::SEEN)?;
            Ok(seen.range(("s", "r", "")..)?.count())
        })
        .expect("read");
    assert_eq!(remembered, REMEMBERED_ACKS);
    // The newest is still recognised.
    let last = format!("e{}", REMEMBERED_ACKS + 3);
    assert_eq!(disposition(inbox.accept("s", message(99, "r", &last)).await), Disposition::Acked);
}

#[tokio::test]
async fn acks_given_while_the_sender_is_away_are_sent_when_it_reconnects() {
    let dir = tempfile::tempdir().expect("temp dir");
    let inbox = open(dir.path(), 100).await;
    let (tx, rx) = mpsc::channel(16);
    let connection = inbox.connect("s", tx);
    inbox.accept("s", message(5, "r", "e")).await;
    drop(connection);
    drop(rx);
    let mut receiver = inbox.receiver();
    let (m, _) = next(&mut receiver).await;
    inbox.ack(m.id).await.expect("ack while the sender is away");
    let (tx, mut acks) = mpsc::channel(16);
    let _connection = inbox.connect("s", tx);
    let ack = acks.recv().await.expect("the ACK on the new connection");
    assert_eq!((ack.sequence, ack.disposition), (5, Disposition::Acked as i32));
}

#[tokio::test]
async fn a_message_of_an_older_term_than_one_stored_is_refused_for_good_also_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let claimed = |sequence: u64, event: &str, claim: &str| PeerMessage {
        claim: claim.to_owned(),
        ..message(sequence, "r", event)
    };
    {
        let inbox = open(dir.path(), 100).await;
        assert_eq!(disposition(inbox.accept("old-leader", claimed(1, "e1", "ns/e/7")).await), Disposition::Stored);
        assert_eq!(disposition(inbox.accept("new-leader", claimed(1, "e2", "ns/e/8")).await), Disposition::Stored);
        let late = inbox.accept("old-leader", claimed(2, "e3", "ns/e/7")).await.expect("an answer");
        assert_eq!(late.disposition, Disposition::Fenced as i32);
        assert_eq!(late.reason, "election ns/e sent this daemon a message in term 8, and this was guarded by term 7");
        // A resend of what was stored before the later term arrived is still that message.
        assert_eq!(disposition(inbox.accept("old-leader", claimed(1, "e1", "ns/e/7")).await), Disposition::Stored);
        // Another election, an unguarded message, and a malformed claim.
        assert_eq!(disposition(inbox.accept("x", claimed(1, "e4", "ns/f/1")).await), Disposition::Stored);
        assert_eq!(disposition(inbox.accept("x", message(2, "r", "e5")).await), Disposition::Stored);
        assert_eq!(disposition(inbox.accept("x", claimed(3, "e6", "ns/e")).await), Disposition::Fenced);
        assert_eq!(inbox.pending(), 4, "nothing refused reaches the app");
        let mut receiver = inbox.receiver();
        let (first, _) = next(&mut receiver).await;
        assert_eq!(first.claim, Some(Claim { namespace: "ns".into(), lease: "e".into(), term: 7 }));
    }
    // The newest term is stored with the message that carried it.
    let inbox = open(dir.path(), 100).await;
    assert_eq!(disposition(inbox.accept("old-leader", claimed(3, "e7", "ns/e/7")).await), Disposition::Fenced);
    assert_eq!(disposition(inbox.accept("new-leader", claimed(2, "e8", "ns/e/9")).await), Disposition::Stored);
}
