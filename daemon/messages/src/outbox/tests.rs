use std::time::Duration;

use consistd_core::config::{BackoffConfig, Live};
use tokio::sync::broadcast::Receiver;

use super::*;

/// A peer nobody listens on: deliveries stay pending, so ACKs can be played by the test.
const PEER: &str = "127.0.0.1:1";

fn parts(config: OutboxConfig, tasks: &Tasks) -> OutboxParts {
    let backoff = BackoffConfig { initial: Duration::from_secs(1), factor: 2.0, cap: Duration::from_secs(5) };
    OutboxParts {
        config: Live::fixed(OutboxConfig { backoff, ..config }),
        transport: Some(Transport { tls: None, identity: "sender".to_owned() }),
        members: Members::none(),
        namespace: "ns".to_owned(),
        metrics: Metrics::new(),
        tasks: tasks.clone(),
    }
}

fn out(peer: &str, resource: &str, event: &str) -> Outgoing {
    Outgoing {
        destination: Destination::Peer(peer.to_owned()),
        resource_id: resource.to_owned(),
        event_id: event.to_owned(),
        payload: Bytes::from_static(b"{}"),
        content_type: "application/json".to_owned(),
        trace: TraceContext::default(),
        claim: None,
    }
}

async fn next(outcomes: &mut Receiver<Outcome>) -> Outcome {
    tokio::time::timeout(Duration::from_secs(5), outcomes.recv()).await.expect("an outcome in time").expect("outcome")
}

fn pending_sequences(outbox: &Outbox) -> Vec<u64> {
    let (destinations, _) = outbox.status();
    destinations.iter().flat_map(|d| d.pending.iter().map(|p| p.message.sequence)).collect()
}

#[tokio::test]
async fn a_newer_event_supersedes_and_an_ack_for_the_older_never_clears_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tasks = Tasks::new();
    let outbox =
        Outbox::open(Store::open(dir.path()).expect("store"), parts(OutboxConfig::default(), &tasks)).expect("open");
    let mut outcomes = outbox.outcomes();
    let s1 = outbox.send(out(PEER, "r", "e1")).await.expect("send e1");
    let s2 = outbox.send(out(PEER, "r", "e2")).await.expect("send e2");
    assert!(s2 > s1);
    let o = next(&mut outcomes).await;
    assert_eq!((o.message.sequence, o.kind), (s1, OutcomeKind::Superseded));
    assert_eq!(pending_sequences(&outbox), vec![s2]);

    // A late ACK for e1, and an ACK naming the wrong event, change nothing.
    outbox.acked(PEER, s1, "r", "e1");
    outbox.acked(PEER, s2, "r", "e1");
    assert_eq!(pending_sequences(&outbox), vec![s2]);

    outbox.acked(PEER, s2, "r", "e2");
    let o = next(&mut outcomes).await;
    assert_eq!((o.message.sequence, o.kind, o.peer.as_str()), (s2, OutcomeKind::Acked, PEER));
    assert_eq!(outbox.status().1, 0, "nothing held after the ACK");
    // A second ACK for the same message is ignored.
    outbox.acked(PEER, s2, "r", "e2");
    assert!(outcomes.try_recv().is_err());
    tasks.signal_stop();
}

#[tokio::test]
async fn bounds_refuse_with_a_message_naming_the_limit_and_superseding_still_works_when_full() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tasks = Tasks::new();
    let config =
        OutboxConfig { max_payload_bytes: 8, max_pending_per_destination: 2, max_pending: 3, ..Default::default() };
    let outbox = Outbox::open(Store::open(dir.path()).expect("store"), parts(config, &tasks)).expect("open");
    outbox.send(out(PEER, "a", "1")).await.expect("first");
    outbox.send(out(PEER, "b", "1")).await.expect("second");
    let e = outbox.send(out(PEER, "c", "1")).await.expect_err("destination full");
    assert!(
        matches!(&e, OutboxError::Exhausted(b @ Bound::PerDestination { .. }) if b.to_string().contains("maxPendingPerDestination")),
        "{e}"
    );
    // The same resource replaces its message: no more room needed.
    outbox.send(out(PEER, "a", "2")).await.expect("supersede while full");
    outbox.send(out("127.0.0.1:2", "a", "1")).await.expect("other destination");
    let e = outbox.send(out("127.0.0.1:3", "a", "1")).await.expect_err("outbox full");
    assert!(
        matches!(&e, OutboxError::Exhausted(b @ Bound::Pending { .. }) if b.to_string().contains("outbox.maxPending")),
        "{e}"
    );
    let mut big = out(PEER, "a", "3");
    big.payload = Bytes::from_static(b"123456789");
    let e = outbox.send(big).await.expect_err("payload too large");
    assert!(
        matches!(&e, OutboxError::Exhausted(b @ Bound::Payload { bytes: 9, .. }) if b.to_string().starts_with("payload: 9 bytes")),
        "{e}"
    );
    assert_eq!(outbox.status().1, 3);
    tasks.signal_stop();
}

#[tokio::test]
async fn the_byte_bound_counts_held_payloads_frees_them_on_ack_and_still_lets_a_message_be_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tasks = Tasks::new();
    let outbox = Outbox::open(Store::open(dir.path()).expect("store"), parts(config_of(16), &tasks)).expect("open");
    let sized = |resource: &str, event: &str, bytes: &'static [u8]| {
        let mut o = out(PEER, resource, event);
        o.payload = Bytes::from_static(bytes);
        o
    };
    let a = outbox.send(sized("a", "1", b"12345678")).await.expect("8 bytes");
    outbox.send(sized("b", "1", b"12345678")).await.expect("16 bytes");
    let e = outbox.send(sized("c", "1", b"1")).await.expect_err("17 bytes");
    assert!(
        matches!(&e, OutboxError::Exhausted(b @ Bound::PendingBytes { max: 16, .. }) if b.to_string().contains("16 payload bytes") && b.to_string().contains("outbox.maxPendingBytes (16)")),
        "{e}"
    );
    // Replacing a's message needs no more room; it frees a's bytes once stored.
    let a2 = outbox.send(sized("a", "2", b"1234")).await.expect("supersede while full");
    outbox.send(sized("c", "1", b"1234")).await.expect("the superseded message's bytes were freed");
    // An ACK frees its message's bytes.
    outbox.acked(PEER, a2, "a", "2");
    outbox.send(sized("d", "1", b"1234")).await.expect("the ACKed message's bytes were freed");
    assert!(a < a2);
    // A restart counts what it loads.
    drop(outbox);
    tasks.signal_stop();
    let tasks = Tasks::new();
    let store = crate::store::open_when_free(dir.path()).await;
    let outbox = Outbox::open(store, parts(config_of(16), &tasks)).expect("reopen");
    let e = outbox.send(sized("e", "1", b"12345")).await.expect_err("16 + 5 bytes after the restart");
    assert!(
        matches!(&e, OutboxError::Exhausted(b @ Bound::PendingBytes { .. }) if b.to_string().contains("16 payload bytes")),
        "{e}"
    );
    tasks.signal_stop();
}

fn config_of(max_pending_bytes: usize) -> OutboxConfig {
    OutboxConfig { max_payload_bytes: 8, max_pending_bytes, ..Default::default() }
}

#[tokio::test]
async fn sends_are_refused_without_a_transport_and_group_destinations_without_kubernetes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tasks = Tasks::new();
    let mut p = parts(OutboxConfig::default(), &tasks);
    p.transport = None;
    let outbox = Outbox::open(Store::open(dir.path()).expect("store"), p).expect("open");
    assert!(matches!(outbox.send(out(PEER, "a", "1")).await, Err(OutboxError::NotConfigured)));
    let dir = tempfile::tempdir().expect("temp dir");
    let outbox =
        Outbox::open(Store::open(dir.path()).expect("store"), parts(OutboxConfig::default(), &tasks)).expect("open");
    let mut group = out(PEER, "a", "1");
    group.destination = Destination::Service { namespace: "ns".into(), name: "web".into() };
    assert!(matches!(outbox.send(group).await, Err(OutboxError::Unsupported(_))));
    tasks.signal_stop();
}

#[tokio::test]
async fn stored_messages_survive_a_restart_and_sequences_never_go_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tasks = Tasks::new();
    let outbox =
        Outbox::open(Store::open(dir.path()).expect("store"), parts(OutboxConfig::default(), &tasks)).expect("open");
    let trace = TraceContext {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        tracestate: "a=1".to_owned(),
    };
    let s1 = outbox.send(Outgoing { trace: trace.clone(), ..out(PEER, "r1", "e1") }).await.expect("send");
    let s2 = outbox.send(out(PEER, "r2", "e1")).await.expect("send");
    let s3 = outbox.send(out(PEER, "r3", "e1")).await.expect("send");
    outbox.acked(PEER, s3, "r3", "e1");
    tasks.signal_stop();
    drop(outbox);

    // The store is free once the outbox's tasks have seen the shutdown.
    let tasks = Tasks::new();
    let store = crate::store::open_when_free(dir.path()).await;
    let outbox = Outbox::open(store, parts(OutboxConfig::default(), &tasks)).expect("reopen");
    assert_eq!(pending_sequences(&outbox), vec![s1, s2]);
    let (destinations, total) = outbox.status();
    assert_eq!(total, 2);
    assert_eq!(destinations[0].pending[0].message.resource_id, "r1");
    assert_eq!(destinations[0].pending[0].message.trace, trace, "its trace is kept");
    let s4 = outbox.send(out(PEER, "r4", "e1")).await.expect("send");
    assert!(s4 > s3, "{s4} must be above every earlier id ({s3})");
    tasks.signal_stop();
}

#[tokio::test]
async fn settle_waits_for_held_messages_and_says_how_many_remain() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tasks = Tasks::new();
    let outbox =
        Outbox::open(Store::open(dir.path()).expect("store"), parts(OutboxConfig::default(), &tasks)).expect("open");
    let sequence = outbox.send(out(PEER, "r", "e1")).await.expect("send");
    assert_eq!(outbox.settle(Duration::from_millis(100)).await, 1, "nobody ACKs: still held after the wait");

    let acking = outbox.clone();
    consistd_testkit::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        acking.acked(PEER, sequence, "r", "e1");
    });
    let started = std::time::Instant::now();
    assert_eq!(outbox.settle(Duration::from_secs(10)).await, 0, "the ACK settles it");
    assert!(started.elapsed() < Duration::from_secs(5), "settle returns once nothing is held");
    tasks.signal_stop();
}
