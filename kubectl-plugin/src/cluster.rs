//! Finding the cluster the way kubectl does: `--kubeconfig`, else `KUBECONFIG` or `~/.kube/config`, else
//! the pod's service account; `--context` picks a context; the namespace defaults to the context's.

use std::path::PathBuf;

use clap::Args;
use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// The flags every command that talks to the cluster takes, as kubectl spells them.
#[derive(Debug, Clone, Args)]
pub(crate) struct ClusterArgs {
    /// Path to the kubeconfig file to use (default: KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) context: Option<String>,
    /// The namespace (default: the context's namespace, else "default").
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub(crate) namespace: Option<String>,
}

/// Why no client for the cluster could be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The kubeconfig named by `--kubeconfig` could not be read or used.
    #[error("load kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What was wrong with it.
        #[source]
        source: KubeconfigError,
    },
    /// `--context` was given, but KUBECONFIG / ~/.kube/config could not be loaded with it.
    #[error("load context {context} from KUBECONFIG or ~/.kube/config")]
    Context {
        /// The context asked for.
        context: String,
        /// What was wrong.
        #[source]
        source: KubeconfigError,
    },
    /// Neither a kubeconfig nor an in-cluster service account was found.
    #[error("find a kubeconfig (KUBECONFIG, ~/.kube/config) or in-cluster service account")]
    Infer {
        /// Why each way failed.
        #[source]
        source: InferConfigError,
    },
    /// The configuration could not be turned into a client (e.g. unusable TLS material).
    #[error("build the Kubernetes client")]
    Client {
        /// kube's error.
        #[source]
        source: kube::Error,
    },
}

/// A client, and the namespace commands use unless told otherwise.
pub(crate) struct Cluster {
    /// The Kubernetes client.
    pub(crate) client: kube::Client,
    /// `-n`, else the context's namespace.
    pub(crate) namespace: String,
}

impl ClusterArgs {
    /// Connects as kubectl would with these flags (no request is made yet).
    pub(crate) async fn connect(&self) -> Result<Cluster, ConnectError> {
        let options = KubeConfigOptions { context: self.context.clone(), ..KubeConfigOptions::default() };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kubeconfig_error = |source| ConnectError::Kubeconfig { path: path.display().to_string(), source };
                let file = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
                kube::Config::from_custom_kubeconfig(file, &options).await.map_err(kubeconfig_error)?
            }
            (None, Some(context)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|source| ConnectError::Context { context: context.clone(), source })?,
            (None, None) => kube::Config::infer().await.map_err(|source| ConnectError::Infer { source })?,
        };
        let namespace = self.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).map_err(|source| ConnectError::Client { source })?;
        Ok(Cluster { client, namespace })
    }
}
