//! What a watch keeps of each object, against the real apiserver: by default the whole object without
//! managedFields; metadata only, read with the apiserver's metadata requests; a projection of named
//! fields; managedFields when asked. Each distinct view is one upstream watch, shared by equal views,
//! held at its own bytes, and CONSISTENT delivery marks the pod's own write in any view. A bad view is
//! refused naming its field. A test binary of its own, so it counts the daemon's upstream watches alone.

use consistd_client::proto::{
    DeliveryMode, EventType, ObjectView, PatchRequest, PatchType, SubscribeRequest, SubscribeResponse,
};
use consistd_testkit::{
    Daemon,
    proxy::DelayProxy,
    watch::{Events, raw},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

fn with_view(ns: &str, view: ObjectView) -> SubscribeRequest {
    SubscribeRequest { view: Some(view), ..raw("configmaps", ns) }
}

fn metadata_only() -> ObjectView {
    ObjectView { metadata_only: true, ..Default::default() }
}

fn projection(fields: &[&str]) -> ObjectView {
    ObjectView { fields: fields.iter().map(|f| (*f).to_owned()).collect(), ..Default::default() }
}

fn json_of(event: &SubscribeResponse) -> Value {
    serde_json::from_slice(&event.object.as_ref().expect("an object").json).expect("object JSON")
}

/// The object of the first ADDED event up to SYNCED.
async fn listed(events: &mut Events) -> Value {
    let listed = events.until_synced().await;
    let added = listed.iter().find(|e| e.r#type() == EventType::Added).expect("the object listed");
    json_of(added)
}

#[tokio::test]
async fn each_view_keeps_what_it_asks_for_in_its_own_shared_watch() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    // Server-side apply, so the object has managedFields; a large value, so views differ in bytes.
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "cfg", "labels": { "app": "web" }, "annotations": { "note": "n" } },
        "data": { "field": "s0", "big": "x".repeat(64 * 1024) }
    });
    api.patch("cfg", &PatchParams::apply("the-test"), &Patch::Apply(&cm)).await.expect("apply");
    let daemon = Daemon::builder(BIN).start().await;
    let client = daemon.client();

    let mut whole = Events::open(&client, raw("configmaps", &ns)).await;
    let mut managed =
        Events::open(&client, with_view(&ns, ObjectView { managed_fields: true, ..Default::default() })).await;
    let mut metadata = Events::open(&client, with_view(&ns, metadata_only())).await;
    let mut projected = Events::open(&client, with_view(&ns, projection(&["data.field"]))).await;
    // The same projection, asked differently: the same watch.
    let mut same = Events::open(&client, with_view(&ns, projection(&[".data.field", "data.field"]))).await;

    let object = listed(&mut whole).await;
    assert_eq!(object["data"]["field"], "s0");
    assert_eq!(object["metadata"]["labels"]["app"], "web");
    assert!(object["metadata"].get("managedFields").is_none(), "dropped by default: {}", object["metadata"]);
    let object = listed(&mut managed).await;
    assert_eq!(object["metadata"]["managedFields"][0]["manager"], "the-test", "kept when asked");
    let object = listed(&mut metadata).await;
    assert_eq!((object["apiVersion"].as_str(), object["kind"].as_str()), (Some("v1"), Some("ConfigMap")));
    assert_eq!(object["metadata"]["annotations"]["note"], "n");
    assert!(object.get("data").is_none() && object["metadata"].get("managedFields").is_none(), "{object}");
    for events in [&mut projected, &mut same] {
        let object = listed(events).await;
        assert_eq!(object["data"], json!({ "field": "s0" }), "only the named field");
        assert_eq!(object["metadata"]["name"], "cfg");
        assert!(object["metadata"]["uid"].is_string() && object["metadata"]["resourceVersion"].is_string());
        assert!(object["metadata"].get("labels").is_none(), "labels not named: {object}");
    }

    let upstreams = daemon.metric("consistd_watch_upstreams", "").await;
    assert_eq!(upstreams, Some(4.0), "four views, four upstream watches; equal projections share one");
    let bytes = |view: &'static str| {
        let daemon = &daemon;
        async move {
            daemon.metric("consistd_watch_cache_bytes", &format!("view=\"{view}\"")).await.expect("a watch's bytes")
        }
    };
    let (full, meta, fields) = (bytes("full").await, bytes("metadata").await, bytes("fields:data.field").await);
    assert!(full > 64.0 * 1024.0 && meta < full / 10.0 && fields < full / 10.0, "{full} {meta} {fields}");

    // A change reaches every view; a CONSISTENT subscriber of a projection is handed the pod's own write
    // marked as its own.
    let mut consistent = Events::open(
        &client,
        SubscribeRequest { mode: DeliveryMode::Consistent.into(), ..with_view(&ns, projection(&["data.field"])) },
    )
    .await;
    consistent.until_synced().await;
    let patch = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        name: "cfg".into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "field": "p1" } }).to_string().into_bytes(),
        ..Default::default()
    };
    let written = client.objects().patch(patch).await.expect("patch").into_inner().object.expect("the object");
    for events in [&mut whole, &mut managed, &mut metadata, &mut projected, &mut same] {
        let event = events.next().await;
        assert_eq!(event.r#type(), EventType::Modified);
        assert_eq!(event.object.as_ref().map(|o| o.resource_version.as_str()), Some(written.resource_version.as_str()));
    }
    let event = consistent.next().await;
    assert_eq!(json_of(&event)["data"], json!({ "field": "p1" }));
    assert_eq!(event.consistency().as_str_name(), "CONSISTENCY_OWN_WRITE");
}

#[tokio::test]
async fn a_metadata_only_watch_never_brings_the_objects_data_over_the_wire() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    for name in ["a", "b"] {
        let cm = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": name }, "data": { "big": "x".repeat(64 * 1024) } });
        api.patch(name, &PatchParams::apply("the-test"), &Patch::Apply(&cm)).await.expect("apply");
    }
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let daemon = Daemon::builder(BIN).through(&proxy).start().await;
    // What the daemon reads at its start (the apiserver's version, its fencing policies) is not the
    // watch's: counted from once it is done.
    let started = tokio::time::Instant::now();
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("read admin report");
        if report.fencing.is_some() && report.apiserver.version.is_some() {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "the daemon's start did not end: {report:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let before = proxy.bytes_down();
    let mut metadata = Events::open(&daemon.client(), with_view(&ns, metadata_only())).await;
    assert_eq!(metadata.until_synced().await.len(), 3, "two objects and SYNCED");
    let patch = json!({ "data": { "big": "y".repeat(64 * 1024) } });
    api.patch("a", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    assert_eq!(metadata.next().await.r#type(), EventType::Modified);
    // The list of two 64 KiB objects and the change of one, as metadata: a few KiB, not 192.
    let down = proxy.bytes_down() - before;
    eprintln!("{down} bytes from the apiserver for a metadata-only list and watch");
    assert!(down < 32 * 1024, "{down} bytes from the apiserver for a metadata-only list and watch");
}

#[tokio::test]
async fn a_view_that_cannot_be_kept_is_refused_naming_its_field() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).start().await;
    let refused = async |view: ObjectView| {
        let mut events = daemon.client().watch();
        events.subscribe(with_view(&ns, view)).await.expect_err("refused")
    };
    let both = ObjectView { metadata_only: true, fields: vec!["data".into()], ..Default::default() };
    for (view, field) in [
        (both, "view.fields"),
        (projection(&["data", "spec..x"]), "view.fields[1]"),
        (projection(&["status.conditions[0]"]), "view.fields[0]"),
    ] {
        let status = refused(view).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(status.message().split(':').next(), Some(field), "{status:?}");
    }
}
