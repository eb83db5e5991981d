//! Example: a ConfigMap controller on consistd. `configmap-controller controller` campaigns for
//! leadership and prints each state; meanwhile it works on the daemon's reconcile queue of labelled
//! ConfigMaps (`Client::reconcile`), which hands out work only while this pod leads the election. For each
//! ConfigMap the queue hands it, it records the data keys in an annotation through consistd (guarded by
//! the item's fencing term, and naming the item's lease so the key's next pass waits until the write is
//! seen) and notifies a peer with an ACK-tracked send. `configmap-controller receive` is that peer: it
//! prints each notification and ACKs it. Settings come from the environment (see examples/README.md):
//! `EXAMPLE_PEER` is a peer's "host:port" or "service/NAME" (every ready endpoint of that Service). On
//! SIGTERM or SIGINT either command stops, leaving the campaign (the sidecar resigns: it releases the
//! Lease), and exits 0.

use std::{
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail};
use consistd_client::{
    Action, Client, ReconcileError, ReconcileSpec, Reconciler, WorkItem,
    proto::{
        CampaignRequest, Destination, LeadershipState, PatchRequest, PatchType, SendRequest, ServiceDestination,
        destination::Target,
    },
    to_peer,
};
use futures::StreamExt as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::Notify,
};

const OBSERVED_KEYS: &str = "example.consistd.io/observed-keys";

/// How many ConfigMaps the queue hands out at once.
const MAX_LEASES: u32 = 4;

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
/// and with it the campaign stream and the reconcile stream: the sidecar resigns at once (it releases the
/// Lease, so another replica leads without waiting for it to expire), the leases of items still being
/// handled go back to the queue, and the process exits 0.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Arc::new(Settings::from_env()?);
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

/// Campaigns and, meanwhile, works on the queue; returns once `EXAMPLE_EXIT_AFTER` ConfigMaps were handled.
/// Returning (or being dropped) ends the campaign: the sidecar resigns.
async fn controller(client: &Client, settings: &Arc<Settings>) -> anyhow::Result<()> {
    tokio::select! {
        led = campaign(client, settings) => led,
        reconciled = reconcile(client, settings) => reconciled,
    }
}

/// Campaigns in the election and prints each leadership state; runs until the leadership stream fails.
async fn campaign(client: &Client, settings: &Settings) -> anyhow::Result<()> {
    let request = CampaignRequest {
        election: settings.election.clone(),
        namespace: settings.namespace.clone(),
        ..Default::default()
    };
    let mut states = pin!(client.campaign(request));
    while let Some(state) = states.next().await {
        let state = state.context("campaign")?;
        match state.state {
            LeadershipState::Leader => println!("leader term={}", state.term),
            LeadershipState::Follower => println!("follower holder={}", state.holder),
            _ => println!("unknown"),
        }
    }
    bail!("leadership stream ended")
}

/// Runs the handler on the ConfigMaps the queue hands out (only while this pod leads the election) until
/// `EXAMPLE_EXIT_AFTER` were handled: then it stops taking items, lets the running handlers complete
/// their leases, and returns.
async fn reconcile(client: &Client, settings: &Arc<Settings>) -> anyhow::Result<()> {
    // The queue is named after the election: apps in other languages sharing the daemon use queues of
    // their own.
    let spec = ReconcileSpec::new(&settings.election, "configmaps")
        .namespace(&settings.namespace)
        .labels(&settings.selector)
        .max_leases(MAX_LEASES)
        .election(&settings.election, &settings.namespace);
    let handler = Arc::new(Handler {
        client: client.clone(),
        settings: Arc::clone(settings),
        handled: AtomicUsize::new(0),
        enough: Notify::new(),
    });
    let finished = Arc::clone(&handler);
    Reconciler::new(client, spec)
        .graceful_shutdown_on(async move { finished.enough.notified().await })
        .run(move |item| {
            let handler = Arc::clone(&handler);
            async move { handler.handle(item).await }
        })
        .await
        .context("reconcile configmaps")
}

/// What every pass of the handler shares.
struct Handler {
    client: Client,
    settings: Arc<Settings>,
    /// How many ConfigMaps were patched (and their peer notified).
    handled: AtomicUsize,
    /// Notified once `EXAMPLE_EXIT_AFTER` were handled.
    enough: Notify,
}

impl Handler {
    /// One pass over a ConfigMap: records its data keys unless already recorded, then notifies the peer.
    /// The key is done when it returns `Ok`; an error has the queue hand it out again after its backoff.
    async fn handle(&self, item: WorkItem) -> Result<Action, ReconcileError> {
        if item.deleted {
            return Ok(Action::done());
        }
        let Some(configmap) = item.json() else { return Ok(Action::done()) };
        let consistency = item.consistency.as_str_name().trim_start_matches("CONSISTENCY_");
        println!(
            "reconciling {}/{} attempt={} term={} {consistency}",
            item.namespace, item.name, item.attempt, item.term
        );
        // Another pass over the same state cannot mend an object that is not JSON: wait until it changes.
        let configmap = configmap.map_err(|e| ReconcileError::terminal(format!("the ConfigMap is not JSON: {e}")))?;
        let mut keys: Vec<&str> =
            configmap["data"].as_object().map(|data| data.keys().map(String::as_str).collect()).unwrap_or_default();
        keys.sort_unstable();
        let joined = keys.join(",");
        if configmap["metadata"]["annotations"][OBSERVED_KEYS].as_str() == Some(joined.as_str()) {
            return Ok(Action::done());
        }
        // An error is retried; its text, sent with the completion, is the error with its causes.
        self.record(&item, &keys, &joined).await?;
        let handled = self.handled.fetch_add(1, Ordering::Relaxed) + 1;
        if self.settings.done(handled) {
            self.enough.notify_one();
        }
        Ok(Action::done())
    }

    /// Patches the keys into the ConfigMap's annotations, then notifies the peer and waits for its ACK.
    async fn record(&self, item: &WorkItem, keys: &[&str], joined: &str) -> anyhow::Result<()> {
        let (namespace, name) = (&item.namespace, &item.name);
        let patch = serde_json::json!({ "metadata": { "annotations": {
            OBSERVED_KEYS: joined, "example.consistd.io/handled-by": "rust-example" } } });
        let request = PatchRequest {
            resource: "configmaps".into(),
            namespace: namespace.clone(),
            name: name.clone(),
            patch_type: PatchType::Merge.into(),
            patch: patch.to_string().into_bytes(),
            // The guard of the term the lease was granted in: only its leader may write, so a deposed
            // leader's late write is refused.
            guard: item.guard.clone(),
            ..Default::default()
        };
        // The item's objects client names the lease: the key's next pass waits until this write is seen.
        let patched =
            item.objects().patch(request).await.with_context(|| format!("patch configmap {namespace}/{name}"))?;
        let version = patched.into_inner().object.map(|o| o.resource_version).unwrap_or_default();
        println!("patched {namespace}/{name} keys={joined} resourceVersion={version}");

        if let Some(peer) = &self.settings.peer {
            let payload = serde_json::json!({ "namespace": namespace, "name": name, "keys": keys });
            let sent = self
                .client
                .send(SendRequest {
                    destination: Some(destination(peer)),
                    resource_id: format!("configmaps/{namespace}/{name}"),
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
        Ok(())
    }
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
