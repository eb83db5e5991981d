//! Whether a watch's label and field selectors select an object, judged as the apiserver judges them, so
//! a write can be waited for on exactly the watches that will show it. Label selectors in full
//! (`k`, `!k`, `=`, `==`, `!=`, `in`, `notin`); field selectors on `metadata.name` and
//! `metadata.namespace` (other fields are the resource's own and cannot be told here).

use std::collections::BTreeMap;

use serde_json::Value;

use super::object::Obj;

/// Whether `label_selector` and `field_selector` select `obj`: None when a field selector names a field
/// other than `metadata.name` or `metadata.namespace`, or a selector does not parse.
pub(crate) fn selects(label_selector: &str, field_selector: &str, obj: &Obj) -> Option<bool> {
    let labels = labels(obj);
    let mut unknown = false;
    for requirement in split(label_selector)? {
        match label_matches(requirement, &labels) {
            Some(false) => return Some(false),
            Some(true) => {}
            None => unknown = true,
        }
    }
    for requirement in split(field_selector)? {
        match field_matches(requirement, obj) {
            Some(false) => return Some(false),
            Some(true) => {}
            None => unknown = true,
        }
    }
    (!unknown).then_some(true)
}

fn labels(obj: &Obj) -> BTreeMap<String, String> {
    let json: Value = serde_json::from_slice(obj.json()).unwrap_or_default();
    let labels = json.get("metadata").and_then(|m| m.get("labels")).and_then(Value::as_object);
    labels.into_iter().flatten().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect()
}

/// The requirements of a selector: split at commas outside parentheses; None when parentheses do not
/// pair up.
fn split(selector: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                out.push(selector[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return None;
    }
    out.push(selector[start..].trim());
    Some(out.into_iter().filter(|r| !r.is_empty()).collect())
}

/// One label requirement against `labels`.
fn label_matches(requirement: &str, labels: &BTreeMap<String, String>) -> Option<bool> {
    if let Some(key) = requirement.strip_prefix('!') {
        return Some(!labels.contains_key(key.trim()));
    }
    if let Some((key, value)) = requirement.split_once("!=") {
        return Some(labels.get(key.trim()).map(String::as_str) != Some(value.trim()));
    }
    if let Some((key, value)) = requirement.split_once("==").or_else(|| requirement.split_once('=')) {
        return Some(labels.get(key.trim()).map(String::as_str) == Some(value.trim()));
    }
    let mut words = requirement.splitn(2, char::is_whitespace);
    let key = words.next()?.trim();
    let rest = words.next().unwrap_or_default().trim();
    if rest.is_empty() {
        return Some(labels.contains_key(key));
    }
    let (negated, set) =
        if let Some(set) = rest.strip_prefix("notin") { (true, set) } else { (false, rest.strip_prefix("in")?) };
    let set = set.trim().strip_prefix('(')?.strip_suffix(')')?;
    let contained = labels.get(key).is_some_and(|v| set.split(',').any(|s| s.trim() == v));
    // `notin` also selects objects without the label, as the apiserver does.
    Some(contained != negated)
}

/// One field requirement against `obj`; None for a field other than its name or namespace.
fn field_matches(requirement: &str, obj: &Obj) -> Option<bool> {
    let (field, value, equal) = if let Some((f, v)) = requirement.split_once("!=") {
        (f, v, false)
    } else {
        let (f, v) = requirement.split_once("==").or_else(|| requirement.split_once('='))?;
        (f, v, true)
    };
    let actual = match field.trim() {
        "metadata.name" => obj.name(),
        "metadata.namespace" => obj.namespace(),
        _ => return None,
    };
    Some((actual == value.trim()) == equal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(labels: &str) -> Obj {
        let json = format!(r#"{{"metadata":{{"name":"child","namespace":"ns","labels":{{{labels}}}}}}}"#);
        Obj::new("u", "ns", "child", "1", json.into_bytes())
    }

    #[test]
    fn label_selectors_select_as_the_apiserver_does() {
        let o = obj(r#""role":"child","tier":"web""#);
        for (selector, want) in [
            ("", true),
            ("role=child", true),
            ("role==child", true),
            ("role!=child", false),
            ("role=other", false),
            ("role", true),
            ("!role", false),
            ("missing", false),
            ("!missing", true),
            ("tier in (web, db)", true),
            ("tier in (db)", false),
            ("tier notin (db)", true),
            ("missing notin (db)", true),
            ("role=child,tier in (web,db)", true),
            ("role=child,tier notin (web)", false),
        ] {
            assert_eq!(selects(selector, "", &o), Some(want), "{selector:?}");
        }
        assert_eq!(selects("tier in (web", "", &o), None, "unpaired parenthesis");
    }

    #[test]
    fn field_selectors_on_name_and_namespace_are_judged_others_are_not() {
        let o = obj("");
        assert_eq!(selects("", "metadata.name=child", &o), Some(true));
        assert_eq!(selects("", "metadata.name=primary", &o), Some(false));
        assert_eq!(selects("", "metadata.name!=primary,metadata.namespace==ns", &o), Some(true));
        assert_eq!(selects("", "status.phase=Running", &o), None, "cannot tell");
        assert_eq!(selects("role=x", "status.phase=Running", &o), Some(false), "the labels already say no");
    }
}
