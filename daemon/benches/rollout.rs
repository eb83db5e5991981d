//! Replica barrier (`make bench`): N daemons whose apps subscribe to one channel and report each version
//! applied as soon as it arrives; a Publish on a follower, then WaitApplied on another replica. Prints
//! the time from calling Publish to the barrier opening, for 3 and 10 replicas.
//!
//! Not a test: it measures and prints.

use std::time::{Duration, Instant};

use consistd_client::proto::{
    GetLeadershipRequest, GetRolloutStatusRequest, PublishRequest, ReportAppliedRequest, SubscribeVersionsRequest,
    WaitAppliedRequest,
};
use consistd_testkit::{Daemon, figures, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const ROUNDS: usize = 20;

async fn replica(ns: &str, channel: &str, i: usize) -> (Daemon, tokio::task::JoinHandle<()>) {
    let addr = format!("127.0.0.1:{}", free_port());
    let config =
        format!("identity: r{i}\nnamespace: {ns}\npeer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\n");
    let daemon = Daemon::builder(BIN).config(config).env("CONSISTD_LOG_LEVEL", "warn").start().await;
    let client = daemon.client();
    let channel = channel.to_owned();
    // The app: applies each version at once and reports it.
    let app = consistd_testkit::spawn(async move {
        let request = SubscribeVersionsRequest { channel: channel.clone() };
        let mut stream = client.rollout().subscribe_versions(request).await.expect("SubscribeVersions").into_inner();
        while let Ok(Some(v)) = stream.message().await {
            let report = ReportAppliedRequest { channel: channel.clone(), version: v.version };
            let _ = client.rollout().report_applied(report).await;
        }
    });
    (daemon, app)
}

fn summary(v: &[f64]) -> String {
    let p = |q: f64| figures::quantile(v, q).unwrap_or(f64::NAN);
    format!("p50 {:.1} | p90 {:.1} | max {:.1} ms (n={})", p(0.5), p(0.9), p(1.0), v.len())
}

async fn run(n: usize) {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let channel = "bench";
    let mut replicas = Vec::new();
    for i in 0..n {
        replicas.push(replica(&ns, channel, i).await);
    }
    let first = replicas[0].0.client();
    let started = Instant::now();
    let leader = loop {
        let members = first
            .rollout()
            .get_rollout_status(GetRolloutStatusRequest { channel: channel.to_owned(), version: 0 })
            .await
            .expect("status")
            .into_inner()
            .members
            .len();
        let holder = first
            .leadership()
            .get_leadership(GetLeadershipRequest { election: channel.to_owned(), ..Default::default() })
            .await
            .expect("leadership")
            .into_inner()
            .status
            .map(|s| s.holder)
            .unwrap_or_default();
        if members == n && !holder.is_empty() {
            break holder;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{n} replicas never formed a channel");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let followers: Vec<usize> = (0..n).filter(|i| format!("r{i}") != leader).collect();
    let (publisher, waiter) = (replicas[followers[0]].0.client(), replicas[followers[1]].0.client());
    let mut times = Vec::new();
    for round in 0..ROUNDS {
        let t0 = Instant::now();
        let request = PublishRequest {
            channel: channel.to_owned(),
            payload: format!("config {round}").into_bytes(),
            content_type: "text/plain".to_owned(),
            ..Default::default()
        };
        let version = publisher.rollout().publish(request).await.expect("Publish").into_inner().version;
        let wait = WaitAppliedRequest {
            channel: channel.to_owned(),
            version,
            timeout: Some(prost_types::Duration { seconds: 30, nanos: 0 }),
        };
        let opened = waiter.rollout().wait_applied(wait).await.expect("WaitApplied").into_inner();
        assert!(opened.all_applied, "the barrier did not open: {opened:?}");
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    figures::record_barrier(n, &times);
    println!("| {n} replicas | {} |", summary(&times));
    for (daemon, app) in replicas {
        app.abort();
        drop(daemon);
    }
}

#[tokio::main]
async fn main() {
    println!("replica barrier: Publish on a follower -> WaitApplied open on another ({ROUNDS} rounds)");
    println!();
    println!("| replicas | Publish -> barrier open |");
    println!("| --- | --- |");
    run(3).await;
    run(10).await;
}
