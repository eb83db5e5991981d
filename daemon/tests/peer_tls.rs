//! Peer certificate rotation between real daemons: leaves valid for 40 s, mounted as Secret volumes that
//! are updated the way kubelet's atomic writer does (cert-manager renewing them). First the CA bundle
//! gains a second CA, then both leaves are replaced by ones from that CA; connections are cut after the
//! rotation and again after the old leaves expired, so every handshake after a cut uses what the files
//! hold then. A stream of sends keeps being ACKed throughout, none FAILED.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use consistd_client::proto::{
    AckOutcome, AckRequest, Destination, ReceiveRequest, SendRequest, WatchAcksRequest, destination::Target,
};
use consistd_testkit::{
    Daemon, free_port,
    proxy::DelayProxy,
    tls::{Ca, SecretVolume},
};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
/// How long the first leaves are valid.
const SHORT_LIVED: Duration = Duration::from_secs(40);
const BACKOFF: &str = "outbox:\n  backoff: {initial: 20ms, factor: 2, cap: 500ms}\n";

/// A Secret volume's files: a leaf, its key and a CA bundle.
fn secret<'a>(leaf: &'a (String, String), bundle: &'a str) -> [(&'static str, &'a str); 3] {
    [("tls.crt", leaf.0.as_str()), ("tls.key", leaf.1.as_str()), ("ca.crt", bundle)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_leaves_and_ca_keep_sends_acked_after_the_old_leaves_expired() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (old_ca, new_ca) = (Ca::new("old peer CA"), Ca::new("new peer CA"));
    let started = Instant::now();
    let (a_leaf, b_leaf) = (old_ca.leaf("consistd", Some(SHORT_LIVED)), old_ca.leaf("consistd", Some(SHORT_LIVED)));
    let a_volume = SecretVolume::new(&dir.path().join("a"), &secret(&a_leaf, old_ca.pem()));
    let b_volume = SecretVolume::new(&dir.path().join("b"), &secret(&b_leaf, old_ca.pem()));

    let b_addr = format!("127.0.0.1:{}", free_port());
    let log_json = "log:\n  format: json\n";
    let b_config =
        format!("identity: b\npeer:\n  listen: \"{b_addr}\"\n{}{log_json}", b_volume.cert_files().yaml("consistd"));
    let b = Daemon::builder(BIN).config(b_config).start().await;
    let proxy = DelayProxy::start(b_addr.parse().expect("address")).await;
    let a_config = format!("identity: a\npeer:\n{}{BACKOFF}{log_json}", a_volume.cert_files().yaml("consistd"));
    let a = Daemon::builder(BIN).config(a_config).start().await;

    // B's app ACKs everything; A's outcomes are collected.
    let b_client = b.client();
    consistd_testkit::spawn(async move {
        let mut inbox = b_client.inbox().receive(ReceiveRequest {}).await.expect("Receive").into_inner();
        while let Ok(Some(r)) = inbox.message().await {
            let id = r.message.expect("message").message_id;
            b_client.inbox().ack(AckRequest { message_id: id }).await.expect("Ack");
        }
    });
    let outcomes = Arc::new(Mutex::new((HashSet::<String>::new(), Vec::<String>::new())));
    let mut acks = a.client().outbox().watch_acks(WatchAcksRequest::default()).await.expect("WatchAcks").into_inner();
    let seen = outcomes.clone();
    consistd_testkit::spawn(async move {
        while let Ok(Some(o)) = acks.message().await {
            let mut seen = seen.lock().expect("outcomes");
            match o.outcome() {
                AckOutcome::Acked => {
                    seen.0.insert(o.resource_id);
                }
                other => seen.1.push(format!("{} {other:?}: {}", o.resource_id, o.reason)),
            }
        }
    });

    // A stream of sends, one every 100 ms, each a resource of its own.
    let sending = Arc::new(AtomicBool::new(true));
    let (a_client, peer, going) = (a.client(), proxy.addr().to_string(), sending.clone());
    let sender = consistd_testkit::spawn(async move {
        let mut sent = Vec::new();
        while going.load(Ordering::SeqCst) {
            let resource_id = format!("r{}", sent.len());
            let request = SendRequest {
                destination: Some(Destination { target: Some(Target::Peer(peer.clone())) }),
                resource_id: resource_id.clone(),
                event_id: "1".to_owned(),
                payload: b"{}".to_vec(),
                content_type: "application/json".to_owned(),
                ..Default::default()
            };
            a_client.outbox().send(request).await.expect("Send");
            sent.push((resource_id, started.elapsed()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sent
    });
    let at = |secs: u64| tokio::time::sleep_until((started + Duration::from_secs(secs)).into());
    // Closes the connection between the daemons; the next one is a new handshake.
    let cut = || async {
        proxy.cut(true);
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.cut(false);
    };

    // The bundle gains the new CA; then both leaves come from it (valid for an hour).
    at(3).await;
    let bundle = format!("{}{}", old_ca.pem(), new_ca.pem());
    a_volume.update(&secret(&a_leaf, &bundle));
    b_volume.update(&secret(&b_leaf, &bundle));
    at(6).await;
    let hour = Some(Duration::from_secs(3600));
    a_volume.update(&secret(&new_ca.leaf("consistd", hour), &bundle));
    b_volume.update(&secret(&new_ca.leaf("consistd", hour), &bundle));
    // New connections present the new leaves; then again once the old ones have expired.
    at(9).await;
    cut().await;
    at(SHORT_LIVED.as_secs() + 3).await;
    cut().await;
    let cut_after_expiry = started.elapsed();
    at(SHORT_LIVED.as_secs() + 8).await;
    sending.store(false, Ordering::SeqCst);
    let sent = sender.await.expect("sender");

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (acked, failed) = outcomes.lock().expect("outcomes").clone();
        assert!(failed.is_empty(), "no send may fail: {failed:?}\nA:\n{}\nB:\n{}", a.logs(), b.logs());
        let missing: Vec<&String> = sent.iter().map(|(r, _)| r).filter(|r| !acked.contains(*r)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} sends not ACKed, e.g. {:?}\nA:\n{}\nB:\n{}",
            missing.len(),
            sent.len(),
            &missing[..missing.len().min(5)],
            a.logs(),
            b.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after_expiry = sent.iter().filter(|(_, at)| *at > cut_after_expiry).count();
    assert!(after_expiry >= 20, "sends after the old leaves expired and the connection was cut: {after_expiry}");
    for (name, daemon) in [("A", &a), ("B", &b)] {
        let reloads = daemon.logs().matches("reloaded the peer TLS files").count();
        assert!(
            reloads >= 2,
            "{name} reloaded its files {reloads} times, expected the bundle and the leaf:\n{}",
            daemon.logs()
        );
    }
}
