//! Watch streams that reconnect on their own and resume after the last event they delivered.

use futures::{Stream, StreamExt as _};

use crate::{
    Client, Error,
    proto::{Consistency, DeliveryMode, EventType, KubeObject, SubscribeRequest, SubscribeResponse},
    retry::{Backoff, is_retryable},
};

/// One event of a watch, or one of its markers (SYNCED, RESYNC_REQUIRED).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: EventType,
    /// The object; `None` for SYNCED and RESYNC_REQUIRED.
    pub object: Option<KubeObject>,
    /// Resume position after this event.
    pub cursor: String,
    /// How the state relates to this pod's own writes.
    pub consistency: Consistency,
}

impl Event {
    fn from_proto(r: SubscribeResponse) -> Self {
        Self { kind: r.r#type(), consistency: r.consistency(), object: r.object, cursor: r.cursor }
    }

    /// The object's JSON, parsed; `None` for markers.
    pub fn json(&self) -> Option<Result<serde_json::Value, serde_json::Error>> {
        self.object.as_ref().map(|o| serde_json::from_slice(&o.json))
    }
}

/// What to watch: a resource, optionally narrowed, in RAW or CONSISTENT mode (the default).
#[derive(Debug, Clone)]
pub struct Watch {
    request: SubscribeRequest,
}

impl Watch {
    /// Watches `resource` (a plural such as "configmaps", "apps/v1/deployments", or a kind) in CONSISTENT
    /// mode in every namespace.
    pub fn new(resource: impl Into<String>) -> Self {
        Self {
            request: SubscribeRequest {
                resource: resource.into(),
                mode: DeliveryMode::Consistent.into(),
                ..Default::default()
            },
        }
    }

    /// Only this namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.request.namespace = namespace.into();
        self
    }

    /// Only objects matching this label selector.
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.request.label_selector = selector.into();
        self
    }

    /// Only objects matching this field selector.
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.request.field_selector = selector.into();
        self
    }

    /// RAW (every event) or CONSISTENT (states consistent with this pod's writes).
    pub fn mode(mut self, mode: DeliveryMode) -> Self {
        self.request.mode = mode.into();
        self
    }

    /// Starts after the event with this cursor instead of from a fresh snapshot.
    pub fn resume_from(mut self, cursor: impl Into<String>) -> Self {
        self.request.resume_cursor = cursor.into();
        self
    }
}

impl Client {
    /// Streams the watch's events. When the connection to the sidecar is lost the stream subscribes
    /// again from the last cursor it delivered (with backoff), so each event arrives once; if the
    /// daemon cannot resume from there, the stream yields RESYNC_REQUIRED and a fresh snapshot. Any
    /// other error ends the stream with that error. Dropping the stream ends the subscription.
    pub fn subscribe(&self, watch: Watch) -> impl Stream<Item = Result<Event, Error>> + Send + 'static {
        let mut service = self.watch();
        let mut request = watch.request;
        async_stream::stream! {
            let mut backoff = Backoff::new();
            loop {
                let failure = match service.subscribe(request.clone()).await {
                    Err(status) => status,
                    Ok(response) => {
                        let mut events = response.into_inner();
                        loop {
                            match events.next().await {
                                Some(Ok(r)) => {
                                    backoff.reset();
                                    if !r.cursor.is_empty() {
                                        request.resume_cursor.clone_from(&r.cursor);
                                    }
                                    yield Ok(Event::from_proto(r));
                                }
                                Some(Err(status)) => break status,
                                None => break tonic::Status::unavailable("the sidecar ended the watch"),
                            }
                        }
                    }
                };
                if !is_retryable(&failure) {
                    yield Err(Error::Status(failure));
                    return;
                }
                backoff.wait().await;
            }
        }
    }
}
