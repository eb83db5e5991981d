//! The test support itself, against the real control plane: every test gets a namespace of its own.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

#[tokio::test]
async fn each_call_creates_a_distinct_namespace_on_the_apiserver() {
    let client = consistd_testkit::kube_client().await;
    let a = consistd_testkit::namespace(&client).await;
    let b = consistd_testkit::namespace(&client).await;
    assert_ne!(a, b);
    let namespaces = Api::<Namespace>::all(client);
    for name in [&a, &b] {
        let ns = namespaces.get(name).await.unwrap_or_else(|e| panic!("namespace {name} exists: {e}"));
        let labels = ns.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("consistd.io/test").map(String::as_str), Some("true"));
    }
}
