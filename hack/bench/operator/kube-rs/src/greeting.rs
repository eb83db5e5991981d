//! The Greeting custom resource of examples/crd.yaml, as kube's derive makes it (the CRD itself is that file's).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// What a Greeting asks for: the message its ConfigMap is to hold.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug)]
#[kube(
    group = "example.consistd.io",
    version = "v1",
    kind = "Greeting",
    namespaced,
    status = "GreetingStatus",
    schema = "disabled"
)]
pub(crate) struct GreetingSpec {
    pub(crate) message: String,
}

/// What the operator says about a Greeting: its Ready condition.
#[derive(Deserialize, Serialize, Clone, Debug, Default)]
pub(crate) struct GreetingStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) conditions: Vec<Condition>,
}
