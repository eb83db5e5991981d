//! A queue's finalizer (controller-runtime's controllerutil, kube-rs's `finalizer()`): which pass a primary's
//! state calls for, and the JSON patches that add the finalizer before its first pass and remove it when its
//! finalize pass is done. Each patch tests the object's uid and its finalizers as read, so it never lands on
//! an object created again under the name, nor drops a finalizer another controller added meanwhile.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::watch::object::Obj;

/// What a granted key's primary calls for, under a queue with a finalizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FinalizerStep {
    /// The object lacks the finalizer and is not being deleted: add it (this patch), then hand the pass out.
    Add(Value),
    /// The object carries it: an ordinary pass.
    Pass,
    /// The object is being deleted and carries it: a finalize pass.
    Finalize,
    /// The object is being deleted and no longer carries it: nothing to hand out until it is gone.
    Skip,
}

/// What of an object's metadata a finalizer reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Marks {
    uid: Option<String>,
    resource_version: Option<String>,
    finalizers: Option<Vec<String>>,
    deletion_timestamp: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Finalizable {
    #[serde(default)]
    metadata: Marks,
}

fn marks(obj: &Obj) -> Marks {
    serde_json::from_slice::<Finalizable>(obj.json()).map(|m| m.metadata).unwrap_or_default()
}

/// The step `obj` calls for under `finalizer`.
pub(super) fn step(obj: &Obj, finalizer: &str) -> FinalizerStep {
    let m = marks(obj);
    let carries = m.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == finalizer));
    match (m.deletion_timestamp.is_some(), carries) {
        (false, true) => FinalizerStep::Pass,
        (false, false) => FinalizerStep::Add(add(&m, finalizer)),
        (true, true) => FinalizerStep::Finalize,
        (true, false) => FinalizerStep::Skip,
    }
}

/// The patch that adds `finalizer` to the object `m` describes: its uid tested, and its finalizers as read
/// (none: its resourceVersion, since a JSON patch cannot test that a field is absent).
fn add(m: &Marks, finalizer: &str) -> Value {
    let mut ops = vec![test("/metadata/uid", &m.uid)];
    match &m.finalizers {
        Some(list) => {
            ops.push(json!({ "op": "test", "path": "/metadata/finalizers", "value": list }));
            ops.push(json!({ "op": "add", "path": "/metadata/finalizers/-", "value": finalizer }));
        }
        None => {
            ops.push(test("/metadata/resourceVersion", &m.resource_version));
            ops.push(json!({ "op": "add", "path": "/metadata/finalizers", "value": [finalizer] }));
        }
    }
    Value::Array(ops)
}

/// The patch that removes `finalizer` from `obj` (its uid and finalizers tested), or None when it carries
/// none.
pub(super) fn remove(obj: &Obj, finalizer: &str) -> Option<Value> {
    let m = marks(obj);
    let list = m.finalizers.as_ref().filter(|f| f.iter().any(|f| f == finalizer))?;
    let kept: Vec<&String> = list.iter().filter(|f| *f != finalizer).collect();
    Some(json!([
        test("/metadata/uid", &m.uid),
        { "op": "test", "path": "/metadata/finalizers", "value": list },
        { "op": "replace", "path": "/metadata/finalizers", "value": kept },
    ]))
}

fn test(path: &str, value: &Option<String>) -> Value {
    json!({ "op": "test", "path": path, "value": value.as_deref().unwrap_or_default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::object::RawObject;

    const F: &str = "example.com/cleanup";

    fn obj(metadata: &str) -> Obj {
        let json =
            format!(r#"{{"metadata":{{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"7"{metadata}}}}}"#);
        Obj::from(serde_json::from_str::<RawObject>(&json).expect("test object decodes"))
    }

    #[test]
    fn each_state_calls_for_its_step() {
        assert_eq!(step(&obj(&format!(r#","finalizers":["{F}"]"#)), F), FinalizerStep::Pass);
        let deleting = r#","deletionTimestamp":"2026-12-07T00:00:00Z""#;
        assert_eq!(step(&obj(&format!(r#","finalizers":["other/x","{F}"]{deleting}"#)), F), FinalizerStep::Finalize);
        assert_eq!(step(&obj(&format!(r#","finalizers":["other/x"]{deleting}"#)), F), FinalizerStep::Skip);
        assert_eq!(step(&obj(deleting), F), FinalizerStep::Skip);
        assert!(matches!(step(&obj(r#","finalizers":["other/x"]"#), F), FinalizerStep::Add(_)));
    }

    #[test]
    fn an_add_tests_the_uid_and_the_finalizers_it_read_or_the_version_when_there_are_none() {
        let FinalizerStep::Add(patch) = step(&obj(r#","finalizers":["other/x"]"#), F) else { panic!("an add") };
        assert_eq!(
            patch,
            json!([
                { "op": "test", "path": "/metadata/uid", "value": "u1" },
                { "op": "test", "path": "/metadata/finalizers", "value": ["other/x"] },
                { "op": "add", "path": "/metadata/finalizers/-", "value": F },
            ])
        );
        let FinalizerStep::Add(patch) = step(&obj(""), F) else { panic!("an add") };
        assert_eq!(
            patch,
            json!([
                { "op": "test", "path": "/metadata/uid", "value": "u1" },
                { "op": "test", "path": "/metadata/resourceVersion", "value": "7" },
                { "op": "add", "path": "/metadata/finalizers", "value": [F] },
            ])
        );
    }

    #[test]
    fn a_removal_keeps_every_other_finalizer_and_tests_what_it_read() {
        let patch = remove(&obj(&format!(r#","finalizers":["a/1","{F}","b/2"]"#)), F).expect("carries it");
        assert_eq!(
            patch,
            json!([
                { "op": "test", "path": "/metadata/uid", "value": "u1" },
                { "op": "test", "path": "/metadata/finalizers", "value": ["a/1", F, "b/2"] },
                { "op": "replace", "path": "/metadata/finalizers", "value": ["a/1", "b/2"] },
            ])
        );
        assert_eq!(remove(&obj(r#","finalizers":["a/1"]"#), F), None);
    }
}
