//! The connection to the Kubernetes apiserver: in-cluster config or KUBECONFIG, and a probe that keeps
//! the daemon's health up to date.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{health::Health, metrics::Metrics};

/// Probe every 10 s while the apiserver answers; every 1 s while it does not, so readiness recovers fast.
const PROBE_INTERVAL: Duration = Duration::from_secs(10);
const PROBE_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// A probe that takes longer than this counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why no Kubernetes client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Neither in-cluster config nor a kubeconfig was usable.
    #[error("find Kubernetes credentials (in-cluster service account or KUBECONFIG)")]
    Config(#[source] kube::config::InferConfigError),
    /// The config was found but a client could not be built from it.
    #[error("build Kubernetes client")]
    Client(#[source] kube::Error),
}

/// A client for the apiserver, from in-cluster config when running in a pod, else KUBECONFIG.
pub(crate) async fn connect() -> Result<(kube::Client, String), ClusterError> {
    let config = kube::Config::infer().await.map_err(ClusterError::Config)?;
    let url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(ClusterError::Client)?;
    Ok((client, url))
}

/// Probes the apiserver's /version until `shutdown`, recording each result in `health` and `metrics`.
pub(crate) async fn probe(client: kube::Client, health: Health, metrics: Metrics, shutdown: CancellationToken) {
    loop {
        let result = match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
            Ok(Ok(info)) => Ok(info.git_version),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        };
        let was_reachable = health.apiserver_reachable();
        match &result {
            Ok(version) if !was_reachable => tracing::info!(%version, "apiserver reachable"),
            Err(error) if was_reachable => tracing::warn!(%error, "apiserver unreachable"),
            Err(error) => tracing::debug!(%error, "apiserver still unreachable"),
            Ok(_) => {}
        }
        metrics.apiserver_up.set(i64::from(result.is_ok()));
        let interval = if result.is_ok() { PROBE_INTERVAL } else { PROBE_RETRY_INTERVAL };
        health.record_probe(result);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
