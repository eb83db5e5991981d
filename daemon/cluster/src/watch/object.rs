//! Objects as the watch hub keeps them: the apiserver's JSON bytes exactly as received, plus the few
//! metadata fields the hub needs, so a cached object costs about its JSON size and is never re-encoded.

use std::borrow::Cow;

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, core::DynamicResourceScope, discovery::ApiResource};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::budget::{Budget, Charge};

/// An object of any resource, decoded only as far as its identity.
#[derive(Debug, Clone)]
pub struct RawObject {
    /// name, namespace, uid and resourceVersion only.
    metadata: ObjectMeta,
    /// The object as the apiserver sent it, until the watch's view shapes it.
    pub(crate) json: Bytes,
}

/// The metadata fields the hub reads; everything else stays in the JSON.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Identity {
    #[serde(default)]
    metadata: IdentityMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct IdentityMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw: Box<RawValue> = Deserialize::deserialize(deserializer)?;
        let identity: Identity = serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?;
        let m = identity.metadata;
        let metadata = ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            ..ObjectMeta::default()
        };
        // The decoded text becomes the bytes kept: no second copy.
        let text: Box<str> = raw.into();
        Ok(Self { metadata, json: Bytes::from(text.into_boxed_bytes()) })
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

/// A cached object: immutable, shared by the cache, the history and every subscriber queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Obj {
    /// metadata.uid.
    pub uid: String,
    /// metadata.namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// metadata.name.
    pub name: String,
    /// metadata.resourceVersion (opaque: compared for equality only).
    pub resource_version: String,
    /// The whole object as JSON.
    pub json: Bytes,
    /// Its share of the watches' memory budget while any copy of it lives; none outside a watch's cache.
    pub charge: Charge,
}

impl Obj {
    /// The key the cache stores it under.
    pub fn key(&self) -> ObjKey {
        ObjKey { namespace: self.namespace.clone(), name: self.name.clone() }
    }

    /// What holding it costs the budget.
    pub fn cost(&self) -> u64 {
        let identity = self.uid.len() + self.namespace.len() + self.name.len() + self.resource_version.len();
        Budget::cost(self.json.len(), identity)
    }

    /// Whether `other` is the same version of the same object.
    pub fn same_version(&self, other: &Obj) -> bool {
        self.uid == other.uid && self.resource_version == other.resource_version
    }
}

impl From<RawObject> for Obj {
    fn from(raw: RawObject) -> Self {
        let m = raw.metadata;
        Self {
            uid: m.uid.unwrap_or_default(),
            namespace: m.namespace.unwrap_or_default(),
            name: m.name.unwrap_or_default(),
            resource_version: m.resource_version.unwrap_or_default(),
            json: raw.json,
            charge: Charge::default(),
        }
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

impl From<Obj> for consistd_proto::v1::KubeObject {
    fn from(o: Obj) -> Self {
        Self { uid: o.uid, namespace: o.namespace, name: o.name, resource_version: o.resource_version, json: o.json }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_exact_json_and_reads_the_identity() {
        let text = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"42","managedFields":[{"manager":"x"}]},"data":{"k":"v"}}"#;
        let raw: RawObject = serde_json::from_str(text).expect("decodes");
        assert!(raw.metadata.managed_fields.is_none(), "only identity is decoded");
        let obj = Obj::from(raw);
        assert_eq!(obj.json, text.as_bytes());
        assert_eq!((obj.uid.as_str(), obj.namespace.as_str(), obj.name.as_str()), ("u1", "ns", "a"));
        assert_eq!(obj.resource_version, "42");
    }
}
