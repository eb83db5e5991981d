//! The apiserver connection against the real control plane (`make bench`): HTTP/2, the default, beside
//! HTTP/1.1 (the daemon with client-go's `DISABLE_HTTP2` switch, how every build connected before), in one
//! run, printing:
//!
//! 1. the daemon's established connections to the apiserver (what `ss -tnp` lists for it) at 1, 10 and 100
//!    watches of distinct queries;
//! 2. what the apiserver spends on those 100 watches, from its own /metrics: CPU seconds while they are
//!    opened and then fed 20 writes a second for 15 s (each write reaches every watch), and its goroutines,
//!    heap and resident memory once they run, against before the daemon started;
//! 3. a write's latency through the daemon (a merge patch), cold (the first after start, with 5 watches
//!    running) and warm (the next 50), at a round trip of 0 and 50 ms (the delay proxy toward the daemon).
//!
//! Not a test: it measures and prints.

use std::time::{Duration, Instant};

use consistd_client::proto::{DeliveryMode, PatchRequest, PatchType, SubscribeRequest};
use consistd_testkit::{Daemon, figures, proxy::DelayProxy, watch::Events};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const CHURN: Duration = Duration::from_secs(15);
const CHURN_PER_SECOND: u32 = 20;
const WARM_WRITES: usize = 50;

fn mode(http2: bool) -> &'static str {
    if http2 { "HTTP/2" } else { "HTTP/1.1" }
}

async fn daemon(http2: bool, proxy: Option<&DelayProxy>) -> Daemon {
    let mut builder = Daemon::builder(BIN).config("log:\n  level: warn\n");
    if !http2 {
        builder = builder.env("DISABLE_HTTP2", "1");
    }
    if let Some(proxy) = proxy {
        builder = builder.through(proxy);
    }
    builder.start().await
}

/// A RAW watch of every ConfigMap in `ns` whose query string differs for each `i`.
async fn watch(daemon: &Daemon, ns: &str, i: usize) -> Events {
    let request = SubscribeRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        label_selector: format!("query notin (q{i})"),
        mode: DeliveryMode::Raw.into(),
        ..Default::default()
    };
    let mut events = Events::open(&daemon.client(), request).await;
    events.until_synced().await;
    events
}

/// The apiserver's CPU seconds, heap in use, resident bytes and goroutines, from its /metrics.
async fn apiserver_usage(kube: &kube::Client) -> (f64, f64, f64, f64) {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let text = kube.request_text(request).await.expect("GET /metrics from the apiserver");
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in the apiserver's /metrics"))
    };
    (
        value("process_cpu_seconds_total"),
        value("go_memstats_heap_inuse_bytes"),
        value("process_resident_memory_bytes"),
        value("go_goroutines"),
    )
}

fn patch(ns: &str, value: usize) -> PatchRequest {
    PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        name: "written".into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "n": value.to_string() } }).to_string().into_bytes(),
        ..Default::default()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Connections at 1, 10 and 100 watches, then the apiserver's cost of the 100.
async fn connections(kube: &kube::Client, ns: &str, http2: bool) {
    let api: Api<ConfigMap> = Api::namespaced(kube.clone(), ns);
    let (cpu0, heap0, rss0, goroutines0) = apiserver_usage(kube).await;
    let daemon = daemon(http2, None).await;
    let port = consistd_testkit::apiserver_addr().port();
    let mut watches = Vec::new();
    let mut counts = Vec::new();
    for n in [1, 10, 100] {
        while watches.len() < n {
            watches.push(watch(&daemon, ns, watches.len()).await);
        }
        let count = consistd_testkit::tcp_connections(daemon.pid(), port);
        figures::record("link-connections", "connections", mode(http2), n, count as f64);
        counts.push(format!("{n} watches: {count}"));
    }
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < CHURN {
        let body = json!({ "data": { "n": i.to_string() } });
        api.patch("churn", &PatchParams::default(), &Patch::Merge(&body)).await.expect("churn patch");
        i += 1;
        tokio::time::sleep(Duration::from_secs(1) / CHURN_PER_SECOND).await;
    }
    // Every watch is still running: the last write reached each.
    let last = (i - 1).to_string();
    for events in &mut watches {
        loop {
            let event = events.next().await;
            let Some(object) = event.object else { continue };
            let json: serde_json::Value = serde_json::from_slice(&object.json).expect("object JSON");
            if object.name == "churn" && json["data"]["n"] == last.as_str() {
                break;
            }
        }
    }
    let (cpu1, heap1, rss1, goroutines1) = apiserver_usage(kube).await;
    drop(watches);
    drop(daemon);
    let mib = |b: f64| b / (1024.0 * 1024.0);
    figures::record("link-apiserver-cpu", "CPU s", mode(http2), "100 watches", cpu1 - cpu0);
    println!(
        "{:<9} connections at {}; apiserver for 100 watches and {i} writes: {:.2} CPU s, goroutines {:+}, heap {:+.1} MiB, resident {:+.1} MiB",
        mode(http2),
        counts.join(", "),
        cpu1 - cpu0,
        goroutines1 - goroutines0,
        mib(heap1 - heap0),
        mib(rss1 - rss0),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// The first write after start (5 watches running) and the next [`WARM_WRITES`], `rtt` toward the daemon.
async fn write_latency(ns: &str, http2: bool, rtt: Duration) {
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let daemon = daemon(http2, Some(&proxy)).await;
    let mut watches = Vec::new();
    for i in 0..5 {
        watches.push(watch(&daemon, ns, 1000 + i).await);
    }
    proxy.set_delay(rtt);
    let client = daemon.client();
    let mut latencies = Vec::new();
    for i in 0..=WARM_WRITES {
        let started = Instant::now();
        client.objects().patch(patch(ns, i)).await.expect("patch through the daemon");
        latencies.push(ms(started.elapsed()));
    }
    let cold = latencies.remove(0);
    let mut warm = latencies;
    warm.sort_by(f64::total_cmp);
    let q = |q: f64| figures::quantile(&warm, q).unwrap_or(f64::NAN);
    let label = format!("{} rtt {} ms", mode(http2), rtt.as_millis());
    figures::record("link-write", "ms", &format!("{label} cold"), "cold", cold);
    figures::record("link-write", "ms", &format!("{label} warm p50"), "warm p50", q(0.5));
    println!(
        "{:<9} write at {:>2} ms round trip: cold {cold:.1} ms, warm p50 {:.1} ms, p99 {:.1} ms ({} connections opened through the proxy)",
        mode(http2),
        rtt.as_millis(),
        q(0.5),
        q(0.99),
        proxy.connections()
    );
}

#[tokio::main]
async fn main() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    for name in ["churn", "written"] {
        let cm = json!({ "metadata": { "name": name }, "data": { "n": "start" } });
        api.create(&PostParams::default(), &serde_json::from_value(cm).expect("configmap")).await.expect("create");
    }
    println!("The apiserver connection (HTTP/1.1 is DISABLE_HTTP2=1, how consistd connected before):");
    for http2 in [false, true] {
        connections(&kube, &ns, http2).await;
    }
    for rtt in [Duration::ZERO, Duration::from_millis(50)] {
        for http2 in [false, true] {
            write_latency(&ns, http2, rtt).await;
        }
    }
}
