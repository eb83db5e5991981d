//! Objects as the watch hub keeps them: the apiserver's JSON bytes exactly as received (or as the watch's
//! view shaped them), with the places in them of the few metadata fields the hub reads, so a cached object
//! costs about its JSON size, holds its identity without a second copy and is never re-encoded.

use std::{borrow::Cow, fmt, sync::Arc};

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, core::DynamicResourceScope, discovery::ApiResource};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::budget::{Budget, Exhausted};

/// An object of any resource, decoded only as far as its identity.
#[derive(Debug, Clone)]
pub struct RawObject {
    /// name, namespace, uid and resourceVersion only (what kube's watcher reads).
    metadata: ObjectMeta,
    /// The object as the apiserver sent it, until the watch's view shapes it.
    json: Bytes,
    /// Where the identity lies in `json`.
    identity: Identity,
}

/// Where an object's four identity strings are.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Identity {
    /// Ranges of the object's JSON, in the order of [`Identity::UID`] and the rest: the usual case, since
    /// names, namespaces, uids and resourceVersions hold nothing JSON escapes.
    Spans([Span; 4]),
    /// Copies, for an object whose JSON does not hold one of them as it is (escaped, or past 4 GiB), or
    /// that was made from its parts.
    Owned(Box<[String; 4]>),
}

/// A range of bytes of an object's JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Span {
    start: u32,
    len: u32,
}

impl Identity {
    const UID: usize = 0;
    const NAMESPACE: usize = 1;
    const NAME: usize = 2;
    const RESOURCE_VERSION: usize = 3;

    /// Reads the identity of the object `json`, with the metadata kube's watcher reads.
    fn locate(json: &[u8]) -> Result<(Self, ObjectMeta), serde_json::Error> {
        let meta = serde_json::from_slice::<Located<'_>>(json)?.metadata;
        let texts = [meta.uid, meta.namespace, meta.name, meta.resource_version];
        let base = json.as_ptr() as usize;
        let span = |text: &Option<Text<'_>>| match text {
            None => Some(Span::default()),
            Some(Text(Cow::Borrowed(s))) => {
                let start = u32::try_from((s.as_ptr() as usize).checked_sub(base)?).ok()?;
                Some(Span { start, len: u32::try_from(s.len()).ok()? })
            }
            Some(Text(Cow::Owned(_))) => None,
        };
        let spans: Option<Vec<Span>> = texts.iter().map(span).collect();
        let [uid, namespace, name, resource_version] = texts.map(|t| t.map(|Text(t)| t.into_owned()));
        let metadata = ObjectMeta { uid, namespace, name, resource_version, ..ObjectMeta::default() };
        let identity = match spans.and_then(|s| <[Span; 4]>::try_from(s).ok()) {
            Some(spans) => Self::Spans(spans),
            None => Self::Owned(Box::new(Self::strings(&metadata))),
        };
        Ok((identity, metadata))
    }

    /// The four strings of `metadata`, absent ones empty.
    fn strings(m: &ObjectMeta) -> [String; 4] {
        [&m.uid, &m.namespace, &m.name, &m.resource_version].map(|s| s.clone().unwrap_or_default())
    }

    /// String `i` of the object whose JSON is `json`.
    fn get<'a>(&'a self, json: &'a [u8], i: usize) -> &'a str {
        match self {
            Self::Spans(spans) => {
                let Span { start, len } = spans[i];
                let (start, len) = (start as usize, len as usize);
                // Located in this JSON as a string, so a whole UTF-8 sequence.
                std::str::from_utf8(&json[start..start + len]).unwrap_or_default()
            }
            Self::Owned(strings) => &strings[i],
        }
    }

    /// Bytes held beside the JSON.
    fn held(&self) -> usize {
        match self {
            Self::Spans(_) => 0,
            Self::Owned(strings) => strings.iter().map(String::len).sum(),
        }
    }
}

/// The metadata fields the hub reads, borrowed from the JSON where it holds them unescaped.
#[derive(Deserialize)]
struct Located<'a> {
    #[serde(default, borrow)]
    metadata: LocatedMeta<'a>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LocatedMeta<'a> {
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    namespace: Option<Text<'a>>,
    #[serde(borrow)]
    uid: Option<Text<'a>>,
    #[serde(borrow)]
    resource_version: Option<Text<'a>>,
}

/// A JSON string, borrowed unless it had to be unescaped (serde borrows a bare `Cow<str>` only, not one in
/// an `Option`).
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw: Box<RawValue> = Deserialize::deserialize(deserializer)?;
        let (identity, metadata) = Identity::locate(raw.get().as_bytes()).map_err(serde::de::Error::custom)?;
        // The decoded text becomes the bytes kept: no second copy.
        let text: Box<str> = raw.into();
        Ok(Self { metadata, json: Bytes::from(text.into_boxed_bytes()), identity })
    }
}

impl RawObject {
    /// Replaces the JSON with `shape` of it (the watch's view), finding the identity again if it changed.
    pub(crate) fn reshape(&mut self, shape: impl FnOnce(Bytes) -> Bytes) {
        let before = (self.json.as_ptr(), self.json.len());
        self.json = shape(std::mem::take(&mut self.json));
        if (self.json.as_ptr(), self.json.len()) != before {
            self.identity = match Identity::locate(&self.json) {
                Ok((identity, _)) => identity,
                // A shape keeps the identity; if what it made cannot be read, the copies still name it.
                Err(_) => Identity::Owned(Box::new(Identity::strings(&self.metadata))),
            };
        }
    }
}

impl Resource for RawObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An object read with the apiserver's metadata-only requests (PartialObjectMetadata): the same as a
/// [`RawObject`], but kube asks for metadata alone.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct RawMetadata(pub RawObject);

impl Resource for RawMetadata {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn metadata_api() -> bool {
        true
    }
    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        RawObject::kind(dt)
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        RawObject::group(dt)
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        RawObject::version(dt)
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        RawObject::api_version(dt)
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        RawObject::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// A cached object: immutable, shared (as an `Arc`) by the cache, the history and every subscriber queue.
pub struct Obj {
    /// The whole object as JSON.
    json: Box<[u8]>,
    /// Where its uid, namespace, name and resourceVersion are.
    identity: Identity,
    /// The budget its [`Obj::cost`] is charged to while it lives; none outside a watch's cache.
    charged: Option<Arc<Budget>>,
}

impl Obj {
    /// An object made from its parts (a synthetic object, a test's).
    pub fn new(uid: &str, namespace: &str, name: &str, resource_version: &str, json: impl Into<Box<[u8]>>) -> Self {
        let strings = [uid, namespace, name, resource_version].map(String::from);
        Self { json: json.into(), identity: Identity::Owned(Box::new(strings)), charged: None }
    }

    /// metadata.uid.
    pub fn uid(&self) -> &str {
        self.identity.get(&self.json, Identity::UID)
    }

    /// metadata.namespace; empty for cluster-scoped objects.
    pub fn namespace(&self) -> &str {
        self.identity.get(&self.json, Identity::NAMESPACE)
    }

    /// metadata.name.
    pub fn name(&self) -> &str {
        self.identity.get(&self.json, Identity::NAME)
    }

    /// metadata.resourceVersion (opaque: compared for equality only).
    pub fn resource_version(&self) -> &str {
        self.identity.get(&self.json, Identity::RESOURCE_VERSION)
    }

    /// The whole object as JSON.
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// The key the cache stores it under.
    pub fn key(&self) -> ObjKey {
        ObjKey { namespace: self.namespace().into(), name: self.name().into() }
    }

    /// What holding it costs the budget.
    pub fn cost(&self) -> u64 {
        Budget::cost(self.json.len(), self.identity.held())
    }

    /// What it is charged now: its cost while it is charged to a budget, else 0.
    pub fn charged(&self) -> u64 {
        if self.charged.is_some() { self.cost() } else { 0 }
    }

    /// Charges it to `budget` unless that would take the budget past its limit (an object is charged once:
    /// charging it again changes nothing).
    pub fn try_charge(&mut self, budget: &Arc<Budget>) -> Result<(), Exhausted> {
        if self.charged.is_none() {
            budget.try_take(self.cost())?;
            self.charged = Some(budget.clone());
        }
        Ok(())
    }

    /// Charges it to `budget` whatever the limit (see [`Budget::take`]).
    pub fn charge(&mut self, budget: &Arc<Budget>) {
        if self.charged.is_none() {
            budget.take(self.cost());
            self.charged = Some(budget.clone());
        }
    }

    /// Whether `other` is the same version of the same object.
    pub fn same_version(&self, other: &Obj) -> bool {
        self.uid() == other.uid() && self.resource_version() == other.resource_version()
    }

    /// The object as the API sends it: its JSON shared with the cache, not copied.
    pub fn into_proto(self: Arc<Self>) -> consistd_proto::v1::KubeObject {
        consistd_proto::v1::KubeObject {
            uid: self.uid().into(),
            namespace: self.namespace().into(),
            name: self.name().into(),
            resource_version: self.resource_version().into(),
            json: Bytes::from_owner(JsonOf(self)),
        }
    }
}

/// An object's JSON, as bytes that keep the object alive.
struct JsonOf(Arc<Obj>);

impl AsRef<[u8]> for JsonOf {
    fn as_ref(&self) -> &[u8] {
        self.0.json()
    }
}

impl Drop for Obj {
    fn drop(&mut self) {
        if let Some(budget) = self.charged.take() {
            budget.give_back(self.cost());
        }
    }
}

impl From<RawObject> for Obj {
    fn from(raw: RawObject) -> Self {
        // A Bytes made from one allocation and never shared gives it back without a copy.
        let json = Vec::from(raw.json).into_boxed_slice();
        Self { json, identity: raw.identity, charged: None }
    }
}

/// Two objects are equal when their identity and JSON are, however each holds them and whatever it is
/// charged to.
impl PartialEq for Obj {
    fn eq(&self, other: &Self) -> bool {
        self.same_version(other)
            && self.namespace() == other.namespace()
            && self.name() == other.name()
            && self.json == other.json
    }
}

impl Eq for Obj {}

impl fmt::Debug for Obj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Obj")
            .field("uid", &self.uid())
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .field("resource_version", &self.resource_version())
            .field("json_len", &self.json.len())
            .field("charged", &self.charged())
            .finish()
    }
}

/// Where an object lives: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjKey {
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// metadata.name, unique within its namespace.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(text: &str) -> RawObject {
        serde_json::from_str(text).expect("decodes")
    }

    #[test]
    fn keeps_the_exact_json_and_finds_the_identity_in_it() {
        let text = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"42","managedFields":[{"manager":"x"}]},"data":{"k":"v"}}"#;
        let raw = decode(text);
        assert!(raw.metadata.managed_fields.is_none(), "only identity is decoded");
        assert_eq!(raw.metadata.name.as_deref(), Some("a"), "kube's watcher reads the metadata");
        let obj = Obj::from(raw);
        assert!(matches!(obj.identity, Identity::Spans(_)), "no copy of the identity: {:?}", obj.identity);
        assert_eq!(obj.json(), text.as_bytes());
        assert_eq!((obj.uid(), obj.namespace(), obj.name(), obj.resource_version()), ("u1", "ns", "a", "42"));
        assert_eq!(obj.cost(), Budget::cost(text.len(), 0));
    }

    #[test]
    fn an_escaped_or_absent_identity_string_is_read_right() {
        let raw = decode(r#"{"metadata":{"name":"caf\u00e9","resourceVersion":"7"},"data":{"uid":"not-this"}}"#);
        let obj = Obj::from(raw);
        assert!(matches!(obj.identity, Identity::Owned(_)), "an escaped name is copied");
        assert_eq!((obj.uid(), obj.namespace(), obj.name(), obj.resource_version()), ("", "", "café", "7"));
        assert_eq!(obj.cost(), Budget::cost(obj.json().len(), "café".len() + 1), "the copies are charged");
        let bare = Obj::from(decode(r#"{"kind":"Status"}"#));
        assert_eq!((bare.uid(), bare.name(), bare.resource_version()), ("", "", ""));
    }

    #[test]
    fn a_shaped_object_finds_its_identity_in_the_shaped_json() {
        let mut raw = decode(r#"{"data":{"big":"xxxxxxxx"},"metadata":{"uid":"u","name":"n","resourceVersion":"3"}}"#);
        raw.reshape(|_| Bytes::from_static(br#"{"metadata":{"name":"n","uid":"u","resourceVersion":"3"}}"#));
        let obj = Obj::from(raw);
        assert!(matches!(obj.identity, Identity::Spans(_)));
        assert_eq!((obj.uid(), obj.name(), obj.resource_version()), ("u", "n", "3"));
        assert_eq!(obj.json(), br#"{"metadata":{"name":"n","uid":"u","resourceVersion":"3"}}"#);
    }

    #[test]
    fn a_charge_is_given_back_once_when_the_last_holder_of_the_object_lets_go() {
        let budget = Budget::new(10_000);
        let mut obj = Obj::from(decode(r#"{"metadata":{"name":"n","uid":"u"},"data":{"k":"v"}}"#));
        obj.try_charge(&budget).expect("fits");
        obj.try_charge(&budget).expect("charged once");
        let obj = Arc::new(obj);
        let cost = obj.cost();
        assert_eq!((budget.used(), obj.charged()), (cost, cost));
        let sent = obj.clone().into_proto();
        assert_eq!(sent.json.as_ptr(), obj.json().as_ptr(), "sent without a copy");
        assert_eq!((sent.uid.as_str(), sent.name.as_str()), ("u", "n"));
        drop(obj);
        assert_eq!(budget.used(), cost, "a message on its way still holds the object");
        drop(sent);
        assert_eq!(budget.used(), 0, "given back once");
        assert_eq!(Obj::new("u", "", "n", "1", Vec::new()).charged(), 0, "made from parts: charged to nothing");
    }
}
