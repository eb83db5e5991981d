//! Which primary keys a related object names: its controller ownerReference, or the value of a label,
//! an annotation or a field. A value "name" names a primary in the related object's own namespace,
//! "namespace/name" one anywhere.

use serde_json::Value;

use crate::watch::object::{Obj, ObjKey};

/// How a related object names its primary.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MapsBy {
    /// The controller ownerReference whose kind (and API group) is the primary's.
    ControllerOwner,
    /// A label's value.
    Label(String),
    /// An annotation's value.
    Annotation(String),
    /// The string at a dot-separated path.
    Field(Vec<String>),
}

impl MapsBy {
    /// The path of the object it reads, which a projected watch must keep.
    pub fn reads(&self) -> Vec<String> {
        let metadata = |field: &str| vec!["metadata".to_owned(), field.to_owned()];
        match self {
            Self::ControllerOwner => metadata("ownerReferences"),
            Self::Label(_) => metadata("labels"),
            Self::Annotation(_) => metadata("annotations"),
            Self::Field(path) => path.clone(),
        }
    }
}

/// The primary resource's identity, as owner references name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PrimaryKind {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind, e.g. "ConfigMap".
    pub kind: String,
    /// Whether primaries live in namespaces.
    pub namespaced: bool,
}

/// The primary key `obj` names under `maps_by`, if any.
pub(crate) fn primary_of(obj: &Obj, maps_by: &MapsBy, primary: &PrimaryKind) -> Option<ObjKey> {
    let json: Value = serde_json::from_slice(obj.json()).ok()?;
    let metadata = json.get("metadata")?;
    let value = match maps_by {
        MapsBy::ControllerOwner => {
            let owner = metadata.get("ownerReferences")?.as_array()?.iter().find(|r| {
                r.get("controller").and_then(Value::as_bool) == Some(true)
                    && r.get("kind").and_then(Value::as_str) == Some(primary.kind.as_str())
                    && group_of(r.get("apiVersion").and_then(Value::as_str).unwrap_or_default()) == primary.group
            })?;
            // Owners live in the dependent's namespace (or are cluster-scoped): never "namespace/name".
            let name = owner.get("name")?.as_str()?.to_owned();
            let namespace = if primary.namespaced { obj.namespace().to_owned() } else { String::new() };
            return (!name.is_empty()).then_some(ObjKey { namespace, name });
        }
        MapsBy::Label(label) => metadata.get("labels")?.get(label)?.as_str()?,
        MapsBy::Annotation(annotation) => metadata.get("annotations")?.get(annotation)?.as_str()?,
        MapsBy::Field(path) => path.iter().try_fold(&json, |v, part| v.get(part))?.as_str()?,
    };
    named(value, obj.namespace(), primary.namespaced)
}

/// The key a value names: "namespace/name", or "name" in `own_namespace` (cluster-scoped: no namespace).
fn named(value: &str, own_namespace: &str, namespaced: bool) -> Option<ObjKey> {
    let value = value.trim();
    let (namespace, name) = match value.split_once('/') {
        Some((namespace, name)) if namespaced => (namespace.to_owned(), name.to_owned()),
        Some(_) => return None,
        None if namespaced => (own_namespace.to_owned(), value.to_owned()),
        None => (String::new(), value.to_owned()),
    };
    (!name.is_empty() && !name.contains('/')).then_some(ObjKey { namespace, name })
}

/// The group of an apiVersion ("apps/v1" -> "apps", "v1" -> "").
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(namespace: &str, json: &str) -> Obj {
        Obj::new("u", namespace, "child", "1", json.as_bytes())
    }

    fn configmap() -> PrimaryKind {
        PrimaryKind { group: String::new(), kind: "ConfigMap".into(), namespaced: true }
    }

    fn key(namespace: &str, name: &str) -> Option<ObjKey> {
        Some(ObjKey { namespace: namespace.into(), name: name.into() })
    }

    #[test]
    fn the_controller_owner_of_the_primary_kind_names_the_key() {
        let child = obj(
            "ns",
            r#"{"metadata":{"ownerReferences":[
                {"apiVersion":"apps/v1","kind":"ConfigMap","name":"wrong-group","controller":true},
                {"apiVersion":"v1","kind":"ConfigMap","name":"not-controller"},
                {"apiVersion":"v1","kind":"ConfigMap","name":"owner","controller":true}]}}"#,
        );
        assert_eq!(primary_of(&child, &MapsBy::ControllerOwner, &configmap()), key("ns", "owner"));
        let orphan = obj("ns", r#"{"metadata":{}}"#);
        assert_eq!(primary_of(&orphan, &MapsBy::ControllerOwner, &configmap()), None);
    }

    #[test]
    fn labels_annotations_and_fields_name_a_key_here_or_in_another_namespace() {
        let child = obj(
            "ns",
            r#"{"metadata":{"labels":{"app/owner":"a"},"annotations":{"x":"other/b"}},"spec":{"ref":{"name":"c"},"n":3}}"#,
        );
        let p = configmap();
        assert_eq!(primary_of(&child, &MapsBy::Label("app/owner".into()), &p), key("ns", "a"));
        assert_eq!(primary_of(&child, &MapsBy::Annotation("x".into()), &p), key("other", "b"));
        let field = |path: &str| MapsBy::Field(path.split('.').map(str::to_owned).collect());
        assert_eq!(primary_of(&child, &field("spec.ref.name"), &p), key("ns", "c"));
        assert_eq!(primary_of(&child, &field("spec.n"), &p), None, "not a string");
        assert_eq!(primary_of(&child, &field("spec.missing"), &p), None);
        assert_eq!(primary_of(&child, &MapsBy::Label("none".into()), &p), None);
    }

    #[test]
    fn a_cluster_scoped_primary_is_named_without_a_namespace() {
        let p = PrimaryKind { group: String::new(), kind: "Namespace".into(), namespaced: false };
        let child = obj("ns", r#"{"metadata":{"labels":{"team":"blue"}}}"#);
        assert_eq!(primary_of(&child, &MapsBy::Label("team".into()), &p), key("", "blue"));
        let bad = obj("ns", r#"{"metadata":{"labels":{"team":"a/b"}}}"#);
        assert_eq!(primary_of(&bad, &MapsBy::Label("team".into()), &p), None);
    }
}
