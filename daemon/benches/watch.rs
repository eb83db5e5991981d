//! Watch hub benchmark against the real control plane (`make bench`), printing its figures side by side:
//!
//! 1. delivery latency of the same ConfigMap changes to a direct kube-runtime watcher in this process
//!    and through consistd (RAW and CONSISTENT subscribers): p50/p99 of the added latency and the
//!    median ratio of write-to-arrival times;
//! 2. events/s consistd delivers to 1, 8 and 64 subscribers (each reading a 10,000-object snapshot);
//! 3. daemon RSS idle, and with 10,000 cached 1 KiB ConfigMaps against their raw JSON size.
//!
//! Not a test: it asserts nothing about speed; it measures and prints.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use consistd_client::proto::{DeliveryMode, EventType, SubscribeRequest};
use consistd_testkit::{Daemon, figures, watch::Events};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const CHANGES: usize = 500;
const PACE: Duration = Duration::from_millis(10);
const CACHED: usize = 10_000;

type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

/// Records when each resourceVersion of object `obj` arrives on a consistd stream.
fn record(mut events: Events, arrivals: Arrivals) -> tokio::task::JoinHandle<()> {
    consistd_testkit::spawn(async move {
        loop {
            let event = events.next().await;
            if let Some(o) = event.object.as_ref().filter(|o| o.name == "obj") {
                arrivals.lock().expect("lock").insert(o.resource_version.clone(), Instant::now());
            }
        }
    })
}

#[tokio::main]
async fn main() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    let daemon = Daemon::builder(BIN).env("CONSISTD_LOG_LEVEL", "warn").start().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = consistd_testkit::rss_kib(daemon.pid());

    // 1. Latency: the same changes, seen directly and through consistd.
    let obj: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "obj" }, "data": { "i": "0" } })).expect("cm");
    api.create(&PostParams::default(), &obj).await.expect("create obj");
    let direct: Arrivals = Arc::default();
    let direct_task = {
        let (api, direct) = (api.clone(), direct.clone());
        consistd_testkit::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=obj");
            let mut stream = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
            while let Ok(Some(cm)) = stream.try_next().await {
                if let Some(rv) = cm.metadata.resource_version {
                    direct.lock().expect("lock").insert(rv, Instant::now());
                }
            }
        })
    };
    let request = |mode: DeliveryMode| SubscribeRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        field_selector: "metadata.name=obj".into(),
        mode: mode.into(),
        ..Default::default()
    };
    let mut raw = Events::open(&daemon.client(), request(DeliveryMode::Raw)).await;
    let mut consistent = Events::open(&daemon.client(), request(DeliveryMode::Consistent)).await;
    raw.until_synced().await;
    consistent.until_synced().await;
    let (raw_arrivals, consistent_arrivals): (Arrivals, Arrivals) = (Arc::default(), Arc::default());
    let raw_task = record(raw, raw_arrivals.clone());
    let consistent_task = record(consistent, consistent_arrivals.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut written = Vec::new();
    for i in 1..=CHANGES {
        let sent = Instant::now();
        let patch = json!({ "data": { "i": i.to_string() } });
        let cm = api.patch("obj", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
        written.push((cm.metadata.resource_version.expect("rv"), sent));
        tokio::time::sleep(PACE).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for task in [direct_task, raw_task, consistent_task] {
        task.abort();
    }

    println!(
        "consistd watch benchmark ({CHANGES} changes of one ConfigMap, one every {PACE:?}; real etcd + kube-apiserver on loopback)"
    );
    println!();
    println!("| path | write-to-arrival p50 | p99 | added vs direct p50 | p99 | median ratio |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let direct = direct.lock().expect("lock").clone();
    let at = |samples: &[f64], q| figures::quantile(samples, q).unwrap_or(f64::NAN);
    let direct_lat: Vec<f64> = written
        .iter()
        .filter_map(|(rv, sent)| direct.get(rv).map(|t| t.duration_since(*sent).as_secs_f64() * 1e3))
        .collect();
    figures::record_distribution("watch-latency", "write -> arrival, ms", "direct kube-runtime watcher", &direct_lat);
    println!(
        "| direct kube-runtime watcher | {:.2} ms | {:.2} ms | - | - | 1.00 |",
        at(&direct_lat, 0.5),
        at(&direct_lat, 0.99)
    );
    for (name, arrivals) in [("consistd RAW", &raw_arrivals), ("consistd CONSISTENT", &consistent_arrivals)] {
        let arrivals = arrivals.lock().expect("lock").clone();
        let (mut total, mut added, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for (rv, sent) in &written {
            if let (Some(d), Some(c)) = (direct.get(rv), arrivals.get(rv)) {
                let (d_ms, c_ms) =
                    (d.duration_since(*sent).as_secs_f64() * 1e3, c.duration_since(*sent).as_secs_f64() * 1e3);
                total.push(c_ms);
                added.push(c_ms - d_ms);
                ratio.push(c_ms / d_ms);
            }
        }
        figures::record_distribution("watch-latency", "write -> arrival, ms", name, &total);
        println!(
            "| {name} ({} of {CHANGES} seen) | {:.2} ms | {:.2} ms | {:.3} ms | {:.3} ms | {:.2} |",
            total.len(),
            at(&total, 0.5),
            at(&total, 0.99),
            at(&added, 0.5),
            at(&added, 0.99),
            at(&ratio, 0.5),
        );
    }

    // 3 (setup). 10,000 ConfigMaps of 1 KiB each.
    let bulk_ns = consistd_testkit::namespace(&kube).await;
    let bulk: Api<ConfigMap> = Api::namespaced(kube.clone(), &bulk_ns);
    let value = "x".repeat(1024);
    futures::stream::iter(0..CACHED)
        .map(|i| {
            let (bulk, value) = (bulk.clone(), value.clone());
            async move {
                let cm: ConfigMap = serde_json::from_value(
                    json!({ "metadata": { "name": format!("cm-{i:05}") }, "data": { "v": value } }),
                )
                .expect("cm");
                bulk.create(&PostParams::default(), &cm).await.expect("create bulk configmap");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;

    // 2. Fan-out: each subscriber reads the whole cached snapshot.
    let snapshot_request = SubscribeRequest {
        resource: "configmaps".into(),
        namespace: bulk_ns.clone(),
        mode: DeliveryMode::Raw.into(),
        ..Default::default()
    };
    let mut first = Events::open(&daemon.client(), snapshot_request.clone()).await;
    let raw_bytes: usize =
        first.until_synced().await.iter().filter_map(|e| e.object.as_ref()).map(|o| o.json.len()).sum();
    // Measured before the fan-out, whose buffers would otherwise count as cache.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cached_rss = consistd_testkit::rss_kib(daemon.pid());
    let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("report");
    let charged = report.watch_budget.expect("the watch budget").used_bytes;
    println!();
    println!("| subscribers | events delivered | time | events/s (aggregate) |");
    println!("| --- | --- | --- | --- |");
    for subscribers in [1usize, 8, 64] {
        let clients: Vec<_> = (0..subscribers.min(8)).map(|_| daemon.client()).collect();
        let start = Instant::now();
        let tasks: Vec<_> = (0..subscribers)
            .map(|i| {
                let client = clients[i % clients.len()].clone();
                let request = snapshot_request.clone();
                consistd_testkit::spawn(async move {
                    let mut stream = client.watch().subscribe(request).await.expect("subscribe").into_inner();
                    let mut n = 0usize;
                    while let Some(event) = stream.message().await.expect("read") {
                        if event.r#type() == EventType::Synced {
                            return n;
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut delivered = 0;
        for task in tasks {
            delivered += task.await.expect("subscriber");
        }
        let elapsed = start.elapsed();
        let rate = delivered as f64 / elapsed.as_secs_f64();
        figures::record("watch-fanout", "events/s, all subscribers", "one shared watch", subscribers, rate);
        println!(
            "| {subscribers} | {delivered} | {:.2} s | {:.0} |",
            elapsed.as_secs_f64(),
            delivered as f64 / elapsed.as_secs_f64()
        );
    }
    drop(first);

    // 3. Memory.
    let added_kib = cached_rss.saturating_sub(idle_rss);
    println!();
    println!("| daemon memory | figure |");
    println!("| --- | --- |");
    println!("| idle RSS | {:.1} MiB |", idle_rss as f64 / 1024.0);
    println!("| RSS with {CACHED} cached 1 KiB ConfigMaps | {:.1} MiB |", cached_rss as f64 / 1024.0);
    println!("| raw JSON of those objects | {:.1} MiB |", raw_bytes as f64 / 1048576.0);
    println!("| (RSS with cache - idle RSS) / raw JSON | {:.2}x |", (added_kib as f64 * 1024.0) / raw_bytes as f64);
    println!(
        "| charged to the memory budget (watch.maxCacheBytes), every watch | {:.1} MiB |",
        charged as f64 / 1048576.0
    );
    println!("| (RSS with cache - idle RSS) / charged | {:.2}x |", (added_kib as f64 * 1024.0) / charged as f64);
}
