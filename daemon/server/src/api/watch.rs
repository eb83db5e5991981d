//! WatchService: validates a subscription, joins the hub's shared watch, and streams its items to the
//! app, ending when the app leaves or the daemon shuts down.

use std::sync::Arc;

use consistd_cluster::watch::{
    Cursor, Hub, Query, Subscription,
    budget::Exhausted,
    consistent::{self, Consistency, ConsistentSubscription, Delivery, Kind},
    expectations::Expectations,
    object::Obj,
    shared::{Change, Item},
    view::ObjectView,
};
use consistd_core::{config::Service, tasks::Tasks};
use consistd_observe::metrics::Metrics;
use consistd_proto::v1::{self as pb, watch_service_server::WatchService};
use tokio::{sync::mpsc, time::Instant};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{
    access::{Access, Ask, Resource},
    caller::Caller,
    status,
};

/// Items buffered between the subscription and the gRPC stream; the hub's per-subscriber queue is the
/// real bound, this only smooths writes.
const STREAM_BUFFER: usize = 64;

/// The WatchService implementation.
#[derive(Debug, Clone)]
pub(crate) struct WatchApi {
    hub: Arc<Hub>,
    access: Access,
    metrics: Metrics,
    /// The serving group: per-call tasks run in it; its stop signal ends open streams.
    tasks: Tasks,
}

impl WatchApi {
    pub(crate) fn new(hub: Arc<Hub>, access: Access, metrics: Metrics, tasks: Tasks) -> Self {
        Self { hub, access, metrics, tasks }
    }
}

#[tonic::async_trait]
impl WatchService for WatchApi {
    type SubscribeStream = ReceiverStream<Result<pb::SubscribeResponse, Status>>;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = Caller::from_request(&request);
        let request = request.into_inner();
        let (query, mode) = validate(&request)?;
        let namespace = (!query.namespace.is_empty()).then_some(query.namespace.as_str());
        let ask = Ask { service: Service::Watch, verb: "watch", resource: Resource::Kube(&query.resource), namespace };
        self.access.check(&caller, ask).await?;
        let subscription = self.hub.subscribe(query).await.map_err(status::resource_error)?;
        let expectations = self.hub.expectations().clone();
        let (metrics, mode_label) =
            (self.metrics.clone(), if mode == pb::DeliveryMode::Consistent { "consistent" } else { "raw" });
        let mut stream = match mode {
            pb::DeliveryMode::Consistent => {
                Feed::Consistent(Box::new(ConsistentSubscription::new(subscription, expectations)))
            }
            _ => Feed::Raw(subscription.every_event(), expectations),
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let shutdown = self.tasks.signal().clone();
        self.tasks.spawn(async move {
            loop {
                let item = tokio::select! {
                    () = shutdown.cancelled() => {
                        let _ = tx.send(Err(status::shutting_down("WatchService.Subscribe"))).await;
                        break;
                    }
                    () = tx.closed() => break,
                    item = stream.next() => item,
                };
                let Some((item, received)) = item else {
                    let end = match stream.ended() {
                        Some(exhausted) => status::watch_exhausted("WatchService.Subscribe", &exhausted),
                        None => status::shutting_down("WatchService.Subscribe"),
                    };
                    let _ = tx.send(Err(end)).await;
                    break;
                };
                if tx.send(Ok(item)).await.is_err() {
                    break;
                }
                if let Some(received) = received {
                    metrics.watch_delivered(mode_label, received.elapsed());
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A subscription in either mode, producing protocol messages.
enum Feed {
    Raw(Subscription, Expectations),
    Consistent(Box<ConsistentSubscription>),
}

impl Feed {
    /// Why the watch ended, once `next` returned None: the memory budget, or (None) the daemon stopping.
    fn ended(&self) -> Option<Exhausted> {
        match self {
            Feed::Raw(sub, _) => sub.ended(),
            Feed::Consistent(sub) => sub.ended(),
        }
    }

    /// The next message, and when the change it carries was received from the apiserver if it came live.
    async fn next(&mut self) -> Option<(pb::SubscribeResponse, Option<Instant>)> {
        match self {
            Feed::Raw(sub, expectations) => {
                let item = sub.next().await?;
                let received = sub.live_received();
                Some((raw_response(item, sub.incarnation(), sub.resource_plural(), expectations), received))
            }
            Feed::Consistent(sub) => {
                let delivery = sub.next().await?;
                let received = match &delivery {
                    Delivery::Object { received, .. } => *received,
                    Delivery::Synced(_) | Delivery::ResyncRequired => None,
                };
                Some((consistent_response(delivery, sub.incarnation()), received))
            }
        }
    }
}

/// Checks every field, naming the one that is wrong.
fn validate(r: &pb::SubscribeRequest) -> Result<(Query, pb::DeliveryMode), Status> {
    if r.resource.is_empty() {
        return Err(status::invalid_argument("resource", "must not be empty"));
    }
    let mode = match pb::DeliveryMode::try_from(r.mode) {
        Ok(mode @ (pb::DeliveryMode::Raw | pb::DeliveryMode::Consistent)) => mode,
        Ok(pb::DeliveryMode::Unspecified) => {
            return Err(status::invalid_argument("mode", "must be DELIVERY_MODE_RAW or DELIVERY_MODE_CONSISTENT"));
        }
        Err(_) => return Err(status::invalid_argument("mode", format!("unknown value {}", r.mode))),
    };
    if !r.namespace.is_empty() && !is_dns_label(&r.namespace) {
        return Err(status::invalid_argument("namespace", format!("{:?} is not a valid namespace name", r.namespace)));
    }
    let cursor = match r.resume_cursor.as_str() {
        "" => None,
        c => Some(c.parse::<Cursor>().map_err(|m| status::invalid_argument("resume_cursor", m))?),
    };
    let query = Query {
        resource: r.resource.clone(),
        namespace: r.namespace.clone(),
        label_selector: r.label_selector.clone(),
        field_selector: r.field_selector.clone(),
        cursor,
        own: false,
        view: view("view", r.view.as_ref())?,
        shard: None,
    };
    Ok((query, mode))
}

/// The view a request's `field` asks for; unset is the whole object without managedFields.
pub(super) fn view(field: &str, v: Option<&pb::ObjectView>) -> Result<ObjectView, Status> {
    let Some(v) = v else { return Ok(ObjectView::default()) };
    ObjectView::new(v.metadata_only, &v.fields, v.managed_fields)
        .map_err(|e| status::invalid_argument(&format!("{field}.{}", e.field), e.message))
}

/// RFC 1123 label: what Kubernetes accepts as a namespace name.
pub(super) fn is_dns_label(s: &str) -> bool {
    s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A RAW item: every event, each marked with the object's relation to the pod's own writes.
fn raw_response(item: Item, incarnation: u64, plural: &str, expectations: &Expectations) -> pb::SubscribeResponse {
    let cursor = |seq| Cursor { incarnation, seq }.to_string();
    let mark = |o: &Obj, pos| pb_consistency(consistent::classify(expectations, incarnation, plural, o, pos).0);
    let mut previous = String::new();
    let (kind, obj, cursor, consistency) = match item {
        Item::ResyncRequired => (pb::EventType::ResyncRequired, None, String::new(), pb::Consistency::Unspecified),
        Item::Snapshot(obj, at) => {
            let c = mark(&obj, at);
            (pb::EventType::Added, Some(obj), String::new(), c)
        }
        Item::Synced(seq) => (pb::EventType::Synced, None, cursor(seq), pb::Consistency::Unspecified),
        Item::Entry(entry) => match &entry.change {
            Change::Added(o) => (pb::EventType::Added, Some(o.clone()), cursor(entry.seq), mark(o, entry.seq)),
            Change::Modified(o) => {
                previous = entry.previous.as_deref().unwrap_or_default().to_owned();
                (pb::EventType::Modified, Some(o.clone()), cursor(entry.seq), mark(o, entry.seq))
            }
            Change::Deleted(o) => {
                (pb::EventType::Deleted, Some(o.clone()), cursor(entry.seq), pb::Consistency::Consistent)
            }
            Change::Synced => (pb::EventType::Synced, None, cursor(entry.seq), pb::Consistency::Unspecified),
            // Not reached: a RAW subscription resyncs at a relist instead (`Subscription::every_event`).
            Change::Relisted => (pb::EventType::ResyncRequired, None, String::new(), pb::Consistency::Unspecified),
        },
    };
    pb::SubscribeResponse {
        r#type: kind.into(),
        object: obj.map(Obj::into_proto),
        cursor,
        consistency: consistency.into(),
        previous_resource_version: previous,
    }
}

/// A CONSISTENT delivery.
fn consistent_response(delivery: Delivery, incarnation: u64) -> pb::SubscribeResponse {
    let cursor = |seq: Option<u64>| seq.map(|seq| Cursor { incarnation, seq }.to_string()).unwrap_or_default();
    match delivery {
        Delivery::Synced(seq) => pb::SubscribeResponse {
            r#type: pb::EventType::Synced.into(),
            object: None,
            cursor: cursor(Some(seq)),
            consistency: pb::Consistency::Unspecified.into(),
            previous_resource_version: String::new(),
        },
        Delivery::ResyncRequired => pb::SubscribeResponse {
            r#type: pb::EventType::ResyncRequired.into(),
            object: None,
            cursor: String::new(),
            consistency: pb::Consistency::Unspecified.into(),
            previous_resource_version: String::new(),
        },
        Delivery::Object { kind, obj, seq, consistency, previous, .. } => pb::SubscribeResponse {
            r#type: match kind {
                Kind::Added => pb::EventType::Added,
                Kind::Modified => pb::EventType::Modified,
                Kind::Deleted => pb::EventType::Deleted,
            }
            .into(),
            object: Some(obj.into_proto()),
            cursor: cursor(seq),
            consistency: pb_consistency(consistency).into(),
            // Only a MODIFIED names the state it follows (an ADDED is the first this subscriber is told).
            previous_resource_version: match kind {
                Kind::Modified => previous.map(String::from).unwrap_or_default(),
                Kind::Added | Kind::Deleted => String::new(),
            },
        },
    }
}

fn pb_consistency(c: Consistency) -> pb::Consistency {
    match c {
        Consistency::Consistent => pb::Consistency::Consistent,
        Consistency::AwaitingOwnWrite => pb::Consistency::AwaitingOwnWrite,
        Consistency::OwnWrite => pb::Consistency::OwnWrite,
        Consistency::TimedOut => pb::Consistency::TimedOut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(resource: &str, mode: i32) -> pb::SubscribeRequest {
        pb::SubscribeRequest { resource: resource.into(), mode, ..Default::default() }
    }

    fn refused(r: pb::SubscribeRequest) -> Status {
        validate(&r).expect_err("must be refused")
    }

    #[test]
    fn every_bad_field_is_named() {
        let raw = pb::DeliveryMode::Raw as i32;
        let s = refused(request("", raw));
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().starts_with("resource:"), "{}", s.message());
        assert!(refused(request("configmaps", 0)).message().starts_with("mode:"));
        assert!(refused(request("configmaps", 99)).message().contains("unknown value 99"));
        let mut r = request("configmaps", raw);
        r.namespace = "Not_A_Namespace".into();
        assert!(refused(r).message().starts_with("namespace:"));
        let mut r = request("configmaps", raw);
        r.resume_cursor = "garbage".into();
        assert!(refused(r).message().starts_with("resume_cursor:"));
        assert!(validate(&request("configmaps", pb::DeliveryMode::Consistent as i32)).is_ok());
    }

    #[test]
    fn a_good_request_becomes_a_query() {
        let mut r = request("configmaps", pb::DeliveryMode::Raw as i32);
        r.namespace = "team-a".into();
        r.resume_cursor = Cursor { incarnation: 7, seq: 9 }.to_string();
        let (q, mode) = validate(&r).expect("valid");
        assert_eq!(mode, pb::DeliveryMode::Raw);
        assert_eq!(q.namespace, "team-a");
        assert_eq!(q.cursor, Some(Cursor { incarnation: 7, seq: 9 }));
    }
}
