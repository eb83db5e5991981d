//! Sharded reconcile queue benchmark against the real control plane (`make bench`): one queue over 10,000
//! ConfigMaps run by 1, 2, 4 and 8 daemons on this machine, side by side in one run, printing its figures:
//!
//! 1. passes per second at saturation: every app holds 4 leases, waits 20 ms per pass (its I/O) and answers
//!    REQUEUE at once, so every key is always due and the queue, not the change rate, sets the pace;
//! 2. change-to-handler latency, p50 and p99 (from the change's patch being sent to the item reaching a
//!    handler), while a third party changes 200 keys a second and each pass waits 20 ms and answers DONE;
//! 3. the cost per daemon: apiserver requests per second (the apiserver's own `apiserver_request_total`,
//!    the bench's own writes taken off) and watch events per second (`consistd_watch_events_total`), idle
//!    and under those changes;
//! 4. at 4 replicas under 100 changes a second, each pass writing its key guarded by its item: a scale-up to
//!    8, then `kill -9` of one owner: the time until every slot has an owner again, and from an audit of
//!    every grant (pod, key, start, end) and every write (epoch, resourceVersion) the moments two pods held
//!    one key and the writes of a deposed owner that landed after its successor's.
//!
//! Then the timebertt design beside it (modelled from its documented defaults) and a projection to 100
//! replicas and 1,000,000 keys. Not a test: it asserts nothing about speed; it measures and prints.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use consistd_client::proto::{
    Completion, ElectionRef, ObjectQuery, Outcome, PatchRequest, PatchType, QueueSpec, ReconcileRequest,
    ReconcileResponse, WorkItem, WriteGuard, reconcile_request, reconcile_response,
    reconcile_service_client::ReconcileServiceClient,
};
use consistd_testkit::{Daemon, figures};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::{sync::mpsc, time::Instant};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const KEYS: usize = 10_000;
/// The group the queue's keys are spread over.
const GROUP: &str = "bench";
/// Each pass's I/O wait.
const HANDLER: Duration = Duration::from_millis(20);
/// Leases each app holds at once in the saturation run.
const SATURATION_LEASES: u32 = 4;
/// Leases each app holds at once in the live runs.
const LIVE_LEASES: u32 = 16;
const REPLICAS: [usize; 4] = [1, 2, 4, 8];
const WINDOW: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(120);
/// The third party's changes per second in the live runs.
const CHANGES: u64 = 200;
/// `membership.ttl`: how long a killed member's slots wait.
const TTL: &str = "5s";

/// What every app of one run saw and did.
#[derive(Default)]
struct Audit {
    /// Every grant: pod, key, epoch, start, end.
    grants: Vec<(usize, String, u64, Instant, Option<Instant>)>,
    /// Every guarded write that landed: key, epoch, the resourceVersion it made.
    writes: Vec<(String, u64, u64)>,
    /// Guarded writes the apiserver (or the daemon) refused.
    refused: u64,
    /// Change-to-handler latencies in ms, from the change's patch sent to the item's arrival.
    latencies: Vec<f64>,
}

/// How an app answers each pass.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// REQUEUE after 1 ms: every key always due.
    Saturate,
    /// DONE.
    Done,
    /// Writes its key (guarded by the item), then DONE.
    Write,
}

/// Shared by the apps and the third party of one run.
struct Run {
    ns: String,
    audit: Mutex<Audit>,
    passes: AtomicU64,
    /// When each (key, value) change's write was answered.
    changed: Mutex<HashMap<(String, String), Instant>>,
    /// Apps stop granting themselves new work (their pod is being killed).
    dead: Vec<AtomicBool>,
}

fn spec(ns: &str, name: &str, max_leases: u32) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        primary: Some(ObjectQuery { resource: "configmaps".into(), namespace: ns.into(), ..Default::default() }),
        max_leases,
        election: Some(ElectionRef { election: GROUP.into(), namespace: String::new() }),
        sharded: true,
        ..Default::default()
    }
}

async fn member(index: usize, ns: &str) -> Daemon {
    let config = format!("identity: pod-{index}\nnamespace: {ns}\nmembership:\n  ttl: {TTL}\n");
    // Warnings only: eight daemons logging every grant at debug would take the cores the queue needs.
    Daemon::builder(BIN).config(config).env("CONSISTD_LOG_LEVEL", "warn").start().await
}

/// The app of pod `index`: opens `spec` on `daemon` and handles each item as `mode` says, recording it.
async fn app(index: usize, daemon: &Daemon, spec: QueueSpec, mode: Mode, run: Arc<Run>) -> tokio::task::JoinHandle<()> {
    let (tx, requests) = mpsc::unbounded_channel();
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).expect("queue the spec");
    let mut client = ReconcileServiceClient::new(daemon.client().channel());
    let mut answers: Streaming<ReconcileResponse> =
        client.reconcile(UnboundedReceiverStream::new(requests)).await.expect("open the queue").into_inner();
    let objects = daemon.client();
    consistd_testkit::spawn(async move {
        while let Ok(Some(message)) = answers.message().await {
            let Some(reconcile_response::Response::Item(item)) = message.response else { continue };
            if run.dead[index].load(Ordering::Relaxed) {
                return;
            }
            let arrived = Instant::now();
            let grant = {
                let mut audit = run.audit.lock().expect("audit");
                if let Some(written) =
                    value(&item).and_then(|v| run.changed.lock().expect("changed").remove(&(item.name.clone(), v)))
                {
                    audit.latencies.push(arrived.duration_since(written).as_secs_f64() * 1000.0);
                }
                audit.grants.push((index, item.name.clone(), item.term, arrived, None));
                audit.grants.len() - 1
            };
            let (tx, run, objects) = (tx.clone(), run.clone(), objects.clone());
            consistd_testkit::spawn(async move {
                tokio::time::sleep(HANDLER).await;
                if mode == Mode::Write {
                    write(&objects, &run, &item).await;
                }
                if run.dead[index].load(Ordering::Relaxed) {
                    return;
                }
                run.audit.lock().expect("audit").grants[grant].4 = Some(Instant::now());
                run.passes.fetch_add(1, Ordering::Relaxed);
                let (outcome, requeue_after) = match mode {
                    Mode::Saturate => (Outcome::Requeue, Some(prost_types::Duration { seconds: 0, nanos: 1_000_000 })),
                    Mode::Done | Mode::Write => (Outcome::Done, None),
                };
                let done = Completion {
                    lease_id: item.lease_id,
                    outcome: outcome.into(),
                    requeue_after,
                    ..Default::default()
                };
                let _ = tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Complete(done)) });
            });
        }
    })
}

/// The `data.v` the item showed.
fn value(item: &WorkItem) -> Option<String> {
    let object = item.object.as_ref()?;
    let cm: serde_json::Value = serde_json::from_slice(&object.json).ok()?;
    cm["data"]["v"].as_str().map(str::to_owned)
}

/// Writes `handled` = the item's value on its key, guarded by the item; records what landed.
async fn write(client: &consistd_client::Client, run: &Run, item: &WorkItem) {
    let Some(v) = value(item) else { return };
    let patch = PatchRequest {
        resource: "configmaps".into(),
        namespace: run.ns.clone(),
        name: item.name.clone(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "metadata": { "annotations": { "handled": v } } }).to_string().into_bytes(),
        guard: Some(WriteGuard { election: GROUP.into(), namespace: String::new(), term: item.term }),
        reconcile_lease: item.lease_id.clone(),
        ..Default::default()
    };
    match client.objects().patch(patch).await {
        Ok(answer) => {
            let rv = answer
                .into_inner()
                .object
                .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.json).ok())
                .and_then(|o| o["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()))
                .unwrap_or(0);
            run.audit.lock().expect("audit").writes.push((item.name.clone(), item.term, rv));
        }
        Err(_) => run.audit.lock().expect("audit").refused += 1,
    }
}

/// The ring as `daemon`'s status shows it for queue `name`.
async fn ring(daemon: &Daemon, name: &str) -> Option<consistd_core::report::RingState> {
    let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.ok()?;
    report.queues.into_iter().find(|q| q.name == name).and_then(|q| q.ring)
}

/// Waits until `daemon` sees `members` members owning every slot evenly, nothing moving; returns how long.
async fn settled(daemon: &Daemon, name: &str, members: usize) -> Duration {
    let started = Instant::now();
    loop {
        if let Some(r) = ring(daemon, name).await {
            let share = r.slots / members;
            let even = r.members.values().all(|n| *n == share || *n == share + 1);
            if r.members.len() == members && r.unowned == 0 && r.moving == 0 && even {
                return started.elapsed();
            }
        }
        assert!(started.elapsed() < WAIT, "queue {name} did not settle on {members} members within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A third party changing keys round the namespace at `per_second`, until dropped; each write's answer time
/// is noted for the latency.
fn changer(api: Api<ConfigMap>, run: Arc<Run>, per_second: u64, from: u64) -> tokio::task::JoinHandle<()> {
    consistd_testkit::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_second));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for n in from.. {
            tick.tick().await;
            let (api, run) = (api.clone(), run.clone());
            consistd_testkit::spawn(async move {
                let name = key(usize::try_from(n).unwrap_or(0) % KEYS);
                let v = n.to_string();
                let patch = json!({ "data": { "v": v } });
                // Noted before it is sent: its event can reach a handler before its answer reaches us.
                run.changed.lock().expect("changed").insert((name.clone(), v), Instant::now());
                let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
            });
        }
    })
}

fn key(i: usize) -> String {
    format!("k{i:05}")
}

/// The apiserver's requests served so far, by verb and resource.
async fn apiserver_requests(kube: &kube::Client) -> HashMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let text = kube.request_text(request).await.expect("apiserver /metrics");
    let label = |line: &str, name: &str| {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        line[start..].split('"').next().map(str::to_owned)
    };
    let mut by = HashMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some(count) = line.rsplit(' ').next().and_then(|c| c.parse::<f64>().ok()) else { continue };
        let what =
            format!("{} {}", label(line, "verb").unwrap_or_default(), label(line, "resource").unwrap_or_default());
        *by.entry(what).or_default() += count;
    }
    by
}

/// Per daemon over `window`: apiserver requests/s (less `own_per_second`, the bench's own requests) and
/// watch events/s.
async fn cost(kube: &kube::Client, daemons: &[Daemon], window: Duration, own_per_second: f64) -> (f64, f64) {
    let events = async || {
        let mut sum = 0.0;
        for d in daemons {
            sum += d.metric("consistd_watch_events_total", "").await.unwrap_or(0.0);
        }
        sum
    };
    let (requests_before, events_before) = (apiserver_requests(kube).await, events().await);
    tokio::time::sleep(window).await;
    let (requests_after, events_after) = (apiserver_requests(kube).await, events().await);
    #[allow(clippy::cast_precision_loss, reason = "rates")]
    let (n, secs) = (daemons.len() as f64, window.as_secs_f64());
    let mut by: Vec<(String, f64)> = requests_after
        .iter()
        .map(|(what, after)| (what.clone(), after - requests_before.get(what).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    by.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<String> = by.iter().take(4).map(|(what, d)| format!("{what} {:.2}/s", d / secs / n)).collect();
    eprintln!("sharded: {} daemons, requests per daemon by verb and resource: {}", daemons.len(), top.join(", "));
    // The first read of /metrics counts itself.
    let requests = (by.iter().map(|(_, d)| d).sum::<f64>() - 1.0 - own_per_second * secs).max(0.0);
    (requests / secs / n, (events_after - events_before) / secs / n)
}

/// One run's figures at `replicas` members.
struct Figures {
    replicas: usize,
    passes: f64,
    p50: f64,
    p99: f64,
    idle: (f64, f64),
    busy: (f64, f64),
}

impl Run {
    fn new(ns: &str, pods: usize) -> Arc<Self> {
        Arc::new(Self {
            ns: ns.to_owned(),
            audit: Mutex::default(),
            passes: AtomicU64::new(0),
            changed: Mutex::default(),
            dead: (0..pods).map(|_| AtomicBool::new(false)).collect(),
        })
    }
}

async fn sweep(kube: &kube::Client, api: &Api<ConfigMap>, ns: &str, replicas: usize) -> Figures {
    let run = Run::new(ns, replicas);
    let mut daemons = Vec::new();
    for i in 0..replicas {
        daemons.push(member(i, ns).await);
    }
    // 1. Saturation.
    let name = format!("saturate-{replicas}");
    let mut apps = Vec::new();
    for (i, d) in daemons.iter().enumerate() {
        apps.push(app(i, d, spec(ns, &name, SATURATION_LEASES), Mode::Saturate, run.clone()).await);
    }
    settled(&daemons[0], &name, replicas).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = run.passes.load(Ordering::Relaxed);
    tokio::time::sleep(WINDOW).await;
    #[allow(clippy::cast_precision_loss, reason = "a rate")]
    let passes = (run.passes.load(Ordering::Relaxed) - before) as f64 / WINDOW.as_secs_f64();
    for a in apps.drain(..) {
        a.abort();
    }
    // 2. Live changes, after the initial list's pass of every key.
    let run = Run::new(ns, replicas);
    let name = format!("live-{replicas}");
    for (i, d) in daemons.iter().enumerate() {
        apps.push(app(i, d, spec(ns, &name, LIVE_LEASES), Mode::Done, run.clone()).await);
    }
    settled(&daemons[0], &name, replicas).await;
    let started = Instant::now();
    while run.passes.load(Ordering::Relaxed) < KEYS as u64 {
        if started.elapsed() > WAIT {
            for d in &daemons {
                let report = consistd_server::admin::fetch_report(d.admin_socket()).await.expect("status");
                eprintln!("{:?}", report.queues.iter().find(|q| q.name == name));
            }
            let granted: std::collections::HashSet<String> =
                run.audit.lock().expect("audit").grants.iter().map(|g| g.1.clone()).collect();
            let missing: Vec<String> = (0..KEYS).map(key).filter(|k| !granted.contains(k)).take(3).collect();
            panic!(
                "the initial list's {KEYS} passes within {WAIT:?}: {} passes; never: {missing:?}",
                run.passes.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let idle = cost(kube, &daemons, WINDOW, 0.0).await;
    run.audit.lock().expect("audit").latencies.clear();
    let third_party = changer(api.clone(), run.clone(), CHANGES, u64::try_from(replicas * 100_000).unwrap_or(0));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The third party's patches are the bench's own requests, not the daemons'.
    #[allow(clippy::cast_precision_loss, reason = "a rate")]
    let busy = cost(kube, &daemons, Duration::from_secs(10), CHANGES as f64).await;
    third_party.abort();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let latencies = std::mem::take(&mut run.audit.lock().expect("audit").latencies);
    for a in apps {
        a.abort();
    }
    Figures {
        replicas,
        passes,
        p50: figures::quantile(&latencies, 0.5).unwrap_or_default(),
        p99: figures::quantile(&latencies, 0.99).unwrap_or_default(),
        idle,
        busy,
    }
}

/// Moments two pods held one key, and writes of a deposed owner that landed after its successor's.
fn violations(audit: &Audit) -> (usize, usize) {
    let mut by_key: HashMap<&str, Vec<(usize, Instant, Instant)>> = HashMap::new();
    let now = Instant::now();
    for (pod, key, _, start, end) in &audit.grants {
        by_key.entry(key).or_default().push((*pod, *start, end.unwrap_or(now)));
    }
    let mut overlaps = 0;
    for grants in by_key.values_mut() {
        grants.sort_by_key(|g| g.1);
        for (i, a) in grants.iter().enumerate() {
            overlaps += grants[i + 1..].iter().filter(|b| b.1 < a.2 && b.0 != a.0).count();
        }
    }
    let mut writes: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for (key, epoch, rv) in &audit.writes {
        writes.entry(key).or_default().push((*rv, *epoch));
    }
    let mut late = 0;
    for w in writes.values_mut() {
        w.sort_unstable();
        let mut newest = 0;
        for (_, epoch) in w.iter() {
            if *epoch < newest {
                late += 1;
            }
            newest = newest.max(*epoch);
        }
    }
    (overlaps, late)
}

/// At 4 replicas under 100 changes a second, each pass writing its key: 4 more join, then one is killed.
async fn moves(api: &Api<ConfigMap>, ns: &str) {
    let run = Run::new(ns, 8);
    let name = "moves";
    let mut daemons = Vec::new();
    let mut apps = Vec::new();
    for i in 0..4 {
        daemons.push(member(i, ns).await);
        apps.push(app(i, &daemons[i], spec(ns, name, LIVE_LEASES), Mode::Write, run.clone()).await);
    }
    settled(&daemons[0], name, 4).await;
    let third_party = changer(api.clone(), run.clone(), 100, 10_000_000);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let joined_at = Instant::now();
    for i in 4..8 {
        daemons.push(member(i, ns).await);
        apps.push(app(i, &daemons[i], spec(ns, name, LIVE_LEASES), Mode::Write, run.clone()).await);
    }
    // The daemons start one after another, each ready before the next: the ring settles after that.
    let started = joined_at.elapsed();
    settled(&daemons[0], name, 8).await;
    let scale_up = joined_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // kill -9 of pod-5, an owner: its leases die with it (their grants end now in the audit).
    let killed_at = Instant::now();
    run.dead[5].store(true, Ordering::Relaxed);
    daemons[5].signal(Signal::SIGKILL);
    {
        let mut audit = run.audit.lock().expect("audit");
        for g in audit.grants.iter_mut().filter(|g| g.0 == 5 && g.4.is_none()) {
            g.4 = Some(killed_at);
        }
    }
    let recovered = settled(&daemons[0], name, 7).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    third_party.abort();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (overlaps, late, grants, writes, refused) = {
        let audit = run.audit.lock().expect("audit");
        let (o, l) = violations(&audit);
        (o, l, audit.grants.len(), audit.writes.len(), audit.refused)
    };
    for a in apps {
        a.abort();
    }
    println!("\nsharded: 4 replicas under 100 changes/s, each pass writing its key guarded by its item");
    println!(
        "  scale-up 4 -> 8: every slot owned, evenly, {:.2} s after the first new daemon started ({:.2} s until the fourth was ready and its app attached)",
        scale_up.as_secs_f64(),
        started.as_secs_f64()
    );
    // A member whose renewal was not answered within its hold stops granting and its slots move: under
    // load, what stretches a scale-up.
    let lapses: usize =
        daemons.iter().map(|d| d.logs().matches("this member holds no slot until it renews").count()).sum();
    println!("  holds that lapsed (a renewal not answered in time) across the 8 members: {lapses}");
    println!(
        "  kill -9 of an owner: every slot owned again {:.2} s after (membership.ttl {TTL})",
        recovered.as_secs_f64()
    );
    println!(
        "  audit: {grants} grants, {writes} writes landed, {refused} refused; moments two pods held one key: {overlaps}; deposed owners' writes that landed after a successor's: {late}"
    );
    figures::record("sharded-moves", "seconds", "consistd", "scale-up 4 to 8", scale_up.as_secs_f64());
    figures::record("sharded-moves", "seconds", "consistd", "kill -9 of an owner", recovered.as_secs_f64());
}

#[tokio::main]
async fn main() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    let started = Instant::now();
    consistd_testkit::create_configmaps(
        &api,
        KEYS,
        |i| json!({ "metadata": { "name": key(i) }, "data": { "v": "0" } }),
    )
    .await;
    println!("sharded: {KEYS} ConfigMaps created in {:.1} s", started.elapsed().as_secs_f64());

    let mut rows = Vec::new();
    for replicas in REPLICAS {
        rows.push(sweep(&kube, &api, &ns, replicas).await);
    }
    let one = rows[0].passes;
    println!("\nsharded: one queue over {KEYS} keys, a 20 ms handler, the replicas daemons on this machine (2 cores)");
    println!(
        "{:>8} {:>10} {:>12} {:>10} {:>10} {:>14} {:>14} {:>14} {:>14}",
        "replicas", "passes/s", "x one's", "p50 ms", "p99 ms", "idle req/s", "idle ev/s", "busy req/s", "busy ev/s"
    );
    for f in &rows {
        #[allow(clippy::cast_precision_loss, reason = "a ratio")]
        let ratio = f.passes / one;
        println!(
            "{:>8} {:>10.0} {:>12.2} {:>10.1} {:>10.1} {:>14.2} {:>14.1} {:>14.2} {:>14.1}",
            f.replicas, f.passes, ratio, f.p50, f.p99, f.idle.0, f.idle.1, f.busy.0, f.busy.1
        );
        #[allow(clippy::cast_precision_loss, reason = "a count")]
        let x = f.replicas as f64;
        figures::record("sharded-passes", "passes per second", "consistd", x, f.passes);
        figures::record("sharded-passes", "passes per second", "ideal (N x one replica)", x, one * x);
        figures::record("sharded-latency", "ms, change to handler", "p50", x, f.p50);
        figures::record("sharded-latency", "ms, change to handler", "p99", x, f.p99);
    }
    moves(&api, &ns).await;
    project(&rows);
}

/// The timebertt design beside consistd, per daemon, and both projected to 100 replicas and 1,000,000 keys.
///
/// timebertt/kubernetes-controller-sharding, from its documentation: each shard renews its Lease as
/// controller-runtime's leader election does (a write every RetryPeriod, 2 s), watches only the objects
/// labelled for it, and the sharder watches every object and writes the shard label on each object it
/// assigns or moves (two writes per moved object while the old shard lives: the drain label, then the new
/// shard's). consistd: each member renews every third of `membership.ttl` (30 s by default), watches every
/// object of the queue sharded by key (this bench) or only its slots' namespaces sharded by namespace
/// (daemon/benches/shard_watch.rs), and moves a slot with one ring write and one hand-off Lease per batch of
/// slots.
fn project(rows: &[Figures]) {
    let eight = rows.last().expect("rows");
    // The watch events per daemon under the live changes, as measured, scale with the change rate.
    #[allow(clippy::cast_precision_loss, reason = "a rate")]
    let events_per_change = eight.busy.1 / CHANGES as f64;
    println!(
        "\nsharded: beside timebertt's design (modelled), per daemon, at a change rate of C per second over N replicas"
    );
    println!(
        "  consistd:  requests/s = 1/10 (renewal at membership.ttl 30 s) + moves (measured here at {TTL}: {:.2} idle); watch events/s = C x {events_per_change:.2} sharded by key (every member sees every change; measured at 8), about C / N sharded by namespace on an apiserver with sharded watches (bench shard_watch)",
        eight.idle.0
    );
    println!(
        "  timebertt: requests/s = 1/2 (renewal every 2 s); watch events/s = C / N; sharder: 2 writes per object moved"
    );
    println!(
        "  projected to 100 replicas, 1,000,000 keys, C = 1,000 changes/s; a member joining moves 1/101 of the keys:"
    );
    let (n, keys, c) = (100.0_f64, 1_000_000.0_f64, 1_000.0_f64);
    let moved = keys / (n + 1.0);
    println!(
        "    consistd:  {:.2} requests/s per daemon idle, {:.0} watch events/s per daemon by key ({:.0} by namespace); a join moves ~{:.0} slots of 1024 with ~{:.0} ring and hand-off writes in all",
        0.1,
        c * events_per_change,
        c / n,
        1024.0 / (n + 1.0),
        2.0 + (1024.0 / (n + 1.0) / 16.0).ceil()
    );
    println!(
        "    timebertt: {:.2} requests/s per daemon idle, {:.0} watch events/s per daemon; a join moves ~{moved:.0} objects with ~{:.0} label writes",
        0.5,
        c / n,
        2.0 * moved
    );
    println!(
        "    memory: sharded by key, each consistd member queues every key (~{:.0} MB for 1,000,000 keys at the reconcile bench's 647 bytes per key, beside the watch's cache of every object); by namespace, and a timebertt shard, 1/N of both",
        keys * 647.0 / 1e6
    );
}
