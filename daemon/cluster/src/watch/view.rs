//! What of each object a watch keeps and delivers: the whole object, its metadata only, or a projection of
//! named fields; managedFields only when asked. Shaping rewrites the apiserver's JSON without decoding more
//! of it than the fields it drops or keeps, and keeps the order of the fields it keeps.

use std::{borrow::Cow, fmt};

use bytes::Bytes;
use serde::{
    Deserialize, Deserializer,
    de::{MapAccess, Visitor},
};
use serde_json::value::RawValue;

/// The most fields a projection may name.
pub const MAX_FIELDS: usize = 32;

/// Fields every shape keeps beside what it names: what apps and the hub identify an object and its
/// changes by.
const IDENTITY: [&str; 6] = ["name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp"];

/// What a watch keeps of each object. Two queries share an upstream watch only with equal views.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ObjectView {
    /// How much of the object.
    pub shape: Shape,
    /// Whether `metadata.managedFields` is kept.
    pub managed_fields: bool,
}

/// How much of an object a view keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum Shape {
    /// All of it.
    #[default]
    Full,
    /// `apiVersion`, `kind` and `metadata`, read with the apiserver's metadata-only requests.
    Metadata,
    /// `apiVersion`, `kind`, the identity in `metadata` and these paths (sorted, none inside another).
    Fields(Vec<Vec<String>>),
}

/// A view a request asks for that cannot be kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ViewError {
    /// The request field, relative to the view ("fields[2]").
    pub field: String,
    /// Why.
    pub message: String,
}

impl ObjectView {
    /// The view a request asks for: `metadata_only`, or the dot-separated `fields`, or neither; and
    /// whether managedFields are kept.
    pub fn new(metadata_only: bool, fields: &[String], managed_fields: bool) -> Result<Self, ViewError> {
        let refuse = |field: String, message: String| Err(ViewError { field, message });
        if metadata_only && !fields.is_empty() {
            return refuse("fields".into(), "a metadata-only view has no other fields: set one of the two".into());
        }
        if fields.len() > MAX_FIELDS {
            return refuse("fields".into(), format!("{} paths; at most {MAX_FIELDS}", fields.len()));
        }
        let mut paths = Vec::with_capacity(fields.len());
        for (i, field) in fields.iter().enumerate() {
            let Some(path) = dot_path(field.strip_prefix('.').unwrap_or(field)) else {
                return refuse(
                    format!("fields[{i}]"),
                    format!("{field:?} is not a dot-separated path like spec.replicas"),
                );
            };
            if path.iter().any(|p| p.contains(['[', ']', '*'])) {
                return refuse(
                    format!("fields[{i}]"),
                    format!("{field:?}: a path names object fields only; an array is kept whole (status.conditions)"),
                );
            }
            paths.push(path);
        }
        let shape = if metadata_only {
            Shape::Metadata
        } else if paths.is_empty() {
            Shape::Full
        } else {
            Shape::Fields(normalized(paths))
        };
        Ok(Self { shape, managed_fields })
    }

    /// Whether the watch reads with the apiserver's metadata-only requests.
    pub fn metadata_only(&self) -> bool {
        self.shape == Shape::Metadata
    }

    /// Whether objects are kept whole (managedFields aside), so a read may be answered from them.
    pub fn whole(&self) -> bool {
        self.shape == Shape::Full
    }

    /// Keeps `path` too (a related query's mapping reads it), unless the view already keeps it.
    pub fn keep(&mut self, path: &[String]) {
        if let Shape::Fields(paths) = &mut self.shape {
            paths.push(path.to_vec());
            *paths = normalized(std::mem::take(paths));
        }
    }

    /// Whether the view keeps the value at `path`.
    pub fn keeps(&self, path: &[String]) -> bool {
        match &self.shape {
            Shape::Full => true,
            Shape::Metadata => path.first().is_some_and(|p| p == "metadata" || p == "apiVersion" || p == "kind"),
            Shape::Fields(paths) => paths.iter().any(|p| path.starts_with(p)) || is_identity(path),
        }
    }

    /// How the view reads in metrics and status: "full", "metadata" or "fields:a.b,c", "+managedFields"
    /// when kept.
    pub fn label(&self) -> String {
        let shape = match &self.shape {
            Shape::Full => "full".to_owned(),
            Shape::Metadata => "metadata".to_owned(),
            Shape::Fields(paths) => {
                format!("fields:{}", paths.iter().map(|p| p.join(".")).collect::<Vec<_>>().join(","))
            }
        };
        if self.managed_fields { format!("{shape}+managedFields") } else { shape }
    }

    /// `json` (an object as the apiserver sent it) shaped by the view; `api_version` and `kind` name the
    /// resource (a metadata-only answer says PartialObjectMetadata, the view says what the object is).
    /// JSON that is not an object is returned as it is. The result holds no spare capacity: it is what the
    /// cache keeps.
    pub fn shape(&self, json: Bytes, api_version: &str, kind: &str) -> Bytes {
        if self.shape == Shape::Full && (self.managed_fields || !contains(&json, b"\"managedFields\"")) {
            return json;
        }
        let Ok(object) = serde_json::from_slice::<Fields<'_>>(&json) else { return json };
        let kept = object.0.iter().filter_map(|(key, value)| {
            let kept = match (&self.shape, key.as_ref()) {
                (Shape::Metadata, "apiVersion") => Cow::Owned(string(api_version)),
                (Shape::Metadata, "kind") => Cow::Owned(string(kind)),
                (_, "metadata") => Cow::Owned(self.metadata(value)),
                (_, "apiVersion" | "kind") | (Shape::Full, _) => Cow::Borrowed(value.get().as_bytes()),
                (Shape::Metadata, _) => return None,
                (Shape::Fields(paths), key) => project(value, key, paths)?,
            };
            Some((key.as_ref(), kept))
        });
        let mut out = object_of(kept, json.len());
        out.shrink_to_fit();
        Bytes::from(out)
    }

    /// The object's metadata as the view keeps it: all of it (managedFields only when asked), or for a
    /// projection the identity and the paths under `metadata`.
    fn metadata(&self, value: &RawValue) -> Vec<u8> {
        let Ok(meta) = serde_json::from_str::<Fields<'_>>(value.get()) else { return value.get().as_bytes().to_vec() };
        let under: Option<Vec<Vec<String>>> = match &self.shape {
            Shape::Fields(paths) if !paths.iter().any(|p| p.len() == 1 && p[0] == "metadata") => {
                Some(paths.iter().filter(|p| p[0] == "metadata").map(|p| p[1..].to_vec()).collect())
            }
            _ => None,
        };
        let kept = meta.0.iter().filter_map(|(key, value)| {
            if key == "managedFields" && !self.managed_fields {
                return None;
            }
            let kept = match &under {
                Some(under) if !IDENTITY.contains(&key.as_ref()) => project(value, key, under)?,
                _ => Cow::Borrowed(value.get().as_bytes()),
            };
            Some((key.as_ref(), kept))
        });
        object_of(kept, value.get().len())
    }
}

/// The value of field `key` as `paths` (relative to the object holding it) keep it, if at all.
fn project<'a>(value: &'a RawValue, key: &str, paths: &[Vec<String>]) -> Option<Cow<'a, [u8]>> {
    let under: Vec<Vec<String>> = paths.iter().filter(|p| p[0] == key).map(|p| p[1..].to_vec()).collect();
    if under.is_empty() {
        return None;
    }
    // Named whole, or not an object (an array, a string): kept whole.
    let whole = Cow::Borrowed(value.get().as_bytes());
    if under.iter().any(Vec::is_empty) {
        return Some(whole);
    }
    let Ok(object) = serde_json::from_str::<Fields<'_>>(value.get()) else { return Some(whole) };
    let kept = object.0.iter().filter_map(|(k, v)| Some((k.as_ref(), project(v, k, &under)?)));
    Some(Cow::Owned(object_of(kept, 64)))
}

/// A JSON object of `fields`, each value already JSON, in their order; `capacity` is a first guess.
fn object_of<'a, 'v>(fields: impl Iterator<Item = (&'a str, Cow<'v, [u8]>)>, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.push(b'{');
    for (i, (key, value)) in fields.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // A key is a JSON string: written escaped, as serde_json writes any string.
        let _ = serde_json::to_writer(&mut out, key);
        out.push(b':');
        out.extend_from_slice(&value);
    }
    out.push(b'}');
    out
}

/// The parts of a dot-separated path ("spec.replicas"); None when one is empty.
pub fn dot_path(text: &str) -> Option<Vec<String>> {
    let parts: Vec<String> = text.split('.').map(str::to_owned).collect();
    (!parts.iter().any(String::is_empty)).then_some(parts)
}

/// Sorted, deduplicated paths with none inside another (`spec` keeps `spec.replicas` already).
fn normalized(mut paths: Vec<Vec<String>>) -> Vec<Vec<String>> {
    paths.sort();
    paths.dedup();
    let mut kept: Vec<Vec<String>> = Vec::with_capacity(paths.len());
    for path in paths {
        if !kept.iter().any(|k| path.starts_with(k)) {
            kept.push(path);
        }
    }
    kept
}

/// Whether `path` is one of the identity fields every view keeps.
fn is_identity(path: &[String]) -> bool {
    match path {
        [top] => top == "apiVersion" || top == "kind",
        [meta, key, ..] => meta == "metadata" && IDENTITY.contains(&key.as_str()),
        _ => false,
    }
}

/// `s` as a JSON string.
fn string(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).unwrap_or_else(|_| b"\"\"".to_vec())
}

/// Whether `haystack` holds `needle`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A JSON object's fields in the order written, their values undecoded.
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Fields<'a>, M::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some((key, value)) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    fields.push((key, value));
                }
                Ok(Fields(fields))
            }
        }
        deserializer.deserialize_map(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const OBJECT: &str = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"42","labels":{"app":"web","tier":"db"},"annotations":{"note":"x"},"managedFields":[{"manager":"kubectl"}]},"data":{"field":"s0","big":"xxxxxxxx"},"binaryData":{}}"#;

    fn shaped(view: &ObjectView, json: &str) -> Value {
        serde_json::from_slice(&view.shape(Bytes::copy_from_slice(json.as_bytes()), "v1", "ConfigMap")).expect("JSON")
    }

    fn fields(paths: &[&str]) -> ObjectView {
        ObjectView::new(false, &paths.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>(), false).expect("a view")
    }

    #[test]
    fn the_default_drops_managed_fields_only_and_keeps_the_rest_byte_for_byte() {
        let view = ObjectView::default();
        let out = view.shape(Bytes::from_static(OBJECT.as_bytes()), "v1", "ConfigMap");
        assert_eq!(out, OBJECT.replace(r#","managedFields":[{"manager":"kubectl"}]"#, "").as_bytes());
        let kept = ObjectView { managed_fields: true, ..ObjectView::default() };
        assert_eq!(kept.shape(Bytes::from_static(OBJECT.as_bytes()), "v1", "ConfigMap"), OBJECT.as_bytes());
        let without = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b"}}"#;
        assert_eq!(view.shape(Bytes::from_static(without.as_bytes()), "v1", "ConfigMap"), without.as_bytes());
    }

    #[test]
    fn metadata_only_names_the_resource_kind_and_keeps_all_metadata_but_managed_fields() {
        let view = ObjectView::new(true, &[], false).expect("a view");
        let answer = r#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","uid":"u1","resourceVersion":"42","labels":{"app":"web"},"managedFields":[{}]}}"#;
        assert_eq!(
            shaped(&view, answer),
            json!({"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","uid":"u1","resourceVersion":"42","labels":{"app":"web"}}})
        );
        assert!(view.metadata_only() && !view.whole());
    }

    #[test]
    fn a_projection_keeps_the_identity_and_the_named_paths() {
        let view = fields(&["data.field", "metadata.labels.app"]);
        assert_eq!(
            shaped(&view, OBJECT),
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"42","labels":{"app":"web"}},"data":{"field":"s0"}})
        );
        let whole_metadata = fields(&["metadata", ".data"]);
        assert_eq!(
            shaped(&whole_metadata, OBJECT),
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"42","labels":{"app":"web","tier":"db"},"annotations":{"note":"x"}},"data":{"field":"s0","big":"xxxxxxxx"}})
        );
        // A path to what the object does not have keeps nothing of it; an array is kept whole.
        let missing = fields(&["spec.replicas", "status.conditions"]);
        let status = r#"{"metadata":{"name":"a"},"status":{"conditions":[{"type":"Ready"}],"phase":"Up"}}"#;
        assert_eq!(
            shaped(&missing, status),
            json!({"metadata":{"name":"a"},"status":{"conditions":[{"type":"Ready"}]}})
        );
    }

    #[test]
    fn paths_are_normalized_so_equal_projections_share_a_watch() {
        assert_eq!(fields(&["spec", "spec.replicas", "data"]), fields(&["data", "spec"]));
        let mut view = fields(&["data"]);
        view.keep(&["metadata".to_owned(), "ownerReferences".to_owned()]);
        assert!(view.keeps(&["metadata".to_owned(), "ownerReferences".to_owned()]));
        assert!(view.keeps(&["metadata".to_owned(), "name".to_owned()]));
        assert!(!view.keeps(&["spec".to_owned(), "x".to_owned()]));
        assert_eq!(view.label(), "fields:data,metadata.ownerReferences");
    }

    #[test]
    fn bad_views_are_refused_naming_the_field() {
        let err = ObjectView::new(true, &["data".into()], false).expect_err("both");
        assert_eq!(err.field, "fields");
        let err = ObjectView::new(false, &["data".into(), "spec..x".into()], false).expect_err("empty part");
        assert_eq!(err.field, "fields[1]");
        let err = ObjectView::new(false, &["status.conditions[0]".into()], false).expect_err("index");
        assert_eq!(err.field, "fields[0]");
        let many: Vec<String> = (0..=MAX_FIELDS).map(|i| format!("f{i}")).collect();
        assert_eq!(ObjectView::new(false, &many, false).expect_err("too many").field, "fields");
    }
}
