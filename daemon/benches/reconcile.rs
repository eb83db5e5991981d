//! Reconcile queue benchmark against the real control plane (`make bench`), printing its figures:
//!
//! 1. leases granted per second to one app that completes each at once, for 10,000 keys queued by the
//!    initial list, at 1, 16 and 256 leases in flight;
//! 2. memory per key: the daemon's RSS with a queue of those 10,000 keys, against the same daemon with
//!    only a watch of them (the cache is the watch's either way);
//! 3. change-to-grant latency of live changes, p50 and p99, while the app keeps up.
//!
//! Not a test: it asserts nothing about speed; it measures and prints.

use std::time::{Duration, Instant};

use consistd_client::proto::{
    Completion, DeliveryMode, ObjectQuery, Outcome, QueueSpec, ReconcileRequest, ReconcileResponse, SubscribeRequest,
    reconcile_request, reconcile_response, reconcile_service_client::ReconcileServiceClient,
};
use consistd_testkit::{Daemon, figures, watch::Events};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::Streaming;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const KEYS: usize = 10_000;
const LIVE: usize = 500;

/// A Reconcile stream of queue `name` over the ConfigMaps of `ns`, holding up to `max_leases`.
async fn open(
    daemon: &Daemon,
    name: &str,
    ns: &str,
    max_leases: u32,
) -> (mpsc::UnboundedSender<ReconcileRequest>, Streaming<ReconcileResponse>) {
    let spec = QueueSpec {
        name: name.into(),
        primary: Some(ObjectQuery { resource: "configmaps".into(), namespace: ns.into(), ..Default::default() }),
        max_leases,
        ..Default::default()
    };
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).expect("queue the spec");
    let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    let mut client = ReconcileServiceClient::new(daemon.client().channel());
    let answers = client.reconcile(stream).await.expect("open the queue").into_inner();
    (tx, answers)
}

/// Completes every item at once until `count` were handed out; returns each item's key and when it came.
async fn drain(
    tx: &mpsc::UnboundedSender<ReconcileRequest>,
    answers: &mut Streaming<ReconcileResponse>,
    count: usize,
) -> Vec<(String, Instant)> {
    let mut got = Vec::with_capacity(count);
    while got.len() < count {
        let message = answers.message().await.expect("the stream").expect("not ended");
        if let Some(reconcile_response::Response::Item(item)) = message.response {
            got.push((item.name.clone(), Instant::now()));
            let done = Completion { lease_id: item.lease_id, outcome: Outcome::Done.into(), ..Default::default() };
            tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Complete(done)) }).expect("send");
        }
    }
    got
}

#[tokio::main]
async fn main() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let started = Instant::now();
    consistd_testkit::create_configmaps(
        &api,
        KEYS,
        |i| json!({ "metadata": { "name": format!("k{i:05}") }, "data": { "v": "0" } }),
    )
    .await;
    println!("reconcile: {KEYS} ConfigMaps created in {:.1} s", started.elapsed().as_secs_f64());

    // A watch alone, then the queue over the same watch: the difference is the queue's.
    let daemon = Daemon::builder(BIN).start().await;
    let subscribe = SubscribeRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        mode: DeliveryMode::Raw.into(),
        ..Default::default()
    };
    let mut watch = Events::open(&daemon.client(), subscribe).await;
    watch.until_synced().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let watch_rss = consistd_testkit::rss_kib(daemon.pid());

    println!("\nreconcile: leases granted to one app completing each at once, {KEYS} keys from the initial list");
    println!("{:>14} {:>12} {:>14}", "leases at once", "seconds", "grants/s");
    let mut queue_rss = 0;
    for (i, max_leases) in [1u32, 16, 256].into_iter().enumerate() {
        let name = format!("bench-{max_leases}");
        let start = Instant::now();
        let (tx, mut answers) = open(&daemon, &name, &ns, max_leases).await;
        drain(&tx, &mut answers, KEYS).await;
        let secs = start.elapsed().as_secs_f64();
        #[allow(clippy::cast_precision_loss, reason = "a rate")]
        let rate = KEYS as f64 / secs;
        println!("{max_leases:>14} {secs:>12.2} {rate:>14.0}");
        figures::record("reconcile-grants", "leases granted per second", "consistd", f64::from(max_leases), rate);
        if i == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            queue_rss = consistd_testkit::rss_kib(daemon.pid());
        }
        // Keep the last queue open for the live changes.
        if max_leases == 256 {
            live(&api, &tx, &mut answers).await;
        }
    }
    #[allow(clippy::cast_precision_loss, reason = "bytes per key")]
    let per_key = (queue_rss.saturating_sub(watch_rss) * 1024) as f64 / KEYS as f64;
    println!(
        "\nreconcile: daemon RSS {} KiB with the watch of {KEYS} ConfigMaps, {} KiB with one queue of them: {:.0} bytes per key",
        watch_rss, queue_rss, per_key
    );
    figures::record("reconcile-memory", "bytes per key", "consistd", "10,000 keys", per_key);
}

/// Live changes to `LIVE` keys, one at a time, each timed from its write's answer to its grant.
async fn live(
    api: &Api<ConfigMap>,
    tx: &mpsc::UnboundedSender<ReconcileRequest>,
    answers: &mut Streaming<ReconcileResponse>,
) {
    let mut latencies = Vec::with_capacity(LIVE);
    for i in 0..LIVE {
        let name = format!("k{:05}", i * (KEYS / LIVE));
        // A new value (the objects were created with "0"): a patch that changes nothing makes no event.
        let patch = json!({ "data": { "v": (i + 1).to_string() } });
        tokio::time::timeout(Duration::from_secs(30), api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)))
            .await
            .unwrap_or_else(|_| panic!("patch {name}: no answer in 30 s"))
            .expect("patch");
        let written = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(30), drain(tx, answers, 1))
            .await
            .unwrap_or_else(|_| panic!("no lease for {name} within 30 s of its change"));
        assert_eq!(got[0].0, name, "the changed key is the one granted");
        latencies.push(got[0].1.duration_since(written).as_secs_f64() * 1000.0);
    }
    let (p50, p99) = (figures::quantile(&latencies, 0.5), figures::quantile(&latencies, 0.99));
    println!(
        "\nreconcile: {LIVE} live changes, write answered -> lease granted: p50 {:.2} ms, p99 {:.2} ms",
        p50.unwrap_or_default(),
        p99.unwrap_or_default()
    );
}
