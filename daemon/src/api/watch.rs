//! WatchService: validates a subscription, joins the hub's shared watch, and streams its items to the
//! app, ending when the app leaves or the daemon shuts down.

use std::sync::Arc;

use consistd_proto::v1::{self as pb, watch_service_server::WatchService};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::status;
use crate::watch::{
    Cursor, Hub, Query, Subscription,
    object::Obj,
    shared::{Change, Item},
};

/// Items buffered between the subscription and the gRPC stream; the hub's per-subscriber queue is the
/// real bound, this only smooths writes.
const STREAM_BUFFER: usize = 64;

/// The WatchService implementation.
#[derive(Debug, Clone)]
pub(crate) struct WatchApi {
    hub: Arc<Hub>,
    shutdown: CancellationToken,
}

impl WatchApi {
    pub(crate) fn new(hub: Arc<Hub>, shutdown: CancellationToken) -> Self {
        Self { hub, shutdown }
    }
}

#[tonic::async_trait]
impl WatchService for WatchApi {
    type SubscribeStream = ReceiverStream<Result<pb::SubscribeResponse, Status>>;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let request = request.into_inner();
        let query = validate(&request)?;
        let mut subscription = self.hub.subscribe(query).await.map_err(status::watch_error)?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let incarnation = subscription.incarnation();
            loop {
                let item = tokio::select! {
                    () = shutdown.cancelled() => {
                        let _ = tx.send(Err(status::shutting_down("WatchService.Subscribe"))).await;
                        break;
                    }
                    () = tx.closed() => break,
                    item = subscription.next() => item,
                };
                let Some(item) = item else {
                    let _ = tx.send(Err(status::shutting_down("WatchService.Subscribe"))).await;
                    break;
                };
                if tx.send(Ok(response(item, incarnation))).await.is_err() {
                    break;
                }
            }
            drop::<Subscription>(subscription);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Checks every field, naming the one that is wrong.
fn validate(r: &pb::SubscribeRequest) -> Result<Query, Status> {
    if r.resource.is_empty() {
        return Err(status::invalid_argument("resource", "must not be empty"));
    }
    match pb::DeliveryMode::try_from(r.mode) {
        Ok(pb::DeliveryMode::Raw) => {}
        Ok(pb::DeliveryMode::Consistent) => {
            return Err(status::unimplemented_detail(
                "WatchService.Subscribe",
                "mode DELIVERY_MODE_CONSISTENT (own-write expectations come with ObjectsService writes); use DELIVERY_MODE_RAW",
            ));
        }
        Ok(pb::DeliveryMode::Unspecified) => {
            return Err(status::invalid_argument("mode", "must be DELIVERY_MODE_RAW or DELIVERY_MODE_CONSISTENT"));
        }
        Err(_) => return Err(status::invalid_argument("mode", format!("unknown value {}", r.mode))),
    }
    if !r.namespace.is_empty() && !is_dns_label(&r.namespace) {
        return Err(status::invalid_argument("namespace", format!("{:?} is not a valid namespace name", r.namespace)));
    }
    let cursor = match r.resume_cursor.as_str() {
        "" => None,
        c => Some(c.parse::<Cursor>().map_err(|m| status::invalid_argument("resume_cursor", m))?),
    };
    Ok(Query {
        resource: r.resource.clone(),
        namespace: r.namespace.clone(),
        label_selector: r.label_selector.clone(),
        field_selector: r.field_selector.clone(),
        cursor,
    })
}

/// RFC 1123 label: what Kubernetes accepts as a namespace name.
pub(super) fn is_dns_label(s: &str) -> bool {
    s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn response(item: Item, incarnation: u64) -> pb::SubscribeResponse {
    let cursor = |seq| Cursor { incarnation, seq }.to_string();
    let (kind, obj, cursor) = match item {
        Item::ResyncRequired => (pb::EventType::ResyncRequired, None, String::new()),
        Item::Snapshot(obj) => (pb::EventType::Added, Some(obj), String::new()),
        Item::Synced(seq) => (pb::EventType::Synced, None, cursor(seq)),
        Item::Entry(entry) => {
            let (kind, obj) = match &entry.change {
                Change::Added(o) => (pb::EventType::Added, Some(o.clone())),
                Change::Modified(o) => (pb::EventType::Modified, Some(o.clone())),
                Change::Deleted(o) => (pb::EventType::Deleted, Some(o.clone())),
                Change::Synced => (pb::EventType::Synced, None),
            };
            (kind, obj, cursor(entry.seq))
        }
    };
    let consistency = if obj.is_some() { pb::Consistency::Consistent } else { pb::Consistency::Unspecified };
    pb::SubscribeResponse {
        r#type: kind.into(),
        object: obj.map(|o| kube_object(&o)),
        cursor,
        consistency: consistency.into(),
    }
}

fn kube_object(o: &Obj) -> pb::KubeObject {
    o.clone().into()
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
        assert_eq!(
            refused(request("configmaps", pb::DeliveryMode::Consistent as i32)).code(),
            tonic::Code::Unimplemented
        );
    }

    #[test]
    fn a_good_request_becomes_a_query() {
        let mut r = request("configmaps", pb::DeliveryMode::Raw as i32);
        r.namespace = "team-a".into();
        r.resume_cursor = Cursor { incarnation: 7, seq: 9 }.to_string();
        let q = validate(&r).expect("valid");
        assert_eq!(q.namespace, "team-a");
        assert_eq!(q.cursor, Some(Cursor { incarnation: 7, seq: 9 }));
    }
}
