//! WatchService against the real apiserver: initial state then SYNCED then live events, late joiners,
//! resource names in every form (custom resources too), resume from a cursor, a stalled subscriber that
//! must resync without slowing a fast one, bad input named by field, and the state a MODIFIED follows.

use std::{collections::BTreeMap, time::Duration};

use consistd_client::proto::{DeliveryMode, EventType, SubscribeRequest};
use consistd_testkit::{
    Daemon,
    watch::{Events, describe, raw},
};
use k8s_openapi::{
    api::core::v1::ConfigMap, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("k".to_owned(), value.to_owned())])),
        ..Default::default()
    }
}

async fn set(api: &Api<ConfigMap>, name: &str, value: &str) {
    let patch = serde_json::json!({ "data": { "k": value } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch configmap");
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn initial_state_then_synced_then_every_live_event_for_first_and_late_subscribers() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &config_map(name, "0")).await.expect("create configmap");
    }
    let daemon = Daemon::builder(BIN).start().await;
    let client = daemon.client();

    let mut first = Events::open(&client, raw("configmaps", &ns)).await;
    let initial: Vec<String> = first.until_synced().await.iter().map(describe).collect();
    assert_eq!(initial.last().map(String::as_str), Some("SYNCED"));
    assert_eq!(sorted(initial[..3].to_vec()), ["ADDED a", "ADDED b", "ADDED c"]);

    let mut late = Events::open(&client, raw("configmaps", &ns)).await;
    let snapshot = late.until_synced().await;
    assert_eq!(sorted(snapshot.iter().take(3).map(describe).collect()), ["ADDED a", "ADDED b", "ADDED c"]);
    assert!(!snapshot[3].cursor.is_empty(), "SYNCED carries a cursor");

    api.create(&PostParams::default(), &config_map("d", "0")).await.expect("create d");
    set(&api, "a", "1").await;
    api.delete("b", &DeleteParams::default()).await.expect("delete b");
    for events in [&mut first, &mut late] {
        let mut live = Vec::new();
        for _ in 0..3 {
            let event = events.next().await;
            assert!(!event.cursor.is_empty(), "live events carry cursors");
            let object = event.object.as_ref().expect("live events carry the object");
            let json: serde_json::Value = serde_json::from_slice(&object.json).expect("object is JSON");
            assert_eq!(json["metadata"]["resourceVersion"], object.resource_version.as_str());
            live.push(describe(&event));
        }
        assert_eq!(live, ["ADDED d", "MODIFIED a", "DELETED b"], "apiserver order");
    }
}

#[tokio::test]
async fn resources_resolve_in_every_form_including_custom_resources_created_later() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).start().await;
    let client = daemon.client();
    for resource in [
        "configmaps",
        "v1/configmaps",
        "ConfigMap",
        "configmap",
        "deployments.apps",
        "apps/v1/deployments",
        "Deployment",
    ] {
        let mut events = Events::open(&client, raw(resource, &ns)).await;
        assert_eq!(describe(&events.next().await), "SYNCED", "{resource} resolves and syncs");
    }

    // A custom resource the daemon's first discovery never saw.
    let group = format!("{ns}.example.com");
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("widgets.{group}") },
        "spec": {
            "group": group,
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "scope": "Namespaced",
            "versions": [{ "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } } }]
        }
    }))
    .expect("CRD object");
    Api::<CustomResourceDefinition>::all(kube.clone()).create(&PostParams::default(), &crd).await.expect("create CRD");
    let resource = format!("widgets.{group}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match client.watch().subscribe(raw(&resource, &ns)).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                let first = stream.message().await.expect("read").expect("an event");
                assert_eq!(first.r#type(), EventType::Synced);
                break;
            }
            // The CRD takes a moment to be established and served.
            Err(status) if status.code() == Code::NotFound && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("subscribe to {resource}: {status}"),
        }
    }
}

#[tokio::test]
async fn a_cursor_resumes_without_gaps_or_duplicates_and_a_foreign_one_requires_a_resync() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &config_map("a", "0")).await.expect("create a");
    // A long linger keeps the watch (and its history) while nobody is subscribed.
    let daemon = Daemon::builder(BIN).config("watch:\n  linger: 60s\n").start().await;
    let client = daemon.client();

    let mut events = Events::open(&client, raw("configmaps", &ns)).await;
    events.until_synced().await;
    set(&api, "a", "1").await;
    let seen = events.next().await;
    assert_eq!(describe(&seen), "MODIFIED a");
    drop(events);

    set(&api, "a", "2").await;
    api.create(&PostParams::default(), &config_map("b", "0")).await.expect("create b");
    // Make sure the daemon has seen both changes before resuming, through another subscriber.
    let mut witness = Events::open(&client, raw("configmaps", &ns)).await;
    witness.until_synced().await;

    let mut request = raw("configmaps", &ns);
    request.resume_cursor = seen.cursor.clone();
    let mut resumed = Events::open(&client, request).await;
    let first = resumed.next().await;
    let second = resumed.next().await;
    assert_eq!([describe(&first), describe(&second)], ["MODIFIED a", "ADDED b"]);
    let data: serde_json::Value = serde_json::from_slice(&first.object.expect("object").json).expect("json");
    assert_eq!(data["data"]["k"], "2", "the change after the cursor, not the one before it");
    set(&api, "a", "3").await;
    assert_eq!(describe(&resumed.next().await), "MODIFIED a", "then live, with nothing repeated");

    let mut request = raw("configmaps", &ns);
    request.resume_cursor = "0000000000000001.1".to_owned();
    let mut foreign = Events::open(&client, request).await;
    let items: Vec<String> = foreign.until_synced().await.iter().map(describe).collect();
    assert_eq!(items[0], "RESYNC_REQUIRED");
    assert_eq!(sorted(items[1..3].to_vec()), ["ADDED a", "ADDED b"]);
    assert_eq!(items[3], "SYNCED");
}

#[tokio::test]
async fn a_stalled_subscriber_is_resynced_and_never_slows_a_fast_one() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &config_map("a", "0")).await.expect("create a");
    let daemon = Daemon::builder(BIN).config("watch:\n  subscriberQueue: 4\n").start().await;

    // Separate connections, as separate apps have: on one shared HTTP/2 connection the stalled stream
    // would exhaust the connection's flow-control window for both, inside the client.
    let mut stalled = Events::open(&daemon.client(), raw("configmaps", &ns)).await;
    let mut stalled_consistent = Events::open(&daemon.client(), consistent("configmaps", &ns)).await;
    let mut fast = Events::open(&daemon.client(), raw("configmaps", &ns)).await;
    fast.until_synced().await;
    // Enough data to fill the stalled subscriber's queue, its stream buffer and the client's HTTP/2
    // windows (hyper's defaults: 2 MiB per stream, 5 MiB per connection): 400 changes of 16 KiB. Each
    // change is made once the fast subscriber has the one before: a hub that waited for the stalled one
    // would stop the fast one, and the writer with it (the test would time out), while the fast one's own
    // queue of 4 never holds more than one change, however busy the machine (written ahead of a reader
    // the machine starved, it overflowed in one CI run).
    const CHANGES: usize = 400;
    let (taken, mut taken_rx) = tokio::sync::mpsc::channel::<()>(1);
    let writer = {
        let api = api.clone();
        consistd_testkit::spawn(async move {
            for i in 1..=CHANGES {
                set(&api, "a", &format!("{i}-{}", "x".repeat(16 * 1024))).await;
                if taken_rx.recv().await.is_none() {
                    return;
                }
            }
        })
    };
    for i in 1..=CHANGES {
        let event = tokio::time::timeout(Duration::from_secs(20), fast.next())
            .await
            .unwrap_or_else(|_| panic!("the fast subscriber waited 20 s for change {i}"));
        assert_eq!(describe(&event), "MODIFIED a", "fast subscriber gets change {i}");
        taken.send(()).await.expect("the writer waits for each change to be taken");
    }
    writer.await.expect("writer");

    // Now the stalled one reads: what was queued, then RESYNC_REQUIRED, a snapshot and SYNCED.
    let mut seen = Vec::new();
    loop {
        let event = stalled.next().await;
        seen.push(describe(&event));
        if event.r#type() == EventType::ResyncRequired {
            break;
        }
        assert!(seen.len() <= CHANGES + 2, "no RESYNC_REQUIRED among {} events", seen.len());
    }
    let after: Vec<String> = stalled.until_synced().await.iter().map(describe).collect();
    assert_eq!(after, ["ADDED a", "SYNCED"], "a fresh snapshot follows");

    // The stalled CONSISTENT subscriber is coalesced instead: what was queued, then the latest state,
    // never a RESYNC_REQUIRED, and a DELETE is never coalesced away.
    api.delete("a", &DeleteParams::default()).await.expect("delete a");
    let mut versions = Vec::new();
    loop {
        let event = stalled_consistent.next().await;
        assert_ne!(event.r#type(), EventType::ResyncRequired, "CONSISTENT subscribers are coalesced");
        if event.r#type() == EventType::Deleted {
            // A DELETE found by coalescing carries the last state this subscriber was told.
            break;
        }
        if let Some(o) = &event.object {
            assert!(!versions.contains(&o.resource_version), "each version at most once");
            versions.push(o.resource_version.clone());
        }
    }
    assert!(versions.len() < CHANGES, "coalesced: {} deliveries for {CHANGES} changes", versions.len());
    let metrics = consistd_server::admin::get(daemon.admin_socket(), "/metrics").await.expect("metrics").1;
    let text = String::from_utf8_lossy(&metrics);
    assert!(text.contains("consistd_watch_resyncs_total 2"), "both stalled subscribers were cut off:\n{text}");
}

fn consistent(resource: &str, namespace: &str) -> SubscribeRequest {
    SubscribeRequest { mode: DeliveryMode::Consistent.into(), ..raw(resource, namespace) }
}

#[tokio::test]
async fn bad_subscriptions_are_refused_naming_the_field_and_harm_no_one() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).start().await;
    let client = daemon.client();
    let mut bystander = Events::open(&client, raw("configmaps", &ns)).await;
    bystander.until_synced().await;

    let refuse = |request: SubscribeRequest| {
        let client = client.clone();
        async move { client.watch().subscribe(request).await.expect_err("must be refused") }
    };
    let status = refuse(raw("gizmos", &ns)).await;
    assert_eq!(status.code(), Code::NotFound, "{status}");
    assert!(status.message().starts_with("resource:") && status.message().contains("gizmos"), "{status}");

    let status = refuse(raw("a/b/c/d", &ns)).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");

    let mut bad_labels = raw("configmaps", &ns);
    bad_labels.label_selector = "app in (".to_owned();
    let status = refuse(bad_labels).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().contains("label_selector"), "{status}");

    let mut bad_fields = raw("configmaps", &ns);
    bad_fields.field_selector = "spec.nonsense=1".to_owned();
    let status = refuse(bad_fields).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().contains("field_selector"), "{status}");

    let status = refuse(raw("namespaces", &ns)).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().starts_with("namespace:"), "{status}");

    let mut no_mode = raw("configmaps", &ns);
    no_mode.mode = DeliveryMode::Unspecified.into();
    assert!(refuse(no_mode).await.message().starts_with("mode:"));

    let mut huge = raw("configmaps", &ns);
    huge.label_selector = "x".repeat(5 * 1024 * 1024);
    let status = refuse(huge).await;
    assert_eq!(status.code(), Code::OutOfRange, "oversized request: {status}");

    // The bystander still gets events and the daemon still serves.
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &config_map("after", "0")).await.expect("create");
    assert_eq!(describe(&bystander.next().await), "ADDED after");
}

#[tokio::test]
async fn label_and_field_selectors_filter_upstream() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &config_map("web", "0")).await.expect("create web");
    let mut other = config_map("db", "0");
    other.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "db".to_owned())]));
    api.create(&PostParams::default(), &other).await.expect("create db");
    let daemon = Daemon::builder(BIN).start().await;

    let mut by_label = raw("configmaps", &ns);
    by_label.label_selector = "app=db".to_owned();
    let items: Vec<String> =
        Events::open(&daemon.client(), by_label).await.until_synced().await.iter().map(describe).collect();
    assert_eq!(items, ["ADDED db", "SYNCED"]);

    let mut by_field = raw("configmaps", &ns);
    by_field.field_selector = "metadata.name=web".to_owned();
    let items: Vec<String> =
        Events::open(&daemon.client(), by_field).await.until_synced().await.iter().map(describe).collect();
    assert_eq!(items, ["ADDED web", "SYNCED"]);
}

/// The value of the watch of configmaps in `ns`'s gauge `name` in `metrics`, if shown.
fn watch_gauge(metrics: &str, name: &str, ns: &str) -> Option<f64> {
    let prefix = format!("{name}{{resource=\"v1/configmaps\",namespace=\"{ns}\",");
    metrics.lines().find(|l| l.starts_with(&prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Issue 46: each watch shows how far behind the apiserver's store it is. Every `watch.stalenessCheck` a
/// consistent read gives the store's version (`consistd_watch_store_resource_version`); a quiet watch, while
/// other namespaces change, has not reached it and counts up (`consistd_watch_staleness_seconds`) until an
/// event of its own (or a bookmark) takes it past, and then shows 0.
#[tokio::test]
async fn a_watch_shows_how_long_it_has_been_behind_the_store() {
    let kube = consistd_testkit::kube_client().await;
    let (quiet, busy) = (consistd_testkit::namespace(&kube).await, consistd_testkit::namespace(&kube).await);
    let quiet_api: Api<ConfigMap> = Api::namespaced(kube.clone(), &quiet);
    quiet_api.create(&PostParams::default(), &config_map("q", "0")).await.expect("create");
    let busy_api: Api<ConfigMap> = Api::namespaced(kube.clone(), &busy);
    busy_api.create(&PostParams::default(), &config_map("b", "0")).await.expect("create");
    let daemon = Daemon::builder(BIN).config("watch:\n  stalenessCheck: 1s\n").start().await;
    let mut events = Events::open(&daemon.client(), raw("configmaps", &quiet)).await;
    events.until_synced().await;

    // Elsewhere, the store moves on; the quiet watch shows none of it.
    let writer = consistd_testkit::spawn(async move {
        for i in 0.. {
            let patch = serde_json::json!({ "data": { "i": i.to_string() } });
            busy_api.patch("b", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch elsewhere");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let behind = loop {
        let metrics = daemon.metrics().await;
        if let Some(seconds) = watch_gauge(&metrics, "consistd_watch_staleness_seconds", &quiet)
            && seconds >= 1.5
        {
            let store = watch_gauge(&metrics, "consistd_watch_store_resource_version", &quiet).expect("store version");
            let mark = watch_gauge(&metrics, "consistd_watch_resource_version", &quiet).expect("watch version");
            assert!(store > mark, "behind: the store at {store}, the watch at {mark}");
            break seconds;
        }
        assert!(tokio::time::Instant::now() < deadline, "the quiet watch never showed itself behind:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    writer.abort();

    // An event of its own takes it past every read so far.
    let patch = serde_json::json!({ "data": { "mine": "1" } });
    quiet_api.patch("q", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch the quiet namespace");
    events.next().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = daemon.metrics().await;
        if watch_gauge(&metrics, "consistd_watch_staleness_seconds", &quiet) == Some(0.0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "behind {behind} s, and still after its own event:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A MODIFIED names the state of the object the daemon's watch saw directly before it, in RAW and in
/// CONSISTENT mode: the first state (ADDED), a deletion and a state from a list name none.
#[tokio::test]
async fn a_modified_names_the_state_it_directly_follows() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let daemon = Daemon::builder(BIN).start().await;
    let client = daemon.client();
    let mut every = Events::open(&client, raw("configmaps", &ns)).await;
    let mut states = Events::open(&client, consistent("configmaps", &ns)).await;
    every.until_synced().await;
    states.until_synced().await;

    let created = api.create(&PostParams::default(), &config_map("a", "0")).await.expect("create a");
    let mut versions = vec![created.metadata.resource_version.expect("a resourceVersion")];
    for value in ["1", "2"] {
        let patch = serde_json::json!({ "data": { "k": value } });
        let patched = api.patch("a", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch a");
        versions.push(patched.metadata.resource_version.expect("a resourceVersion"));
    }
    api.delete("a", &DeleteParams::default()).await.expect("delete a");
    for (mode, events) in [("RAW", &mut every), ("CONSISTENT", &mut states)] {
        let mut got = Vec::new();
        for _ in 0..4 {
            let event = events.next().await;
            got.push((describe(&event), event.previous_resource_version));
        }
        let want = [
            ("ADDED a".to_owned(), String::new()),
            ("MODIFIED a".to_owned(), versions[0].clone()),
            ("MODIFIED a".to_owned(), versions[1].clone()),
            ("DELETED a".to_owned(), String::new()),
        ];
        assert_eq!(got, want, "{mode}");
    }
    // A late subscriber's snapshot is listed: its ADDED names nothing.
    api.create(&PostParams::default(), &config_map("b", "0")).await.expect("create b");
    let mut late = Events::open(&client, consistent("configmaps", &ns)).await;
    let snapshot = late.until_synced().await;
    assert!(snapshot.iter().all(|e| e.previous_resource_version.is_empty()), "{snapshot:?}");
}
