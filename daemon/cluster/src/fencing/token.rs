//! The fencing token on an object: a guarded write stamps the object it writes with its claim (the annotation
//! `consistd.io/fence`), in its own body where that body carries metadata, else by a stamp of its own just
//! before it; the consistd-fence-object policy then refuses every older claim on that object.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use serde_json::{Map, Value};

use super::Claim;

/// The annotation that holds an object's token: the claim of the newest guarded write that stamped it.
pub(crate) const ANNOTATION: &str = "consistd.io/fence";
/// How many objects [`Stamped`] remembers before it starts over (forgetting only costs a stamp more).
const REMEMBERED: usize = 65_536;

/// Sets the token to `claim` in a JSON object that carries metadata: a create's or an update's object, or a
/// merge or strategic merge patch. Annotations set to null in a patch (remove them all) become a map with the
/// token alone: the token stays for the object's life. False when `body` has no place for it (not a JSON
/// object, or metadata or annotations that are not objects), and nothing changed.
pub(crate) fn stamp(body: &mut Value, claim: &Claim) -> bool {
    let Some(object) = body.as_object_mut() else { return false };
    let metadata = object.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if metadata.is_null() {
        *metadata = Value::Object(Map::new());
    }
    let Some(metadata) = metadata.as_object_mut() else { return false };
    let annotations = metadata.entry("annotations").or_insert_with(|| Value::Object(Map::new()));
    if annotations.is_null() {
        *annotations = Value::Object(Map::new());
    }
    let Some(annotations) = annotations.as_object_mut() else { return false };
    annotations.insert(ANNOTATION.to_owned(), Value::String(claim.to_string()));
    true
}

/// The merge patch that stamps an object by itself, before a write that cannot carry the token (a JSON patch,
/// a server-side apply, whose field manager would then own it, or a `/status` write, whose metadata the
/// apiserver ignores).
pub(crate) fn stamp_alone(claim: &Claim) -> Value {
    let mut patch = Value::Object(Map::new());
    stamp(&mut patch, claim);
    patch
}

/// The objects this daemon stamped, each with the claim it stamped: a write that needs a stamp of its own
/// sends none when its object already carries its claim. Sound without asking the apiserver: only a guarded
/// write moves a token, so a token this daemon set has since moved only to a newer claim, which refuses the
/// write anyway.
#[derive(Debug, Default)]
pub(crate) struct Stamped {
    claims: Mutex<HashMap<String, String>>,
}

impl Stamped {
    /// Whether this daemon stamped `object` with `claim`.
    pub(crate) fn has(&self, object: &str, claim: &Claim) -> bool {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner).get(object).is_some_and(|c| *c == claim.to_string())
    }

    /// `object` now carries `claim`.
    pub(crate) fn record(&self, object: &str, claim: &Claim) {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if claims.len() >= REMEMBERED && !claims.contains_key(object) {
            claims.clear();
        }
        claims.insert(object.to_owned(), claim.to_string());
    }

    /// `object` was deleted: one created again under its name carries no token.
    pub(crate) fn forget(&self, object: &str) {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner).remove(object);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(term: u64) -> Claim {
        Claim { namespace: "ns".into(), lease: "e".into(), term }
    }

    #[test]
    fn a_body_with_metadata_takes_the_token_beside_what_it_had() {
        let mut object = json!({ "metadata": { "name": "x", "annotations": { "a": "1" } }, "data": {} });
        assert!(stamp(&mut object, &claim(3)));
        assert_eq!(object["metadata"]["annotations"], json!({ "a": "1", "consistd.io/fence": "ns/e/3" }));
        let mut patch = json!({ "data": { "by": "b" } });
        assert!(stamp(&mut patch, &claim(4)));
        assert_eq!(
            patch,
            json!({ "data": { "by": "b" }, "metadata": { "annotations": { "consistd.io/fence": "ns/e/4" } } })
        );
        let mut cleared = json!({ "metadata": { "annotations": null } });
        assert!(stamp(&mut cleared, &claim(5)));
        assert_eq!(cleared["metadata"]["annotations"], json!({ "consistd.io/fence": "ns/e/5" }));
        assert_eq!(stamp_alone(&claim(6)), json!({ "metadata": { "annotations": { "consistd.io/fence": "ns/e/6" } } }));
    }

    #[test]
    fn a_body_with_no_place_for_it_is_left_alone() {
        for mut body in [json!([1]), json!({ "metadata": "x" }), json!({ "metadata": { "annotations": [] } })] {
            let before = body.clone();
            assert!(!stamp(&mut body, &claim(1)));
            assert_eq!(body, before);
        }
    }

    #[test]
    fn a_stamp_is_remembered_for_its_claim_until_the_object_is_deleted() {
        let stamped = Stamped::default();
        stamped.record("configmaps/ns/x", &claim(2));
        assert!(stamped.has("configmaps/ns/x", &claim(2)));
        assert!(!stamped.has("configmaps/ns/x", &claim(3)), "a new term stamps again");
        assert!(!stamped.has("configmaps/ns/y", &claim(2)));
        stamped.forget("configmaps/ns/x");
        assert!(!stamped.has("configmaps/ns/x", &claim(2)));
    }
}
