//! ACK-tracked sends under faults, between real daemons: kill -9 of the sender and of the receiver at
//! random points during 10,000 sends, and a lossy, slow network (connections dropped, traffic delayed)
//! with a receiving app that is absent and then slow. Afterwards every message `Send` acknowledged was
//! ACKed exactly once by the receiving app, and nothing was lost. The app calls Ack again when the
//! daemon died under the call, as apps do, so the id it was given must name the same message after a
//! restart. Each message is sent under a trace of its own (half in the call's `traceparent` metadata,
//! half in the request), and the app checks it receives that trace with the message: trace context
//! survives the kills too.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use consistd_client::{
    Client,
    proto::{AckRequest, Destination, GetOutboxStatusRequest, ReceiveRequest, SendRequest, destination::Target},
};
use consistd_testkit::{Daemon, free_port, proxy::DelayProxy};
use nix::sys::signal::Signal;
use rand::Rng;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const BACKOFF: &str = "outbox:\n  backoff: {initial: 20ms, factor: 2, cap: 500ms}\n";

/// The two tests run one at a time: each keeps both cores busy, and run together each starved the other
/// (the lossy network's connections, cut every 50-250 ms, then carried almost nothing before each cut).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the receiving app saw, per resource_id.
#[derive(Debug, Default)]
struct AppLog {
    delivered: HashMap<String, usize>,
    /// Ack calls that returned OK.
    acked: HashMap<String, usize>,
    /// Ack calls the daemon refused, with its answer (a daemon dying under a call is not a refusal: the
    /// app calls again): every id Receive gives names a message an Ack can record, restarts or not.
    refused: Vec<(String, String)>,
    /// Deliveries of a resource after the app had ACKed it successfully.
    after_ack: Vec<String>,
    /// Deliveries whose traceparent was not the one the message was sent under: (resource_id, received).
    wrong_trace: Vec<(String, String)>,
}

/// The W3C traceparent message `r{i}` is sent under: a trace of its own.
fn traceparent(i: usize) -> String {
    format!("00-{:032x}-00f067aa0ba902b7-01", i + 1)
}

/// Message `i`'s Send: odd ones carry their trace in the request, even ones in the call's metadata.
fn request(peer: &str, i: usize) -> tonic::Request<SendRequest> {
    let in_request = i % 2 == 1;
    let mut request = tonic::Request::new(SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(peer.to_owned())) }),
        resource_id: format!("r{i:05}"),
        event_id: "e1".to_owned(),
        payload: vec![b'x'; 1024],
        content_type: "application/octet-stream".to_owned(),
        traceparent: if in_request { traceparent(i) } else { String::new() },
        ..Default::default()
    });
    if !in_request {
        request.metadata_mut().insert("traceparent", traceparent(i).parse().expect("metadata value"));
    }
    request
}

/// Sends `count` messages from `workers` tasks, each retrying until `Send` acknowledges it, pausing
/// `pace` between sends; returns the indexes `Send` acknowledged (all of them, in the end).
fn spawn_senders(
    socket: PathBuf,
    peer: String,
    count: usize,
    workers: usize,
    pace: Duration,
) -> (Arc<AtomicUsize>, Vec<tokio::task::JoinHandle<Vec<usize>>>) {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let handles = (0..workers)
        .map(|_| {
            let (next, done, socket, peer) = (next.clone(), done.clone(), socket.clone(), peer.clone());
            consistd_testkit::spawn(async move {
                let client = Client::new(&socket);
                let mut acknowledged = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= count {
                        return acknowledged;
                    }
                    loop {
                        match client.outbox().send(request(&peer, i)).await {
                            Ok(_) => break,
                            // The daemon is down (killed): not acknowledged, so send it again.
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                    acknowledged.push(i);
                    done.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(pace).await;
                }
            })
        })
        .collect();
    (done, handles)
}

/// The receiving app: receives, optionally dawdles, ACKs; reconnects whenever its daemon goes away.
fn spawn_app(
    socket: PathBuf,
    log: Arc<Mutex<AppLog>>,
    slow_for: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    consistd_testkit::spawn(async move {
        let client = Client::new(&socket);
        let started = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            let Ok(stream) = client.inbox().receive(ReceiveRequest {}).await else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let mut stream = stream.into_inner();
            while let Ok(Some(r)) = stream.message().await {
                let Some(m) = r.message else { continue };
                {
                    let mut log = log.lock().expect("log");
                    *log.delivered.entry(m.resource_id.clone()).or_default() += 1;
                    let i: usize = m.resource_id[1..].parse().unwrap_or(usize::MAX);
                    if i == usize::MAX || m.traceparent != traceparent(i) {
                        log.wrong_trace.push((m.resource_id.clone(), m.traceparent.clone()));
                    }
                    if log.acked.contains_key(&m.resource_id) {
                        log.after_ack.push(m.resource_id.clone());
                    }
                }
                if started.elapsed() < slow_for {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let outcome = ack(&client, &m.message_id, &stop).await;
                let mut log = log.lock().expect("log");
                match outcome {
                    Ok(_) => *log.acked.entry(m.resource_id).or_default() += 1,
                    Err(e) => log.refused.push((m.resource_id, format!("{:?}: {}", e.code(), e.message()))),
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Acks `message_id` as an app would: a call that failed because the daemon went away (killed under it)
/// is made again until a daemon answers, which is then the restarted one, so a message id must still
/// name the same message after a restart.
async fn ack(client: &Client, message_id: &str, stop: &AtomicBool) -> Result<(), tonic::Status> {
    loop {
        match client.inbox().ack(AckRequest { message_id: message_id.to_owned() }).await {
            Err(e) if matches!(e.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
                if stop.load(Ordering::SeqCst) {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answered => return answered.map(|_| ()),
        }
    }
}

/// How long settling may go without progress (the sender holding fewer messages, or the app ACKing
/// more) before the test fails. Progress, not a deadline: under a disk flushing others' writes each
/// commit can take 200 ms, and the app's ACKs, one at a time, each wait for one; a stall is what no
/// slowness explains.
const STALL: Duration = Duration::from_secs(60);

/// What the sender's status and both daemons' last log lines show, for a stall's failure message.
async fn stall_report(client: &Client, daemons: [&Daemon; 2]) -> String {
    let mut report = String::new();
    match client.outbox().get_outbox_status(GetOutboxStatusRequest {}).await {
        Ok(status) => {
            let now = std::time::SystemTime::now();
            for d in status.into_inner().destinations {
                let mut attempts: Vec<u32> = d.pending.iter().map(|p| p.attempts).collect();
                attempts.sort_unstable();
                let due_in: Vec<i64> = d
                    .pending
                    .iter()
                    .filter_map(|p| p.next_attempt_at)
                    .map(|t| {
                        let t = std::time::SystemTime::UNIX_EPOCH
                            + Duration::new(u64::try_from(t.seconds).unwrap_or(0), u32::try_from(t.nanos).unwrap_or(0));
                        t.duration_since(now)
                            .map_or_else(|e| -(e.duration().as_millis() as i64), |d| d.as_millis() as i64)
                    })
                    .collect();
                let mut errors: Vec<&str> = d.pending.iter().map(|p| p.last_error.as_str()).collect();
                errors.dedup();
                report += &format!(
                    "\n{} pending for {} (connected: {}); attempts min {:?} max {:?}; next attempt in ms min {:?} max {:?}; \
                     errors: {:?}",
                    d.pending.len(),
                    d.peer,
                    d.connected,
                    attempts.first(),
                    attempts.last(),
                    due_in.iter().min(),
                    due_in.iter().max(),
                    &errors[..errors.len().min(3)],
                );
            }
        }
        Err(e) => report += &format!("\nno outbox status: {e}"),
    }
    for (name, daemon) in ["sender", "receiver"].into_iter().zip(daemons) {
        let logs = daemon.logs();
        // Not the calls themselves: the test's own status polls would fill the report.
        let lines: Vec<&str> = logs.lines().filter(|l| !l.contains("consistd_server::api::caller")).collect();
        report +=
            &format!("\n--- the {name}'s last log lines ---\n{}", lines[lines.len().saturating_sub(60)..].join("\n"));
    }
    report
}

/// Waits until the sender holds nothing and every acknowledged message reached the app, failing if
/// neither moves for [`STALL`]; then checks exactly-once.
async fn settle_and_check(daemons: [&Daemon; 2], acknowledged: &[usize], log: &Arc<Mutex<AppLog>>) {
    let client = Client::new(daemons[0].socket());
    let started = Instant::now();
    let (mut best, mut progressed) = ((u64::MAX, usize::MAX), Instant::now());
    loop {
        let pending = client
            .outbox()
            .get_outbox_status(GetOutboxStatusRequest {})
            .await
            .map(|s| s.into_inner().total_pending)
            .unwrap_or(u64::MAX);
        let missing: Vec<String> = {
            let log = log.lock().expect("log");
            acknowledged.iter().map(|i| format!("r{i:05}")).filter(|r| !log.acked.contains_key(r)).collect()
        };
        if pending == 0 && missing.is_empty() {
            break;
        }
        // Both only ever fall once the sends are done.
        if pending < best.0 || missing.len() < best.1 {
            best = (best.0.min(pending), best.1.min(missing.len()));
            progressed = Instant::now();
        }
        if progressed.elapsed() >= STALL {
            panic!(
                "no progress for {STALL:?} ({:?} settling): {pending} pending at the sender, {} messages never ACKed \
                 by the app (first: {:?}){}",
                started.elapsed(),
                missing.len(),
                missing.first(),
                stall_report(&client, daemons).await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("settled in {:?}", started.elapsed());
    let log = log.lock().expect("log");
    for i in acknowledged {
        let r = format!("r{i:05}");
        assert!(log.delivered.get(&r).copied().unwrap_or(0) >= 1, "{r} acknowledged by Send but never delivered");
        let acks = log.acked.get(&r).copied().unwrap_or(0);
        assert_eq!(acks, 1, "{r} ACKed {acks} times by the app");
    }
    assert!(log.refused.is_empty(), "Acks refused: {:?}", &log.refused[..log.refused.len().min(10)]);
    assert!(
        log.after_ack.is_empty(),
        "delivered again after a successful ACK: {:?}",
        &log.after_ack[..log.after_ack.len().min(10)]
    );
    assert!(
        log.wrong_trace.is_empty(),
        "delivered without the trace it was sent under: {:?}",
        &log.wrong_trace[..log.wrong_trace.len().min(10)]
    );
    let unknown: Vec<&String> =
        log.delivered.keys().filter(|r| !acknowledged.contains(&r[1..].parse().unwrap_or(usize::MAX))).collect();
    assert!(unknown.is_empty(), "messages nobody sent: {unknown:?}");
}

/// Two random durations (the thread-local generator must not live across an await).
fn random_millis(a: std::ops::Range<u64>, b: std::ops::Range<u64>) -> (Duration, Duration) {
    let mut rng = rand::rng();
    (Duration::from_millis(rng.random_range(a)), Duration::from_millis(rng.random_range(b)))
}

async fn start(config: &str, dir: &std::path::Path) -> Daemon {
    Daemon::builder(BIN).config(config).dir(dir).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_sender_and_receiver_during_10000_sends_loses_nothing_and_acks_each_once() {
    let _alone = ONE_AT_A_TIME.lock().await;
    const SENDS: usize = 10_000;
    let port = free_port();
    let peer = format!("127.0.0.1:{port}");
    let (a_dir, b_dir) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let a_config = format!("identity: sender-a\npeer:\n  insecure: true\n{BACKOFF}");
    let b_config = format!("identity: receiver-b\npeer:\n  listen: {peer}\n  insecure: true\n");
    let mut a = start(&a_config, a_dir.path()).await;
    let mut b = start(&b_config, b_dir.path()).await;

    let log = Arc::new(Mutex::new(AppLog::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let app = spawn_app(b.socket().to_owned(), log.clone(), Duration::ZERO, stop.clone());
    let (done, senders) = spawn_senders(a.socket().to_owned(), peer.clone(), SENDS, 8, Duration::from_millis(4));

    // Kill one of them at a random moment, alternating, while the sends go on; restart it on the same
    // store and socket.
    let mut kills = (0, 0);
    let mut round = 0;
    while done.load(Ordering::SeqCst) < SENDS {
        let pause = Duration::from_millis(rand::rng().random_range(200..900));
        tokio::time::sleep(pause).await;
        if done.load(Ordering::SeqCst) >= SENDS {
            break;
        }
        round += 1;
        let (victim, config, dir) =
            if round % 2 == 1 { (&mut a, &a_config, a_dir.path()) } else { (&mut b, &b_config, b_dir.path()) };
        victim.signal(Signal::SIGKILL);
        victim.wait_exit(Duration::from_secs(10)).await;
        *victim = start(config, dir).await;
        if round % 2 == 1 { kills.0 += 1 } else { kills.1 += 1 }
    }
    let mut acknowledged = Vec::new();
    for s in senders {
        acknowledged.extend(s.await.expect("sender task"));
    }
    assert_eq!(acknowledged.len(), SENDS);
    assert!(kills.0 >= 2 && kills.1 >= 2, "too few kills during the sends: {kills:?}");
    settle_and_check([&a, &b], &acknowledged, &log).await;
    stop.store(true, Ordering::SeqCst);
    app.abort();
    let log = log.lock().expect("log");
    let redelivered = log.delivered.values().filter(|n| **n > 1).count();
    println!("kills (sender, receiver): {kills:?}; messages delivered to the app more than once: {redelivered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_slow_network_and_an_absent_then_slow_app_lose_and_duplicate_nothing() {
    let _alone = ONE_AT_A_TIME.lock().await;
    const SENDS: usize = 2_000;
    let port = free_port();
    let b = Daemon::builder(BIN)
        .config(format!("identity: receiver-b\npeer:\n  listen: 127.0.0.1:{port}\n  insecure: true\n"))
        .start()
        .await;
    let proxy = DelayProxy::start(format!("127.0.0.1:{port}").parse().expect("addr")).await;
    proxy.set_delay(Duration::from_millis(3));
    let a =
        Daemon::builder(BIN).config(format!("identity: sender-a\npeer:\n  insecure: true\n{BACKOFF}")).start().await;

    // The network drops every connection every 50-250 ms.
    let chaos_stop = Arc::new(AtomicBool::new(false));
    let chaos = {
        let stop = chaos_stop.clone();
        let proxy = Arc::new(proxy);
        let p = proxy.clone();
        let task = consistd_testkit::spawn(async move {
            let mut drops = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let (every, closed) = random_millis(50..250, 0..30);
                tokio::time::sleep(every).await;
                p.cut(true);
                tokio::time::sleep(closed).await;
                p.cut(false);
                drops += 1;
            }
            drops
        });
        (task, proxy)
    };

    let (_, senders) =
        spawn_senders(a.socket().to_owned(), chaos.1.addr().to_string(), SENDS, 4, Duration::from_millis(1));
    // The app is absent for the first second, then slow for two more.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = Arc::new(Mutex::new(AppLog::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let app = spawn_app(b.socket().to_owned(), log.clone(), Duration::from_secs(2), stop.clone());
    let mut acknowledged = Vec::new();
    for s in senders {
        acknowledged.extend(s.await.expect("sender task"));
    }
    settle_and_check([&a, &b], &acknowledged, &log).await;
    chaos_stop.store(true, Ordering::SeqCst);
    let drops = chaos.0.await.expect("chaos task");
    stop.store(true, Ordering::SeqCst);
    app.abort();
    assert!(drops >= 5, "the network dropped connections only {drops} times");
    let body = consistd_server::admin::get(a.admin_socket(), "/metrics").await.expect("metrics").1;
    let metrics = String::from_utf8_lossy(&body);
    let retries =
        metrics.lines().find(|l| l.starts_with("consistd_outbox_retries_total")).unwrap_or_default().to_owned();
    println!("connection drops: {drops}; {retries}");
    assert!(b.logs().contains("peer connected"));
}
