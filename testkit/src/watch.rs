//! Reading a WatchService stream in tests: the next event within a timeout, or everything up to SYNCED;
//! and a counter in ConfigMaps recorded through a RAW subscription, checked for gaps.

use std::{
    pin::pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use consistd_client::{
    Client, Watch,
    proto::{DeliveryMode, EventType, SubscribeRequest, SubscribeResponse},
};
use futures::StreamExt as _;
use tokio::task::JoinHandle;
use tonic::Streaming;

/// How long a test waits for one event before failing.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// An open subscription.
#[derive(Debug)]
pub struct Events {
    stream: Streaming<SubscribeResponse>,
}

/// A RAW subscription request for `resource` in `namespace`.
pub fn raw(resource: &str, namespace: &str) -> SubscribeRequest {
    SubscribeRequest {
        resource: resource.to_owned(),
        namespace: namespace.to_owned(),
        mode: DeliveryMode::Raw.into(),
        ..SubscribeRequest::default()
    }
}

impl Events {
    /// Subscribes, failing the test if the daemon refuses.
    pub async fn open(client: &Client, request: SubscribeRequest) -> Self {
        let response =
            client.watch().subscribe(request.clone()).await.unwrap_or_else(|e| panic!("subscribe {request:?}: {e}"));
        Self { stream: response.into_inner() }
    }

    /// The next event, failing the test after [`EVENT_TIMEOUT`] or if the stream ends.
    pub async fn next(&mut self) -> SubscribeResponse {
        match tokio::time::timeout(EVENT_TIMEOUT, self.stream.message()).await {
            Ok(Ok(Some(event))) => event,
            Ok(Ok(None)) => panic!("watch stream ended"),
            Ok(Err(status)) => panic!("watch stream failed: {status}"),
            Err(_) => panic!("no watch event within {EVENT_TIMEOUT:?}"),
        }
    }

    /// The next message or status, without failing on stream errors.
    pub async fn next_result(&mut self) -> Result<Option<SubscribeResponse>, tonic::Status> {
        tokio::time::timeout(EVENT_TIMEOUT, self.stream.message())
            .await
            .unwrap_or_else(|_| panic!("no watch message within {EVENT_TIMEOUT:?}"))
    }

    /// Every event up to and including SYNCED.
    pub async fn until_synced(&mut self) -> Vec<SubscribeResponse> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await;
            let synced = event.r#type() == EventType::Synced;
            events.push(event);
            if synced {
                return events;
            }
        }
    }
}

/// `TYPE name` of an event, for compact assertions.
pub fn describe(event: &SubscribeResponse) -> String {
    let kind = event.r#type().as_str_name().trim_start_matches("EVENT_TYPE_");
    match &event.object {
        Some(o) => format!("{kind} {}", o.name),
        None => kind.to_owned(),
    }
}

/// What a RAW subscriber saw of a ConfigMap counter (`data.v`): a value, or a resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// ADDED or MODIFIED with this `data.v`.
    Value(u32),
    /// RESYNC_REQUIRED.
    Resync,
}

/// Records, through a RAW subscription, every `data.v` of `namespace`'s ConfigMaps and every resync, in
/// the order delivered; returns once the subscription has synced. Abort the task to stop recording.
pub async fn record_counter(client: Client, namespace: &str) -> (Arc<Mutex<Vec<Seen>>>, JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let synced = Arc::new(tokio::sync::Notify::new());
    let (into, ready) = (seen.clone(), synced.clone());
    let watch = Watch::new("configmaps").namespace(namespace).mode(DeliveryMode::Raw);
    let task = tokio::spawn(async move {
        let mut events = pin!(client.subscribe(watch));
        while let Some(event) = events.next().await {
            let event = event.expect("the watch through the daemon");
            match event.kind {
                EventType::Synced => ready.notify_one(),
                EventType::ResyncRequired => into.lock().expect("lock").push(Seen::Resync),
                EventType::Added | EventType::Modified => {
                    let object: serde_json::Value = event.json().expect("an object").expect("object JSON");
                    let v = object["data"]["v"].as_str().and_then(|v| v.parse().ok()).expect("data.v");
                    into.lock().expect("lock").push(Seen::Value(v));
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), synced.notified()).await.expect("the watch synced");
    (seen, task)
}

/// Checks a recorded counter: each value follows the one before it, never a gap or a repeat, except
/// right after a resync, where the state may jump ahead (never back).
pub fn assert_no_gap(seen: &[Seen]) {
    let mut last = 0;
    let mut resynced = false;
    for s in seen {
        match *s {
            Seen::Resync => resynced = true,
            Seen::Value(v) if resynced => {
                assert!(v >= last, "after a resync the state goes back: {last} then {v}");
                (last, resynced) = (v, false);
            }
            Seen::Value(v) => {
                assert!(v == last + 1 || (v == 0 && last == 0), "a gap or a repeat: {last} then {v} in {seen:?}");
                last = v;
            }
        }
    }
}
