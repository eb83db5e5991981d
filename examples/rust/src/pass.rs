//! One pass of the operator over a Greeting the queue handed out: publish its message, or finalize it.

use anyhow::Context as _;
use consistd_client::{
    Action, Client, ReconcileError, WorkItem,
    proto::{ConditionStatus, EventSeverity},
};
use serde_json::Value;

use crate::{configmap, notify::notify};

/// What every pass shares.
pub(crate) struct Pass {
    client: Client,
    /// `EXAMPLE_PEER`: whom to notify of each publication, if anyone.
    peer: Option<String>,
}

impl Pass {
    pub(crate) fn new(client: Client, peer: Option<String>) -> Self {
        Self { client, peer }
    }

    /// Publishes the item's Greeting, or cleans up after it on its finalize pass. The key is done when it
    /// returns `Ok`; an error hands the Greeting back for a retry after its backoff.
    pub(crate) async fn handle(&self, item: WorkItem) -> Result<Action, ReconcileError> {
        if item.finalizing {
            finalize(&item).await?;
            return Ok(Action::done());
        }
        if item.deleted {
            return Ok(Action::done());
        }
        // None: a ConfigMap named a Greeting that does not exist.
        let Some(greeting) = item.json() else { return Ok(Action::done()) };
        let consistency = item.consistency.as_str_name().trim_start_matches("CONSISTENCY_");
        println!(
            "reconciling {}/{} attempt={} term={} {consistency}",
            item.namespace, item.name, item.attempt, item.term
        );
        // Another pass over the same state cannot mend it: wait until the Greeting changes.
        let greeting = greeting.map_err(|e| ReconcileError::terminal(format!("the Greeting is not JSON: {e}")))?;
        let Some(message) = greeting.pointer("/spec/message").and_then(Value::as_str) else {
            return Err(ReconcileError::terminal("the Greeting has no spec.message"));
        };
        self.publish(&item, &greeting, message).await?;
        Ok(Action::done())
    }

    /// Applies the Greeting's ConfigMap unless it already publishes `message`, and after an apply records
    /// the Published event and notifies the peer; then sets the Greeting's Ready condition.
    async fn publish(&self, item: &WorkItem, greeting: &Value, message: &str) -> anyhow::Result<()> {
        let uid = item.object.as_ref().map_or("", |o| o.uid.as_str());
        let note = format!("ConfigMap {} holds the message", item.name);
        let current = configmap::read(item).await?;
        if !current.is_some_and(|c| configmap::publishes(&c, message, uid)) {
            let version = configmap::apply(item, uid, message).await?;
            let generation = greeting.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            println!(
                "published {}/{} generation={generation} configmap={} resourceVersion={version}",
                item.namespace, item.name, item.name
            );
            item.record_event(EventSeverity::Normal, "Published", "Publish", &note)
                .await
                .context("record the Published event")?;
            if let Some(peer) = &self.peer {
                notify(&self.client, peer, item, message, &version).await?;
            }
        }
        item.set_condition("Ready", ConditionStatus::True, "Published", &note)
            .await
            .context("set the Ready condition")?;
        Ok(())
    }
}

/// The finalize pass: deletes the Greeting's ConfigMap; returning lets the sidecar remove the finalizer.
async fn finalize(item: &WorkItem) -> anyhow::Result<()> {
    println!("finalizing {}/{} term={}", item.namespace, item.name, item.term);
    configmap::delete(item).await?;
    println!("finalized {}/{}", item.namespace, item.name);
    Ok(())
}
