//! ACK-tracked sends between real daemons on loopback: delivery to the peer's app and the ACK back,
//! mutual TLS, latest-wins per resource, peers that are not up yet, an absent or NACKing app, bounds,
//! bad input, Service fan-out through EndpointSlices, metrics and structured logs, and the W3C trace
//! context a message was sent under reaching the receiving app through kill -9 of both daemons, and the
//! streaming SendStream and AckStream: answered in order, refusals that leave the stream going, stored
//! before answered.

use std::time::Duration;

use consistd_client::proto::{
    AckOutcome, AckRequest, AckStreamRequest, AckStreamResponse, Destination, GetOutboxStatusRequest, InboxMessage,
    NackRequest, ReceiveRequest, SendRequest, SendStreamRequest, SendStreamResponse, ServiceDestination,
    WaitOutcomeRequest, WatchAcksRequest, WatchAcksResponse, destination::Target,
};
use consistd_testkit::{Daemon, free_port, tls::Ca};
use nix::sys::signal::Signal;
use tonic::{Code, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const WAIT: Duration = Duration::from_secs(20);
/// Fast retries, so tests about reconnecting take milliseconds.
const BACKOFF: &str = "outbox:\n  backoff: {initial: 20ms, factor: 2, cap: 500ms}\n";

/// A daemon that receives from peers on a free loopback port (plaintext), and its address.
async fn receiver(identity: &str, extra: &str) -> (Daemon, String) {
    receiver_on("127.0.0.1".parse().expect("ip"), identity, extra).await
}

/// A receiving daemon listening on `ip`.
async fn receiver_on(ip: std::net::IpAddr, identity: &str, extra: &str) -> (Daemon, String) {
    let addr = std::net::SocketAddr::new(ip, free_port());
    let config = format!("identity: {identity}\npeer:\n  listen: \"{addr}\"\n  insecure: true\n{extra}");
    (Daemon::builder(BIN).config(config).start().await, addr.to_string())
}

/// A daemon that only sends (plaintext).
async fn sender(identity: &str, extra: &str) -> Daemon {
    let config = format!("identity: {identity}\npeer:\n  insecure: true\n{BACKOFF}{extra}");
    Daemon::builder(BIN).config(config).start().await
}

fn to_peer(peer: &str, resource: &str, event: &str, payload: &[u8]) -> SendRequest {
    SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(peer.to_owned())) }),
        resource_id: resource.to_owned(),
        event_id: event.to_owned(),
        payload: payload.to_vec(),
        content_type: "application/json".to_owned(),
        ..Default::default()
    }
}

async fn send(daemon: &Daemon, request: SendRequest) -> String {
    daemon.client().outbox().send(request).await.expect("Send").into_inner().message_id
}

async fn inbox(daemon: &Daemon) -> Streaming<consistd_client::proto::ReceiveResponse> {
    daemon.client().inbox().receive(ReceiveRequest {}).await.expect("Receive").into_inner()
}

async fn next_message(stream: &mut Streaming<consistd_client::proto::ReceiveResponse>) -> InboxMessage {
    let item = tokio::time::timeout(WAIT, stream.message()).await.expect("a message in time");
    item.expect("Receive stream").expect("stream open").message.expect("message set")
}

async fn acks(daemon: &Daemon) -> Streaming<WatchAcksResponse> {
    daemon.client().outbox().watch_acks(WatchAcksRequest::default()).await.expect("WatchAcks").into_inner()
}

async fn next_outcome(stream: &mut Streaming<WatchAcksResponse>) -> WatchAcksResponse {
    let item = tokio::time::timeout(WAIT, stream.message()).await.expect("an outcome in time");
    item.expect("WatchAcks stream").expect("stream open")
}

async fn ack(daemon: &Daemon, message_id: &str) {
    daemon.client().inbox().ack(AckRequest { message_id: message_id.to_owned() }).await.expect("Ack");
}

async fn metrics(daemon: &Daemon) -> String {
    let body = consistd_server::admin::get(daemon.admin_socket(), "/metrics").await.expect("GET /metrics").1;
    String::from_utf8_lossy(&body).into_owned()
}

async fn total_pending(daemon: &Daemon) -> u64 {
    daemon
        .client()
        .outbox()
        .get_outbox_status(GetOutboxStatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .total_pending
}

#[tokio::test]
async fn a_message_reaches_the_peers_app_and_its_ack_comes_back() {
    let (b, b_addr) = receiver("receiver-b", "").await;
    let a = Daemon::builder(BIN)
        .config(format!("identity: sender-a\npeer:\n  insecure: true\n{BACKOFF}"))
        .env("CONSISTD_LOG_FORMAT", "json")
        .start()
        .await;
    let mut outcomes = acks(&a).await;
    let mut messages = inbox(&b).await;

    let id = send(&a, to_peer(&b_addr, "uid-1", "rv-7", br#"{"spec":1}"#)).await;
    let m = next_message(&mut messages).await;
    assert_eq!(
        (m.sender.as_str(), m.resource_id.as_str(), m.event_id.as_str(), m.payload.as_slice()),
        ("sender-a", "uid-1", "rv-7", br#"{"spec":1}"#.as_slice())
    );
    assert_eq!((m.content_type.as_str(), m.delivery_attempt), ("application/json", 1));
    assert_eq!(total_pending(&a).await, 1, "held until the app ACKs");
    ack(&b, &m.message_id).await;

    let o = next_outcome(&mut outcomes).await;
    assert_eq!(o.outcome(), AckOutcome::Acked);
    assert_eq!(
        (o.message_id.as_str(), o.peer.as_str(), o.resource_id.as_str()),
        (id.as_str(), b_addr.as_str(), "uid-1")
    );
    assert_eq!(o.destination.and_then(|d| d.target), Some(Target::Peer(b_addr.clone())));
    assert_eq!(total_pending(&a).await, 0);

    // Metrics count it on both sides.
    let sent = metrics(&a).await;
    for line in ["consistd_outbox_sends_total 1", "consistd_outbox_acks_total 1"] {
        assert!(sent.contains(line), "{line} missing from:\n{sent}");
    }
    // Whether a resend happened depends on how fast the peer answered; the counters are there.
    for name in
        ["consistd_outbox_retries_total ", "consistd_outbox_oldest_pending_seconds ", "consistd_peer_connections "]
    {
        assert!(sent.contains(name), "{name} missing from:\n{sent}");
    }
    let received = metrics(&b).await;
    for line in ["consistd_inbox_received_total 1", "consistd_inbox_acks_total 1", "consistd_inbox_pending 0"] {
        assert!(received.contains(line), "{line} missing from:\n{received}");
    }

    // A later message to the same peer reuses the connection (it lingers after the last ACK).
    send(&a, to_peer(&b_addr, "uid-2", "rv-1", b"again")).await;
    let m = next_message(&mut messages).await;
    ack(&b, &m.message_id).await;
    assert_eq!(next_outcome(&mut outcomes).await.outcome(), AckOutcome::Acked);
    assert_eq!(b.logs().matches("peer connected").count(), 1, "one connection:\n{}", b.logs());

    // Logs carry the message's identity as fields.
    let logs = a.logs();
    let acked = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["message"] == "message ACKed")
        .unwrap_or_else(|| panic!("no 'message ACKed' line in:\n{logs}"));
    let f = &acked;
    assert_eq!((f["resource_id"].as_str(), f["event_id"].as_str()), (Some("uid-1"), Some("rv-7")), "{acked}");
    assert_eq!(f["destination"].as_str(), Some(format!("peer {b_addr}").as_str()), "{acked}");
    // The delivery attempt that was ACKed (a resend if the peer answered after the first backoff).
    assert!(f["attempt"].as_u64().is_some_and(|a| a >= 1), "{acked}");
}

#[tokio::test]
async fn peers_talk_mutual_tls_and_refuse_strangers() {
    let pki = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("consistd test CA");
    let a_certs = ca.issue("consistd", &pki.path().join("a"));
    let b_certs = ca.issue("consistd", &pki.path().join("b"));
    let port = free_port();
    let b_addr = format!("127.0.0.1:{port}");
    let b = Daemon::builder(BIN)
        .config(format!("identity: b\npeer:\n  listen: 127.0.0.1:{port}\n{}", b_certs.yaml("consistd")))
        .start()
        .await;
    let a =
        Daemon::builder(BIN).config(format!("identity: a\npeer:\n{}{BACKOFF}", a_certs.yaml("consistd"))).start().await;
    let mut messages = inbox(&b).await;
    send(&a, to_peer(&b_addr, "r", "e", b"over TLS")).await;
    let m = next_message(&mut messages).await;
    assert_eq!((m.sender.as_str(), m.payload.as_slice()), ("a", b"over TLS".as_slice()));
    ack(&b, &m.message_id).await;

    // A daemon with a certificate from another CA, and one speaking plaintext, get nothing through;
    // their messages stay pending with the error.
    let other = Ca::new("another CA").issue("consistd", &pki.path().join("stranger"));
    let stranger =
        Daemon::builder(BIN).config(format!("identity: s\npeer:\n{}{BACKOFF}", other.yaml("consistd"))).start().await;
    let plain = sender("p", "").await;
    for d in [&stranger, &plain] {
        send(d, to_peer(&b_addr, "r", "e2", b"should not arrive")).await;
    }
    let arrived = tokio::time::timeout(Duration::from_secs(2), messages.message()).await;
    assert!(arrived.is_err(), "a stranger's message was delivered: {arrived:?}");
    for d in [&stranger, &plain] {
        let status =
            d.client().outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status").into_inner();
        let dest = &status.destinations[0];
        assert!(!dest.connected, "{status:?}");
        assert!(!dest.pending[0].last_error.is_empty(), "{status:?}");
        assert!(dest.pending[0].attempts == 0, "never sent: {status:?}");
    }
    assert!(b.logs().contains("peer connected"), "the TLS peer connected");
}

#[tokio::test]
async fn a_newer_event_supersedes_an_unacked_one_and_an_old_ack_never_clears_the_newer() {
    let (b, b_addr) = receiver("b", "").await;
    let a = sender("a", "").await;
    let mut outcomes = acks(&a).await;
    let mut messages = inbox(&b).await;
    let first = send(&a, to_peer(&b_addr, "uid", "rv-1", b"1")).await;
    let m1 = next_message(&mut messages).await;
    assert_eq!(m1.event_id, "rv-1");

    let second = send(&a, to_peer(&b_addr, "uid", "rv-2", b"2")).await;
    let o = next_outcome(&mut outcomes).await;
    assert_eq!((o.message_id.as_str(), o.outcome()), (first.as_str(), AckOutcome::Superseded));
    let m2 = next_message(&mut messages).await;
    assert_eq!(m2.event_id, "rv-2");

    // The app ACKs the older event: the sender still waits for rv-2.
    ack(&b, &m1.message_id).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = a.client().outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status").into_inner();
    let pending: Vec<&str> =
        status.destinations.iter().flat_map(|d| d.pending.iter().map(|p| p.event_id.as_str())).collect();
    assert_eq!(pending, vec!["rv-2"], "{status:?}");

    ack(&b, &m2.message_id).await;
    let o = next_outcome(&mut outcomes).await;
    assert_eq!((o.message_id.as_str(), o.event_id.as_str(), o.outcome()), (second.as_str(), "rv-2", AckOutcome::Acked));
    assert_eq!(total_pending(&a).await, 0);
}

/// WaitOutcome for `message_id`, bounded by `deadline` (the call's own gRPC deadline).
async fn wait_outcome(
    daemon: &Daemon,
    message_id: &str,
    deadline: Duration,
) -> Result<WatchAcksResponse, tonic::Status> {
    let mut request = tonic::Request::new(WaitOutcomeRequest { message_id: message_id.to_owned() });
    request.set_timeout(deadline);
    let answer = daemon.client().outbox().wait_outcome(request).await?.into_inner();
    Ok(answer.outcome.expect("an outcome"))
}

#[tokio::test]
async fn wait_outcome_answers_a_messages_first_outcome_when_it_comes_or_at_once_and_across_a_restart() {
    let (a_dir, b_dir) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let b_addr = format!("127.0.0.1:{}", free_port());
    let b_config = format!("identity: b\npeer:\n  listen: {b_addr}\n  insecure: true\n");
    let a_config = format!("identity: a\npeer:\n  insecure: true\n{BACKOFF}");
    let b = Daemon::builder(BIN).config(&b_config).dir(b_dir.path()).start().await;
    let mut a = Daemon::builder(BIN).config(&a_config).dir(a_dir.path()).start().await;
    let mut messages = inbox(&b).await;

    // A wait that starts before the outcome gets it when it comes: rv-2 supersedes rv-1.
    let first = send(&a, to_peer(&b_addr, "uid", "rv-1", b"1")).await;
    next_message(&mut messages).await;
    let waiting = consistd_testkit::spawn({
        let (a, first) = (a.client(), first.clone());
        async move {
            let request = WaitOutcomeRequest { message_id: first };
            a.outbox().wait_outcome(request).await.map(|r| r.into_inner().outcome.expect("an outcome"))
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "WaitOutcome answered before rv-1 had an outcome");
    let second = send(&a, to_peer(&b_addr, "uid", "rv-2", b"2")).await;
    let o = tokio::time::timeout(WAIT, waiting).await.expect("in time").expect("task").expect("WaitOutcome");
    assert_eq!(
        (o.message_id.as_str(), o.event_id.as_str(), o.outcome()),
        (first.as_str(), "rv-1", AckOutcome::Superseded)
    );
    // Asked again, the kept outcome is answered at once.
    let again = wait_outcome(&a, &first, WAIT).await.expect("WaitOutcome");
    assert_eq!((again.outcome(), again.resource_id.as_str()), (AckOutcome::Superseded, "uid"));

    // The call's deadline bounds a wait; calling again after it waits on and gets the ACK.
    let m2 = next_message(&mut messages).await;
    let cut = wait_outcome(&a, &second, Duration::from_millis(200)).await.expect_err("no outcome yet");
    // (tonic's client ends the call itself at its deadline, with CANCELLED.)
    assert!(matches!(cut.code(), Code::DeadlineExceeded | Code::Cancelled), "{cut:?}");
    ack(&b, &m2.message_id).await;
    let o = wait_outcome(&a, &second, WAIT).await.expect("WaitOutcome");
    assert_eq!((o.outcome(), o.peer.as_str(), o.event_id.as_str()), (AckOutcome::Acked, b_addr.as_str(), "rv-2"));

    // A message still pending when the sender restarts is waited for after it; one settled before is
    // NOT_FOUND, saying why.
    let third = send(&a, to_peer(&b_addr, "other", "rv-1", b"3")).await;
    let m3 = next_message(&mut messages).await;
    a.signal(Signal::SIGKILL);
    a.wait_exit(WAIT).await;
    let a = Daemon::builder(BIN).config(&a_config).dir(a_dir.path()).start().await;
    let gone = wait_outcome(&a, &second, WAIT).await.expect_err("settled before the restart");
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    assert!(gone.message().contains("before this daemon started"), "{gone:?}");
    ack(&b, &m3.message_id).await;
    let o = wait_outcome(&a, &third, WAIT).await.expect("WaitOutcome after the restart");
    assert_eq!((o.message_id.as_str(), o.outcome()), (third.as_str(), AckOutcome::Acked));

    // Bad ids are refused naming the field.
    let bad = wait_outcome(&a, "rv-1", WAIT).await.expect_err("not an id");
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().starts_with("message_id: "), "{bad:?}");
    let unknown = wait_outcome(&a, "999999999", WAIT).await.expect_err("never sent");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    assert!(unknown.message().starts_with("message_id: 999999999 is not"), "{unknown:?}");
}

#[tokio::test]
async fn messages_for_a_peer_that_is_not_up_yet_are_kept_and_delivered_when_it_comes() {
    let a = sender("a", "").await;
    let port = free_port();
    let b_addr = format!("127.0.0.1:{port}");
    let mut outcomes = acks(&a).await;
    for i in 0..5 {
        send(&a, to_peer(&b_addr, &format!("r{i}"), "e", b"early")).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = a.client().outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status").into_inner();
    assert_eq!(status.total_pending, 5);
    assert!(!status.destinations[0].connected);
    assert!(status.destinations[0].pending[0].last_error.contains(&b_addr), "{status:?}");
    // `consistd status` (the admin report) shows the same.
    let report = consistd_server::admin::fetch_report(a.admin_socket()).await.expect("report");
    assert_eq!((report.outbox_pending, report.peers.len()), (5, 1), "{report:?}");
    assert_eq!(
        (report.peers[0].peer.as_str(), report.peers[0].connected, report.peers[0].pending),
        (b_addr.as_str(), false, 5)
    );
    assert!(
        consistd_core::report::render(&report).contains("NOT CONNECTED, 5 not ACKed"),
        "{}",
        consistd_core::report::render(&report)
    );

    let b = Daemon::builder(BIN)
        .config(format!("identity: b\npeer:\n  listen: 127.0.0.1:{port}\n  insecure: true\n"))
        .start()
        .await;
    let mut messages = inbox(&b).await;
    let mut got = Vec::new();
    for _ in 0..5 {
        let m = next_message(&mut messages).await;
        ack(&b, &m.message_id).await;
        got.push(m.resource_id);
    }
    got.sort();
    assert_eq!(got, vec!["r0", "r1", "r2", "r3", "r4"]);
    for _ in 0..5 {
        assert_eq!(next_outcome(&mut outcomes).await.outcome(), AckOutcome::Acked);
    }
}

#[tokio::test]
async fn messages_wait_for_an_absent_app_and_come_back_after_a_nack_or_a_dropped_receiver() {
    let (b, b_addr) = receiver("b", "").await;
    let a = sender("a", "").await;
    send(&a, to_peer(&b_addr, "r", "e", b"waits")).await;
    // Nobody receives on b for a while: the message is kept.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(total_pending(&a).await, 1);

    let mut messages = inbox(&b).await;
    let m = next_message(&mut messages).await;
    assert_eq!((m.payload.as_slice(), m.delivery_attempt), (b"waits".as_slice(), 1));
    let nacked = std::time::Instant::now();
    b.client()
        .inbox()
        .nack(NackRequest {
            message_id: m.message_id.clone(),
            retry_after: Some(prost_types::Duration { seconds: 0, nanos: 300_000_000 }),
            reason: "database busy".to_owned(),
        })
        .await
        .expect("Nack");
    let again = next_message(&mut messages).await;
    assert!(nacked.elapsed() >= Duration::from_millis(300), "redelivered after {:?}", nacked.elapsed());
    assert_eq!((again.message_id.as_str(), again.delivery_attempt), (m.message_id.as_str(), 2));

    // The app goes away without ACKing; the next receiver gets the message.
    drop(messages);
    let mut messages = inbox(&b).await;
    let again = next_message(&mut messages).await;
    assert_eq!((again.message_id.as_str(), again.delivery_attempt), (m.message_id.as_str(), 3));
    ack(&b, &again.message_id).await;
    for _ in 0..100 {
        if total_pending(&a).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the sender never saw the ACK");
}

#[tokio::test]
async fn a_flood_past_the_receivers_inbox_byte_bound_is_refused_until_its_app_drains_it_and_nothing_is_lost() {
    // b's inbox holds 64 KiB of payloads; its app is away. a sends ten messages of 16 KiB.
    let (b, b_addr) = receiver("b", "outbox:\n  maxPayloadBytes: 16384\ninbox:\n  maxPendingBytes: 65536\n").await;
    let a = sender("a", "").await;
    let mut outcomes = acks(&a).await;
    let mut ids = std::collections::BTreeMap::new();
    for i in 0..10 {
        let resource = format!("r{i}");
        ids.insert(send(&a, to_peer(&b_addr, &resource, "e", &[b'x'; 16384])).await, resource);
    }
    // Four fit; the rest are refused, naming the bound, and wait at a.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let status = a.client().outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status");
        let status = status.into_inner();
        let errors: Vec<&str> =
            status.destinations.iter().flat_map(|d| &d.pending).map(|m| m.last_error.as_str()).collect();
        if errors.iter().any(|e| e.contains("inbox.maxPendingBytes (65536)")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no refusal naming inbox.maxPendingBytes: {status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = consistd_server::admin::fetch_report(b.admin_socket()).await.expect("b's admin report").inbox_pending;
    assert_eq!(held, 4, "64 KiB of 16 KiB payloads");

    // b's app comes and ACKs what it gets: all ten arrive, each once, and every ACK reaches a.
    let mut messages = inbox(&b).await;
    let mut received = Vec::new();
    while received.len() < 10 {
        let m = next_message(&mut messages).await;
        ack(&b, &m.message_id).await;
        received.push(m.resource_id);
    }
    received.sort();
    let mut expected: Vec<String> = ids.values().cloned().collect();
    expected.sort();
    assert_eq!(received, expected, "each message once");
    let mut acked = std::collections::BTreeSet::new();
    while acked.len() < 10 {
        let o = next_outcome(&mut outcomes).await;
        assert_eq!(o.outcome(), AckOutcome::Acked, "{o:?}");
        acked.insert(o.message_id);
    }
    assert_eq!(acked.into_iter().collect::<Vec<_>>(), ids.keys().cloned().collect::<Vec<_>>());
    assert_eq!(total_pending(&a).await, 0);
}

#[tokio::test]
async fn bounds_answer_resource_exhausted_naming_the_limit() {
    let a = sender("a", "  maxPayloadBytes: 1024\n  maxPendingPerDestination: 2\n  maxPending: 3\n").await;
    let mut outbox = a.client().outbox();
    let nobody = "127.0.0.1:1";
    send(&a, to_peer(nobody, "r1", "e", b"x")).await;
    send(&a, to_peer(nobody, "r2", "e", b"x")).await;
    let e = outbox.send(to_peer(nobody, "r3", "e", b"x")).await.expect_err("destination full");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("peer 127.0.0.1:1") && e.message().contains("maxPendingPerDestination"), "{e:?}");
    // A newer event of a held resource still fits.
    send(&a, to_peer(nobody, "r1", "e2", b"x")).await;
    send(&a, to_peer("127.0.0.1:2", "r1", "e", b"x")).await;
    let e = outbox.send(to_peer("127.0.0.1:3", "r1", "e", b"x")).await.expect_err("outbox full");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("outbox.maxPending"), "{e:?}");
    let e = outbox.send(to_peer(nobody, "r1", "e3", &[0; 1025])).await.expect_err("payload too large");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().starts_with("payload: 1025 bytes"), "{e:?}");
    assert_eq!(total_pending(&a).await, 3, "refused sends stored nothing");
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field() {
    let a = sender("a", "").await;
    let mut outbox = a.client().outbox();
    let good = to_peer("127.0.0.1:1", "r", "e", b"");
    let cases: Vec<(SendRequest, &str)> = vec![
        (SendRequest { destination: None, ..good.clone() }, "destination"),
        (to_peer("no-port", "r", "e", b""), "destination.peer"),
        (to_peer("10.0.0.1:0", "r", "e", b""), "destination.peer"),
        (SendRequest { resource_id: String::new(), ..good.clone() }, "resource_id"),
        (SendRequest { event_id: "a\nb".to_owned(), ..good.clone() }, "event_id"),
        (SendRequest { event_id: "x".repeat(2000), ..good.clone() }, "event_id"),
        (SendRequest { content_type: "y".repeat(300), ..good.clone() }, "content_type"),
        (SendRequest { traceparent: "00-nope".to_owned(), ..good.clone() }, "traceparent"),
        (
            SendRequest { traceparent: TRACEPARENT.to_owned(), tracestate: "a=1,".repeat(200), ..good.clone() },
            "tracestate",
        ),
        (
            SendRequest {
                destination: Some(Destination {
                    target: Some(Target::Service(ServiceDestination {
                        namespace: String::new(),
                        name: "Web!".to_owned(),
                    })),
                }),
                ..good.clone()
            },
            "destination.service.name",
        ),
    ];
    for (request, field) in cases {
        let e = outbox.send(request).await.expect_err(field);
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        assert!(e.message().starts_with(&format!("{field}:")), "{field}: {e:?}");
    }
    let mut inbox = a.client().inbox();
    let e = inbox.ack(AckRequest { message_id: "abc".to_owned() }).await.expect_err("bad id");
    assert_eq!((e.code(), e.message().starts_with("message_id:")), (Code::InvalidArgument, true), "{e:?}");
    let e = inbox.ack(AckRequest { message_id: "424242".to_owned() }).await.expect_err("unknown id");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = inbox
        .nack(NackRequest {
            message_id: "1".to_owned(),
            retry_after: Some(prost_types::Duration { seconds: -1, nanos: 0 }),
            reason: String::new(),
        })
        .await
        .expect_err("negative delay");
    assert_eq!((e.code(), e.message().starts_with("retry_after:")), (Code::InvalidArgument, true), "{e:?}");

    // Without a peer transport, Send says what to configure.
    let bare = Daemon::builder(BIN).start().await;
    let e = bare.client().outbox().send(good).await.expect_err("no transport");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("peer.tls"), "{e:?}");
    // The daemon is unharmed.
    assert_eq!(total_pending(&a).await, 0);
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A Send of `resource` whose call carries `metadata` as its `traceparent` header.
fn under_trace(mut request: SendRequest, resource: &str, metadata: &str) -> tonic::Request<SendRequest> {
    request.resource_id = resource.to_owned();
    let mut request = tonic::Request::new(request);
    request.metadata_mut().insert("traceparent", metadata.parse().expect("metadata value"));
    request.metadata_mut().insert("tracestate", "vendor=from-metadata".parse().expect("metadata value"));
    request
}

#[tokio::test]
async fn a_message_carries_the_trace_it_was_sent_under_through_kill_9_of_both_daemons() {
    let (a_dir, b_dir) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let port = free_port();
    let b_addr = format!("127.0.0.1:{port}");
    let a_config = format!("identity: a\npeer:\n  insecure: true\n{BACKOFF}");
    let b_config = format!("identity: b\npeer:\n  listen: {b_addr}\n  insecure: true\n");
    let mut a = Daemon::builder(BIN).config(&a_config).dir(a_dir.path()).start().await;
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let base = to_peer(&b_addr, "", "e", b"traced");
    let mut outbox = a.client().outbox();
    // From the call's metadata (what OpenTelemetry's gRPC instrumentation sets).
    outbox.send(under_trace(base.clone(), "from-metadata", TRACEPARENT)).await.expect("Send");
    // From the request, which wins over the metadata.
    let given = SendRequest { traceparent: other.to_owned(), tracestate: "vendor=given".to_owned(), ..base.clone() };
    outbox.send(under_trace(given, "from-request", TRACEPARENT)).await.expect("Send");
    // A malformed header is ignored, as W3C says, and the message is sent under no trace.
    outbox.send(under_trace(base.clone(), "malformed", "00-not-a-trace")).await.expect("Send");
    outbox.send(to_peer(&b_addr, "untraced", "e", b"")).await.expect("Send");

    // The sender dies with the messages in its outbox only; the receiver dies with them in its inbox only.
    a.signal(Signal::SIGKILL);
    a.wait_exit(WAIT).await;
    let mut b = Daemon::builder(BIN).config(&b_config).dir(b_dir.path()).start().await;
    let _a = Daemon::builder(BIN).config(&a_config).dir(a_dir.path()).start().await;
    let deadline = std::time::Instant::now() + WAIT;
    while !metrics(&b).await.contains("\nconsistd_inbox_pending 4\n") {
        assert!(std::time::Instant::now() < deadline, "the 4 messages never reached b's inbox:\n{}", b.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.signal(Signal::SIGKILL);
    b.wait_exit(WAIT).await;
    let b = Daemon::builder(BIN).config(&b_config).dir(b_dir.path()).start().await;

    let mut messages = inbox(&b).await;
    let mut got = std::collections::BTreeMap::new();
    for _ in 0..4 {
        let m = next_message(&mut messages).await;
        ack(&b, &m.message_id).await;
        got.insert(m.resource_id, (m.traceparent, m.tracestate));
    }
    let want = |p: &str, s: &str| (p.to_owned(), s.to_owned());
    assert_eq!(got["from-metadata"], want(TRACEPARENT, "vendor=from-metadata"));
    assert_eq!(got["from-request"], want(other, "vendor=given"));
    assert_eq!(got["malformed"], want("", ""));
    assert_eq!(got["untraced"], want("", ""));
}

/// Sends `requests` on one SendStream and returns its answers, in order.
async fn send_stream(daemon: &Daemon, requests: Vec<SendRequest>) -> Vec<SendStreamResponse> {
    send_stream_requests(
        daemon,
        requests.into_iter().map(|message| SendStreamRequest { message: Some(message) }).collect(),
    )
    .await
}

/// Sends `requests` as they are on one SendStream and returns its answers, in order.
async fn send_stream_requests(daemon: &Daemon, requests: Vec<SendStreamRequest>) -> Vec<SendStreamResponse> {
    let stream = daemon.client().outbox().send_stream(futures::stream::iter(requests)).await.expect("SendStream");
    collect(stream.into_inner()).await
}

/// ACKs `ids` on one AckStream and returns its answers, in order.
async fn ack_stream(daemon: &Daemon, ids: Vec<String>) -> Vec<AckStreamResponse> {
    let requests = futures::stream::iter(ids.into_iter().map(|message_id| AckStreamRequest { message_id }));
    let stream = daemon.client().inbox().ack_stream(requests).await.expect("AckStream");
    collect(stream.into_inner()).await
}

/// Every answer of a stream, which must end cleanly.
async fn collect<T>(mut stream: Streaming<T>) -> Vec<T> {
    let mut answers = Vec::new();
    while let Some(answer) = tokio::time::timeout(WAIT, stream.message()).await.expect("answers in time").expect("ok") {
        answers.push(answer);
    }
    answers
}

#[tokio::test]
async fn a_send_stream_answers_each_message_in_order_and_an_ack_stream_acks_them() {
    let (b, addr) = receiver("stream-receiver", "").await;
    let a = sender("stream-sender", "").await;
    let mut outcomes = acks(&a).await;
    let requests: Vec<_> = (0..500).map(|i| to_peer(&addr, &format!("r{i}"), "1", b"{}")).collect();
    let answers = send_stream(&a, requests).await;
    assert_eq!(answers.len(), 500, "one answer per message");
    let ids: Vec<u64> = answers
        .iter()
        .map(|a| {
            assert_eq!(a.refusal, None);
            a.message_id.parse().expect("a message id")
        })
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "answered in request order: {ids:?}");

    let mut messages = inbox(&b).await;
    let mut received = Vec::new();
    for _ in 0..500 {
        received.push(next_message(&mut messages).await);
    }
    let mut resources: Vec<_> = received.iter().map(|m| m.resource_id.clone()).collect();
    resources.sort();
    resources.dedup();
    assert_eq!(resources.len(), 500, "each message received once");
    let received_ids: Vec<String> = received.iter().map(|m| m.message_id.clone()).collect();
    let answers = ack_stream(&b, received_ids.clone()).await;
    let answered: Vec<_> = answers.iter().map(|a| a.message_id.clone()).collect();
    assert_eq!(answered, received_ids, "ACKs answered in request order");
    assert!(answers.iter().all(|a| a.refusal.is_none()), "{answers:?}");

    let mut acked = std::collections::BTreeSet::new();
    while acked.len() < 500 {
        let o = next_outcome(&mut outcomes).await;
        assert_eq!(o.outcome(), AckOutcome::Acked, "{o:?}");
        acked.insert(o.message_id);
    }
    assert_eq!(acked, ids.iter().map(u64::to_string).collect(), "every message ACKed");
    assert_eq!(total_pending(&a).await, 0);
}

#[tokio::test]
async fn a_refused_message_or_ack_is_answered_with_its_refusal_and_the_stream_goes_on() {
    let (b, addr) = receiver("refusing-receiver", "").await;
    let a = sender("refusing-sender", "  maxPayloadBytes: 16\n").await;
    let answers = send_stream_requests(
        &a,
        [
            Some(to_peer(&addr, "first", "1", b"{}")),
            Some(to_peer(&addr, "", "1", b"{}")),
            Some(to_peer(&addr, "big", "1", &[b'x'; 17])),
            Some(SendRequest { traceparent: "00-bad".to_owned(), ..to_peer(&addr, "traced", "1", b"{}") }),
            None,
            Some(to_peer(&addr, "last", "1", b"{}")),
        ]
        .into_iter()
        .map(|message| SendStreamRequest { message })
        .collect(),
    )
    .await;
    let refusals: Vec<_> =
        answers.iter().map(|a| a.refusal.as_ref().map(|r| (Code::from(r.code), r.message.clone()))).collect();
    assert_eq!(refusals[0], None);
    assert_eq!(refusals[1], Some((Code::InvalidArgument, "resource_id: must not be empty".to_owned())));
    let (code, message) = refusals[2].clone().expect("refused");
    assert_eq!(code, Code::ResourceExhausted);
    assert!(message.contains("outbox.maxPayloadBytes"), "{message}");
    let (code, message) = refusals[3].clone().expect("refused");
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.starts_with("traceparent: "), "{message}");
    assert_eq!(refusals[4], Some((Code::InvalidArgument, "message: must be set".to_owned())));
    assert_eq!(refusals[5], None, "the stream goes on after refusals");
    assert!(answers.iter().all(|a| a.refusal.is_some() == a.message_id.is_empty()), "{answers:?}");

    assert_eq!(total_pending(&a).await, 2, "only the two answered with an id were stored");

    let mut messages = inbox(&b).await;
    // Two resources travel independently: either may arrive first.
    let (one, two) = (next_message(&mut messages).await, next_message(&mut messages).await);
    let mut resources = [one.resource_id.as_str(), two.resource_id.as_str()];
    resources.sort_unstable();
    assert_eq!(resources, ["first", "last"]);
    let answers =
        ack_stream(&b, vec![one.message_id.clone(), "nope".to_owned(), "999999".to_owned(), two.message_id.clone()])
            .await;
    let refusals: Vec<_> = answers.iter().map(|a| a.refusal.as_ref().map(|r| Code::from(r.code))).collect();
    assert_eq!(refusals, vec![None, Some(Code::InvalidArgument), Some(Code::NotFound), None]);
    assert!(answers[1].refusal.as_ref().expect("refused").message.starts_with("message_id: "), "{answers:?}");
    let deadline = std::time::Instant::now() + WAIT;
    while total_pending(&a).await != 0 {
        assert!(std::time::Instant::now() < deadline, "the two ACKs never reached the sender");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_send_stream_stores_before_it_answers_and_later_events_supersede_earlier_ones_in_stream_order() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let config = format!("identity: durable-streamer\npeer:\n  insecure: true\n{BACKOFF}");
    let mut a = Daemon::builder(BIN).config(&config).dir(dir.path()).start().await;
    // Ten events of each of twenty resources, interleaved, to a peer that is not up.
    let requests: Vec<_> = (0..10)
        .flat_map(|e| (0..20).map(move |r| (r, e)))
        .map(|(r, e)| to_peer(&addr, &format!("r{r}"), &e.to_string(), b"{}"))
        .collect();
    let answers = send_stream(&a, requests).await;
    assert!(answers.iter().all(|a| a.refusal.is_none()), "{answers:?}");
    assert_eq!(total_pending(&a).await, 20, "per resource only the newest event is kept");

    // Everything answered survives kill -9, and the newest event of each resource is what arrives.
    a.signal(Signal::SIGKILL);
    a.wait_exit(WAIT).await;
    let _a = Daemon::builder(BIN).config(&config).dir(dir.path()).start().await;
    let b_config = format!("identity: durable-receiver\npeer:\n  listen: \"{addr}\"\n  insecure: true\n");
    let b = Daemon::builder(BIN).config(b_config).start().await;
    let mut messages = inbox(&b).await;
    let mut got = std::collections::BTreeMap::new();
    for _ in 0..20 {
        let m = next_message(&mut messages).await;
        ack(&b, &m.message_id).await;
        assert!(got.insert(m.resource_id.clone(), m.event_id.clone()).is_none(), "{} came twice", m.resource_id);
    }
    assert!(got.values().all(|e| e == "9"), "only the last event of each resource: {got:?}");
}

/// An EndpointSlice of Service `service` with one endpoint at this machine's address and `port`.
async fn slice(client: &kube::Client, ns: &str, name: &str, service: &str, port: u16, ready: bool) {
    use kube::api::{Api, Patch, PatchParams};
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/service-name": service } },
        "addressType": "IPv4",
        "ports": [{ "name": "consistd-peer", "port": port, "protocol": "TCP" }],
        "endpoints": [{ "addresses": [consistd_testkit::host_ip().to_string()], "conditions": { "ready": ready } }]
    }))
    .expect("EndpointSlice");
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::apply("consistd-test").force(), &Patch::Apply(&slice))
        .await
        .expect("apply EndpointSlice");
}

/// An EndpointSlice of Service `service` with one endpoint, Pod `pod`, at this machine's address and `port`.
async fn pod_slice(client: &kube::Client, ns: &str, name: &str, service: &str, port: u16, pod: &str) {
    use kube::api::{Api, Patch, PatchParams};
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/service-name": service } },
        "addressType": "IPv4",
        "ports": [{ "name": "consistd-peer", "port": port, "protocol": "TCP" }],
        "endpoints": [{
            "addresses": [consistd_testkit::host_ip().to_string()],
            "conditions": { "ready": true },
            "targetRef": { "kind": "Pod", "name": pod, "namespace": ns },
        }]
    }))
    .expect("EndpointSlice");
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::apply("consistd-test").force(), &Patch::Apply(&slice))
        .await
        .expect("apply EndpointSlice");
}

#[tokio::test]
async fn a_new_pod_on_an_old_pods_address_neither_receives_its_messages_nor_acks_them() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    // Pod "new" got the address pod "old" had; the Service's EndpointSlice still names "old" there.
    let (new, new_addr) = receiver_on(consistd_testkit::host_ip(), "new", "").await;
    let port = new_addr.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).expect("port");
    pod_slice(&kube, &ns, "web-x", "web", port, "old").await;
    let a = sender("a", &format!("namespace: {ns}\n")).await;
    let mut outcomes = acks(&a).await;
    let mut at_new = inbox(&new).await;
    let web = Some(Destination {
        target: Some(Target::Service(ServiceDestination { namespace: String::new(), name: "web".to_owned() })),
    });
    send(&a, SendRequest { destination: web, ..to_peer("unused:1", "config", "v1", b"v1") }).await;

    // The daemon there is not "old": it refuses the exchange, and the message waits for "old".
    let old = format!("old@{new_addr}");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let status = a.client().outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status");
        let status = status.into_inner();
        let refused = status
            .destinations
            .iter()
            .any(|d| d.peer == old && d.pending.iter().any(|m| m.last_error.contains("this is consistd new, not old")));
        if refused {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no refusal by the wrong daemon: {status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(tokio::time::timeout(Duration::from_secs(1), at_new.message()).await.is_err(), "the new pod got it");

    // The EndpointSlice catches up: "old" left (its delivery FAILED, never ACKED), "new" joined and gets
    // the current message.
    pod_slice(&kube, &ns, "web-x", "web", port, "new").await;
    let failed = next_outcome(&mut outcomes).await;
    assert_eq!((failed.outcome(), failed.peer.as_str()), (AckOutcome::Failed, old.as_str()), "{failed:?}");
    assert!(failed.reason.contains("no longer part of service"), "{failed:?}");
    let m = next_message(&mut at_new).await;
    assert_eq!((m.resource_id.as_str(), m.event_id.as_str()), ("config", "v1"));
    ack(&new, &m.message_id).await;
    let o = next_outcome(&mut outcomes).await;
    assert_eq!((o.outcome(), o.peer), (AckOutcome::Acked, format!("new@{new_addr}")));
}

#[tokio::test]
async fn a_service_destination_reaches_every_ready_endpoint_including_ones_that_appear_later() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    // EndpointSlices may not point at loopback: these daemons listen on the machine's address.
    let ip = consistd_testkit::host_ip();
    let (b, b_addr) = receiver_on(ip, "b", "").await;
    let (c, c_addr) = receiver_on(ip, "c", "").await;
    let (d, d_addr) = receiver_on(ip, "d", "").await;
    let port = |addr: &str| addr.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).expect("port");
    slice(&kube, &ns, "web-b", "web", port(&b_addr), true).await;
    slice(&kube, &ns, "web-c", "web", port(&c_addr), true).await;
    slice(&kube, &ns, "web-d", "web", port(&d_addr), false).await;
    let a = sender("a", &format!("namespace: {ns}\n")).await;
    let mut outcomes = acks(&a).await;
    let (mut at_b, mut at_c, mut at_d) = (inbox(&b).await, inbox(&c).await, inbox(&d).await);

    let web = Some(Destination {
        target: Some(Target::Service(ServiceDestination { namespace: String::new(), name: "web".to_owned() })),
    });
    let request = SendRequest { destination: web.clone(), ..to_peer("unused:1", "config", "v1", b"v1") };
    send(&a, request).await;
    let mut expected = vec![b_addr.clone(), c_addr.clone()];
    for (daemon, stream) in [(&b, &mut at_b), (&c, &mut at_c)] {
        let m = next_message(stream).await;
        assert_eq!((m.resource_id.as_str(), m.event_id.as_str()), ("config", "v1"));
        ack(daemon, &m.message_id).await;
    }
    // One ACKED per endpoint.
    let mut acked_by = Vec::new();
    for _ in 0..2 {
        let o = next_outcome(&mut outcomes).await;
        assert_eq!(o.outcome(), AckOutcome::Acked);
        acked_by.push(o.peer);
    }
    acked_by.sort();
    expected.sort();
    assert_eq!(acked_by, expected);
    // A not-ready endpoint gets nothing.
    assert!(tokio::time::timeout(Duration::from_secs(1), at_d.message()).await.is_err(), "not-ready endpoint got it");

    // An endpoint that appears later gets the destination's current message.
    let (e, e_addr) = receiver_on(ip, "e", "").await;
    let mut at_e = inbox(&e).await;
    slice(&kube, &ns, "web-e", "web", port(&e_addr), true).await;
    let m = next_message(&mut at_e).await;
    assert_eq!((m.resource_id.as_str(), m.event_id.as_str()), ("config", "v1"));
    ack(&e, &m.message_id).await;
    let o = next_outcome(&mut outcomes).await;
    assert_eq!((o.outcome(), o.peer.as_str()), (AckOutcome::Acked, e_addr.as_str()));
    // So does one that becomes ready.
    slice(&kube, &ns, "web-d", "web", port(&d_addr), true).await;
    let m = next_message(&mut at_d).await;
    assert_eq!(m.event_id, "v1");

    // The newest message stays held for members that come later; a member that leaves before ACKing
    // a newer one is reported FAILED, not silently dropped.
    assert_eq!(total_pending(&a).await, 1);
    send(&a, SendRequest { destination: web, ..to_peer("unused:1", "config", "v2", b"v2") }).await;
    let superseded = next_outcome(&mut outcomes).await;
    assert_eq!((superseded.outcome(), superseded.event_id.as_str()), (AckOutcome::Superseded, "v1"));
    let m = next_message(&mut at_c).await;
    assert_eq!(m.event_id, "v2");
    use kube::api::{Api, DeleteParams};
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(kube.clone(), &ns)
        .delete("web-c", &DeleteParams::default())
        .await
        .expect("delete web-c");
    let failed = loop {
        let o = next_outcome(&mut outcomes).await;
        if o.outcome() == AckOutcome::Failed {
            break o;
        }
    };
    assert_eq!((failed.peer.as_str(), failed.event_id.as_str()), (c_addr.as_str(), "v2"));
    assert!(failed.reason.contains("no longer part of service"), "{failed:?}");
}

/// A receiving daemon in namespace `ns` that campaigns in election `group` (announcing its address
/// with a 3 s membership TTL); the Campaign stream is returned: dropping it leaves the group.
async fn member(ns: &str, identity: &str) -> (Daemon, String, Streaming<consistd_client::proto::CampaignResponse>) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let config = format!(
        "identity: {identity}\nnamespace: {ns}\npeer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\nmembership:\n  ttl: 3s\n"
    );
    let daemon = Daemon::builder(BIN).config(config).start().await;
    let request = consistd_client::proto::CampaignRequest { election: "group".to_owned(), ..Default::default() };
    let campaign = daemon.client().leadership().campaign(request).await.expect("Campaign").into_inner();
    (daemon, addr, campaign)
}

async fn member_leases(kube: &kube::Client, ns: &str) -> usize {
    use kube::api::{Api, ListParams};
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(kube.clone(), ns)
        .list(&ListParams::default().labels("consistd.io/member-of=group"))
        .await
        .expect("list member Leases")
        .items
        .len()
}

#[tokio::test]
async fn an_election_destination_reaches_every_member_and_follows_joins_resignations_and_crashes() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let (b, b_addr, _b_campaign) = member(&ns, "b").await;
    let (c, c_addr, _c_campaign) = member(&ns, "c").await;
    let (d, _d_addr, d_campaign) = member(&ns, "d").await;
    for _ in 0..100 {
        if member_leases(&kube, &ns).await == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(member_leases(&kube, &ns).await, 3, "each campaigning daemon has a member Lease");
    let a = sender("a", &format!("namespace: {ns}\n")).await;
    let mut outcomes = acks(&a).await;
    let (mut at_b, mut at_c, mut at_d) = (inbox(&b).await, inbox(&c).await, inbox(&d).await);
    let group = Some(Destination { target: Some(Target::Election("group".to_owned())) });
    let to_group = |event: &str| SendRequest { destination: group.clone(), ..to_peer("unused:1", "cfg", event, b"x") };

    send(&a, to_group("v1")).await;
    for (daemon, stream) in [(&b, &mut at_b), (&c, &mut at_c), (&d, &mut at_d)] {
        let m = next_message(stream).await;
        assert_eq!(m.event_id, "v1");
        ack(daemon, &m.message_id).await;
    }
    for _ in 0..3 {
        assert_eq!(next_outcome(&mut outcomes).await.outcome(), AckOutcome::Acked);
    }

    // d resigns: its member Lease is deleted at once and it gets nothing more.
    drop(d_campaign);
    for _ in 0..100 {
        if member_leases(&kube, &ns).await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(member_leases(&kube, &ns).await, 2, "a resigned member leaves the group");
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&a, to_group("v2")).await;
    assert_eq!(next_outcome(&mut outcomes).await.outcome(), AckOutcome::Superseded);
    let m = next_message(&mut at_b).await;
    assert_eq!(m.event_id, "v2");
    ack(&b, &m.message_id).await;
    let o = next_outcome(&mut outcomes).await;
    assert_eq!((o.outcome(), o.peer), (AckOutcome::Acked, format!("b@{b_addr}")), "a member known by its identity");
    assert_eq!(next_message(&mut at_c).await.event_id, "v2");
    assert!(tokio::time::timeout(Duration::from_secs(1), at_d.message()).await.is_err(), "d left but got v2");

    // c is killed before ACKing v2: once its membership expires (3 s) it is reported FAILED.
    c.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = std::time::Instant::now();
    let failed = next_outcome(&mut outcomes).await;
    assert_eq!(
        (failed.outcome(), failed.peer.clone(), failed.event_id.as_str()),
        (AckOutcome::Failed, format!("c@{c_addr}"), "v2")
    );
    assert!(failed.reason.contains("no longer part of election"), "{failed:?}");
    assert!(killed.elapsed() >= Duration::from_secs(2), "dropped after {:?}, before its TTL", killed.elapsed());

    // A member that joins later gets the current message.
    let (e, e_addr, _e_campaign) = member(&ns, "e").await;
    let mut at_e = inbox(&e).await;
    let m = next_message(&mut at_e).await;
    assert_eq!(m.event_id, "v2");
    ack(&e, &m.message_id).await;
    let o = next_outcome(&mut outcomes).await;
    assert_eq!((o.outcome(), o.peer), (AckOutcome::Acked, format!("e@{e_addr}")));
}
