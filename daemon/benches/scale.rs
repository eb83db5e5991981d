//! Scale (`make bench`): N daemons as processes in one namespace against the real control plane, every
//! one a replica of one rollout channel (so a candidate in its election and a member of its group), each
//! app applying versions at once and observing the election. For N = 25, 100 and 250 (BENCH_REPLICAS to
//! choose; 250 daemons take about 6.5 GiB), prints:
//!
//! 1. idle cost: apiserver requests per second (from the audit log, by what they were for), Lease watch
//!    events the apiserver sent, and RSS and CPU per daemon;
//! 2. the barrier: Publish on a follower until WaitApplied opens on another replica;
//! 3. graceful handover (SIGTERM to the leader's daemon) and crash failover (kill -9), until the first
//!    and the last surviving replica report the new holder.
//!
//! Not a test: it measures and prints.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use consistd_client::proto::{
    GetRolloutStatusRequest, ObserveRequest, PublishRequest, ReportAppliedRequest, SubscribeVersionsRequest,
    WaitAppliedRequest,
};
use consistd_testkit::{Daemon, figures, free_port};
use nix::sys::signal::Signal;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const CHANNEL: &str = "bench";
const IDLE: Duration = Duration::from_secs(30);
/// From a formed channel to the idle measurement: half the 30 s membership TTL (see step 1).
const SETTLE: Duration = Duration::from_secs(15);
const ROUNDS: usize = 20;
/// The unit of CPU times in /proc on Linux (fixed by the kernel's ABI).
const USER_HZ: f64 = 100.0;

/// The holder each replica's app last observed, and when it was told.
type Holders = Arc<Mutex<Vec<(String, Instant)>>>;

struct Replica {
    daemon: Daemon,
    apps: Vec<tokio::task::JoinHandle<()>>,
}

async fn replica(ns: &str, i: usize, holders: Holders) -> Replica {
    let addr = format!("127.0.0.1:{}", free_port());
    let config =
        format!("identity: r{i}\nnamespace: {ns}\npeer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\n");
    let daemon = Daemon::builder(BIN).config(config).env("CONSISTD_LOG_LEVEL", "warn").start().await;
    let client = daemon.client();
    // The app applies each version at once and reports it.
    let apply = consistd_testkit::spawn({
        let client = client.clone();
        async move {
            let request = SubscribeVersionsRequest { channel: CHANNEL.to_owned() };
            let mut stream =
                client.rollout().subscribe_versions(request).await.expect("SubscribeVersions").into_inner();
            while let Ok(Some(v)) = stream.message().await {
                let report = ReportAppliedRequest { channel: CHANNEL.to_owned(), version: v.version };
                let _ = client.rollout().report_applied(report).await;
            }
        }
    });
    // It also follows who leads.
    let observe = consistd_testkit::spawn(async move {
        let request = ObserveRequest { election: CHANNEL.to_owned(), ..Default::default() };
        let mut stream = client.leadership().observe(request).await.expect("Observe").into_inner();
        while let Ok(Some(m)) = stream.message().await {
            let holder = m.status.map(|s| s.holder).unwrap_or_default();
            let mut holders = holders.lock().expect("holders");
            if holders[i].0 != holder {
                holders[i] = (holder, Instant::now());
            }
        }
    });
    Replica { daemon, apps: vec![apply, observe] }
}

fn summary(v: &[f64]) -> String {
    let p = |q: f64| figures::quantile(v, q).unwrap_or(f64::NAN);
    format!("p50 {:.1} / p99 {:.1} ms", p(0.5), p(0.99))
}

/// User+system CPU seconds and resident memory (KiB) of a process, from /proc.
fn usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command name (which may hold spaces) start at field 3; utime and stime are 14, 15.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("stat format").1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    (ticks as f64 / USER_HZ, rss)
}

/// The apiserver's count of Lease watch events sent to watchers (`apiserver_watch_events_total`).
async fn lease_watch_events(kube: &kube::Client) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("metrics request");
    let text = kube.request_text(request).await.expect("apiserver /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_watch_events_total{") && l.contains("coordination.k8s.io"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Requests the apiserver completed in `ns` since audit-log offset `from`, by what they were for.
fn audited(ns: &str, from: u64) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for event in consistd_testkit::audit_events(from) {
        let object = &event["objectRef"];
        if event["stage"] != "ResponseComplete" || object["namespace"] != ns || event["verb"] == "watch" {
            continue;
        }
        let name = object["name"].as_str().unwrap_or_default();
        let what = match (object["resource"].as_str().unwrap_or_default(), name.contains(".member.")) {
            ("leases", true) => "member Lease",
            ("leases", false) => "election Lease",
            (resource, _) => resource,
        };
        *counts.entry(format!("{} {what}", event["verb"].as_str().unwrap_or_default())).or_insert(0) += 1;
    }
    counts
}

/// Waits until every live replica's app has been told a holder other than `old`; the times until the
/// first and the last were told, in ms.
async fn new_holder(holders: &Holders, live: &[usize], old: &str, since: Instant) -> (f64, f64, String) {
    loop {
        {
            let holders = holders.lock().expect("holders");
            let told: Vec<&(String, Instant)> =
                live.iter().map(|&i| &holders[i]).filter(|(h, _)| !h.is_empty() && h != old).collect();
            if told.len() == live.len() {
                let ms = |t: Instant| t.duration_since(since).as_secs_f64() * 1e3;
                let first = told.iter().map(|(_, t)| ms(*t)).fold(f64::INFINITY, f64::min);
                let last = told.iter().map(|(_, t)| ms(*t)).fold(0.0, f64::max);
                return (first, last, told[0].0.clone());
            }
        }
        assert!(since.elapsed() < Duration::from_secs(90), "no new leader 90 s after {old} left");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn run(n: usize) {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let holders: Holders = Arc::new(Mutex::new(vec![(String::new(), Instant::now()); n]));
    let started = Instant::now();
    let mut replicas = Vec::new();
    for i in 0..n {
        replicas.push(replica(&ns, i, holders.clone()).await);
    }
    let first = replicas[0].daemon.client();
    let leader = loop {
        let status = GetRolloutStatusRequest { channel: CHANNEL.to_owned(), version: 0 };
        let members = first.rollout().get_rollout_status(status).await.expect("status").into_inner().members.len();
        let holder = holders.lock().expect("holders")[0].0.clone();
        if members == n && !holder.is_empty() {
            break holder;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{n} replicas never formed a channel");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let formed = started.elapsed();

    // 1. Idle: nothing published, nobody campaigning anew. First the leader's roll call record is written
    // (at its next renewal, within a third of the TTL) and heard by every member (within a sixth).
    tokio::time::sleep(SETTLE).await;
    let (offset, events_before) = (consistd_testkit::audit_offset(), lease_watch_events(&kube).await);
    let before: Vec<(f64, u64)> = replicas.iter().map(|r| usage(r.daemon.pid())).collect();
    tokio::time::sleep(IDLE).await;
    let after: Vec<(f64, u64)> = replicas.iter().map(|r| usage(r.daemon.pid())).collect();
    let events = lease_watch_events(&kube).await - events_before;
    let requests = audited(&ns, offset);
    let secs = IDLE.as_secs_f64();
    let total: u64 = requests.values().sum();
    let cpu: f64 = before.iter().zip(&after).map(|(b, a)| a.0 - b.0).sum::<f64>() / n as f64 / secs;
    let rss = after.iter().map(|a| a.1).sum::<u64>() as f64 / n as f64 / 1024.0;
    let breakdown: Vec<String> = requests.iter().map(|(what, c)| format!("{what} {:.2}/s", *c as f64 / secs)).collect();
    let per_daemon = total as f64 / secs / n as f64;
    figures::record(
        "idle-requests",
        "apiserver requests/s per idle daemon",
        "consistd: election + group",
        n,
        per_daemon,
    );
    println!(
        "| {n} | formed in {:.1} s | {:.2} req/s ({:.3} per daemon: {}) | {:.0} Lease watch events/s | \
         {:.1} MiB RSS, {:.2}% CPU per daemon |",
        formed.as_secs_f64(),
        total as f64 / secs,
        total as f64 / secs / n as f64,
        breakdown.join(", "),
        events / secs,
        rss,
        cpu * 100.0,
    );

    // 2. The barrier.
    let followers: Vec<usize> = (0..n).filter(|i| format!("r{i}") != leader).collect();
    let (publisher, waiter) = (replicas[followers[0]].daemon.client(), replicas[followers[1]].daemon.client());
    let mut times = Vec::new();
    for round in 0..ROUNDS {
        let t0 = Instant::now();
        let request = PublishRequest {
            channel: CHANNEL.to_owned(),
            payload: format!("config {round}").into_bytes(),
            content_type: "text/plain".to_owned(),
            ..Default::default()
        };
        let version = publisher.rollout().publish(request).await.expect("Publish").into_inner().version;
        let wait = WaitAppliedRequest {
            channel: CHANNEL.to_owned(),
            version,
            timeout: Some(prost_types::Duration { seconds: 60, nanos: 0 }),
        };
        let opened = waiter.rollout().wait_applied(wait).await.expect("WaitApplied").into_inner();
        assert!(opened.all_applied, "the barrier did not open: {opened:?}");
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    figures::record_barrier(n, &times);
    println!("| {n} | barrier: Publish -> all applied, {ROUNDS} rounds: {} |", summary(&times));

    // 3. Graceful handover, then crash failover, of the leader's daemon.
    let mut live: Vec<usize> = (0..n).collect();
    let mut old = leader;
    for (how, signal) in
        [("graceful handover (SIGTERM)", Signal::SIGTERM), ("crash failover (kill -9)", Signal::SIGKILL)]
    {
        let index: usize = old.trim_start_matches('r').parse().expect("identity");
        live.retain(|&i| i != index);
        let since = Instant::now();
        replicas[index].daemon.signal(signal);
        let (first, last, holder) = new_holder(&holders, &live, &old, since).await;
        figures::record("handover-at-scale", "ms until the last app is told", how, n, last);
        println!("| {n} | {how}: first app told the new holder {first:.0} ms, last {last:.0} ms |");
        old = holder;
    }
    for replica in replicas {
        replica.apps.iter().for_each(tokio::task::JoinHandle::abort);
        drop(replica.daemon);
    }
}

#[tokio::main]
async fn main() {
    #[allow(clippy::disallowed_methods, reason = "a benchmark's own switch, not the daemon's environment")]
    let sizes: Vec<usize> = std::env::var("BENCH_REPLICAS")
        .unwrap_or_else(|_| "25,100,250".to_owned())
        .split(',')
        .map(|n| n.trim().parse().expect("BENCH_REPLICAS: comma-separated replica counts"))
        .collect();
    println!(
        "scale: N daemons, one rollout channel (one election, one group), client-go timing (lease 15 s, retry \
         2 s), membership TTL 30 s; idle for {} s from {} s after the channel formed",
        IDLE.as_secs(),
        SETTLE.as_secs()
    );
    println!();
    println!("| replicas | measure |");
    println!("| --- | --- |");
    for n in sizes {
        run(n).await;
    }
}
