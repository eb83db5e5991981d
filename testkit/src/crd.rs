//! A custom resource for tests that need one: a Widget CRD of a group of the test's own, with a status
//! subresource whose conditions are a list map keyed by type.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
};
use serde_json::json;

/// Creates a Widget CRD in the group `<ns>.example.com`, its conditions as Go's []metav1.Condition with
/// +listType=map generates them, and waits until it is served: its resource name and kube's ApiResource.
pub async fn widgets(kube: &kube::Client, ns: &str) -> (String, ApiResource) {
    let group = format!("{ns}.example.com");
    let condition = json!({
        "type": "object",
        "required": ["type", "status", "reason", "message", "lastTransitionTime"],
        "properties": {
            "type": { "type": "string" }, "status": { "type": "string" }, "reason": { "type": "string" },
            "message": { "type": "string" }, "lastTransitionTime": { "type": "string", "format": "date-time" },
            "observedGeneration": { "type": "integer", "format": "int64" },
        },
    });
    let schema = json!({
        "type": "object",
        "properties": {
            "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            "status": { "type": "object", "properties": { "conditions": {
                "type": "array", "items": condition,
                "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
            } } },
        },
    });
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": { "name": format!("widgets.{group}") },
        "spec": {
            "group": group,
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "scope": "Namespaced",
            "versions": [{ "name": "v1", "served": true, "storage": true, "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": schema } }],
        },
    }))
    .expect("CRD object");
    Api::<CustomResourceDefinition>::all(kube.clone()).create(&PostParams::default(), &crd).await.expect("create CRD");
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&group, "v1", "Widget"), "widgets");
    // The CRD takes a moment to be established and served.
    let api: Api<DynamicObject> = Api::namespaced_with(kube.clone(), ns, &resource);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while api.list(&Default::default()).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the Widget CRD was not served");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (format!("widgets.{group}"), resource)
}
