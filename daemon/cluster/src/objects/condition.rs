//! One status condition set as apimachinery's `meta.SetStatusCondition` does: compared with the condition
//! of its type the object has, lastTransitionTime kept while the status stays, and the server-side apply
//! body that writes it alone.

use serde_json::{Value, json};

/// A condition to set; lastTransitionTime is worked out here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// Its type, e.g. "Ready".
    pub kind: String,
    /// "True", "False" or "Unknown".
    pub status: &'static str,
    /// Why, in CamelCase.
    pub reason: String,
    /// For humans.
    pub message: String,
    /// The generation it was judged on; 0: the object's own.
    pub observed_generation: i64,
}

/// What setting a condition on an object takes.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Plan {
    /// The object has it already, as set at this lastTransitionTime.
    Unchanged { last_transition_time: String },
    /// Apply this body to the status subresource; the condition's lastTransitionTime is this.
    Apply { body: Value, last_transition_time: String },
}

/// How `object` (its JSON) of `(api_version, kind)` takes `c` at `now` (RFC 3339).
pub(super) fn plan(object: &Value, (api_version, kind): (&str, &str), c: &Condition, now: &str) -> Plan {
    let generation = match c.observed_generation {
        0 => object.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0),
        g => g,
    };
    let existing = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|all| all.iter().find(|e| e.get("type").and_then(Value::as_str) == Some(c.kind.as_str())));
    let text = |e: &Value, field: &str| e.get(field).and_then(Value::as_str).map(str::to_owned);
    let kept_time = existing
        .filter(|e| text(e, "status").as_deref() == Some(c.status))
        .and_then(|e| text(e, "lastTransitionTime"))
        .filter(|t| !t.is_empty());
    if let (Some(e), Some(time)) = (existing, &kept_time) {
        let same = text(e, "reason").unwrap_or_default() == c.reason
            && text(e, "message").unwrap_or_default() == c.message
            && e.get("observedGeneration").and_then(Value::as_i64).unwrap_or(0) == generation;
        if same {
            return Plan::Unchanged { last_transition_time: time.clone() };
        }
    }
    let last_transition_time = kept_time.unwrap_or_else(|| now.to_owned());
    let mut condition = json!({
        "type": c.kind,
        "status": c.status,
        "reason": c.reason,
        "message": c.message,
        "lastTransitionTime": last_transition_time,
    });
    if generation != 0 {
        condition["observedGeneration"] = generation.into();
    }
    let mut metadata = json!({ "name": object.pointer("/metadata/name").cloned().unwrap_or_default() });
    if let Some(namespace) = object.pointer("/metadata/namespace").filter(|n| n.as_str().is_some_and(|n| !n.is_empty()))
    {
        metadata["namespace"] = namespace.clone();
    }
    let body = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": metadata,
        "status": { "conditions": [condition] },
    });
    Plan::Apply { body, last_transition_time }
}

/// Whether `kind` is a condition type metav1.Condition takes: an optional DNS subdomain and '/', then a name
/// of letters, digits, '-', '_' and '.' that starts and ends alphanumeric; at most 316 characters.
pub fn is_condition_type(kind: &str) -> bool {
    let name = match kind.rsplit_once('/') {
        Some((prefix, name)) => {
            if !consistd_core::names::is_dns_subdomain(prefix) {
                return false;
            }
            name
        }
        None => kind,
    };
    let alnum = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    kind.len() <= 316
        && alnum(name.as_bytes().first())
        && alnum(name.as_bytes().last())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether `reason` is one metav1.Condition takes: a letter, then letters, digits, '_', ',' and ':', not
/// ending in ',' or ':'; at most 1024 characters.
pub fn is_condition_reason(reason: &str) -> bool {
    let bytes = reason.as_bytes();
    reason.len() <= 1024
        && bytes.first().is_some_and(u8::is_ascii_alphabetic)
        && bytes.last().is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-12-07T12:00:00Z";
    const WIDGET: (&str, &str) = ("example.com/v1", "Widget");
    const BEFORE: &str = "2026-01-01T00:00:00Z";

    fn widget(conditions: Value) -> Value {
        json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": { "name": "w", "namespace": "ns", "generation": 3, "resourceVersion": "9" },
            "spec": { "size": 1 },
            "status": { "conditions": conditions },
        })
    }

    fn ready(status: &'static str, reason: &str) -> Condition {
        Condition { kind: "Ready".into(), status, reason: reason.into(), message: "m".into(), observed_generation: 0 }
    }

    fn existing(status: &str, reason: &str, generation: i64) -> Value {
        json!([
            { "type": "Synced", "status": "True", "reason": "Ok", "message": "", "lastTransitionTime": BEFORE },
            { "type": "Ready", "status": status, "reason": reason, "message": "m", "lastTransitionTime": BEFORE,
              "observedGeneration": generation },
        ])
    }

    #[test]
    fn a_new_condition_is_applied_alone_with_the_objects_generation_and_now() {
        let Plan::Apply { body, last_transition_time } = plan(&widget(json!([])), WIDGET, &ready("True", "Up"), NOW)
        else {
            panic!("a write")
        };
        assert_eq!(last_transition_time, NOW);
        assert_eq!(
            body,
            json!({
                "apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": { "name": "w", "namespace": "ns" },
                "status": { "conditions": [{ "type": "Ready", "status": "True", "reason": "Up", "message": "m",
                    "lastTransitionTime": NOW, "observedGeneration": 3 }] },
            })
        );
    }

    #[test]
    fn the_same_condition_writes_nothing_and_a_new_reason_or_generation_keeps_the_transition_time() {
        let same = plan(&widget(existing("True", "Up", 3)), WIDGET, &ready("True", "Up"), NOW);
        assert_eq!(same, Plan::Unchanged { last_transition_time: BEFORE.into() });
        for (object, condition) in [
            (widget(existing("True", "Up", 3)), ready("True", "StillUp")),
            (widget(existing("True", "Up", 2)), ready("True", "Up")),
        ] {
            let Plan::Apply { body, last_transition_time } = plan(&object, WIDGET, &condition, NOW) else {
                panic!("a write")
            };
            assert_eq!(last_transition_time, BEFORE, "the status stayed: {condition:?}");
            assert_eq!(body.pointer("/status/conditions/0/lastTransitionTime"), Some(&json!(BEFORE)));
        }
    }

    #[test]
    fn a_new_status_moves_the_transition_time_and_an_asked_generation_wins() {
        let mut down = ready("False", "Down");
        down.observed_generation = 2;
        let Plan::Apply { body, last_transition_time } = plan(&widget(existing("True", "Up", 3)), WIDGET, &down, NOW)
        else {
            panic!("a write")
        };
        assert_eq!(last_transition_time, NOW);
        assert_eq!(body.pointer("/status/conditions/0/observedGeneration"), Some(&json!(2)));
        assert_eq!(body["status"]["conditions"].as_array().map(Vec::len), Some(1), "only the condition set");
    }

    #[test]
    fn condition_types_and_reasons_follow_metav1() {
        for good in ["Ready", "example.com/Ready", "a.b-c_d"] {
            assert!(is_condition_type(good), "{good}");
        }
        for bad in ["", "-Ready", "Ready-", "Bad Type", "Example.com/Ready", "/Ready"] {
            assert!(!is_condition_type(bad), "{bad}");
        }
        for good in ["Up", "Waiting_For:Pods,Now", "A1"] {
            assert!(is_condition_reason(good), "{good}");
        }
        for bad in ["", "1Up", "Up:", "Up-Down", "Up Down"] {
            assert!(!is_condition_reason(bad), "{bad}");
        }
    }
}
