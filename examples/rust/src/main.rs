//! Example: a ConfigMap controller on consistd. `configmap-controller controller` campaigns for
//! leadership and, only while it leads, watches labelled ConfigMaps in CONSISTENT mode, records their
//! data keys in an annotation through consistd (guarded by its fencing term) and notifies a peer with
//! an ACK-tracked send. `configmap-controller receive` is that peer: it prints each notification and
//! ACKs it. Settings come from the environment (see examples/README.md): `EXAMPLE_PEER` is a peer's
//! "host:port" or "service/NAME" (every ready endpoint of that Service). On SIGTERM or SIGINT either
//! command stops, leaving the campaign (the sidecar resigns: it releases the Lease), and exits 0.

use std::{pin::pin, time::Duration};

use anyhow::{Context as _, bail};
use consistd_client::{
    Client, Leadership, Watch,
    proto::{
        CampaignRequest, Destination, EventType, LeadershipState, PatchRequest, PatchType, SendRequest,
        ServiceDestination, WriteGuard, destination::Target,
    },
    to_peer,
};
use futures::StreamExt as _;
use tokio::signal::unix::{SignalKind, signal};

const OBSERVED_KEYS: &str = "example.consistd.io/observed-keys";

/// The example's settings, from the environment.
struct Settings {
    namespace: String,
    election: String,
    selector: String,
    /// `EXAMPLE_PEER` as given: a peer's "host:port", or "service/NAME".
    peer: Option<String>,
    exit_after: Option<usize>,
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        let exit_after = match std::env::var("EXAMPLE_EXIT_AFTER") {
            Ok(n) => Some(n.parse().with_context(|| format!("EXAMPLE_EXIT_AFTER={n:?} is not a number"))?),
            Err(_) => None,
        };
        Ok(Self {
            namespace: var("EXAMPLE_NAMESPACE", "default"),
            election: var("EXAMPLE_ELECTION", "configmap-controller"),
            selector: var("EXAMPLE_SELECTOR", "example.consistd.io/watch=true"),
            peer: std::env::var("EXAMPLE_PEER").ok().filter(|p| !p.is_empty()),
            exit_after,
        })
    }

    fn done(&self, handled: usize) -> bool {
        self.exit_after.is_some_and(|n| handled >= n)
    }
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

/// Runs the command until it is done or SIGTERM/SIGINT arrives. Stopping drops the command's future,
/// and with it the campaign stream: the sidecar resigns at once (it releases the Lease, so another
/// replica leads without waiting for it to expire), and the process exits 0.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let command = std::env::args().nth(1);
    let client = Client::from_env();
    let run = async {
        client.wait_ready(Duration::from_secs(30)).await.context("wait for consistd")?;
        match command.as_deref() {
            Some("controller") => controller(&client, &settings).await,
            Some("receive") => receive(&client, &settings).await,
            _ => bail!("usage: configmap-controller controller|receive"),
        }
    };
    let stop = stop_signal().context("listen for SIGTERM and SIGINT")?;
    tokio::select! {
        done = run => return done,
        name = stop => println!("stopping on {name}"),
    }
    // `run` is dropped by now: the campaign is left.
    println!("stopped");
    Ok(())
}

/// Listens for SIGTERM and SIGINT from now on; the future resolves to the name of the first to arrive.
fn stop_signal() -> std::io::Result<impl Future<Output = &'static str>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Campaigns, and reconciles only while this pod leads; stops reconciling the moment it does not.
async fn controller(client: &Client, settings: &Settings) -> anyhow::Result<()> {
    let request = CampaignRequest {
        election: settings.election.clone(),
        namespace: settings.namespace.clone(),
        ..Default::default()
    };
    let mut states = pin!(client.campaign(request));
    let mut handled = 0;
    let mut state = states.next().await.context("leadership stream ended")??;
    loop {
        match state.state {
            LeadershipState::Leader => println!("leader term={}", state.term),
            LeadershipState::Follower => println!("follower holder={}", state.holder),
            _ => println!("unknown"),
        }
        if !state.is_leader() {
            state = states.next().await.context("leadership stream ended")??;
            continue;
        }
        tokio::select! {
            next = states.next() => state = next.context("leadership stream ended")??,
            done = reconcile(client, settings, &state, &mut handled) => return done,
        }
    }
}

/// Watches the ConfigMaps and handles each state; returns once `EXAMPLE_EXIT_AFTER` were handled.
async fn reconcile(client: &Client, settings: &Settings, lead: &Leadership, handled: &mut usize) -> anyhow::Result<()> {
    let watch = Watch::new("configmaps").namespace(&settings.namespace).labels(&settings.selector);
    let mut events = pin!(client.subscribe(watch));
    while let Some(event) = events.next().await {
        let event = event.context("watch configmaps")?;
        if !matches!(event.kind, EventType::Added | EventType::Modified) {
            continue;
        }
        let Some(Ok(configmap)) = event.json() else { continue };
        if handle(client, settings, lead, &configmap).await? {
            *handled += 1;
            if settings.done(*handled) {
                return Ok(());
            }
        }
    }
    bail!("watch ended")
}

/// Records the ConfigMap's data keys unless already recorded, then notifies the peer; whether it wrote.
async fn handle(
    client: &Client,
    settings: &Settings,
    lead: &Leadership,
    configmap: &serde_json::Value,
) -> anyhow::Result<bool> {
    let name = configmap["metadata"]["name"].as_str().unwrap_or_default();
    let mut keys: Vec<&str> =
        configmap["data"].as_object().map(|data| data.keys().map(String::as_str).collect()).unwrap_or_default();
    keys.sort_unstable();
    let joined = keys.join(",");
    if configmap["metadata"]["annotations"][OBSERVED_KEYS].as_str() == Some(joined.as_str()) {
        return Ok(false);
    }
    let patch = serde_json::json!({ "metadata": { "annotations": {
        OBSERVED_KEYS: joined, "example.consistd.io/handled-by": "rust-example" } } });
    let request = PatchRequest {
        resource: "configmaps".into(),
        namespace: settings.namespace.clone(),
        name: name.to_owned(),
        patch_type: PatchType::Merge.into(),
        patch: patch.to_string().into_bytes(),
        // Only the leader of this term may write: a deposed leader's late write is refused.
        guard: Some(WriteGuard { election: lead.election.clone(), namespace: lead.namespace.clone(), term: lead.term }),
        ..Default::default()
    };
    let patched = client.objects().patch(request).await.with_context(|| format!("patch configmap {name}"))?;
    let version = patched.into_inner().object.map(|o| o.resource_version).unwrap_or_default();
    println!("patched {}/{name} keys={joined} resourceVersion={version}", settings.namespace);

    if let Some(peer) = &settings.peer {
        let payload = serde_json::json!({ "namespace": settings.namespace, "name": name, "keys": keys });
        let sent = client
            .send(SendRequest {
                destination: Some(destination(peer)),
                resource_id: format!("configmaps/{}/{name}", settings.namespace),
                event_id: version,
                payload: payload.to_string().into_bytes(),
                content_type: "application/json".into(),
                ..Default::default()
            })
            .await
            .context("send notification")?;
        let id = sent.message_id.clone();
        let outcome = sent.await.context("wait for the notification's ACK")?;
        println!("notified {peer} {} {id}", outcome.kind.as_str_name().trim_start_matches("ACK_OUTCOME_"));
    }
    Ok(true)
}

/// Prints each notification from peers and ACKs it once printed.
async fn receive(client: &Client, settings: &Settings) -> anyhow::Result<()> {
    let mut deliveries = pin!(client.receive());
    let mut received = 0;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery.context("receive")?;
        let m = &delivery.message;
        println!("received {} {} {}", m.resource_id, m.event_id, String::from_utf8_lossy(&m.payload));
        delivery.ack().await.context("ack")?;
        received += 1;
        if settings.done(received) {
            return Ok(());
        }
    }
    bail!("inbox stream ended")
}
