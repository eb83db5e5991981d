//! One pass over a Greeting: publish its message in the ConfigMap it owns, or delete that when it goes.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::ConfigMap,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Client, Resource, ResourceExt,
    api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams},
    runtime::{
        controller::Action,
        events::{Event, EventType, Recorder},
        finalizer::{self, Event as Finalizer, finalizer},
    },
};

use crate::greeting::Greeting;

/// The finalizer that holds a Greeting until its ConfigMap is deleted.
const FINALIZER: &str = "example.consistd.io/cleanup";
/// The field manager of the operator's server-side applies, and the value of its ConfigMaps' managed-by label.
pub(crate) const MANAGER: &str = "greeting-operator";
/// The label that marks the ConfigMaps the operator made.
pub(crate) const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// How long a failed pass waits before the Greeting is reconciled again.
const RETRY: Duration = Duration::from_secs(5);

/// What every pass shares.
pub(crate) struct Context {
    pub(crate) client: Client,
    pub(crate) recorder: Recorder,
}

/// Why a pass failed: the step, the object and the apiserver's answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OperatorError {
    #[error("read ConfigMap {0}: {1}")]
    ReadConfigMap(String, kube::Error),
    #[error("apply ConfigMap {0}: {1}")]
    ApplyConfigMap(String, kube::Error),
    #[error("record the Published event on Greeting {0}: {1}")]
    RecordEvent(String, kube::Error),
    #[error("set the Ready condition of Greeting {0}: {1}")]
    SetReady(String, kube::Error),
    #[error("delete ConfigMap {0}: {1}")]
    DeleteConfigMap(String, kube::Error),
    #[error("Greeting {0}: {1}")]
    Finalizer(String, Box<finalizer::Error<OperatorError>>),
}

/// The controller's reconciler: `finalizer()` keeps FINALIZER on the Greeting and picks the pass.
pub(crate) async fn reconcile(greeting: Arc<Greeting>, context: Arc<Context>) -> Result<Action, OperatorError> {
    let namespace = greeting.namespace().unwrap_or_default();
    let key = format!("{namespace}/{}", greeting.name_any());
    if greeting.meta().deletion_timestamp.is_none() {
        // The consistd examples' line. kube-rs counts no attempts and has no leadership term or consistency:
        // attempt=0, term=0 and UNSPECIFIED are fixed placeholders.
        println!("reconciling {key} attempt=0 term=0 UNSPECIFIED");
    }
    let greetings: Api<Greeting> = Api::namespaced(context.client.clone(), &namespace);
    finalizer(&greetings, FINALIZER, greeting, |event| async {
        match event {
            Finalizer::Apply(greeting) => publish(&greeting, &context).await,
            Finalizer::Cleanup(greeting) => clean_up(&greeting, &context).await,
        }
    })
    .await
    .map_err(|error| OperatorError::Finalizer(key, Box::new(error)))
}

/// The controller's error policy: the Greeting is reconciled again after RETRY.
pub(crate) fn error_policy(greeting: Arc<Greeting>, error: &OperatorError, _: Arc<Context>) -> Action {
    tracing::warn!(greeting = greeting.name_any(), "pass failed: {error}");
    Action::requeue(RETRY)
}

/// Applies the Greeting's ConfigMap unless it already says the message, records the Published event when it
/// applied, and sets Ready when that changes it.
async fn publish(greeting: &Greeting, context: &Context) -> Result<Action, OperatorError> {
    let (namespace, name) = (greeting.namespace().unwrap_or_default(), greeting.name_any());
    let configmaps: Api<ConfigMap> = Api::namespaced(context.client.clone(), &namespace);
    let current = configmaps.get_opt(&name).await.map_err(|error| OperatorError::ReadConfigMap(name.clone(), error))?;
    let message = &greeting.spec.message;
    let owner = greeting.controller_owner_ref(&());
    let published = current.is_some_and(|cm| {
        cm.data.as_ref().and_then(|data| data.get("message")) == Some(message)
            && cm
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == greeting.uid().as_ref())
    });
    let note = format!("ConfigMap {name} holds the message");
    if !published {
        let configmap = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(MANAGED_BY.to_owned(), MANAGER.to_owned())])),
                owner_references: owner.map(|owner| vec![owner]),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("message".to_owned(), message.clone())])),
            ..ConfigMap::default()
        };
        let applied = configmaps
            .patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&configmap))
            .await
            .map_err(|error| OperatorError::ApplyConfigMap(name.clone(), error))?;
        println!(
            "published {namespace}/{name} generation={} configmap={name} resourceVersion={}",
            greeting.meta().generation.unwrap_or_default(),
            applied.resource_version().unwrap_or_default()
        );
        let event = Event {
            type_: EventType::Normal,
            reason: "Published".to_owned(),
            note: Some(note.clone()),
            action: "Publish".to_owned(),
            secondary: None,
        };
        context
            .recorder
            .publish(&event, &greeting.object_ref(&()))
            .await
            .map_err(|error| OperatorError::RecordEvent(name.clone(), error))?;
    }
    set_ready(greeting, context, note).await?;
    Ok(Action::await_change())
}

/// Sets the Greeting's Ready condition to True (reason Published, observedGeneration its generation) unless it
/// says so already, by server-side apply to the status subresource.
async fn set_ready(greeting: &Greeting, context: &Context, message: String) -> Result<(), OperatorError> {
    let generation = greeting.meta().generation;
    let current = greeting.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let ready = |c: &Condition| c.status == "True";
    if current.is_some_and(|c| {
        ready(c) && c.reason == "Published" && c.message == message && c.observed_generation == generation
    }) {
        return Ok(());
    }
    // The transition time moves only when the status does.
    let last_transition_time =
        current.filter(|c| ready(c)).map_or_else(|| Time(Timestamp::now()), |c| c.last_transition_time.clone());
    let condition = Condition {
        type_: "Ready".to_owned(),
        status: "True".to_owned(),
        reason: "Published".to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    };
    let status = serde_json::json!({
        "apiVersion": Greeting::api_version(&()),
        "kind": Greeting::kind(&()),
        "status": { "conditions": [condition] },
    });
    let name = greeting.name_any();
    let greetings: Api<Greeting> = Api::namespaced(context.client.clone(), &greeting.namespace().unwrap_or_default());
    greetings
        .patch_status(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&status))
        .await
        .map_err(|error| OperatorError::SetReady(name.clone(), error))?;
    Ok(())
}

/// The finalize pass: deletes the Greeting's ConfigMap (already gone is fine); `finalizer()` then removes
/// FINALIZER.
async fn clean_up(greeting: &Greeting, context: &Context) -> Result<Action, OperatorError> {
    let (namespace, name) = (greeting.namespace().unwrap_or_default(), greeting.name_any());
    // kube-rs has no leadership term: term=0 is a fixed placeholder.
    println!("finalizing {namespace}/{name} term=0");
    let configmaps: Api<ConfigMap> = Api::namespaced(context.client.clone(), &namespace);
    match configmaps.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_not_found() => {}
        Err(error) => return Err(OperatorError::DeleteConfigMap(name, error)),
    }
    println!("finalized {namespace}/{name}");
    Ok(Action::await_change())
}
