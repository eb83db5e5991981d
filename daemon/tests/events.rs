//! ObjectsService.RecordEvent against the real apiserver: an events.k8s.io/v1 Event about the object (its
//! uid read when not given, none for an object that is gone), repeats from any app of the pod counted on one
//! series, a reporting controller's events about one object dropped past client-go's burst of 25, a
//! cluster-scoped object's events in "default", bad input refused naming the field.

use consistd_client::proto::{EventSeverity, RecordEventRequest, objects_service_client::ObjectsServiceClient};
use consistd_testkit::Daemon;
use k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::json;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

fn request(resource: &str, ns: &str, name: &str, reason: &str) -> RecordEventRequest {
    RecordEventRequest {
        resource: resource.into(),
        namespace: ns.into(),
        name: name.into(),
        severity: EventSeverity::Normal.into(),
        reason: reason.into(),
        action: "Reconcile".into(),
        note: format!("{name} is {reason}"),
        reporting_controller: "example.com/test-operator".into(),
        ..Default::default()
    }
}

/// The Events of `ns` about the object named `name`.
async fn events_about(kube: &kube::Client, ns: &str, name: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(kube.clone(), ns);
    let all = events.list(&ListParams::default()).await.expect("list events");
    all.items.into_iter().filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)).collect()
}

#[tokio::test]
async fn an_event_names_its_object_and_repeats_from_any_app_of_the_pod_make_one_series() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    let cm = serde_json::from_value(json!({ "metadata": { "name": "app" } })).expect("cm");
    let cm = cms.create(&PostParams::default(), &cm).await.expect("create");
    let daemon = Daemon::builder(BIN).config("identity: pod-a\n").start().await;
    // Two apps of the pod, each on a connection of its own.
    let mut one = ObjectsServiceClient::new(daemon.client().channel());
    let mut two = ObjectsServiceClient::new(consistd_client::Client::new(daemon.socket()).channel());

    let recorded = one.record_event(request("configmaps", &ns, "app", "Synced")).await.expect("record").into_inner();
    assert!(recorded.recorded);
    let [event] = events_about(&kube, &ns, "app").await.try_into().expect("one Event");
    let regarding = event.regarding.clone().expect("regarding");
    assert_eq!((regarding.kind.as_deref(), regarding.api_version.as_deref()), (Some("ConfigMap"), Some("v1")));
    assert_eq!(regarding.uid, cm.metadata.uid, "the uid read by the daemon");
    assert_eq!((event.type_.as_deref(), event.reason.as_deref()), (Some("Normal"), Some("Synced")));
    assert_eq!((event.action.as_deref(), event.note.as_deref()), (Some("Reconcile"), Some("app is Synced")));
    assert_eq!(event.reporting_controller.as_deref(), Some("example.com/test-operator"));
    assert_eq!(event.reporting_instance.as_deref(), Some("pod-a"), "the daemon's identity");

    // The same event from the other app, twice: one Event, its series counting three.
    for _ in 0..2 {
        assert!(
            two.record_event(request("configmaps", &ns, "app", "Synced")).await.expect("record").into_inner().recorded
        );
    }
    let [event] = events_about(&kube, &ns, "app").await.try_into().expect("still one Event");
    assert_eq!(event.series.map(|s| s.count), Some(3));
    // Another reason is another Event.
    one.record_event(request("configmaps", &ns, "app", "Degraded")).await.expect("record");
    assert_eq!(events_about(&kube, &ns, "app").await.len(), 2);

    // An object that is gone is named without a uid.
    one.record_event(request("configmaps", &ns, "gone", "Cleaned")).await.expect("an event about a gone object");
    let [gone] = events_about(&kube, &ns, "gone").await.try_into().expect("one Event");
    assert_eq!(gone.regarding.and_then(|r| r.uid), None);

    // A cluster-scoped object's events go to "default".
    one.record_event(request("namespaces", "", &ns, "Labelled")).await.expect("an event about a namespace");
    let [about_ns] = events_about(&kube, "default", &ns).await.try_into().expect("one Event in default");
    assert_eq!(about_ns.regarding.and_then(|r| r.kind).as_deref(), Some("Namespace"));
}

#[tokio::test]
async fn a_controllers_events_about_one_object_are_dropped_past_a_burst_of_25() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).start().await;
    let mut objects = ObjectsServiceClient::new(daemon.client().channel());
    let mut recorded = 0;
    for i in 0..30 {
        let answer = objects.record_event(request("configmaps", &ns, "noisy", &format!("Step{i}"))).await;
        if answer.expect("record").into_inner().recorded {
            recorded += 1;
        }
    }
    assert_eq!(recorded, 25, "client-go's burst");
    assert_eq!(events_about(&kube, &ns, "noisy").await.len(), 25, "the dropped ones were not written");
    let mut other = request("configmaps", &ns, "noisy", "Step0");
    other.reporting_controller = "example.com/another".into();
    assert!(objects.record_event(other).await.expect("record").into_inner().recorded, "another controller's own");
    let quiet = objects.record_event(request("configmaps", &ns, "quiet", "Step0")).await.expect("record");
    assert!(quiet.into_inner().recorded, "another object's own");
}

#[tokio::test]
async fn a_bad_event_is_refused_naming_the_field() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).start().await;
    let mut objects = ObjectsServiceClient::new(daemon.client().channel());
    let good = || request("configmaps", &ns, "a", "Synced");
    let cases = [
        (RecordEventRequest { severity: EventSeverity::Unspecified.into(), ..good() }, "severity"),
        (RecordEventRequest { reason: String::new(), ..good() }, "reason"),
        (RecordEventRequest { action: "A".repeat(129), ..good() }, "action"),
        (RecordEventRequest { note: "n".repeat(1025), ..good() }, "note"),
        (RecordEventRequest { reporting_controller: "c".repeat(129), ..good() }, "reporting_controller"),
        (RecordEventRequest { name: String::new(), ..good() }, "name"),
    ];
    for (bad, field) in cases {
        let refused = objects.record_event(bad).await.expect_err("refused");
        assert_eq!((refused.code(), refused.message().split(':').next()), (Code::InvalidArgument, Some(field)));
    }
    let unknown = objects.record_event(request("nosuchthings", &ns, "a", "Synced")).await.expect_err("refused");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown}");
}
