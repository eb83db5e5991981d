//! Test support shared by consistd's integration tests: the real control plane started by
//! `hack/control-plane.sh`, a fresh namespace for every test, and consistd daemons run as processes.
//!
//! Nothing here fakes Kubernetes: when the control plane is not running, tests fail and say how to
//! start it.

mod daemon;
pub mod watch;

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};

pub use daemon::{Daemon, DaemonBuilder};

/// The kubeconfig of the running test control plane: `CONSISTD_TEST_KUBECONFIG`, else the one
/// `hack/control-plane.sh start` writes under `target/control-plane/`.
pub fn kubeconfig() -> PathBuf {
    let path = std::env::var_os("CONSISTD_TEST_KUBECONFIG").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/control-plane/kubeconfig"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "no test control plane: {} does not exist. Start one with `hack/control-plane.sh start` \
         (make test does this), or point CONSISTD_TEST_KUBECONFIG at a kubeconfig.",
        path.display()
    );
    path
}

/// A Kubernetes client for the test control plane, with admin rights.
pub async fn kube_client() -> Client {
    let path = kubeconfig();
    let kubeconfig =
        Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("read test kubeconfig {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("load test kubeconfig {}: {e}", path.display()));
    Client::try_from(config).unwrap_or_else(|e| panic!("build Kubernetes client: {e}"))
}

/// Creates a namespace of its own for one test, `consistd-t-<random>`, and returns its name.
///
/// Namespaces are not deleted: the test control plane runs no namespace controller, so a deleted one
/// would stay Terminating anyway, and the whole control plane is thrown away after the run.
pub async fn namespace(client: &Client) -> String {
    let name = format!("consistd-t-{:08x}", rand::random::<u32>());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "consistd.io/test": "true" } }
    }))
    .unwrap_or_else(|e| panic!("build namespace object: {e}"));
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create test namespace {name}: {e}"));
    name
}
