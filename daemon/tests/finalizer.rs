//! A reconcile queue's finalizer against the real apiserver: added before each object's first pass (never
//! dropping another controller's), a deleted object handed out as a finalize pass, RETRY keeping the
//! finalizer and DONE removing it, nothing more handed out for that object, an object created again under
//! the name taken as new, a cluster-scoped primary the same, and no removal by a deposed leader.

use std::time::Duration;

use consistd_client::proto::{
    CampaignRequest, ElectionRef, LeadershipState, ObjectQuery, Outcome, QueueSpec, WorkItem, reconcile_response,
};
use consistd_testkit::{Daemon, queue::open};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap, rbac::v1::ClusterRole};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tonic::{Code, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
/// How long a test waits for one message or state before failing.
const WAIT: Duration = Duration::from_secs(20);
/// The queues' finalizer.
const FINALIZER: &str = "test.consistd.io/cleanup";
/// Another controller's.
const FOREIGN: &str = "other.example.com/keep";

fn spec(name: &str, primary: ObjectQuery) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        primary: Some(primary),
        max_leases: 10,
        finalizer: FINALIZER.into(),
        ..Default::default()
    }
}

fn configmaps(ns: &str) -> ObjectQuery {
    ObjectQuery { resource: "configmaps".into(), namespace: ns.into(), ..Default::default() }
}

/// The finalizers of the object an item carries.
fn handed_finalizers(item: &WorkItem) -> Vec<String> {
    let object = item.object.as_ref().expect("an object");
    let json: Value = serde_json::from_slice(&object.json).expect("json");
    serde_json::from_value(json["metadata"]["finalizers"].clone()).unwrap_or_default()
}

fn configmap(name: &str, finalizers: &[&str]) -> ConfigMap {
    serde_json::from_value(json!({ "metadata": { "name": name, "finalizers": finalizers } })).expect("configmap")
}

/// Waits until `get` finds nothing.
async fn gone<T, F, Fut>(what: &str, get: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while get().await.is_some() {
        assert!(tokio::time::Instant::now() < deadline, "{what} is still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_finalizer_is_added_before_the_first_pass_and_removed_only_when_the_finalize_pass_is_done() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube, &ns);
    cms.create(&PostParams::default(), &configmap("plain", &[])).await.expect("create");
    cms.create(&PostParams::default(), &configmap("shared", &[FOREIGN])).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;
    let mut q = open(&daemon, spec("finalized", configmaps(&ns))).await.expect("open");

    // Each first pass carries the object with the finalizer on it, beside any other controller's; adding
    // it queued no pass of its own.
    let mut first = Vec::new();
    for _ in 0..2 {
        let item = q.item().await;
        assert!(!item.finalizing, "{item:?}");
        first.push((item.name.clone(), handed_finalizers(&item)));
        q.complete(&item, Outcome::Done).await;
    }
    first.sort();
    let expected = [
        ("plain".to_owned(), vec![FINALIZER.to_owned()]),
        ("shared".to_owned(), vec![FOREIGN.to_owned(), FINALIZER.to_owned()]),
    ];
    assert_eq!(first, expected);
    for (name, finalizers) in &expected {
        let cm = cms.get(name).await.expect("read");
        assert_eq!(cm.metadata.finalizers.as_ref(), Some(finalizers), "{name} as the apiserver holds it");
    }
    let extra = q.item_within(Duration::from_secs(2)).await;
    assert!(extra.is_none(), "adding the finalizer queued a pass: {extra:?}");

    // Deleted, it is handed out as a finalize pass; a RETRY keeps the finalizer.
    cms.delete("plain", &DeleteParams::default()).await.expect("delete");
    let finalize = q.item().await;
    assert_eq!((finalize.name.as_str(), finalize.finalizing, finalize.attempt), ("plain", true, 1));
    q.complete(&finalize, Outcome::Retry).await;
    let again = q.item().await;
    assert_eq!((again.name.as_str(), again.finalizing, again.attempt), ("plain", true, 2));
    let cm = cms.get("plain").await.expect("a RETRY keeps the object");
    assert_eq!(cm.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));

    // DONE removes it: the object goes, and its deletion hands out nothing.
    q.complete(&again, Outcome::Done).await;
    gone("plain", || async { cms.get_opt("plain").await.expect("read") }).await;
    let after = q.item_within(Duration::from_secs(2)).await;
    assert!(after.is_none(), "a pass after the finalize pass removed the finalizer: {after:?}");

    // Another controller's finalizer stays; the object's later states and its deletion hand out nothing.
    cms.delete("shared", &DeleteParams::default()).await.expect("delete");
    let finalize = q.item().await;
    assert_eq!((finalize.name.as_str(), finalize.finalizing), ("shared", true));
    q.complete(&finalize, Outcome::Done).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let cm = cms.get("shared").await.expect("another controller's finalizer keeps it");
        if cm.metadata.finalizers == Some(vec![FOREIGN.to_owned()]) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the finalizer was not removed: {:?}", cm.metadata);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cms.patch("shared", &PatchParams::default(), &Patch::Merge(json!({ "metadata": { "finalizers": null } })))
        .await
        .expect("the other controller lets it go");
    gone("shared", || async { cms.get_opt("shared").await.expect("read") }).await;
    let after = q.item_within(Duration::from_secs(2)).await;
    assert!(after.is_none(), "a pass after the finalize pass removed the finalizer: {after:?}");

    // Created again under the name, it is a new object: a first pass, the finalizer added again.
    cms.create(&PostParams::default(), &configmap("plain", &[])).await.expect("create again");
    let reborn = q.item().await;
    assert_eq!((reborn.name.as_str(), reborn.finalizing), ("plain", false));
    assert_eq!(handed_finalizers(&reborn), [FINALIZER]);
    q.complete(&reborn, Outcome::Done).await;
}

#[tokio::test]
async fn a_cluster_scoped_primary_gets_and_loses_the_finalizer_the_same_way() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let roles: Api<ClusterRole> = Api::all(kube);
    let name = format!("{ns}-finalized");
    let role: ClusterRole =
        serde_json::from_value(json!({ "metadata": { "name": name, "labels": { "test": ns } } })).expect("role");
    roles.create(&PostParams::default(), &role).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;
    let query = ObjectQuery {
        resource: "clusterroles.rbac.authorization.k8s.io".into(),
        label_selector: format!("test={ns}"),
        ..Default::default()
    };
    let mut q = open(&daemon, spec("cluster", query)).await.expect("open");
    let first = q.item().await;
    assert_eq!((first.namespace.as_str(), first.name.as_str()), ("", name.as_str()));
    assert_eq!(handed_finalizers(&first), [FINALIZER]);
    q.complete(&first, Outcome::Done).await;
    roles.delete(&name, &DeleteParams::default()).await.expect("delete");
    let finalize = q.item().await;
    assert!(finalize.finalizing, "{finalize:?}");
    q.complete(&finalize, Outcome::Done).await;
    gone(&name, || async { roles.get_opt(&name).await.expect("read") }).await;
}

/// The next leadership state a campaign streams.
async fn state(states: &mut Streaming<consistd_client::proto::CampaignResponse>) -> LeadershipState {
    states.message().await.expect("campaign stream").expect("status").status.expect("status").state()
}

#[tokio::test]
async fn a_deposed_leader_never_removes_its_finalizer() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    cms.create(&PostParams::default(), &configmap("led", &[])).await.expect("create");
    let daemon = Daemon::builder(BIN).config(format!("identity: me\nnamespace: {ns}\n")).start().await;
    // Until the daemon has found the apiserver's fencing policy, a guarded write is checked here alone.
    let deadline = tokio::time::Instant::now() + WAIT;
    while !daemon.logs().contains("guarded writes are fenced at the apiserver") {
        assert!(tokio::time::Instant::now() < deadline, "not fenced at the apiserver:\n{}", daemon.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let campaign = CampaignRequest { election: "fin".into(), ..Default::default() };
    let mut states = daemon.client().leadership().campaign(campaign).await.expect("campaign").into_inner();
    while state(&mut states).await != LeadershipState::Leader {}
    let mut s = spec("led", configmaps(&ns));
    s.election = Some(ElectionRef { election: "fin".into(), namespace: String::new() });
    let mut q = open(&daemon, s).await.expect("open");
    let first = q.item().await;
    assert_eq!(handed_finalizers(&first), [FINALIZER], "added by the leader");
    // On the first try: the add tests the resourceVersion it read (the object had no finalizers), and the
    // fencing stamp made before it must not make that test fail.
    assert_eq!(first.attempt, 1, "the guarded add was retried:\n{}", daemon.logs());
    q.complete(&first, Outcome::Done).await;
    // The add's two writes (the fencing stamp, then the patch) are the lease's own: no pass comes for them.
    let again = q.message(Duration::from_secs(2)).await;
    assert!(again.is_none(), "{again:?} after the lease's own writes:\n{}", daemon.logs());
    cms.delete("led", &DeleteParams::default()).await.expect("delete");
    let finalize = q.item().await;
    assert!(finalize.finalizing, "{finalize:?}");

    // The Lease moves to another holder in a later term while the finalize pass is out; its DONE then
    // removes nothing, whether this daemon has seen the term end yet (the lease went back) or not (the
    // apiserver refuses the removal's stale term).
    let leases: Api<Lease> = Api::namespaced(kube, &ns);
    let transitions = leases.get("fin").await.expect("the Lease").spec.and_then(|s| s.lease_transitions);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now());
    let usurped = json!({ "spec": {
        "holderIdentity": "usurper",
        "leaseTransitions": transitions.unwrap_or(0) + 1,
        "leaseDurationSeconds": 3600,
        "renewTime": now,
        "acquireTime": now,
    } });
    leases.patch("fin", &PatchParams::default(), &Patch::Merge(usurped)).await.expect("another holder takes it");
    q.complete(&finalize, Outcome::Done).await;
    while state(&mut states).await == LeadershipState::Leader {}
    // A pass handed out again before this daemon saw the term end (its removal refused, the key retried)
    // is DONE too: nothing is removed either.
    while let Some(answer) = q.message(Duration::from_secs(2)).await {
        // A refusal is the daemon's answer to a DONE whose lease went back when it saw the term end.
        if let reconcile_response::Response::Item(late) = answer {
            assert_eq!(late.term, finalize.term, "handed out in a later term: {late:?}");
            q.complete(&late, Outcome::Done).await;
        }
    }
    let cm = cms.get("led").await.expect("a deposed leader's DONE leaves the object");
    assert_eq!(cm.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
}

#[tokio::test]
async fn a_finalizer_that_is_not_a_prefixed_qualified_name_is_refused_naming_the_field() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).start().await;
    for bad in ["cleanup", "Example.com/x", "example.com/-x"] {
        let mut s = spec("bad", configmaps(&ns));
        s.finalizer = bad.into();
        let status = open(&daemon, s).await.err().expect("refused");
        assert_eq!(
            (status.code(), status.message().split(':').next()),
            (Code::InvalidArgument, Some("spec.finalizer")),
            "{bad}: {status}"
        );
    }
}
