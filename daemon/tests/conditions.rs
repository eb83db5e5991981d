//! ObjectsService.SetCondition against the real apiserver, on a custom resource with a status subresource:
//! the condition applied alone beside every other one, written only when it changes, its lastTransitionTime
//! moved only when its status does, observedGeneration from the object or as asked; bad input refused naming
//! the field, a guard not led refused, a resource without a status subresource NOT_FOUND.

use std::time::Duration;

use consistd_client::proto::{
    Condition, ConditionStatus, SetConditionRequest, SetConditionResponse, WriteGuard,
    objects_service_client::ObjectsServiceClient,
};
use consistd_testkit::Daemon;
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const OLD: &str = "2020-01-01T00:00:00Z";

fn condition(kind: &str, status: ConditionStatus, reason: &str) -> Condition {
    Condition {
        r#type: kind.into(),
        status: status.into(),
        reason: reason.into(),
        message: format!("{kind} is {reason}"),
        observed_generation: 0,
    }
}

/// The object's conditions by type: (status, reason, lastTransitionTime, observedGeneration).
fn conditions(object: &Value) -> Vec<(String, String, String, String, i64)> {
    let all = object.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let text = |c: &Value, f: &str| c[f].as_str().unwrap_or_default().to_owned();
    let mut out: Vec<_> = all
        .iter()
        .map(|c| {
            let generation = c["observedGeneration"].as_i64().unwrap_or(0);
            (text(c, "type"), text(c, "status"), text(c, "reason"), text(c, "lastTransitionTime"), generation)
        })
        .collect();
    out.sort();
    out
}

fn json_of(answer: &SetConditionResponse) -> Value {
    serde_json::from_slice(&answer.object.as_ref().expect("an object").json).expect("json")
}

#[tokio::test]
async fn a_condition_is_applied_alone_and_written_only_when_it_changes() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let (resource, ar) = consistd_testkit::crd::widgets(&kube, &ns).await;
    let api: Api<DynamicObject> = Api::namespaced_with(kube.clone(), &ns, &ar);
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": ar.api_version, "kind": "Widget", "metadata": { "name": "w" }, "spec": { "size": 1 },
    }))
    .expect("widget");
    api.create(&PostParams::default(), &widget).await.expect("create the widget");
    // Another controller's condition, set long ago.
    let theirs = json!({ "status": { "conditions": [{ "type": "Synced", "status": "True", "reason": "Theirs",
        "message": "", "lastTransitionTime": OLD }] } });
    api.patch_status("w", &PatchParams::default(), &Patch::Merge(theirs)).await.expect("their condition");
    let daemon = Daemon::builder(BIN).start().await;
    let mut objects = ObjectsServiceClient::new(daemon.client().channel());
    let request = |c: Condition| SetConditionRequest {
        resource: resource.clone(),
        namespace: ns.clone(),
        name: "w".into(),
        condition: Some(c),
        ..Default::default()
    };
    let mut set = async |c: Condition| objects.set_condition(request(c)).await.map(tonic::Response::into_inner);

    // A new condition: written beside theirs, with the object's generation, at a new transition time.
    let first = set(condition("Ready", ConditionStatus::False, "Creating")).await.expect("set Ready");
    assert!(first.changed);
    let created = first.last_transition_time.clone();
    assert_ne!(created, OLD);
    let synced = ("Synced".to_owned(), "True".to_owned(), "Theirs".to_owned(), OLD.to_owned(), 0);
    let ready = |status: &str, reason: &str, at: &str, generation| {
        ("Ready".to_owned(), status.to_owned(), reason.to_owned(), at.to_owned(), generation)
    };
    assert_eq!(conditions(&json_of(&first)), [ready("False", "Creating", &created, 1), synced.clone()]);

    // The same again writes nothing; a new reason or generation is written, its transition time kept.
    let again = set(condition("Ready", ConditionStatus::False, "Creating")).await.expect("set Ready again");
    assert_eq!((again.changed, again.last_transition_time.as_str()), (false, created.as_str()));
    let reason = set(condition("Ready", ConditionStatus::False, "Waiting")).await.expect("a new reason");
    assert_eq!((reason.changed, reason.last_transition_time.as_str()), (true, created.as_str()));
    let spec = json!({ "spec": { "size": 2 } });
    api.patch("w", &PatchParams::default(), &Patch::Merge(spec)).await.expect("the spec moves the generation");
    let mut judged = condition("Ready", ConditionStatus::False, "Waiting");
    judged.observed_generation = 2;
    let moved = set(judged).await.expect("a new generation");
    assert!(moved.changed);
    assert_eq!(conditions(&json_of(&moved)), [ready("False", "Waiting", &created, 2), synced.clone()]);

    // A new status moves the transition time (a second later, as the apiserver keeps seconds).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let up = set(condition("Ready", ConditionStatus::True, "Available")).await.expect("a transition");
    assert!(up.changed);
    assert_ne!(up.last_transition_time, created, "the status changed, so did the transition time");

    // Setting another condition keeps this one: each type is applied under a field manager of its own.
    let ours = set(condition("Synced", ConditionStatus::False, "Drifted")).await.expect("set Synced");
    let stored = api.get("w").await.expect("read the widget");
    let stored = serde_json::to_value(stored).expect("json");
    let up_at = up.last_transition_time.as_str();
    let synced_at = ours.last_transition_time.as_str();
    assert_eq!(
        conditions(&stored),
        [
            ready("True", "Available", up_at, 2),
            ("Synced".into(), "False".into(), "Drifted".into(), synced_at.into(), 2)
        ]
    );
}

#[tokio::test]
async fn bad_conditions_a_guard_not_led_and_a_resource_without_status_are_refused() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).start().await;
    let mut objects = ObjectsServiceClient::new(daemon.client().channel());
    let request = |c: Condition| SetConditionRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        name: "nothing".into(),
        condition: Some(c),
        ..Default::default()
    };
    let ready = || condition("Ready", ConditionStatus::True, "Up");
    let cases = [
        (condition("", ConditionStatus::True, "Up"), "condition.type"),
        (condition("Bad Type", ConditionStatus::True, "Up"), "condition.type"),
        (condition("Ready", ConditionStatus::Unspecified, "Up"), "condition.status"),
        (condition("Ready", ConditionStatus::True, ""), "condition.reason"),
        (condition("Ready", ConditionStatus::True, "not camel"), "condition.reason"),
        (Condition { observed_generation: -1, ..ready() }, "condition.observed_generation"),
    ];
    for (c, field) in cases {
        let refused = objects.set_condition(request(c.clone())).await.expect_err("refused");
        assert_eq!(
            (refused.code(), refused.message().split(':').next()),
            (Code::InvalidArgument, Some(field)),
            "{c:?}"
        );
    }
    let mut none = request(ready());
    none.condition = None;
    let refused = objects.set_condition(none).await.expect_err("refused");
    assert_eq!((refused.code(), refused.message().split(':').next()), (Code::InvalidArgument, Some("condition")));

    let mut guarded = request(ready());
    guarded.guard = Some(WriteGuard { election: "nobody-leads".into(), namespace: ns.clone(), term: 1 });
    let refused = objects.set_condition(guarded).await.expect_err("not led");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");

    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(kube, &ns);
    let cm = serde_json::from_value(json!({ "metadata": { "name": "nothing" } })).expect("cm");
    cms.create(&PostParams::default(), &cm).await.expect("create");
    let refused = objects.set_condition(request(ready())).await.expect_err("a ConfigMap has no status subresource");
    assert_eq!(refused.code(), Code::NotFound, "{refused}");
}
