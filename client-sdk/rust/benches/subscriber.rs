//! Benchmark: events/s received by one subscriber through each language's SDK from the same daemon.
//!
//! One daemon (the release build when `CONSISTD_BIN` names it, as `make bench` does) watches a namespace
//! holding many ConfigMaps. Each round, one subscriber per language subscribes in RAW mode through its
//! SDK and counts events until SYNCED: the whole snapshot streamed from the daemon's cache as fast as
//! the SDK takes it. Rust runs in this process; Python, Go, TypeScript and Java run their SDK's
//! `hack/sdk/<lang>.sh bench-subscriber` program, which prints one JSON line per round. Needs the test
//! control plane (`make bench` starts it).

use std::{pin::pin, process::Command, time::Instant};

use consistd_client::{Client, Watch, proto::DeliveryMode};
use consistd_testkit::{Daemon, consistd_bin, kube_client, namespace};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::PostParams};

const OBJECTS: usize = 5_000;
const ROUNDS: usize = 5;
const OTHERS: [&str; 4] = ["python", "go", "typescript", "java"];

#[tokio::main]
async fn main() {
    let daemon = Daemon::builder(consistd_bin()).config("identity: bench-subscriber").start().await;
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    create_configmaps(&kube, &ns).await;
    let client = daemon.client();
    // Start the shared watch, let it fill its cache before anything is timed, and keep it running (a
    // subscriber that reads on in the background) so no language's round pays for the upstream list.
    let (first, seconds) = rust_round(&client, &ns).await;
    println!("first subscriber, while the watch lists from the apiserver: {first} events in {seconds:.3} s");
    let keeper = client.subscribe(Watch::new("configmaps").namespace(&ns).mode(DeliveryMode::Raw));
    let keeper = tokio::spawn(keeper.for_each(|_| async {}));

    println!("SDK subscriber: {OBJECTS} ConfigMaps streamed to one RAW subscriber until SYNCED, {ROUNDS} rounds");
    println!("{:<12} {:>10} {:>14} {:>14}", "language", "events", "median ev/s", "best ev/s");
    let mut rust = Vec::new();
    for _ in 0..ROUNDS {
        rust.push(rust_round(&client, &ns).await);
    }
    report("rust", &rust);
    for lang in OTHERS {
        match other_rounds(lang, &daemon, &ns) {
            Ok(rounds) => report(lang, &rounds),
            Err(why) => println!("{lang:<12} not measured: {why}"),
        }
    }
    keeper.abort();
}

/// Creates the ConfigMaps, 32 requests at a time.
async fn create_configmaps(kube: &kube::Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(kube.clone(), ns);
    futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": { "name": format!("cm-{i:05}"), "labels": { "bench": "sdk" } },
                    "data": { "index": i.to_string(), "payload": "x".repeat(200) },
                }))
                .map_err(|e| format!("build configmap: {e}"))?;
                api.create(&PostParams::default(), &cm).await.map_err(|e| format!("create cm-{i:05}: {e}"))
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// One round in this process: (events, seconds).
async fn rust_round(client: &Client, ns: &str) -> (usize, f64) {
    let start = Instant::now();
    let mut events = pin!(client.subscribe(Watch::new("configmaps").namespace(ns).mode(DeliveryMode::Raw)));
    let mut count = 0;
    while let Some(event) = events.next().await {
        let event = event.unwrap_or_else(|e| panic!("watch: {e}"));
        if event.kind == consistd_client::proto::EventType::Synced {
            return (count, start.elapsed().as_secs_f64());
        }
        count += 1;
    }
    panic!("watch ended before SYNCED")
}

/// Runs another language's subscriber against the daemon and reads its rounds.
fn other_rounds(lang: &str, daemon: &Daemon, ns: &str) -> Result<Vec<(usize, f64)>, String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../hack/sdk/{lang}.sh"));
    let output = Command::new(&script)
        .args(["bench-subscriber", ns, &ROUNDS.to_string()])
        .env("CONSISTD_SOCKET", daemon.socket())
        .output()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!("{} exited with {}: {}", script.display(), output.status, tail.join(" | ")));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("{line:?}: {e}"))?;
            let events = v["events"].as_u64().ok_or_else(|| format!("no events in {line:?}"))?;
            let seconds = v["seconds"].as_f64().ok_or_else(|| format!("no seconds in {line:?}"))?;
            Ok((usize::try_from(events).unwrap_or(usize::MAX), seconds))
        })
        .collect()
}

fn report(lang: &str, rounds: &[(usize, f64)]) {
    let events = rounds.first().map_or(0, |r| r.0);
    if rounds.iter().any(|r| r.0 != OBJECTS) {
        println!("{lang:<12} wrong count: {rounds:?} (expected {OBJECTS} events per round)");
        return;
    }
    let mut rates: Vec<f64> = rounds.iter().map(|(n, s)| *n as f64 / s).collect();
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    let best = rates[rates.len() - 1];
    println!("{lang:<12} {events:>10} {median:>14.0} {best:>14.0}");
}
