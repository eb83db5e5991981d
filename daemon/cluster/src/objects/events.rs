//! Events (events.k8s.io/v1) the pod's apps record about objects, correlated once for all of them as client-go
//! does: one kube-runtime `Recorder` per reporting controller, shared by every app, makes a repeat part of a
//! series (one Event whose count is patched); in front of it, client-go's spam filter drops a reporting
//! controller's events about one object past a burst of 25, then lets one through per 5 minutes.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, Recorder, Reporter},
};
use tokio::time::Instant;

/// Events one reporting controller may record about one object at once (client-go's spam filter's burst).
const BURST: f64 = 25.0;
/// How long one more event takes to be allowed after the burst (client-go: a rate of 1/300 per second).
const REFILL: Duration = Duration::from_secs(300);
/// Buckets kept before the full ones (nothing recorded for a while) are forgotten.
const MAX_BUCKETS: usize = 10_000;

/// The recorders of every reporting controller, and their rate limits per object.
pub(super) struct Recorders {
    client: Client,
    /// The reportingInstance of every event: this daemon's identity (its pod).
    instance: String,
    /// One per reporting controller; a publish holds it, so two repeats of one event never both create it.
    recorders: Mutex<HashMap<String, std::sync::Arc<tokio::sync::Mutex<Recorder>>>>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// A token bucket: its tokens as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Its tokens at `now`.
    fn refilled(self, now: Instant) -> f64 {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() / REFILL.as_secs_f64();
        (self.tokens + gained).min(BURST)
    }
}

impl Recorders {
    pub(super) fn new(client: Client, instance: String) -> Self {
        Self { client, instance, recorders: Mutex::default(), buckets: Mutex::default() }
    }

    /// Records `event` about `regarding` as reported by `controller`: Ok(false) when the rate limit of that
    /// controller's events about that object dropped it.
    pub(super) async fn record(
        &self,
        controller: &str,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<bool, kube::Error> {
        let r = regarding;
        let key = [Some(controller), r.api_version.as_deref(), r.kind.as_deref(), r.namespace.as_deref()]
            .into_iter()
            .chain([r.name.as_deref(), r.uid.as_deref()])
            .map(Option::unwrap_or_default)
            .collect::<Vec<_>>()
            .join("\n");
        if !self.admit(&key, Instant::now()) {
            return Ok(false);
        }
        let recorder = self.recorder(controller);
        let mut recorder = recorder.lock().await;
        match recorder.publish(event, regarding).await {
            // The series' Event is gone (it expired, or was deleted): kube's Recorder would keep patching it,
            // so a recorder with no memory of it creates it anew.
            Err(kube::Error::Api(status)) if status.code == 404 => {
                *recorder = Recorder::new(self.client.clone(), self.reporter(controller));
                recorder.publish(event, regarding).await?;
            }
            answer => answer?,
        }
        Ok(true)
    }

    fn reporter(&self, controller: &str) -> Reporter {
        Reporter { controller: controller.to_owned(), instance: Some(self.instance.clone()) }
    }

    fn recorder(&self, controller: &str) -> std::sync::Arc<tokio::sync::Mutex<Recorder>> {
        let mut recorders = self.recorders.lock().unwrap_or_else(PoisonError::into_inner);
        recorders
            .entry(controller.to_owned())
            .or_insert_with(|| {
                let recorder = Recorder::new(self.client.clone(), self.reporter(controller));
                std::sync::Arc::new(tokio::sync::Mutex::new(recorder))
            })
            .clone()
    }

    /// Whether `key` (a controller and an object) may record one more event at `now`, taking its token.
    fn admit(&self, key: &str, now: Instant) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        admit(&mut buckets, key, now)
    }
}

fn admit(buckets: &mut HashMap<String, Bucket>, key: &str, now: Instant) -> bool {
    if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
        buckets.retain(|_, b| b.refilled(now) < BURST);
    }
    let bucket = buckets.entry(key.to_owned()).or_insert(Bucket { tokens: BURST, at: now });
    bucket.tokens = bucket.refilled(now);
    bucket.at = now;
    if bucket.tokens < 1.0 {
        return false;
    }
    bucket.tokens -= 1.0;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_takes_a_burst_of_25_then_one_event_per_5_minutes_each_controller_apart() {
        let now = Instant::now();
        let mut buckets = HashMap::new();
        let admitted = (0..30).filter(|_| admit(&mut buckets, "c\na", now)).count();
        assert_eq!(admitted, 25, "the burst");
        assert!(admit(&mut buckets, "c\nb", now), "another object has its own");
        assert!(admit(&mut buckets, "d\na", now), "another controller has its own");
        assert!(!admit(&mut buckets, "c\na", now + REFILL - Duration::from_secs(1)), "not yet");
        assert!(admit(&mut buckets, "c\na", now + REFILL), "one more after 5 minutes");
        assert!(!admit(&mut buckets, "c\na", now + REFILL), "and only one");
    }

    #[test]
    fn full_buckets_are_forgotten_when_there_are_too_many() {
        let now = Instant::now();
        let mut buckets = HashMap::new();
        for i in 0..MAX_BUCKETS {
            admit(&mut buckets, &i.to_string(), now);
        }
        let later = now + REFILL;
        assert!(admit(&mut buckets, "new", later));
        assert_eq!(buckets.len(), 1, "every bucket but the new one was full again");
    }
}
