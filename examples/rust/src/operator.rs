//! The `controller` command: campaigns for leadership and, meanwhile, runs the Greetings' reconcile queue.

use std::{pin::pin, sync::Arc};

use anyhow::{Context as _, bail};
use consistd_client::{Changed, Client, ReconcileSpec, Related, proto::CampaignRequest};
use futures::StreamExt as _;

use crate::{configmap, pass::Pass, settings::Settings};

/// The queue's primary resource: the Greetings of examples/crd.yaml.
const GREETINGS: &str = "greetings.example.consistd.io";

/// The finalizer the queue keeps on every Greeting until its finalize pass.
const FINALIZER: &str = "example.consistd.io/cleanup";

/// How many Greetings the queue hands out at once.
const MAX_LEASES: u32 = 4;

/// Campaigns and works on the queue until either fails; dropping it ends the campaign (the sidecar
/// resigns) and returns the leases of running passes to the queue.
pub(crate) async fn run(client: &Client, settings: Settings) -> anyhow::Result<()> {
    tokio::select! {
        led = campaign(client, &settings) => led,
        reconciled = reconcile(client, &settings) => reconciled,
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
        let name = state.state.as_str_name().trim_start_matches("LEADERSHIP_STATE_");
        println!("leadership {name} holder={} term={}", state.holder, state.term);
    }
    bail!("leadership stream ended")
}

/// The queue, named after the election (apps in other languages sharing the daemon use queues of their
/// own): the Greetings of the namespace, queued by a change of their spec (the generation) or of the
/// ConfigMap each owns, handed out only while this pod leads, each kept under the finalizer.
fn spec(settings: &Settings) -> ReconcileSpec {
    let owned = Related::owned("configmaps").namespace(&settings.namespace).labels(configmap::managed_selector());
    ReconcileSpec::new(&settings.election, GREETINGS)
        .namespace(&settings.namespace)
        .only_changes_of(Changed::Generation)
        .related(owned)
        .finalizer(FINALIZER)
        .max_leases(MAX_LEASES)
        .election(&settings.election, &settings.namespace)
}

/// Runs a pass on each Greeting the queue hands out; returns only on the daemon's refusal of the spec.
async fn reconcile(client: &Client, settings: &Settings) -> anyhow::Result<()> {
    let pass = Arc::new(Pass::new(client.clone(), settings.peer.clone()));
    client
        .reconcile(spec(settings), move |item| {
            let pass = Arc::clone(&pass);
            async move { pass.handle(item).await }
        })
        .await
        .context("reconcile greetings")
}
