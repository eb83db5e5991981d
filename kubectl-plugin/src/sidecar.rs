//! Reading a pod's consistd sidecar: a JSON report from its admin port (`consistd-admin`, `admin.listen`)
//! through the apiserver's pod proxy, so a command needs only the `pods/proxy` permission and no route to
//! the pod. `outbox` and `queues` read through it.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use crate::cluster::Cluster;

/// The container port the injector gives the sidecar's admin endpoint.
const ADMIN_PORT_NAME: &str = "consistd-admin";

/// Why a pod's sidecar could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SidecarError {
    /// The pod could not be read.
    #[error("get pod {namespace}/{pod}")]
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        pod: String,
        /// The apiserver's refusal (not found, forbidden).
        #[source]
        source: kube::Error,
    },
    /// No container of the pod has the admin port.
    #[error(
        "pod {namespace}/{pod} has no container port named {ADMIN_PORT_NAME}: is consistd injected with an admin \
         port (annotation consistd.io/admin-port other than 0)?"
    )]
    NoAdminPort {
        /// Its namespace.
        namespace: String,
        /// Its name.
        pod: String,
    },
    /// The proxied request failed.
    #[error("GET {path} from pod {namespace}/{pod} through the apiserver's pod proxy")]
    Proxy {
        /// What was asked, e.g. "/outbox".
        path: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        pod: String,
        /// The apiserver's or the sidecar's answer.
        #[source]
        source: kube::Error,
    },
    /// The answer is not the report asked for.
    #[error("decode the {path} answer of pod {namespace}/{pod}")]
    Decode {
        /// What was asked.
        path: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        pod: String,
        /// Why it does not parse (an older consistd without the path answers 404 text).
        #[source]
        source: serde_json::Error,
    },
}

/// GETs `path` from the admin port of `pod`'s sidecar and decodes its JSON answer.
pub(crate) async fn read<T: serde::de::DeserializeOwned>(
    cluster: &Cluster,
    pod: &str,
    path: &'static str,
) -> Result<T, SidecarError> {
    let namespace = &cluster.namespace;
    let (ns, name) = (|| namespace.clone(), || pod.to_owned());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let spec = pods
        .get(pod)
        .await
        .map_err(|source| SidecarError::Pod { namespace: ns(), pod: name(), source })?
        .spec
        .unwrap_or_default();
    let containers = spec.init_containers.iter().flatten().chain(&spec.containers);
    let port = containers
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(ADMIN_PORT_NAME))
        .map(|p| p.container_port)
        .ok_or_else(|| SidecarError::NoAdminPort { namespace: ns(), pod: name() })?;
    let url = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}");
    let request = http::Request::get(url).body(Vec::new()).unwrap_or_default();
    let body = cluster.client.request_text(request).await.map_err(|source| SidecarError::Proxy {
        path,
        namespace: ns(),
        pod: name(),
        source,
    })?;
    serde_json::from_str(&body).map_err(|source| SidecarError::Decode { path, namespace: ns(), pod: name(), source })
}
