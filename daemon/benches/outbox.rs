//! ACK-tracked sends between two daemons on loopback (`make bench`), with 1 KiB payloads, printing:
//!
//! 1. throughput: ACKed messages/s, the sending app keeping many Sends in flight and the receiving app
//!    ACKing as it receives — plaintext and mutual TLS, each with unary Send and Ack calls and with the
//!    Rust SDK's `send` and `Delivery::ack` (one SendStream and one AckStream), side by side;
//! 2. latency: Send called -> ACKED seen on WatchAcks, at a steady 1,000 messages/s, the same four ways;
//! 3. resends per message when the link is down 10% of the time (a proxy drops every connection at
//!    random, on average once a second, and refuses new ones for 100 ms).
//!
//! Not a test: it measures and prints.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use consistd_client::{
    Client,
    proto::{AckOutcome, AckRequest, Destination, ReceiveRequest, SendRequest, WatchAcksRequest, destination::Target},
};
use consistd_testkit::{Daemon, figures, free_port, proxy::DelayProxy, tls::Ca};
use futures::StreamExt;
use rand::Rng;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const PAYLOAD: usize = 1024;

fn request(peer: &str, i: usize) -> SendRequest {
    SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(peer.to_owned())) }),
        resource_id: format!("resource-{i}"),
        event_id: "1".to_owned(),
        payload: vec![b'x'; PAYLOAD],
        content_type: "application/octet-stream".to_owned(),
        ..Default::default()
    }
}

async fn daemon(identity: &str, peer_yaml: &str) -> Daemon {
    let config = format!(
        "identity: {identity}\npeer:\n{peer_yaml}outbox:\n  maxPendingPerDestination: 100000\n  maxPending: 100000\n"
    );
    Daemon::builder(BIN).config(config).env("CONSISTD_LOG_LEVEL", "warn").start().await
}

/// How the apps call the daemons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// One unary Send per message and one unary Ack per delivery.
    Unary,
    /// The Rust SDK: `Client::send` and `Delivery::ack`, which share one SendStream and one AckStream.
    Streams,
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Api::Unary => "unary",
            Api::Streams => "streams",
        })
    }
}

/// Stores one message through `api` and returns its message id.
async fn send_one(client: &Client, api: Api, request: SendRequest) -> String {
    match api {
        Api::Unary => client.outbox().send(request).await.expect("Send").into_inner().message_id,
        Api::Streams => client.send(request).await.expect("send").message_id,
    }
}

/// The receiving app: ACKs every message as it arrives, up to 256 ACKs in flight.
fn spawn_acking_app(client: Client, stop: Arc<AtomicBool>, api: Api) -> tokio::task::JoinHandle<()> {
    if api == Api::Streams {
        return consistd_testkit::spawn(async move {
            client
                .receive()
                .filter_map(|d| async move { d.ok() })
                .map(|d| async move {
                    let _ = d.ack().await;
                })
                .buffer_unordered(256)
                .for_each(|()| async {})
                .await;
        });
    }
    consistd_testkit::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let Ok(stream) = client.inbox().receive(ReceiveRequest {}).await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let inbox = client.inbox();
            stream
                .into_inner()
                .filter_map(|r| async move { r.ok().and_then(|r| r.message) })
                .map(|m| {
                    let mut inbox = inbox.clone();
                    async move {
                        let _ = inbox.ack(AckRequest { message_id: m.message_id }).await;
                    }
                })
                .buffer_unordered(256)
                .for_each(|()| async {})
                .await;
        }
    })
}

/// Records when each message id was ACKed.
fn spawn_ack_watch(client: Client) -> (Arc<Mutex<HashMap<String, Instant>>>, tokio::task::JoinHandle<()>) {
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let seen = acked.clone();
    let task = consistd_testkit::spawn(async move {
        let mut stream = client.outbox().watch_acks(WatchAcksRequest::default()).await.expect("WatchAcks").into_inner();
        while let Ok(Some(o)) = stream.message().await {
            if o.outcome() == AckOutcome::Acked {
                seen.lock().expect("lock").insert(o.message_id, Instant::now());
            }
        }
    });
    (acked, task)
}

/// CPU time (user + system) a process has used, from /proc/<pid>/stat.
fn cpu(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces): utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // [0] is the state; utime and stime are fields 14 and 15 of the whole line, in 1/100 s ticks.
    Duration::from_millis((field(11) + field(12)) * 10)
}

async fn throughput(label: &str, api: Api, sender: &Daemon, receiver: &Daemon, peer: &str, n: usize) {
    let pids = [sender.pid().to_string(), receiver.pid().to_string(), "self".to_owned()];
    let cpu_before: Vec<Duration> = pids.iter().map(|p| cpu(p)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let app = spawn_acking_app(receiver.client(), stop.clone(), api);
    let (acked, watch) = spawn_ack_watch(sender.client());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let client = sender.client();
    futures::stream::iter(0..n)
        .map(|i| {
            let (client, request) = (client.clone(), request(peer, i));
            async move { send_one(&client, api, request).await }
        })
        .buffer_unordered(128)
        .for_each(|_| async {})
        .await;
    let sent = start.elapsed();
    while acked.lock().expect("lock").len() < n {
        assert!(start.elapsed() < Duration::from_secs(300), "{label}: ACKs missing");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed();
    if label != "warm-up" {
        let series = if api == Api::Unary { "unary Send + Ack" } else { "SendStream + AckStream" };
        figures::record("sends-throughput", "ACKed messages/s", series, label, n as f64 / elapsed.as_secs_f64());
    }
    let label = format!("{label} {api}");
    println!(
        "  {label:<18} {n} messages: {:>8.0} ACKed/s (all Sends stored after {:.2} s, all ACKed after {:.2} s)",
        n as f64 / elapsed.as_secs_f64(),
        sent.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    let per_message: Vec<String> = pids
        .iter()
        .zip(&cpu_before)
        .map(|(p, before)| format!("{:.0}", (cpu(p) - *before).as_secs_f64() * 1e6 / n as f64))
        .collect();
    println!(
        "  {:<18} CPU per message (us): sending daemon {}, receiving daemon {}, the two apps (this process) {}",
        "", per_message[0], per_message[1], per_message[2]
    );
    stop.store(true, Ordering::SeqCst);
    app.abort();
    watch.abort();
}

fn summary(v: &[f64]) -> String {
    let p = |q: f64| figures::quantile(v, q).unwrap_or(f64::NAN);
    format!("p50 {:.3} | p90 {:.3} | p99 {:.3} | max {:.3} ms (n={})", p(0.5), p(0.9), p(0.99), p(1.0), v.len())
}

async fn latency(label: &str, api: Api, sender: &Daemon, receiver: &Daemon, peer: &str, rate: u32, seconds: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let app = spawn_acking_app(receiver.client(), stop.clone(), api);
    let (acked, watch) = spawn_ack_watch(sender.client());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = sender.client();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let n = usize::try_from(u64::from(rate) * seconds).unwrap_or(usize::MAX);
    let started: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let mut calls = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        let (client, started) = (client.clone(), started.clone());
        let request = request(peer, 1_000_000 + i);
        calls.push(consistd_testkit::spawn(async move {
            let t0 = Instant::now();
            let id = send_one(&client, api, request).await;
            started.lock().expect("lock").push((id, t0));
        }));
    }
    for c in calls {
        c.await.expect("send task");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.lock().expect("lock").len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let acked = acked.lock().expect("lock");
    let latencies: Vec<f64> = started
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|(id, t0)| acked.get(id).map(|t1| t1.duration_since(*t0).as_secs_f64() * 1e3))
        .collect();
    let label = format!("{label} {api}");
    figures::record_distribution("sends-latency", "Send -> ACKED at 1,000/s, ms", &label, &latencies);
    println!("  {label:<18} Send -> ACKED at {rate}/s for {seconds} s: {}", summary(&latencies));
    stop.store(true, Ordering::SeqCst);
    app.abort();
    watch.abort();
}

fn retries(metrics: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with("consistd_outbox_retries_total"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn resends_under_drops(receiver: &Daemon, receiver_addr: &str) {
    let proxy = Arc::new(DelayProxy::start(receiver_addr.parse().expect("address")).await);
    let sender = daemon("bench-lossy", "  insecure: true\n").await;
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = {
        let (proxy, stop) = (proxy.clone(), stop.clone());
        consistd_testkit::spawn(async move {
            let mut drops = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let every = Duration::from_millis(rand::rng().random_range(500..1500));
                tokio::time::sleep(every).await;
                proxy.cut(true);
                tokio::time::sleep(Duration::from_millis(100)).await;
                proxy.cut(false);
                drops += 1;
            }
            drops
        })
    };
    let app = spawn_acking_app(receiver.client(), stop.clone(), Api::Unary);
    let (acked, watch) = spawn_ack_watch(sender.client());
    let peer = proxy.addr().to_string();
    let client = sender.client();
    let n = 10_000;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let start = Instant::now();
    for i in 0..n {
        tick.tick().await;
        let mut outbox = client.outbox();
        let request = request(&peer, 2_000_000 + i);
        consistd_testkit::spawn(async move {
            let _ = outbox.send(request).await;
        });
    }
    while acked.lock().expect("lock").len() < n {
        assert!(start.elapsed() < Duration::from_secs(120), "lossy: ACKs missing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let drops = chaos.await.expect("chaos");
    let body = consistd_server::admin::get(sender.admin_socket(), "/metrics").await.expect("metrics").1;
    let resent = retries(&String::from_utf8_lossy(&body));
    println!(
        "  {n} messages at 1,000/s, link down 10% of the time ({drops} drops in {:.1} s): {resent:.0} resends = {:.3} per message",
        start.elapsed().as_secs_f64(),
        resent / n as f64
    );
    app.abort();
    watch.abort();
}

#[tokio::main]
async fn main() {
    println!("ACK-tracked sends, two daemons on loopback, {PAYLOAD}-byte payloads");
    let port = free_port();
    let plain_peer = format!("127.0.0.1:{port}");
    let receiver = daemon("bench-receiver", &format!("  listen: {plain_peer}\n  insecure: true\n")).await;
    let sender = daemon("bench-sender", "  insecure: true\n").await;

    let pki = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("bench CA");
    let tls_port = free_port();
    let tls_peer = format!("127.0.0.1:{tls_port}");
    let r_certs = ca.issue("consistd", &pki.path().join("r"));
    let s_certs = ca.issue("consistd", &pki.path().join("s"));
    let tls_receiver =
        daemon("bench-tls-receiver", &format!("  listen: {tls_peer}\n{}", r_certs.yaml("consistd"))).await;
    let tls_sender = daemon("bench-tls-sender", &s_certs.yaml("consistd")).await;

    // BENCH_ONLY=throughput|latency|drops runs one part; BENCH_API=unary|streams one API (to profile it).
    #[allow(clippy::disallowed_methods, reason = "a benchmark's own switches, not the daemon's environment")]
    let (only, api) = (std::env::var("BENCH_ONLY").unwrap_or_default(), std::env::var("BENCH_API").unwrap_or_default());
    let run = |part: &str| only.is_empty() || only == part;
    let apis: Vec<Api> = [Api::Unary, Api::Streams]
        .into_iter()
        .filter(|a| api.is_empty() || api == if *a == Api::Unary { "unary" } else { "streams" })
        .collect();
    if run("throughput") {
        println!("throughput (128 Sends in flight, ACKs pipelined):");
        throughput("warm-up", Api::Unary, &sender, &receiver, &plain_peer, 5_000).await;
        for &api in &apis {
            throughput("plaintext", api, &sender, &receiver, &plain_peer, 50_000).await;
            throughput("mTLS", api, &tls_sender, &tls_receiver, &tls_peer, 50_000).await;
        }
    }
    if run("latency") {
        println!("latency:");
        for &api in &apis {
            latency("plaintext", api, &sender, &receiver, &plain_peer, 1_000, 10).await;
            latency("mTLS", api, &tls_sender, &tls_receiver, &tls_peer, 1_000, 10).await;
        }
    }
    if run("drops") {
        println!("resends under connection drops:");
        resends_under_drops(&receiver, &plain_peer).await;
    }
}
