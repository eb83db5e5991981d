//! The kustomize bases in manifests/ (base: the app with its sidecar; injector: the webhook) are valid for
//! the Kubernetes version we pin: every object they list is accepted by the real apiserver in a
//! server-side dry run (schema, native sidecar fields, RBAC, the webhook configuration).

use std::path::Path;

use kube::{
    Api,
    api::{DynamicObject, PostParams},
    core::GroupVersionKind,
    discovery::{Discovery, Scope},
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Kustomization {
    resources: Vec<String>,
}

/// Server-side dry runs of every object a kustomization lists (namespaced ones in a fresh test
/// namespace); returns how many were checked.
async fn dry_run_kustomization(dir: &str) -> usize {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests").join(dir);
    let text = std::fs::read_to_string(base.join("kustomization.yaml")).expect("read kustomization.yaml");
    let kustomization: Kustomization = serde_yaml::from_str(&text).expect("parse kustomization.yaml");

    let client = consistd_testkit::kube_client().await;
    let namespace = consistd_testkit::namespace(&client).await;
    let discovery = Discovery::new(client.clone()).run().await.expect("discover apiserver resources");
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };

    let mut checked = 0;
    for file in &kustomization.resources {
        let text = std::fs::read_to_string(base.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        for document in serde_yaml::Deserializer::from_str(&text) {
            let object = DynamicObject::deserialize(document).unwrap_or_else(|e| panic!("parse {file}: {e}"));
            let types = object.types.clone().unwrap_or_else(|| panic!("{file}: object without apiVersion/kind"));
            let gvk = GroupVersionKind::try_from(&types).unwrap_or_else(|e| panic!("{file}: {e}"));
            let (resource, capabilities) =
                discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("{file}: the apiserver does not serve {gvk:?}"));
            let api: Api<DynamicObject> = match capabilities.scope {
                Scope::Namespaced => Api::namespaced_with(client.clone(), &namespace, &resource),
                Scope::Cluster => Api::all_with(client.clone(), &resource),
            };
            api.create(&dry_run, &object).await.unwrap_or_else(|e| panic!("{file}: apiserver refused {gvk:?}: {e}"));
            checked += 1;
        }
    }
    checked
}

#[tokio::test]
async fn every_base_manifest_passes_a_server_side_dry_run() {
    assert_eq!(dry_run_kustomization("base").await, 6, "every object of the base was checked");
}

#[tokio::test]
async fn every_injector_manifest_passes_a_server_side_dry_run() {
    assert_eq!(dry_run_kustomization("injector").await, 9, "every object of the injector was checked");
}

#[test]
fn the_base_configmap_holds_a_valid_consistd_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base/configmap.yaml");
    let text = std::fs::read_to_string(&path).expect("read configmap.yaml");
    let configmap: serde_yaml::Value = serde_yaml::from_str(&text).expect("parse configmap.yaml");
    let document = configmap["data"]["consistd.yaml"].as_str().expect("data.consistd.yaml is a string");
    // The downward API sets POD_IP in the pod.
    let env = consistd_core::config::Environment::from_vars([("POD_IP", "10.1.2.3")]);
    let config = consistd_core::config::Config::parse(document, &env).expect("the embedded config parses");
    config.validate().expect("the embedded config is valid");
    assert_eq!(config.advertise(&env).as_deref(), Some("10.1.2.3:7070"));
    assert!(config.peer.tls.is_some() && !config.peer.insecure, "peers use mutual TLS by default");
}
