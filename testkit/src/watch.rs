//! Reading a WatchService stream in tests: the next event within a timeout, or everything up to SYNCED.

use std::time::Duration;

use consistd_client::{
    Client,
    proto::{DeliveryMode, EventType, SubscribeRequest, SubscribeResponse},
};
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
