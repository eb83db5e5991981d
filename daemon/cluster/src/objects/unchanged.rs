//! Whether a write would change nothing, judged on the cached object: a merge or JSON patch applied to it,
//! an update's object compared with it, the fields the server owns aside (the Java Operator SDK 5.5
//! compares its desired state with its informer's cache the same way before every write).

use serde_json::Value;

use super::PatchKind;

/// Metadata fields the server sets: a write cannot change them, so they are left out of the comparison.
/// `resourceVersion` and `uid` in a write are preconditions, checked on their own first.
const SERVER_OWNED: [&str; 8] = [
    "resourceVersion",
    "uid",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// Metadata maps and lists the apiserver stores as absent when empty.
const EMPTY_IS_ABSENT: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

/// The object `cached` as the patch would leave it; None when it cannot be told here (a strategic merge
/// patch needs the type's schema, an apply the managed fields; a JSON patch whose operation fails, a
/// `test` among them, goes to the apiserver for its own answer).
pub(super) fn patched(cached: &Value, kind: PatchKind, patch: &Value) -> Option<Value> {
    let mut object = cached.clone();
    match kind {
        PatchKind::Merge => json_patch::merge(&mut object, patch),
        PatchKind::Json => {
            let operations: json_patch::Patch = serde_json::from_value(patch.clone()).ok()?;
            json_patch::patch(&mut object, &operations).ok()?;
        }
        PatchKind::Strategic | PatchKind::Apply { .. } => return None,
    }
    Some(object)
}

/// Whether writing `written` over `cached` would leave the object as it is: equal but for the fields the
/// server owns, and any resourceVersion or uid `written` names is the cached one's (else the apiserver
/// refuses it, and says why itself).
pub(super) fn same(cached: &Value, written: &Value) -> bool {
    for precondition in ["resourceVersion", "uid"] {
        let named = written.pointer(&format!("/metadata/{precondition}")).and_then(Value::as_str);
        if let Some(named) = named.filter(|v| !v.is_empty())
            && cached.pointer(&format!("/metadata/{precondition}")).and_then(Value::as_str) != Some(named)
        {
            return false;
        }
    }
    comparable(cached) == comparable(written)
}

/// `object` without what the server owns: its metadata's server fields, empty metadata maps and lists,
/// and `apiVersion` and `kind` (the request's path names the resource, whatever version the body says).
fn comparable(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(fields) = object.as_object_mut() {
        fields.remove("apiVersion");
        fields.remove("kind");
        if let Some(metadata) = fields.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in SERVER_OWNED {
                metadata.remove(field);
            }
            metadata.retain(|field, value| !(EMPTY_IS_ABSENT.contains(&field.as_str()) && is_empty(value)));
            if metadata.is_empty() {
                fields.remove("metadata");
            }
        }
    }
    object
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(list) => list.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cached() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": { "handled": "3" },
            },
            "data": { "value": "3" },
        })
    }

    #[test]
    fn a_merge_patch_setting_what_is_already_there_changes_nothing_and_one_setting_more_does() {
        let same_value = patched(&cached(), PatchKind::Merge, &json!({"metadata": {"annotations": {"handled": "3"}}}));
        assert!(same(&cached(), &same_value.expect("a merge patch applies")));
        let other = patched(&cached(), PatchKind::Merge, &json!({"metadata": {"annotations": {"handled": "4"}}}));
        assert!(!same(&cached(), &other.expect("a merge patch applies")));
        let removed = patched(&cached(), PatchKind::Merge, &json!({"data": {"value": null}}));
        assert!(!same(&cached(), &removed.expect("a merge patch applies")));
    }

    #[test]
    fn a_json_patch_is_applied_and_one_that_fails_is_left_to_the_apiserver() {
        let ops = json!([{"op": "replace", "path": "/data/value", "value": "3"}]);
        assert!(same(&cached(), &patched(&cached(), PatchKind::Json, &ops).expect("applies")));
        let ops = json!([{"op": "add", "path": "/data/other", "value": "x"}]);
        assert!(!same(&cached(), &patched(&cached(), PatchKind::Json, &ops).expect("applies")));
        let failing_test = json!([{"op": "test", "path": "/data/value", "value": "9"}]);
        assert!(patched(&cached(), PatchKind::Json, &failing_test).is_none());
        assert!(patched(&cached(), PatchKind::Json, &json!({"not": "a list"})).is_none());
    }

    #[test]
    fn strategic_merge_and_apply_are_never_judged_here() {
        let patch = json!({"data": {"value": "3"}});
        assert!(patched(&cached(), PatchKind::Strategic, &patch).is_none());
        assert!(patched(&cached(), PatchKind::Apply { force: false }, &patch).is_none());
    }

    #[test]
    fn an_update_is_compared_without_the_fields_the_server_owns() {
        let mut written = cached();
        let metadata = written["metadata"].as_object_mut().expect("metadata");
        for field in ["creationTimestamp", "uid", "resourceVersion"] {
            metadata.remove(field);
        }
        metadata.insert("managedFields".into(), json!([{"manager": "x"}]));
        metadata.insert("labels".into(), json!({}));
        written.as_object_mut().expect("object").remove("apiVersion");
        assert!(same(&cached(), &written), "only server fields and an empty map differ");
        written["data"]["value"] = json!("4");
        assert!(!same(&cached(), &written));
    }

    #[test]
    fn a_precondition_the_cache_does_not_meet_is_the_apiservers_to_answer() {
        let mut written = cached();
        written["metadata"]["resourceVersion"] = json!("6");
        assert!(!same(&cached(), &written), "a stale resourceVersion: the apiserver answers 409");
        written["metadata"]["resourceVersion"] = json!("7");
        assert!(same(&cached(), &written));
        written["metadata"]["uid"] = json!("u2");
        assert!(!same(&cached(), &written), "another uid: a precondition failure");
    }
}
