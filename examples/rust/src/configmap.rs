//! A Greeting's ConfigMap (same name, owned by the Greeting): what it holds, and reading, applying and
//! deleting it as writes made for the Greeting's work item.

use anyhow::Context as _;
use consistd_client::{
    WorkItem,
    proto::{DeleteRequest, GetRequest, PatchRequest, PatchType},
};
use serde_json::{Value, json};
use tonic::Code;

/// The label on every ConfigMap the operator applies; its value is [`OPERATOR`].
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The operator's name: the value of its [`MANAGED_BY`] label and its field manager.
const OPERATOR: &str = "greeting-operator";

/// The label selector of the ConfigMaps the operator applies.
pub(crate) fn managed_selector() -> String {
    format!("{MANAGED_BY}={OPERATOR}")
}

/// Whether `configmap` holds `message` and names the Greeting with `uid` as its controller.
pub(crate) fn publishes(configmap: &Value, message: &str, uid: &str) -> bool {
    let controlled = configmap["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|owners| owners.iter().any(|o| o["controller"] == true && o["uid"] == uid));
    configmap["data"]["message"] == message && controlled
}

/// The item's ConfigMap as the daemon holds it; `None` when there is none.
pub(crate) async fn read(item: &WorkItem) -> anyhow::Result<Option<Value>> {
    let request = GetRequest {
        resource: "configmaps".into(),
        namespace: item.namespace.clone(),
        name: item.name.clone(),
        ..Default::default()
    };
    let read = match item.objects().get(request).await {
        Ok(read) => read.into_inner(),
        Err(status) if status.code() == Code::NotFound => return Ok(None),
        Err(status) => return Err(status).with_context(|| format!("get configmap {}", key(item))),
    };
    let Some(object) = read.object else { return Ok(None) };
    let configmap = serde_json::from_slice(&object.json).with_context(|| format!("parse configmap {}", key(item)))?;
    Ok(Some(configmap))
}

/// Applies the item's ConfigMap holding `message`, owned by the Greeting with `uid` (server-side apply,
/// forced, guarded by the item's term and naming its lease); returns the resourceVersion stored.
pub(crate) async fn apply(item: &WorkItem, uid: &str, message: &str) -> anyhow::Result<String> {
    let configmap = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": item.name,
            "namespace": item.namespace,
            "labels": { MANAGED_BY: OPERATOR },
            "ownerReferences": [{
                "apiVersion": "example.consistd.io/v1",
                "kind": "Greeting",
                "name": item.name,
                "uid": uid,
                "controller": true,
            }],
        },
        "data": { "message": message },
    });
    let request = PatchRequest {
        resource: "configmaps".into(),
        namespace: item.namespace.clone(),
        name: item.name.clone(),
        patch_type: PatchType::Apply.into(),
        patch: configmap.to_string().into_bytes(),
        field_manager: OPERATOR.into(),
        force: true,
        guard: item.guard.clone(),
        ..Default::default()
    };
    let applied =
        item.objects().patch(request).await.with_context(|| format!("apply configmap {}", key(item)))?.into_inner();
    Ok(applied.object.map(|o| o.resource_version).unwrap_or_default())
}

/// Deletes the item's ConfigMap (guarded by the item's term and naming its lease); one already gone is fine.
pub(crate) async fn delete(item: &WorkItem) -> anyhow::Result<()> {
    let request = DeleteRequest {
        resource: "configmaps".into(),
        namespace: item.namespace.clone(),
        name: item.name.clone(),
        guard: item.guard.clone(),
        ..Default::default()
    };
    match item.objects().delete(request).await {
        Err(status) if status.code() != Code::NotFound => {
            Err(status).with_context(|| format!("delete configmap {}", key(item)))
        }
        _ => Ok(()),
    }
}

/// "namespace/name" of the item, for error messages.
fn key(item: &WorkItem) -> String {
    format!("{}/{}", item.namespace, item.name)
}
