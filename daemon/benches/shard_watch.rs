//! Watch traffic per daemon of a sharded queue against the real control plane (`make bench`): 4 daemons
//! run one queue over 40 namespaces of 50 ConfigMaps (1 KiB of random data each), sharded by key (every daemon lists and
//! watches every object) and by namespace (each lists and watches its own slots' namespaces, KEP-5866),
//! side by side in one run. Per daemon, from the queue's open through 2,000 changes by a third party and
//! the ring's settling: the bytes the apiserver sent it (through a counting proxy) and the watch events it
//! took in (`consistd_watch_events_total`). Against an apiserver without the ShardedListAndWatch gate
//! (`CONSISTD_CP_FEATURE_GATES=`) the daemon applies the shard itself: its bytes are by key's, its events by
//! namespace's. Not a test: it measures and prints.

use std::time::Duration;

use consistd_client::proto::{
    Completion, ElectionRef, ObjectQuery, Outcome, QueueSpec, ReconcileRequest, ShardBy, reconcile_request,
    reconcile_response, reconcile_service_client::ReconcileServiceClient,
};
use consistd_testkit::{Daemon, figures, proxy::DelayProxy};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio::{sync::mpsc, time::Instant};
use tokio_stream::wrappers::UnboundedReceiverStream;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const NAMESPACES: usize = 40;
const PER_NAMESPACE: usize = 50;
const DAEMONS: usize = 4;
const CHANGES: usize = 2_000;
const WAIT: Duration = Duration::from_secs(120);

/// One daemon of the run, with the proxy it reaches the apiserver through.
struct Member {
    daemon: Daemon,
    proxy: DelayProxy,
}

async fn member(index: usize, home: &str) -> Member {
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let config = format!("identity: pod-{index}\nnamespace: {home}\nmembership:\n  ttl: 5s\n");
    let daemon = Daemon::builder(BIN).config(config).env("CONSISTD_LOG_LEVEL", "warn").through(&proxy).start().await;
    // What the daemon reads at its start (the apiserver's version, its fencing policies) is not the queue's.
    let started = Instant::now();
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("admin report");
        if report.fencing.is_some() && report.apiserver.version.is_some() {
            break;
        }
        assert!(started.elapsed() < WAIT, "daemon {index} did not finish starting");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Member { daemon, proxy }
}

/// Opens the queue on `daemon` with an app that completes every item DONE at once.
async fn open(daemon: &Daemon, spec: QueueSpec) {
    let (tx, requests) = mpsc::unbounded_channel();
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).expect("queue the spec");
    let mut client = ReconcileServiceClient::new(daemon.client().channel());
    let mut answers = client.reconcile(UnboundedReceiverStream::new(requests)).await.expect("open").into_inner();
    consistd_testkit::spawn(async move {
        while let Ok(Some(message)) = answers.message().await {
            let Some(reconcile_response::Response::Item(item)) = message.response else { continue };
            let done = Completion { lease_id: item.lease_id, outcome: Outcome::Done.into(), ..Default::default() };
            let _ = tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Complete(done)) });
        }
    });
}

/// Waits until `daemon` sees `members` members owning every slot of `queue`, nothing moving.
async fn settled(daemon: &Daemon, queue: &str, members: usize) {
    let started = Instant::now();
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("admin report");
        let ring = report.queues.into_iter().find(|q| q.name == queue).and_then(|q| q.ring);
        if ring.as_ref().is_some_and(|r| r.members.len() == members && r.unowned == 0 && r.moving == 0) {
            return;
        }
        assert!(started.elapsed() < WAIT, "the ring of {queue} did not settle on {members}: {ring:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Per daemon, the mean bytes the apiserver sent and watch events taken in, for one way of sharding.
async fn measure(by: ShardBy, run: &str, namespaces: &[String]) -> (f64, f64) {
    let name = format!("traffic-{}", by.as_str_name().to_lowercase().replace('_', "-"));
    let spec = QueueSpec {
        name: name.clone(),
        primary: Some(ObjectQuery {
            resource: "configmaps".into(),
            label_selector: format!("run={run}"),
            ..Default::default()
        }),
        max_leases: 64,
        election: Some(ElectionRef { election: format!("traffic-{run}"), namespace: String::new() }),
        sharded: true,
        shard_by: by.into(),
        ..Default::default()
    };
    let mut members = Vec::new();
    for i in 0..DAEMONS {
        members.push(member(i, &namespaces[0]).await);
    }
    let mut before = Vec::new();
    for m in &members {
        before.push((m.proxy.bytes_down(), m.daemon.metric("consistd_watch_events_total", "").await.unwrap_or(0.0)));
    }
    for m in &members {
        open(&m.daemon, spec.clone()).await;
    }
    settled(&members[0].daemon, &name, DAEMONS).await;
    let kube = consistd_testkit::kube_client().await;
    for n in 0..CHANGES {
        let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &namespaces[n % NAMESPACES]);
        let patch = json!({ "data": { "v": n.to_string() } });
        api.patch(&format!("cm-{}", (n / NAMESPACES) % PER_NAMESPACE), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("change");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut bytes, mut events) = (0.0, 0.0);
    for (m, (bytes_before, events_before)) in members.iter().zip(before) {
        bytes += (m.proxy.bytes_down() - bytes_before) as f64;
        events += m.daemon.metric("consistd_watch_events_total", "").await.unwrap_or(0.0) - events_before;
    }
    (bytes / DAEMONS as f64, events / DAEMONS as f64)
}

#[tokio::main]
async fn main() {
    let kube = consistd_testkit::kube_client().await;
    let run = format!("{:08x}", rand::random::<u32>());
    let mut namespaces = Vec::new();
    for _ in 0..NAMESPACES {
        let ns = consistd_testkit::namespace(&kube).await;
        let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
        // Random data: the apiserver gzips lists and watches, and a pad of one letter would weigh nothing.
        consistd_testkit::create_configmaps(&api, PER_NAMESPACE, |i| {
            let pad: String = (0..64).map(|_| format!("{:016x}", rand::random::<u64>())).collect();
            json!({ "metadata": { "name": format!("cm-{i}"), "labels": { "run": run } }, "data": { "v": "0", "pad": pad } })
        })
        .await;
        namespaces.push(ns);
    }
    let gates =
        std::fs::read_to_string(consistd_testkit::kubeconfig().with_file_name("feature-gates")).unwrap_or_default();
    println!(
        "shard_watch: {DAEMONS} daemons, one queue over {NAMESPACES} namespaces x {PER_NAMESPACE} ConfigMaps of 1 KiB, \
         {CHANGES} changes; apiserver feature gates: {:?}",
        gates.trim()
    );
    // The charts set both apiservers side by side: `make bench` runs this once against each (hack/bench.sh).
    let apiserver = if gates.contains("ShardedListAndWatch=true") {
        "apiserver with sharded watches"
    } else {
        "apiserver without them (the daemon filters)"
    };
    println!("| sharded by | MiB from the apiserver per daemon | watch events per daemon |");
    println!("| --- | ---: | ---: |");
    for (by, x) in [(ShardBy::Key, "by key"), (ShardBy::Namespace, "by namespace")] {
        let (bytes, events) = measure(by, &run, &namespaces).await;
        let mib = bytes / (1024.0 * 1024.0);
        println!("| {} | {mib:.2} | {events:.0} |", by.as_str_name());
        figures::record("shard-watch-bytes", "MiB from the apiserver per daemon", apiserver, x, mib);
        figures::record("shard-watch-events", "watch events per daemon", apiserver, x, events);
    }
}
