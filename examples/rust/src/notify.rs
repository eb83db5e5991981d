//! The ACK-tracked notification of a published Greeting to the peer app.

use anyhow::Context as _;
use consistd_client::{
    Client, WorkItem,
    proto::{Destination, SendRequest, ServiceDestination, destination::Target},
    to_peer,
};
use serde_json::json;

/// Notifies `peer` (`EXAMPLE_PEER` as given) that the item's Greeting published `message` in the
/// ConfigMap version `version`, waits for the outcome and prints it with the message's id.
pub(crate) async fn notify(
    client: &Client,
    peer: &str,
    item: &WorkItem,
    message: &str,
    version: &str,
) -> anyhow::Result<()> {
    let payload = json!({ "namespace": item.namespace, "name": item.name, "message": message });
    let sent = client
        .send(SendRequest {
            destination: Some(destination(peer)),
            resource_id: format!("greetings/{}/{}", item.namespace, item.name),
            event_id: version.to_owned(),
            payload: payload.to_string().into_bytes(),
            content_type: "application/json".into(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("send the notification to {peer}"))?;
    let id = sent.message_id.clone();
    let outcome = sent.await.with_context(|| format!("wait for the ACK of notification {id}"))?;
    println!("notified {peer} {} {id}", outcome.kind.as_str_name().trim_start_matches("ACK_OUTCOME_"));
    Ok(())
}

/// `EXAMPLE_PEER` as a destination: "service/NAME" is every ready endpoint of the Service NAME in the
/// sidecar's namespace (the sidecar follows its EndpointSlices), anything else one peer's "host:port".
fn destination(peer: &str) -> Destination {
    match peer.strip_prefix("service/") {
        Some(name) => Destination {
            target: Some(Target::Service(ServiceDestination { name: name.to_owned(), namespace: String::new() })),
        },
        None => to_peer(peer),
    }
}
