//! Which changes of a queue's object queue a pass: controller-runtime's generation, label and annotation
//! predicates (kube-rs's `predicates`), on the primary and related queries.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::watch::object::Obj;

/// The parts of an object whose change queues a pass (at least one); a deletionTimestamp set always does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChangeFilter {
    /// `metadata.generation`: the spec, for most resources.
    pub generation: bool,
    /// `metadata.labels`.
    pub labels: bool,
    /// `metadata.annotations`.
    pub annotations: bool,
}

/// What of an object's metadata a filter compares.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Judged {
    generation: Option<i64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    deletion_timestamp: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    metadata: Judged,
}

impl ChangeFilter {
    /// Whether the filter names any part (one that names none is refused where a spec is checked).
    pub fn any(&self) -> bool {
        self.generation || self.labels || self.annotations
    }

    /// The paths a projected watch must keep for the filter to judge.
    pub fn reads(&self) -> Vec<Vec<String>> {
        let path = |field: &str| vec!["metadata".to_owned(), field.to_owned()];
        let mut paths = vec![path("deletionTimestamp")];
        if self.generation {
            paths.push(path("generation"));
        }
        if self.labels {
            paths.push(path("labels"));
        }
        if self.annotations {
            paths.push(path("annotations"));
        }
        paths
    }

    /// Whether the change from `before` to `after` (two states of one object) queues a pass: a part the
    /// filter names differs, or the deletionTimestamp does. Another uid, or metadata that does not decode,
    /// counts as a change (never a pass lost).
    pub fn passes(&self, before: &Obj, after: &Obj) -> bool {
        if before.uid() != after.uid() {
            return true;
        }
        let judged = |o: &Obj| serde_json::from_slice::<Metadata>(o.json()).map(|m| m.metadata);
        let (Ok(before), Ok(after)) = (judged(before), judged(after)) else { return true };
        before.deletion_timestamp != after.deletion_timestamp
            || (self.generation
                && (before.generation.is_none() || after.generation.is_none() || before.generation != after.generation))
            || (self.labels && before.labels != after.labels)
            || (self.annotations && before.annotations != after.annotations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::object::RawObject;

    fn obj(uid: &str, metadata: &str, status: &str) -> Obj {
        let json = format!(
            r#"{{"metadata":{{"name":"a","namespace":"ns","uid":"{uid}","resourceVersion":"1"{metadata}}},"status":{{"s":"{status}"}}}}"#
        );
        Obj::from(serde_json::from_str::<RawObject>(&json).expect("test object decodes"))
    }

    const GENERATION: ChangeFilter = ChangeFilter { generation: true, labels: false, annotations: false };
    const LABELS: ChangeFilter = ChangeFilter { generation: false, labels: true, annotations: false };
    const ANNOTATIONS: ChangeFilter = ChangeFilter { generation: false, labels: false, annotations: true };

    #[test]
    fn only_a_change_of_a_named_part_passes() {
        let base = obj("u", r#","generation":1,"labels":{"a":"1"},"annotations":{"n":"1"}"#, "x");
        let status = obj("u", r#","generation":1,"labels":{"a":"1"},"annotations":{"n":"1"}"#, "y");
        let spec = obj("u", r#","generation":2,"labels":{"a":"1"},"annotations":{"n":"1"}"#, "x");
        let labels = obj("u", r#","generation":1,"labels":{"a":"2"},"annotations":{"n":"1"}"#, "x");
        let annotations = obj("u", r#","generation":1,"labels":{"a":"1"},"annotations":{"n":"2"}"#, "x");
        for filter in [GENERATION, LABELS, ANNOTATIONS] {
            assert!(!filter.passes(&base, &status), "{filter:?}: status alone");
        }
        assert!(GENERATION.passes(&base, &spec) && !LABELS.passes(&base, &spec) && !ANNOTATIONS.passes(&base, &spec));
        assert!(!GENERATION.passes(&base, &labels) && LABELS.passes(&base, &labels));
        assert!(!GENERATION.passes(&base, &annotations) && ANNOTATIONS.passes(&base, &annotations));
        let both = ChangeFilter { generation: true, labels: true, annotations: false };
        assert!(both.passes(&base, &spec) && both.passes(&base, &labels) && !both.passes(&base, &annotations));
    }

    #[test]
    fn a_deletion_mark_another_uid_or_no_generation_always_passes() {
        let base = obj("u", r#","generation":1"#, "x");
        let deleting = obj("u", r#","generation":1,"deletionTimestamp":"2026-12-07T00:00:00Z""#, "x");
        assert!(LABELS.passes(&base, &deleting), "deletionTimestamp set");
        assert!(LABELS.passes(&base, &obj("v", r#","generation":1"#, "x")), "recreated");
        let unversioned = obj("u", "", "x");
        assert!(GENERATION.passes(&unversioned, &obj("u", "", "y")), "a ConfigMap has no generation");
        assert!(!LABELS.passes(&unversioned, &obj("u", "", "y")), "but labels still compare");
    }
}
