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
    ReconcileResponse, WorkItem, WriteGuard, reconcile_request, reconcile_response,
    reconcile_service_client::ReconcileServiceClient,
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
use tokio_stream::wrappers::ReceiverStream;
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
    let config = format!("identity: {identity}\nnamespace: {ns}\nmembership:\n  ttl: 3s\n");
    Daemon::builder(BIN).config(config).start().await
}

/// Opens `spec` on `daemon`: the stream's requests and answers, or the status that refused it.
async fn open(
    daemon: &Daemon,
    spec: QueueSpec,
) -> Result<(mpsc::Sender<ReconcileRequest>, Streaming<ReconcileResponse>), tonic::Status> {
    let (tx, requests) = mpsc::channel(256);
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).await.expect("queue the spec");
    let mut client = ReconcileServiceClient::new(daemon.client().channel());
    let mut rx = client.reconcile(ReceiverStream::new(requests)).await?.into_inner();
    match tokio::time::timeout(WAIT, rx.message()).await.expect("an answer to the spec")? {
        Some(ReconcileResponse { response: Some(reconcile_response::Response::Started(_)) }) => Ok((tx, rx)),
        other => panic!("expected STARTED, got {other:?}"),
    }
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

/// The ring as `daemon`'s status shows it: members and their slots, slots unowned, slots moving.
async fn ring(daemon: &Daemon) -> Option<consistd_core::report::RingState> {
    let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("consistd status");
    report.queues.into_iter().find(|q| q.name == "work").and_then(|q| q.ring)
}

/// Waits until `daemon` sees exactly `members` owning every slot between them, evenly, nothing moving.
async fn settled(daemon: &Daemon, members: &[&str]) -> Duration {
    let started = Instant::now();
    loop {
        if let Some(r) = ring(daemon).await {
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

/// Waits until every ConfigMap's `handled` annotation shows its `data.v`: every change was handled.
async fn all_handled(api: &Api<ConfigMap>) {
    let started = Instant::now();
    loop {
        let list = api.list(&Default::default()).await.expect("list");
        let behind: Vec<String> = list
            .items
            .iter()
            .filter(|cm| {
                let v = cm.data.as_ref().and_then(|d| d.get("v"));
                let handled = cm.metadata.annotations.as_ref().and_then(|a| a.get("handled"));
                v != handled
            })
            .filter_map(|cm| cm.metadata.name.clone())
            .collect();
        if behind.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "{} keys never handled their newest change: {:?}",
            behind.len(),
            &behind[..behind.len().min(10)]
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
    all_handled(&api).await;
    let audit = audit.lock().expect("audit");
    let overlaps = audit.overlaps();
    assert!(overlaps.is_empty(), "{} moments two pods held one key, e.g. {:?}", overlaps.len(), overlaps.first());
    let per_pod = audit.per_pod();
    eprintln!("grants per pod: {per_pod:?}");
    assert!(per_pod.len() == 3 && per_pod.values().all(|n| *n > 0), "every member handled keys: {per_pod:?}");
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
