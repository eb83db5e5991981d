//! `kubectl consistd outbox POD`: what a pod's sidecar has not had ACKed yet, per destination and peer,
//! read from its admin port (`consistd-admin`, `admin.listen`) through the apiserver's pod proxy, so it
//! needs only the `pods/proxy` permission and no route to the pod.

use consistd::health::OutboxReport;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use crate::{
    cluster::Cluster,
    output::{Format, table},
};

/// The container port the injector gives the sidecar's admin endpoint.
const ADMIN_PORT_NAME: &str = "consistd-admin";

/// `kubectl consistd outbox POD`.
#[derive(Debug, clap::Args)]
pub(crate) struct OutboxArgs {
    /// The pod whose consistd sidecar to ask.
    pub(crate) pod: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub(crate) output: Format,
}

/// Why a pod's outbox could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutboxError {
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
    #[error("GET /outbox from pod {namespace}/{pod} through the apiserver's pod proxy")]
    Proxy {
        /// Its namespace.
        namespace: String,
        /// Its name.
        pod: String,
        /// The apiserver's or the sidecar's answer.
        #[source]
        source: kube::Error,
    },
    /// The answer is not an outbox report.
    #[error("decode the /outbox answer of pod {namespace}/{pod}")]
    Decode {
        /// Its namespace.
        namespace: String,
        /// Its name.
        pod: String,
        /// Why it does not parse (an older consistd without /outbox answers 404 text).
        #[source]
        source: serde_json::Error,
    },
}

/// Reads and prints the outbox of `args.pod`.
pub(crate) async fn run(cluster: &Cluster, args: &OutboxArgs) -> Result<(), OutboxError> {
    let report = read(cluster, &args.pod).await?;
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default()),
        Format::Table => print!("{}", render(&report)),
    }
    Ok(())
}

async fn read(cluster: &Cluster, pod: &str) -> Result<OutboxReport, OutboxError> {
    let namespace = &cluster.namespace;
    let (ns, name) = (|| namespace.clone(), || pod.to_owned());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let spec = pods
        .get(pod)
        .await
        .map_err(|source| OutboxError::Pod { namespace: ns(), pod: name(), source })?
        .spec
        .unwrap_or_default();
    let containers = spec.init_containers.iter().flatten().chain(&spec.containers);
    let port = containers
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(ADMIN_PORT_NAME))
        .map(|p| p.container_port)
        .ok_or_else(|| OutboxError::NoAdminPort { namespace: ns(), pod: name() })?;
    let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/outbox");
    let request = http::Request::get(path).body(Vec::new()).unwrap_or_default();
    let body = cluster.client.request_text(request).await.map_err(|source| OutboxError::Proxy {
        namespace: ns(),
        pod: name(),
        source,
    })?;
    serde_json::from_str(&body).map_err(|source| OutboxError::Decode { namespace: ns(), pod: name(), source })
}

/// The report as a table, then a summary line.
fn render(report: &OutboxReport) -> String {
    let rows: Vec<Vec<String>> = report
        .peers
        .iter()
        .map(|p| {
            let peer = if p.peer.is_empty() { "<no member yet>".to_owned() } else { p.peer.clone() };
            let connected = if p.connected { "yes" } else { "no" };
            vec![p.destination.clone(), peer, connected.to_owned(), p.pending.to_string()]
        })
        .collect();
    let mut out = table(&["DESTINATION", "PEER", "CONNECTED", "NOT ACKED"], &rows);
    out += &format!("{} message(s) held by the outbox.\n", report.pending);
    out
}

#[cfg(test)]
mod tests {
    use consistd::health::PeerReport;

    use super::*;

    #[test]
    fn the_table_names_each_peer_and_what_it_has_not_acked() {
        let peer = |destination: &str, peer: &str, connected, pending| PeerReport {
            destination: destination.to_owned(),
            peer: peer.to_owned(),
            connected,
            pending,
        };
        let report = OutboxReport {
            pending: 2,
            peers: vec![peer("service ns/web", "10.0.0.1:7070", true, 0), peer("service ns/web", "", false, 0)],
        };
        let out = render(&report);
        assert_eq!(
            out,
            "DESTINATION      PEER              CONNECTED   NOT ACKED\n\
             service ns/web   10.0.0.1:7070     yes         0\n\
             service ns/web   <no member yet>   no          0\n\
             2 message(s) held by the outbox.\n"
        );
    }
}
