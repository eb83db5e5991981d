//! 410 Gone for real: the daemon loses the apiserver, objects change meanwhile, etcd is compacted, and
//! the watch's resume from its old revision is refused. The hub relists. A CONSISTENT subscriber (states)
//! is told exactly the difference: MODIFIED for changed, DELETED for vanished, ADDED for new, nothing for
//! unchanged. A RAW subscriber (every event) has missed events nobody can replay: it gets
//! RESYNC_REQUIRED and a snapshot, never the difference dressed as the events.
//!
//! PodTemplates are used because the test control plane runs them without a watch cache
//! (hack/control-plane.sh), so their watches are served from etcd and see its compaction.

use std::time::Duration;

use consistd_client::proto::{DeliveryMode, SubscribeRequest};
use consistd_testkit::{
    Daemon,
    proxy::DelayProxy,
    watch::{Events, describe, raw},
};
use k8s_openapi::api::core::v1::PodTemplate;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

fn template(name: &str) -> PodTemplate {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "template": { "spec": { "containers": [{ "name": "c", "image": "x" }] } }
    }))
    .expect("pod template")
}

#[tokio::test]
async fn a_compacted_resume_relists_giving_states_the_difference_and_raw_a_resync() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<PodTemplate> = Api::namespaced(kube, &ns);
    for name in ["same", "changed", "gone"] {
        api.create(&PostParams::default(), &template(name)).await.expect("create");
    }
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let daemon = Daemon::builder(BIN).through(&proxy).start().await;

    let mut every = Events::open(&daemon.client(), raw("podtemplates", &ns)).await;
    let initial: Vec<String> = every.until_synced().await.iter().map(describe).collect();
    assert_eq!(initial.len(), 4, "{initial:?}");
    let states = SubscribeRequest { mode: DeliveryMode::Consistent.into(), ..raw("podtemplates", &ns) };
    let mut events = Events::open(&daemon.client(), states).await;
    let initial: Vec<String> = events.until_synced().await.iter().map(describe).collect();
    assert_eq!(initial.len(), 4, "{initial:?}");

    // The daemon loses the apiserver; the world moves on and etcd forgets the old revisions.
    proxy.cut(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let patch = json!({ "metadata": { "labels": { "changed": "yes" } } });
    api.patch("changed", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    api.delete("gone", &DeleteParams::default()).await.expect("delete");
    api.create(&PostParams::default(), &template("new")).await.expect("create new");
    consistd_testkit::compact_etcd().await;
    proxy.cut(false);

    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(describe(&events.next().await));
    }
    after.sort();
    assert_eq!(after, ["ADDED new", "DELETED gone", "MODIFIED changed"], "exactly the difference");
    let mut resynced: Vec<String> = every.until_synced().await.iter().map(describe).collect();
    assert_eq!(resynced.remove(0), "RESYNC_REQUIRED", "RAW: a resync, then the snapshot: {resynced:?}");
    resynced.sort();
    assert_eq!(resynced, ["ADDED changed", "ADDED new", "ADDED same", "SYNCED"]);

    // Nothing for the unchanged object: the next event is a fresh change.
    let patch = json!({ "metadata": { "labels": { "later": "yes" } } });
    api.patch("same", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch same");
    assert_eq!(describe(&events.next().await), "MODIFIED same");
    assert_eq!(describe(&every.next().await), "MODIFIED same");
    let logs = daemon.logs();
    assert!(logs.contains("is too old") && logs.contains("Expired"), "the resume got 410 Gone:\n{logs}");
}
