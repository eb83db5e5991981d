//! A watch of a shard (KEP-5866) on the real control plane: it lists and watches only the objects of its
//! share, whether the apiserver honours the selector (the test control plane's default,
//! ShardedListAndWatch on) or not (`CONSISTD_CP_FEATURE_GATES=` at its start: the daemon applies it), and
//! its metrics say which of the two did. `make test` runs this binary against both control planes.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use consistd_cluster::watch::{
    Hub, Query, Subscription,
    object::Obj,
    shard::{HASH_END, ShardField, ShardSelector},
    shared::{Change, Item},
    view::ObjectView,
};
use consistd_core::{config::WatchConfig, names::fnv1a64, tasks::Tasks};
use consistd_observe::metrics::{Metrics, WatchLabel};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::PostParams};

const WAIT: Duration = Duration::from_secs(60);

/// Whether the test control plane was started with the ShardedListAndWatch gate
/// (`hack/control-plane.sh` keeps the gates it was given in its state directory).
fn gate_on() -> bool {
    let dir = consistd_testkit::kubeconfig().parent().expect("the control plane's directory").to_owned();
    std::fs::read_to_string(dir.join("feature-gates")).unwrap_or_default().contains("ShardedListAndWatch=true")
}

/// The objects of the watch's first list: a snapshot, or (joined before the list was through) its
/// entries, up to SYNCED.
async fn listed(sub: &mut Subscription) -> Vec<Arc<Obj>> {
    let mut objects = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, sub.next()).await.expect("the first list within WAIT").expect("an item") {
            Item::Snapshot(obj, _) => objects.push(obj),
            Item::Synced(_) => return objects,
            Item::Entry(entry) => match &entry.change {
                Change::Added(obj) => objects.push(obj.clone()),
                Change::Synced => return objects,
                other => panic!("the first list gave {other:?}"),
            },
            Item::ResyncRequired => panic!("a new subscriber was told to resync"),
        }
    }
}

async fn configmap(client: &kube::Client, namespace: &str, name: &str, run: &str) {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "shard-watch-run": run } },
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("create {namespace}/{name}: {e}"));
}

#[tokio::test]
async fn a_shard_watch_holds_only_its_share_and_says_who_applied_it() {
    let client = consistd_testkit::kube_client().await;
    // The lower half of the hash space of namespaces; namespaces are made until both halves have two.
    let share = ShardSelector::new(ShardField::Namespace, [(0, 1 << 63)]).expect("a share");
    let (mut inside, mut outside) = (BTreeSet::new(), BTreeSet::new());
    while inside.len() < 2 || outside.len() < 2 {
        let ns = consistd_testkit::namespace(&client).await;
        assert_eq!(share.holds(&ns), u128::from(fnv1a64(&ns)) < 1 << 63);
        if share.holds(&ns) {
            inside.insert(ns)
        } else {
            outside.insert(ns)
        };
    }
    let run = format!("{:08x}", rand::random::<u32>());
    for ns in inside.iter().chain(&outside) {
        configmap(&client, ns, "listed", &run).await;
    }

    let (metrics, tasks) = (Metrics::new(), Tasks::new());
    let hub = Hub::new(client.clone(), WatchConfig::default(), u64::MAX, metrics.clone(), &tasks);
    let query = Query {
        resource: "configmaps".into(),
        label_selector: format!("shard-watch-run={run}"),
        shard: Some(share.clone()),
        ..Query::default()
    };
    let mut sub = hub.subscribe(query).await.expect("the apiserver takes the shard selector");
    let listed: BTreeSet<String> = listed(&mut sub).await.iter().map(|o| o.namespace().to_owned()).collect();
    assert_eq!(listed, inside, "the list holds the share's namespaces only");

    // Changes outside the share first: the watch shows changes in order, so once the last of the share's
    // is seen, one from outside would have been seen before it.
    for ns in outside.iter().chain(&inside) {
        configmap(&client, ns, "watched", &run).await;
    }
    let mut watched = BTreeSet::new();
    while watched != inside {
        let item =
            tokio::time::timeout(WAIT, sub.next()).await.expect("the share's changes within WAIT").expect("an item");
        let Item::Entry(entry) = item else { panic!("a live watch gave {item:?}") };
        let Change::Added(obj) = &entry.change else { panic!("only creations were made: {:?}", entry.change) };
        assert!(inside.contains(obj.namespace()), "{} is outside the share, yet the watch showed it", obj.namespace());
        watched.insert(obj.namespace().to_owned());
    }

    // Who applied the share: the apiserver with the gate on, else the daemon, which drops what it was sent
    // from outside the share (the list's and the watch's: two objects in each namespace outside).
    let label = WatchLabel {
        resource: "v1/configmaps".into(),
        namespace: String::new(),
        label_selector: format!("shard-watch-run={run}"),
        field_selector: String::new(),
        view: ObjectView::default().label(),
        shard: share.label(),
    };
    let honoured = metrics.watch_shard_honoured.get_or_create(&label).get();
    let dropped = metrics.watch_shard_dropped.get_or_create(&label).get();
    println!("gate on: {}; honoured: {honoured}; dropped here: {dropped}", gate_on());
    if gate_on() {
        assert_eq!((honoured, dropped), (1, 0), "the apiserver honours the selector and sends nothing outside it");
    } else {
        assert_eq!(honoured, 0, "an apiserver without the gate does not honour the selector");
        assert!(
            dropped >= 2 * outside.len() as u64,
            "dropped {dropped} of the {} sent from outside",
            2 * outside.len()
        );
    }
    tasks.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_share_of_uids_as_wide_as_the_hash_space_holds_every_object() {
    // A share of uids, its end 2^64 (the one bound of 17 hex digits): every object is in it.
    let client = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&client).await;
    configmap(&client, &ns, "any", "whole").await;
    let (metrics, tasks) = (Metrics::new(), Tasks::new());
    let hub = Hub::new(client.clone(), WatchConfig::default(), u64::MAX, metrics, &tasks);
    let whole = ShardSelector::new(ShardField::Uid, [(0, HASH_END)]).expect("a share");
    let query = Query { resource: "configmaps".into(), namespace: ns.clone(), shard: Some(whole), ..Query::default() };
    let mut sub = hub.subscribe(query).await.expect("the whole hash space is a valid share");
    let names: Vec<String> = listed(&mut sub).await.iter().map(|o| o.name().to_owned()).collect();
    assert_eq!(names, ["any"], "the whole space holds the one ConfigMap");
    tasks.stop(Duration::from_secs(5)).await;
}
