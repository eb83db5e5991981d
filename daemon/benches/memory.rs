//! What the sidecar holds per watched object, by view, beside a client-go informer in the same run
//! (`make bench`): 10,000, 30,000 and 100,000 ConfigMaps of 1 KiB and 3 KiB, each set watched by a fresh
//! daemon in every view (full with managedFields, the default without them, metadata only, a projection of
//! one field) and by client-go's ConfigMap informer (plain, and with the usual transform that drops
//! managedFields). For each: RSS after SYNCED less before, per object (the daemon's a second after, the
//! informer's at once and after a forced GC, its best case); the daemon's budget charge per object; time
//! to SYNCED; bytes the apiserver sent (through a counting proxy, gzip as each client negotiates it).
//!
//! Not a test: it asserts nothing about memory; it measures and prints. Needs the informer child built by
//! hack/bench.sh (`CONSISTD_BENCH_INFORMERS`, default target/bench/informers); `CONSISTD_BENCH_MEMORY_MOST`
//! keeps only the sets of at most that many objects.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

use consistd_client::proto::{ObjectView, SubscribeRequest};
use consistd_testkit::{
    Daemon, figures,
    proxy::DelayProxy,
    watch::{Events, raw},
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::PostParams};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const COUNTS: [usize; 3] = [10_000, 30_000, 100_000];
const SIZES: [usize; 2] = [1024, 3 * 1024];

/// One row: who held the set, and what it cost.
struct Row {
    who: &'static str,
    rss_per_object: f64,
    /// The informer's after a forced GC.
    collected_per_object: Option<f64>,
    charge_per_object: Option<f64>,
    synced: Duration,
    wire_bytes: u64,
}

/// The daemon's views, as the table names them.
fn views() -> [(&'static str, Option<ObjectView>); 4] {
    [
        ("consistd full (managedFields kept)", Some(ObjectView { managed_fields: true, ..Default::default() })),
        ("consistd default (no managedFields)", None),
        ("consistd metadata only", Some(ObjectView { metadata_only: true, ..Default::default() })),
        (
            "consistd projection (data.field)",
            Some(ObjectView { fields: vec!["data.field".into()], ..Default::default() }),
        ),
    ]
}

/// Creates ConfigMaps `from..to` of about `size` bytes in `ns`, 64 at a time.
async fn fill(api: &Api<ConfigMap>, from: usize, to: usize, size: usize) {
    futures::stream::iter(from..to)
        .map(|i| {
            let cm = json!({
                "metadata": { "name": format!("cm-{i:06}"), "labels": { "app": "bench" } },
                "data": { "field": format!("v{i}"), "pad": "x".repeat(size.saturating_sub(300)) }
            });
            let cm: ConfigMap = serde_json::from_value(cm).expect("configmap");
            async move { api.create(&PostParams::default(), &cm).await.expect("create") }
        })
        .buffer_unordered(64)
        .for_each(|_| async {})
        .await;
}

#[allow(clippy::cast_precision_loss, reason = "figures")]
async fn through_daemon(ns: &str, count: usize, who: &'static str, view: Option<ObjectView>) -> Row {
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let daemon = Daemon::builder(BIN).env("CONSISTD_LOG_LEVEL", "warn").through(&proxy).start().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = consistd_testkit::rss_kib(daemon.pid());
    let down = proxy.bytes_down();
    let started = Instant::now();
    let mut events = Events::open(&daemon.client(), SubscribeRequest { view, ..raw("configmaps", ns) }).await;
    let listed = events.until_synced().await.len() - 1;
    let synced = started.elapsed();
    assert_eq!(listed, count, "{who}: the whole set");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = consistd_testkit::rss_kib(daemon.pid());
    let charge = daemon.metric("consistd_watch_budget_used_bytes", "").await.unwrap_or(f64::NAN);
    Row {
        who,
        rss_per_object: (after.saturating_sub(before) * 1024) as f64 / count as f64,
        collected_per_object: None,
        charge_per_object: Some(charge / count as f64),
        synced,
        wire_bytes: proxy.bytes_down() - down,
    }
}

/// The informer child, started and ready.
struct Informer {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Informer {
    fn expect(&mut self, prefix: &str) -> String {
        for line in self.lines.by_ref() {
            let line = line.expect("the informer's output");
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
        panic!("the informer ended before {prefix:?}");
    }
}

#[allow(clippy::cast_precision_loss, reason = "figures")]
async fn through_informer(ns: &str, count: usize, who: &'static str, mode: &str) -> Row {
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let dir = tempfile::tempdir().expect("a directory");
    let kubeconfig = consistd_testkit::kubeconfig_via(proxy.addr(), dir.path());
    #[allow(clippy::disallowed_methods, reason = "the bench harness's switch, not the daemon's environment")]
    // Cargo runs a bench from its package's directory, so the default is named from the repository's root.
    let bin = std::env::var("CONSISTD_BENCH_INFORMERS")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench/informers").into());
    let mut child = Command::new(&bin)
        .args(["memory", ns, mode])
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {bin} (built by hack/bench.sh): {e}"));
    let stdin = child.stdin.take().expect("stdin");
    let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut informer = Informer { child, stdin, lines };
    informer.expect("ready");
    let pid = informer.child.id();
    let before = consistd_testkit::rss_kib(pid);
    let down = proxy.bytes_down();
    writeln!(informer.stdin, "go").expect("start the informer");
    let synced = tokio::task::spawn_blocking(move || {
        let ms: u64 = informer.expect("synced ").parse().expect("milliseconds");
        (informer, ms)
    })
    .await
    .expect("the informer synced");
    let (mut informer, ms) = synced;
    let after = consistd_testkit::rss_kib(pid);
    let wire_bytes = proxy.bytes_down() - down;
    writeln!(informer.stdin, "gc").expect("collect");
    informer.expect("collected");
    let collected = consistd_testkit::rss_kib(pid);
    drop(informer.stdin);
    let _ = informer.child.wait();
    let per_object = |kib: u64| (kib.saturating_sub(before) * 1024) as f64 / count as f64;
    Row {
        who,
        rss_per_object: per_object(after),
        collected_per_object: Some(per_object(collected)),
        charge_per_object: None,
        synced: Duration::from_millis(ms),
        wire_bytes,
    }
}

#[tokio::main]
async fn main() {
    let kube = consistd_testkit::kube_client().await;
    // `CONSISTD_BENCH_MEMORY_MOST=10000`: only the sets of at most that many objects (a quick look).
    #[allow(clippy::disallowed_methods, reason = "the bench harness's switch, not the daemon's environment")]
    let most: usize =
        std::env::var("CONSISTD_BENCH_MEMORY_MOST").ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX);
    println!("## Memory per watched object, by view, beside client-go's informer");
    println!();
    println!(
        "| objects | size | who | RSS per object | vs the informer (after its GC) | charge per object | to SYNCED | apiserver sent |"
    );
    println!("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    std::io::stdout().flush().ok();
    for size in SIZES {
        let ns = consistd_testkit::namespace(&kube).await;
        let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
        let mut have = 0;
        for count in COUNTS.into_iter().filter(|c| *c <= most) {
            fill(&api, have, count, size).await;
            have = count;
            let mut rows = Vec::new();
            for (who, view) in views() {
                rows.push(through_daemon(&ns, count, who, view).await);
            }
            rows.push(through_informer(&ns, count, "client-go informer", "plain").await);
            rows.push(through_informer(&ns, count, "client-go informer, transform", "transform").await);
            let informer = rows
                .iter()
                .find(|r| r.who == "client-go informer")
                .and_then(|r| r.collected_per_object)
                .unwrap_or(f64::NAN);
            for row in &rows {
                let charge = row.charge_per_object.map_or_else(|| "-".to_owned(), |c| format!("{c:.0} B"));
                let rss = match row.collected_per_object {
                    Some(collected) => format!("{:.0} B, {collected:.0} B after GC", row.rss_per_object),
                    None => format!("{:.0} B", row.rss_per_object),
                };
                let versus = row.collected_per_object.unwrap_or(row.rss_per_object) / informer;
                println!(
                    "| {count} | {} KiB | {} | {rss} | {versus:.2} | {charge} | {:.2} s | {:.1} MiB |",
                    size / 1024,
                    row.who,
                    row.synced.as_secs_f64(),
                    row.wire_bytes as f64 / (1024.0 * 1024.0),
                );
                let rss = row.collected_per_object.unwrap_or(row.rss_per_object);
                let chart = format!("watch-memory-{}kib", size / 1024);
                figures::record(&chart, "RSS per object, bytes (the informer's after its GC)", row.who, count, rss);
            }
            std::io::stdout().flush().ok();
        }
        kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.clone())
            .delete(&ns, &Default::default())
            .await
            .expect("delete the namespace");
    }
}
