//! A sharded reconcile queue against the real apiserver: one queue run by several daemons, its keys spread
//! over them, each key leased to one pod at a time across the whole group while members join, one is
//! killed and one leaves (an audit of every grant finds no two pods holding one key at once), every change
//! handled; and bad input refused naming the field.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use consistd_client::proto::{
    Completion, ElectionRef, ObjectQuery, Outcome, PatchRequest, PatchType, QueueSpec, ReconcileRequest,
    ReconcileResponse, ShardBy, WorkItem, WriteGuard, reconcile_request, reconcile_response,
};
use consistd_testkit::Daemon;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::{sync::mpsc, time::Instant};
use tonic::{Code, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
/// The group the queue's keys are spread over.
const GROUP: &str = "shards";
/// Long enough for a hand-off on a busy machine.
const WAIT: Duration = Duration::from_secs(60);
/// How long a handler holds each lease: leases overlap in time, so a second holder would show.
const HANDLER: Duration = Duration::from_millis(100);

fn spec(ns: &str) -> QueueSpec {
    QueueSpec {
        name: "work".into(),
        primary: Some(ObjectQuery { resource: "configmaps".into(), namespace: ns.into(), ..Default::default() }),
        max_leases: 50,
        election: Some(ElectionRef { election: GROUP.into(), namespace: String::new() }),
        sharded: true,
        ..Default::default()
    }
}

/// A daemon of the group: its namespace `ns`, members counting for 3 s after a renewal.
async fn member(identity: &str, ns: &str) -> Daemon {
    member_for(identity, ns, "3s").await
}

/// A daemon of the group whose members count for `ttl` after a renewal.
async fn member_for(identity: &str, ns: &str, ttl: &str) -> Daemon {
    let config = format!("identity: {identity}\nnamespace: {ns}\nmembership:\n  ttl: {ttl}\n");
    Daemon::builder(BIN).config(config).start().await
}

/// Opens `spec` on `daemon`: the stream's requests and answers, or the status that refused it.
async fn open(
    daemon: &Daemon,
    spec: QueueSpec,
) -> Result<(mpsc::Sender<ReconcileRequest>, Streaming<ReconcileResponse>), tonic::Status> {
    consistd_testkit::queue::open(daemon, spec).await.map(|q| (q.tx, q.rx))
}

/// One grant as the app saw it: from the item's arrival to its completion (or its pod's death).
#[derive(Debug, Clone)]
struct Grant {
    pod: String,
    key: String,
    start: Instant,
    end: Option<Instant>,
}

/// Every grant to every pod.
#[derive(Debug, Default)]
struct Audit {
    grants: Vec<Grant>,
}

impl Audit {
    /// Moments two pods held one key: pairs of grants of one key, from different pods, that overlap.
    fn overlaps(&self) -> Vec<(Grant, Grant)> {
        let mut by_key: HashMap<&str, Vec<&Grant>> = HashMap::new();
        for g in &self.grants {
            by_key.entry(&g.key).or_default().push(g);
        }
        let mut out = Vec::new();
        for grants in by_key.values_mut() {
            grants.sort_by_key(|g| g.start);
            for (i, a) in grants.iter().enumerate() {
                for b in &grants[i + 1..] {
                    let a_end = a.end.unwrap_or(Instant::now());
                    if b.start < a_end && a.pod != b.pod {
                        out.push(((*a).clone(), (*b).clone()));
                    }
                }
            }
        }
        out
    }

    /// Grants by pod.
    fn per_pod(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for g in &self.grants {
            *out.entry(g.pod.clone()).or_default() += 1;
        }
        out
    }

    /// Ends `pod`'s open grants at `at`: its daemon died then, and its leases with it.
    fn died(&mut self, pod: &str, at: Instant) {
        for g in self.grants.iter_mut().filter(|g| g.pod == pod && g.end.is_none()) {
            g.end = Some(at);
        }
    }
}

/// The app of one pod: takes each item, records it, writes `metadata.annotations.handled` (the `data.v`
/// it saw) through consistd with the item's guard and lease when it differs, holds the lease for
/// [`HANDLER`], and completes DONE.
fn run_app(
    pod: &str,
    daemon: &Daemon,
    ns: &str,
    queue: (mpsc::Sender<ReconcileRequest>, Streaming<ReconcileResponse>),
    audit: Arc<Mutex<Audit>>,
) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = queue;
    let (pod, client, ns) = (pod.to_owned(), daemon.client(), ns.to_owned());
    consistd_testkit::spawn(async move {
        while let Ok(Some(message)) = rx.message().await {
            let Some(reconcile_response::Response::Item(item)) = message.response else { continue };
            let index = {
                let mut audit = audit.lock().expect("audit");
                audit.grants.push(Grant { pod: pod.clone(), key: item.name.clone(), start: Instant::now(), end: None });
                audit.grants.len() - 1
            };
            let (tx, client, ns, audit) = (tx.clone(), client.clone(), ns.clone(), audit.clone());
            consistd_testkit::spawn(async move {
                handle(&client, &ns, &item).await;
                tokio::time::sleep(HANDLER).await;
                audit.lock().expect("audit").grants[index].end.get_or_insert(Instant::now());
                let done =
                    Completion { lease_id: item.lease_id.clone(), outcome: Outcome::Done.into(), ..Default::default() };
                let _ = tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Complete(done)) }).await;
            });
        }
    })
}

/// Records the `data.v` the item showed on the object, guarded by the item (its slot's epoch).
async fn handle(client: &consistd_client::Client, ns: &str, item: &WorkItem) {
    let Some(object) = &item.object else { return };
    let cm: serde_json::Value = serde_json::from_slice(&object.json).expect("json");
    let v = cm["data"]["v"].as_str().unwrap_or_default().to_owned();
    if cm["metadata"]["annotations"]["handled"].as_str() == Some(v.as_str()) {
        return;
    }
    let patch = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        name: item.name.clone(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "metadata": { "annotations": { "handled": v } } }).to_string().into_bytes(),
        guard: Some(WriteGuard { election: GROUP.into(), namespace: String::new(), term: item.term }),
        reconcile_lease: item.lease_id.clone(),
        ..Default::default()
    };
    // A lease that went back (its pod's slot moved, its hold lapsed) is refused: the next owner handles it.
    let _ = client.objects().patch(patch).await;
}

/// The ring of `queue` as `daemon`'s status shows it: members and their slots, slots unowned, slots moving.
async fn ring_of(daemon: &Daemon, queue: &str) -> Option<consistd_core::report::RingState> {
    let report =
        tokio::time::timeout(Duration::from_secs(10), consistd_server::admin::fetch_report(daemon.admin_socket()))
            .await
            .expect("consistd status answered within 10 s")
            .expect("consistd status");
    report.queues.into_iter().find(|q| q.name == queue).and_then(|q| q.ring)
}

/// Waits until `daemon` sees exactly `members` owning every slot of the queue "work" between them,
/// evenly, nothing moving.
async fn settled(daemon: &Daemon, members: &[&str]) -> Duration {
    settled_of(daemon, "work", members).await
}

/// Waits until `daemon` sees exactly `members` owning every slot of `queue` between them, evenly, nothing
/// moving.
async fn settled_of(daemon: &Daemon, queue: &str, members: &[&str]) -> Duration {
    let started = Instant::now();
    loop {
        if let Some(r) = ring_of(daemon, queue).await {
            let names: Vec<&str> = r.members.keys().map(String::as_str).collect();
            let share = r.slots / members.len();
            let even = r.members.values().all(|n| *n == share || *n == share + 1);
            if names == members && r.unowned == 0 && r.moving == 0 && even {
                return started.elapsed();
            }
            assert!(started.elapsed() < WAIT, "the ring did not settle on {members:?} within {WAIT:?}: {r:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every ConfigMap's `handled` annotation shows its `data.v`: every change was handled; else
/// fails with what `explain` says of the keys behind.
async fn all_handled(api: &Api<ConfigMap>, explain: &dyn Fn(&[String]) -> String) {
    let started = Instant::now();
    loop {
        let list = api.list(&Default::default()).await.expect("list");
        let behind: Vec<String> = list
            .items
            .iter()
            .filter_map(|cm| {
                let v = cm.data.as_ref().and_then(|d| d.get("v"));
                let handled = cm.metadata.annotations.as_ref().and_then(|a| a.get("handled"));
                let name = cm.metadata.name.clone()?;
                let rv = cm.metadata.resource_version.clone().unwrap_or_default();
                (v != handled).then(|| format!("{name} (v {v:?}, handled {handled:?}, at {rv})"))
            })
            .collect();
        if behind.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "{} keys never handled their newest change: {:?}\n{}",
            behind.len(),
            &behind[..behind.len().min(10)],
            explain(&behind)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn keys_spread_over_the_members_and_none_is_leased_to_two_pods_at_once_through_joins_a_kill_and_a_leave() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    const KEYS: usize = 120;
    for i in 0..KEYS {
        let cm: ConfigMap =
            serde_json::from_value(json!({ "metadata": { "name": format!("cm-{i}") }, "data": { "v": "0" } }))
                .expect("configmap");
        api.create(&PostParams::default(), &cm).await.expect("create");
    }
    let audit = Arc::new(Mutex::new(Audit::default()));
    // A third party changes the keys all along: a steady 100 changes a second, round the keys.
    let writer = {
        let api = api.clone();
        consistd_testkit::spawn(async move {
            for n in 1u64.. {
                let name = format!("cm-{}", n % KEYS as u64);
                let patch = json!({ "data": { "v": n.to_string() } });
                let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    let a = member("pod-a", &ns).await;
    let _app_a = run_app("pod-a", &a, &ns, open(&a, spec(&ns)).await.expect("open on A"), audit.clone());
    settled(&a, &["pod-a"]).await;
    let mut b = member("pod-b", &ns).await;
    let _app_b = run_app("pod-b", &b, &ns, open(&b, spec(&ns)).await.expect("open on B"), audit.clone());
    let c = member("pod-c", &ns).await;
    let app_c = run_app("pod-c", &c, &ns, open(&c, spec(&ns)).await.expect("open on C"), audit.clone());
    let joined = settled(&a, &["pod-a", "pod-b", "pod-c"]).await;
    eprintln!("two members joined: the ring settled {joined:?} after the last one opened the queue");

    // B is killed under load: its slots go to the others once its hold has surely ended.
    b.signal(Signal::SIGKILL);
    audit.lock().expect("audit").died("pod-b", Instant::now());
    b.wait_exit(WAIT).await;
    let taken = settled(&a, &["pod-a", "pod-c"]).await;
    eprintln!("pod-b killed: every slot owned again {taken:?} after");

    // C leaves gracefully: its app goes, and its daemon hands its slots on before its hold would lapse.
    app_c.abort();
    c.signal(Signal::SIGTERM);
    let left = settled(&a, &["pod-a"]).await;
    eprintln!("pod-c left: A owned every slot {left:?} after");

    writer.abort();
    let explain = |behind: &[String]| {
        let audit = audit.lock().expect("audit");
        let t0 = audit.grants.first().map_or_else(Instant::now, |g| g.start);
        let grants: Vec<String> = audit
            .grants
            .iter()
            .filter(|g| behind.iter().any(|b| b.split(' ').next() == Some(g.key.as_str())))
            .map(|g| format!("{} {} at {:?} for {:?}", g.key, g.pod, g.start - t0, g.end.map(|e| e - g.start)))
            .collect();
        format!("their grants:\n{}\nA's log:\n{}\nC's log:\n{}", grants.join("\n"), a.logs(), c.logs())
    };
    all_handled(&api, &explain).await;
    let (overlaps, per_pod) = {
        let audit = audit.lock().expect("audit");
        (audit.overlaps(), audit.per_pod())
    };
    assert!(overlaps.is_empty(), "{} moments two pods held one key, e.g. {:?}", overlaps.len(), overlaps.first());
    eprintln!("grants per pod: {per_pod:?}");
    assert!(per_pod.len() == 3 && per_pod.values().all(|n| *n > 0), "every member handled keys: {per_pod:?}");

    // A's metrics: it owns every slot and key now, handed slots on when B and C joined, and, as the
    // coordinator, counted the slot-seconds B's slots had no owner granting after the kill.
    let metric = |name: &'static str| {
        let a = &a;
        async move { a.metric(name, "name=\"work\"").await.unwrap_or_else(|| panic!("{name} on A")) }
    };
    // The gauges follow the ring within the driver's report interval (250 ms).
    let started = Instant::now();
    while metric("consistd_workqueue_shard_slots").await != 1024.0 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric("consistd_workqueue_shard_slots").await, 1024.0);
    assert_eq!(metric("consistd_workqueue_shard_keys").await, KEYS as f64);
    assert!(metric("consistd_workqueue_shard_handoffs_total").await >= 600.0, "A handed about 2/3 of its slots on");
    let ownerless = metric("consistd_workqueue_shard_ownerless_slot_seconds_total").await;
    // From when B stopped counting as live (a TTL after its last renewal) until the coordinator gave its
    // slots away (a consistent read a TTL after that renewal, and a plan): a part of a TTL, for ~341 slots.
    eprintln!("B's slots went without an owner for {ownerless:.0} slot-seconds");
    assert!(
        (34.0..341.0 * 6.0).contains(&ownerless),
        "B's ~341 slots waited between 0.1 s and two TTLs for an owner: {ownerless} slot-seconds"
    );
}

#[tokio::test]
async fn a_sharded_queue_without_an_election_or_with_a_spec_that_differs_is_refused_naming_the_field() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let a = member("pod-a", &ns).await;
    let refused = open(&a, QueueSpec { election: None, ..spec(&ns) }).await.expect_err("no election");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused}");
    assert!(refused.message().starts_with("spec.sharded: "), "{refused}");

    let _queue = open(&a, spec(&ns)).await.expect("open on A");
    let b = member("pod-b", &ns).await;
    let other = QueueSpec {
        primary: Some(ObjectQuery {
            resource: "configmaps".into(),
            namespace: ns.clone(),
            label_selector: "app=other".into(),
            ..Default::default()
        }),
        ..spec(&ns)
    };
    let refused = open(&b, other).await.expect_err("a spec that differs from A's");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(refused.message().starts_with("spec.primary.label_selector: member pod-a runs sharded queue"), "{refused}");
    // The same spec joins.
    let _joined = open(&b, spec(&ns)).await.expect("open on B with A's spec");
    settled(&a, &["pod-a", "pod-b"]).await;
}

#[tokio::test]
async fn a_queue_sharded_by_namespace_is_refused_where_a_namespace_cannot_spread_its_keys() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let a = member("pod-a", &ns).await;
    let by_ns = |spec: QueueSpec| QueueSpec { shard_by: ShardBy::Namespace.into(), ..spec };
    let all = by_namespace("refusals");
    let cases = [
        (
            "not sharded",
            QueueSpec { sharded: false, ..all.clone() },
            Code::InvalidArgument,
            "spec.shard_by: only a sharded queue",
        ),
        (
            "one namespace",
            by_ns(spec(&ns)),
            Code::InvalidArgument,
            "spec.shard_by: spec.primary.namespace names one namespace",
        ),
        (
            "cluster-scoped",
            QueueSpec {
                primary: Some(ObjectQuery { resource: "namespaces".into(), ..Default::default() }),
                ..all.clone()
            },
            Code::InvalidArgument,
            "spec.shard_by: namespaces is cluster-scoped",
        ),
        (
            "unknown",
            QueueSpec { shard_by: 7, ..all.clone() },
            Code::InvalidArgument,
            "spec.shard_by: 7 is not a ShardBy",
        ),
    ];
    for (what, spec, code, message) in cases {
        let refused = open(&a, spec).await.expect_err(what);
        assert_eq!(refused.code(), code, "{what}: {refused}");
        assert!(refused.message().starts_with(message), "{what}: {refused}");
    }
    // Members must agree on it: one sharded by key where another shards by namespace is refused.
    let _queue = open(&a, all.clone()).await.expect("open on A");
    let b = member("pod-b", &ns).await;
    let refused =
        open(&b, QueueSpec { shard_by: ShardBy::Key.into(), ..all }).await.expect_err("by key beside by namespace");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(refused.message().starts_with("spec.shard_by: member pod-a runs sharded queue"), "{refused}");
}

/// One item as an app saw it: its pod, key, attempt, and when it came.
type Seen = Arc<Mutex<Vec<(String, String, u32, Instant)>>>;

/// The app of a pod that completes each key as its name says: "failing" RETRY, "later" REQUEUE in an
/// hour, "terminal" TERMINAL, anything else DONE; every item is recorded in `seen`.
fn outcomes_app(
    pod: &str,
    queue: (mpsc::Sender<ReconcileRequest>, Streaming<ReconcileResponse>),
    seen: Seen,
) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = queue;
    let pod = pod.to_owned();
    consistd_testkit::spawn(async move {
        while let Ok(Some(message)) = rx.message().await {
            let Some(reconcile_response::Response::Item(item)) = message.response else { continue };
            seen.lock().expect("seen").push((pod.clone(), item.name.clone(), item.attempt, Instant::now()));
            let (outcome, requeue_after, error) = match item.name.as_str() {
                "failing" => (Outcome::Retry, None, "still failing"),
                "later" => (Outcome::Requeue, Some(prost_types::Duration { seconds: 3600, nanos: 0 }), ""),
                "terminal" => (Outcome::Terminal, None, "bad spec"),
                _ => (Outcome::Done, None, ""),
            };
            let completion = Completion {
                lease_id: item.lease_id.clone(),
                outcome: outcome.into(),
                requeue_after,
                error: error.into(),
                priority: 0,
            };
            let _ = tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Complete(completion)) }).await;
        }
    })
}

/// The items `seen` of `pod` for `key`: (attempt, when).
fn items(seen: &Seen, pod: &str, key: &str) -> Vec<(u32, Instant)> {
    let seen = seen.lock().expect("seen");
    seen.iter().filter(|(p, k, _, _)| p == pod && k == key).map(|(_, _, attempt, at)| (*attempt, *at)).collect()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < WAIT, "{what} within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// When the pod a key's slot moves to opens the queue: before its last owner leaves (a rollout that
/// surges), or after (a single replica restarted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handover {
    JoinThenLeave,
    LeaveThenJoin,
}

/// A member that leaves hands each slot on with its keys' state: the next owner retries a failing key
/// after its backoff and counting its failures (not at once, as a first attempt), keeps an hour's requeue,
/// and leaves a TERMINAL key and a DONE one alone until they change.
#[tokio::test]
async fn a_key_carries_its_backoff_requeue_and_terminal_mark_to_the_pod_its_slot_moves_to() {
    carries_its_state(Handover::JoinThenLeave).await;
}

/// A member that leaves with no other member live leaves its slots to nobody, their keys' state kept
/// for the next member to open the queue.
#[tokio::test]
async fn a_key_carries_its_state_to_the_next_pod_to_open_the_queue_after_the_last_one_left() {
    carries_its_state(Handover::LeaveThenJoin).await;
}

async fn carries_its_state(handover: Handover) {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    for name in ["failing", "later", "terminal", "done"] {
        let cm: ConfigMap =
            serde_json::from_value(json!({ "metadata": { "name": name }, "data": { "v": "0" } })).expect("configmap");
        api.create(&PostParams::default(), &cm).await.expect("create");
    }
    let spec = QueueSpec {
        retry: Some(consistd_client::proto::RetryPolicy {
            base_delay: Some(prost_types::Duration { seconds: 2, nanos: 0 }),
            ..Default::default()
        }),
        ..spec(&ns)
    };
    let seen: Seen = Arc::default();
    // Holds of 10 s: a renewal late on a busy machine must not end A's hold (its slots would then go on
    // with nothing carried, which is what this test tells apart).
    let mut a = member_for("pod-a", &ns, "10s").await;
    let _app_a = outcomes_app("pod-a", open(&a, spec.clone()).await.expect("open on A"), seen.clone());
    // The failing key's second attempt, 2 s after its first: its next waits 4 s.
    until("A tried the failing key twice", || items(&seen, "pod-a", "failing").len() >= 2).await;
    let (_, second) = items(&seen, "pod-a", "failing")[1];
    for key in ["later", "terminal", "done"] {
        assert_eq!(items(&seen, "pod-a", key).len(), 1, "{key} once on A");
    }
    let join = async || {
        let b = member_for("pod-b", &ns, "10s").await;
        let app = outcomes_app("pod-b", open(&b, spec.clone()).await.expect("open on B"), seen.clone());
        (b, app)
    };
    let mut joined = None;
    if handover == Handover::JoinThenLeave {
        joined = Some(join().await);
    }
    // A leaves: every slot goes to B with its keys' state (or, B not there yet, waits for it).
    a.signal(Signal::SIGTERM);
    a.wait_exit(WAIT).await;
    let (b, _app_b) = match joined {
        Some(joined) => joined,
        None => join().await,
    };
    settled(&b, &["pod-b"]).await;

    until("B retried the failing key", || !items(&seen, "pod-b", "failing").is_empty()).await;
    let (attempt, at) = items(&seen, "pod-b", "failing")[0];
    assert_eq!(attempt, 3, "the failures came with the key; A's log:\n{}\nB's log:\n{}", a.logs(), b.logs());
    assert!(
        at >= second + Duration::from_secs(3),
        "retried {:?} after the second attempt: its 4 s backoff came with it",
        at - second
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    for key in ["later", "terminal", "done"] {
        assert!(
            items(&seen, "pod-b", key).is_empty(),
            "{key} was handed out again on B: its state did not come with it"
        );
    }
    // A change still reaches the terminal key, once.
    let patch = json!({ "data": { "v": "1" } });
    api.patch("terminal", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change");
    until("B handled the changed terminal key", || !items(&seen, "pod-b", "terminal").is_empty()).await;
}

/// A ring that names a member this daemon never saw (its shard Lease deleted, and the coordinator started
/// after): the member's slots go to the others a TTL after the coordinator first found them, not never.
#[tokio::test]
async fn the_slots_of_a_member_whose_lease_is_gone_go_to_the_others_after_a_ttl() {
    use k8s_openapi::api::coordination::v1::Lease;

    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let a = member("pod-a", &ns).await;
    let queue_a = open(&a, spec(&ns)).await.expect("open on A");
    let mut b = member("pod-b", &ns).await;
    let _queue_b = open(&b, spec(&ns)).await.expect("open on B");
    settled(&a, &["pod-a", "pod-b"]).await;
    // B dies, its shard Lease is deleted, and A restarts: the ring names B, whom the new A never saw.
    b.signal(Signal::SIGKILL);
    b.wait_exit(WAIT).await;
    let leases: Api<Lease> = Api::namespaced(kube, &ns);
    leases.delete(&format!("{GROUP}.ring.work.pod-b"), &Default::default()).await.expect("delete B's shard Lease");
    drop(queue_a);
    drop(a);
    let a = member("pod-a", &ns).await;
    let _queue_a = open(&a, spec(&ns)).await.expect("open on the new A");
    let taken = settled(&a, &["pod-a"]).await;
    eprintln!("the slots of a member never seen went to the others {taken:?} after the coordinator opened");
}

/// A queue of every namespace's ConfigMaps labelled for run `run`, sharded by namespace.
fn by_namespace(run: &str) -> QueueSpec {
    let mut spec = spec("");
    spec.name = "by-ns".into();
    spec.primary =
        Some(ObjectQuery { resource: "configmaps".into(), label_selector: format!("run={run}"), ..Default::default() });
    spec.shard_by = ShardBy::Namespace.into();
    spec
}

#[tokio::test]
async fn a_queue_sharded_by_namespace_lists_and_watches_only_each_members_namespaces() {
    let kube = consistd_testkit::kube_client().await;
    let run = format!("{:08x}", rand::random::<u32>());
    const NAMESPACES: usize = 12;
    const PER_NAMESPACE: usize = 5;
    let mut namespaces = Vec::new();
    for _ in 0..NAMESPACES {
        let ns = consistd_testkit::namespace(&kube).await;
        let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
        for i in 0..PER_NAMESPACE {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": { "name": format!("cm-{i}"), "labels": { "run": run } }, "data": { "v": "0" },
            }))
            .expect("configmap");
            api.create(&PostParams::default(), &cm).await.expect("create");
        }
        namespaces.push((ns, api));
    }
    let home = namespaces[0].0.clone();
    let audit_from = consistd_testkit::audit_offset();
    let audit = Arc::new(Mutex::new(Audit::default()));
    // A third party changes every key in turn, 50 changes a second.
    let writer = {
        let apis: Vec<Api<ConfigMap>> = namespaces.iter().map(|(_, api)| api.clone()).collect();
        consistd_testkit::spawn(async move {
            for n in 1usize.. {
                let api = &apis[n % NAMESPACES];
                let patch = json!({ "data": { "v": n.to_string() } });
                let _ = api
                    .patch(
                        &format!("cm-{}", (n / NAMESPACES) % PER_NAMESPACE),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Each app writes to the namespace of its item: `handle` is given the item's own namespace.
    let app = |pod: &'static str, daemon: &Daemon, queue| {
        let (tx, mut rx): (mpsc::Sender<ReconcileRequest>, Streaming<ReconcileResponse>) = queue;
        let (client, audit) = (daemon.client(), audit.clone());
        consistd_testkit::spawn(async move {
            while let Ok(Some(message)) = rx.message().await {
                let Some(reconcile_response::Response::Item(item)) = message.response else { continue };
                let key = format!("{}/{}", item.namespace, item.name);
                let index = {
                    let mut audit = audit.lock().expect("audit");
                    audit.grants.push(Grant { pod: pod.into(), key, start: Instant::now(), end: None });
                    audit.grants.len() - 1
                };
                let (tx, client, audit) = (tx.clone(), client.clone(), audit.clone());
                consistd_testkit::spawn(async move {
                    handle(&client, &item.namespace.clone(), &item).await;
                    tokio::time::sleep(HANDLER).await;
                    audit.lock().expect("audit").grants[index].end.get_or_insert(Instant::now());
                    let done =
                        Completion { lease_id: item.lease_id, outcome: Outcome::Done.into(), ..Default::default() };
                    let _ =
                        tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Complete(done)) }).await;
                });
            }
        })
    };
    let a = member("pod-a", &home).await;
    let _app_a = app("pod-a", &a, open(&a, by_namespace(&run)).await.expect("open on A"));
    settled_of(&a, "by-ns", &["pod-a"]).await;
    let b = member("pod-b", &home).await;
    let _app_b = app("pod-b", &b, open(&b, by_namespace(&run)).await.expect("open on B"));
    settled_of(&a, "by-ns", &["pod-a", "pod-b"]).await;
    // Some changes under two members.
    tokio::time::sleep(Duration::from_secs(3)).await;
    writer.abort();
    for (_, api) in &namespaces {
        all_handled(api, &|_| format!("A's log:\n{}\nB's log:\n{}", a.logs(), b.logs())).await;
    }

    let (overlaps, per_pod) = {
        let audit = audit.lock().expect("audit");
        (audit.overlaps(), audit.per_pod())
    };
    assert!(overlaps.is_empty(), "{} moments two pods held one key, e.g. {:?}", overlaps.len(), overlaps.first());
    assert!(per_pod.len() == 2, "both members handled keys: {per_pod:?}");
    // Every list and watch of the queue's ConfigMaps named a shard: no daemon read every namespace's.
    let selector = format!("labelSelector=run%3D{run}");
    let requests: Vec<String> = consistd_testkit::audit_events(audit_from)
        .iter()
        .filter_map(|e| e["requestURI"].as_str().map(str::to_owned))
        .filter(|uri| uri.starts_with("/api/v1/configmaps?") && uri.contains(&selector))
        .collect();
    let whole: Vec<&String> = requests.iter().filter(|uri| !uri.contains("shardSelector=")).collect();
    eprintln!("{} lists and watches of the queue's ConfigMaps, {} without a shard", requests.len(), whole.len());
    assert!(requests.len() >= 4, "both members listed and watched: {requests:?}");
    assert!(whole.is_empty(), "lists or watches of every namespace: {whole:?}");
    let honoured = a.metric("consistd_watch_shard_honoured", "resource=\"v1/configmaps\"").await;
    eprintln!("A's share honoured by the apiserver: {honoured:?}");
    assert!(honoured.is_some(), "A's metrics show its watch of a share");
}
