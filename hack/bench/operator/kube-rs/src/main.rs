//! The Greeting operator of examples/README.md written on kube-rs, as its docs teach it: a runtime Controller
//! over the Greetings of EXAMPLE_NAMESPACE (default "default"), their watch filtered by generation, that owns
//! the ConfigMaps it applies, keeps its finalizer with `finalizer()` and records events with a `Recorder`.
//! It prints the consistd examples' `reconciling`, `published`, `finalizing` and `finalized` lines on stdout
//! (its logs go to stderr), so daemon/benches/operator.rs counts its passes as it counts theirs. It has no
//! leader election (kube-rs has none built in) and sends no notification (a consistd feature).
//!
//!     KUBECONFIG=... EXAMPLE_NAMESPACE=NS kube-rs-greeting-operator

mod greeting;
mod reconcile;

use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    runtime::{
        Controller, Predicate as _, PredicateConfig, WatchStreamExt as _,
        events::{Recorder, Reporter},
        predicates, reflector, watcher,
    },
};

use crate::{
    greeting::Greeting,
    reconcile::{Context, MANAGED_BY, MANAGER, error_policy, reconcile},
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let namespace = std::env::var("EXAMPLE_NAMESPACE").unwrap_or_else(|_| "default".to_owned());
    let client = Client::try_default().await.context("connect to the apiserver (KUBECONFIG or in-cluster)")?;
    let greetings: Api<Greeting> = Api::namespaced(client.clone(), &namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);

    // A change of a Greeting's status, labels or annotations alone queues nothing. Its finalizers are let
    // through as well: `finalizer()` ends the pass in which it adds FINALIZER, and waits for that change to
    // come back (adding a finalizer does not move the generation).
    let (reader, writer) = reflector::store();
    let changed = watcher(greetings, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation.combine(predicates::finalizers), PredicateConfig::default());

    let reporter = Reporter { controller: MANAGER.to_owned(), instance: std::env::var("POD_NAME").ok() };
    let context = Arc::new(Context { client: client.clone(), recorder: Recorder::new(client, reporter) });
    Controller::for_stream(changed, reader)
        .owns(configmaps, watcher::Config::default().labels(&format!("{MANAGED_BY}={MANAGER}")))
        .shutdown_on_signal()
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!("reconcile: {error}");
            }
        })
        .await;
    Ok(())
}
