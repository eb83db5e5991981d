//! Watch streams that reconnect on their own and resume after the last event they delivered.

use futures::{Stream, StreamExt as _};

use crate::{
    Client, Error,
    own_writes::OwnWrites,
    proto::{Consistency, DeliveryMode, EventType, KubeObject, ObjectView, SubscribeRequest, SubscribeResponse},
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
    /// How the state relates to this pod's own writes, as the daemon judged it when it sent the event.
    pub consistency: Consistency,
    /// RAW mode only: when the app took this ADDED or MODIFIED event, a write through this client had
    /// already returned a larger resourceVersion of the object, so the state is older than what the app
    /// itself wrote. CONSISTENT mode drops such events instead (see [`Client::subscribe`]).
    pub predates_own_write: bool,
    /// MODIFIED only: the resourceVersion of the state of the object that the daemon's watch saw directly
    /// before this one (no write to the object came between them); empty when not known (ADDED, DELETED, a
    /// state from a list or a snapshot). [`crate::Latest`] uses it to tell the state a worker's own write
    /// made on the state it had from one that also holds another writer's change.
    pub previous_resource_version: String,
}

impl Event {
    fn from_proto(r: SubscribeResponse) -> Self {
        Self {
            kind: r.r#type(),
            consistency: r.consistency(),
            object: r.object,
            cursor: r.cursor,
            predates_own_write: false,
            previous_resource_version: r.previous_resource_version,
        }
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

    /// Only each object's metadata, read with the apiserver's metadata-only requests (client-go's metadata
    /// informer, controller-runtime's `OnlyMetadata`): no spec, status or data, a fraction of the memory.
    pub fn metadata_only(mut self) -> Self {
        self.request.view.get_or_insert_with(ObjectView::default).metadata_only = true;
        self
    }

    /// Only these fields of each object, as dot-separated paths ("spec.replicas", "status.conditions",
    /// "metadata.labels"), beside apiVersion, kind and the identity in metadata, which are always kept.
    pub fn project<P: Into<String>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        let view = self.request.view.get_or_insert_with(ObjectView::default);
        view.fields.extend(paths.into_iter().map(Into::into));
        self
    }

    /// Keeps `metadata.managedFields`, which the daemon drops unless asked.
    pub fn managed_fields(mut self) -> Self {
        self.request.view.get_or_insert_with(ObjectView::default).managed_fields = true;
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
    ///
    /// The own-write rule. The daemon judges a CONSISTENT state when it sends it, so a state sent just
    /// before the app's own write reached the daemon can still be on its way (in the socket, hyper's and
    /// tonic's buffers) when that write returns. So each ADDED or MODIFIED event is checked against the
    /// resourceVersions this client's writes ([`Client::objects`]: create, update, patch, delete) returned
    /// when the app takes it, that is when a poll of this stream hands it over, not when it arrives: if a
    /// write returned a larger resourceVersion of the object, the event is dropped in CONSISTENT mode
    /// and handed over with [`Event::predates_own_write`] set in RAW mode. DELETED, SYNCED and
    /// RESYNC_REQUIRED are never dropped; a version that is not a decimal integer is never compared. A
    /// dropped event still moves the resume cursor, so it does not come again after a reconnect. The
    /// stream reads the next event from the connection only when it is polled, so nothing waits inside
    /// the SDK where a check made earlier would go stale; an app that reads ahead into a queue of its own
    /// (a channel, `ready_chunks`) takes an event when it dequeues it, and can check it again then with
    /// [`Client::predates_own_write`].
    pub fn subscribe(&self, watch: Watch) -> impl Stream<Item = Result<Event, Error>> + Send + 'static {
        self.events(watch, true)
    }

    /// The watch's events, with the own-write rule applied as the app takes each one when `judge` (what
    /// [`Client::subscribe`] hands out), or not at all: the reader of [`Client::subscribe_latest`] applies
    /// it where its app takes a state, and must see every state the daemon sent to keep its books.
    pub(crate) fn events(
        &self,
        watch: Watch,
        judge: bool,
    ) -> impl Stream<Item = Result<Event, Error>> + Send + 'static {
        let mut service = self.watch();
        let mut request = watch.request;
        let writes = self.writes.clone();
        let consistent = request.mode() == DeliveryMode::Consistent;
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
                                    // The take: the app's poll runs this, and nothing awaits before the yield.
                                    let mut event = Event::from_proto(r);
                                    if judge && predates_own_write(&event, &writes) {
                                        if consistent {
                                            continue; // dropped; the cursor above already moved past it
                                        }
                                        event.predates_own_write = true;
                                    }
                                    yield Ok(event);
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

/// Whether `event` is an ADDED or MODIFIED state older than a write this client made (the own-write
/// rule); DELETED and the markers never are.
pub(crate) fn predates_own_write(event: &Event, writes: &OwnWrites) -> bool {
    matches!(event.kind, EventType::Added | EventType::Modified)
        && event.object.as_ref().is_some_and(|o| writes.predates(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventType, rv: &str) -> Event {
        let object = KubeObject { uid: "u".into(), resource_version: rv.into(), ..Default::default() };
        Event {
            kind,
            object: Some(object),
            cursor: String::new(),
            consistency: Consistency::Consistent,
            predates_own_write: false,
            previous_resource_version: String::new(),
        }
    }

    #[test]
    fn a_view_is_unset_unless_asked_and_carries_what_was_asked() {
        assert_eq!(Watch::new("configmaps").request.view, None, "the whole object without managedFields");
        let metadata = Watch::new("configmaps").metadata_only().managed_fields().request.view.expect("a view");
        assert!(metadata.metadata_only && metadata.managed_fields && metadata.fields.is_empty());
        let projected = Watch::new("pods").project(["spec.nodeName"]).project(["status.phase"]).request.view;
        assert_eq!(projected.map(|v| v.fields), Some(vec!["spec.nodeName".into(), "status.phase".into()]));
    }

    #[test]
    fn only_added_and_modified_states_older_than_an_own_write_predate_it() {
        let writes = OwnWrites::default();
        writes.record(&KubeObject { uid: "u".into(), resource_version: "10".into(), ..Default::default() });
        assert!(predates_own_write(&event(EventType::Added, "9"), &writes));
        assert!(predates_own_write(&event(EventType::Modified, "9"), &writes));
        assert!(!predates_own_write(&event(EventType::Modified, "10"), &writes), "the write's own state");
        assert!(!predates_own_write(&event(EventType::Deleted, "9"), &writes), "a deletion is never dropped");
        for marker in [EventType::Synced, EventType::ResyncRequired] {
            let marker = Event { object: None, ..event(marker, "") };
            assert!(!predates_own_write(&marker, &writes), "{marker:?}");
        }
    }
}
