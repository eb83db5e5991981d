//! The gRPC API on the app-facing Unix socket: the consistd services, grpc.health.v1 and server
//! reflection, served on whatever listener the caller hands over.

mod access;
mod caller;
mod calls;
mod guard;
mod inbox;
mod leadership;
mod objects;
mod ordered;
mod outbox;
mod reconcile;
mod rollout;
pub(crate) mod status;
mod watch;

use std::sync::Arc;

use consistd_cluster::{leadership::Leadership, objects::Objects, reconcile::Reconciler, watch::Hub};
use consistd_core::{
    config::{AccessRule, Live},
    tasks::Tasks,
};
use consistd_messages::{inbox::Inbox, outbox::Outbox};
use consistd_observe::metrics::Metrics;
use consistd_proto::v1::{
    FILE_DESCRIPTOR_SET,
    inbox_service_server::{self, InboxServiceServer},
    leadership_service_server::{self, LeadershipServiceServer},
    objects_service_server::{self, ObjectsServiceServer},
    outbox_service_server::{self, OutboxServiceServer},
    reconcile_service_server::{self, ReconcileServiceServer},
    rollout_service_server::{self, RolloutServiceServer},
    watch_service_server::{self, WatchServiceServer},
};
use futures::TryStreamExt;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic_health::{ServingStatus, server::HealthReporter};

pub use self::caller::Allowlist;
use self::{
    access::Access, caller::CallerLayer, inbox::InboxApi, leadership::LeadershipApi, objects::ObjectsApi,
    outbox::OutboxApi, reconcile::ReconcileApi, rollout::RolloutApi, watch::WatchApi,
};
use crate::{authority::Relaxed, connections};

/// What a server-streaming RPC answers with.
type ResponseStream<T> = futures::stream::BoxStream<'static, Result<T, tonic::Status>>;

/// Full names of the consistd services, as reflection and health report them.
pub const SERVICE_NAMES: [&str; 7] = [
    watch_service_server::SERVICE_NAME,
    objects_service_server::SERVICE_NAME,
    leadership_service_server::SERVICE_NAME,
    outbox_service_server::SERVICE_NAME,
    inbox_service_server::SERVICE_NAME,
    rollout_service_server::SERVICE_NAME,
    reconcile_service_server::SERVICE_NAME,
];

/// The largest request the daemon decodes (4 MiB, gRPC's customary default); larger ones are refused
/// before they reach a service.
pub(crate) const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// What the services work with.
#[derive(Debug, Clone)]
pub struct Services {
    /// Shared upstream watches, for WatchService.
    pub hub: Arc<Hub>,
    /// Object reads and writes, for ObjectsService.
    pub objects: Objects,
    /// Elections, for LeadershipService and the leader guard on ObjectsService writes.
    pub leadership: Arc<Leadership>,
    /// ACK-tracked sends from this pod.
    pub outbox: Outbox,
    /// Messages for this pod's app.
    pub inbox: Inbox,
    /// The namespace of destinations that name none.
    pub namespace: String,
    /// Versioned rollouts and their barrier.
    pub rollout: consistd_messages::rollout::Rollout,
    /// Reconcile queues, for ReconcileService, and the writes made for their leases.
    pub reconciler: Arc<Reconciler>,
    /// Who may call the socket at all (`socket.allowedUids` / `socket.allowedGids`), as reloads change it.
    pub allowlist: Live<Arc<Allowlist>>,
    /// What callers may do (`access.rules`), as reloads change them.
    pub access: Live<Arc<[AccessRule]>>,
    /// Where calls are counted per caller.
    pub metrics: Metrics,
}

/// Why the gRPC server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The reflection service could not load the protocol's descriptors.
    #[error("build the gRPC reflection service")]
    Reflection(#[source] tonic_reflection::server::Error),
    /// The server failed while serving.
    #[error("serve gRPC")]
    Serve(#[source] tonic::transport::Error),
}

/// Serves every consistd service on `listener` until the `serving` group is stopped, then marks every
/// service NOT_SERVING (so health watchers learn at once), ends open watch streams with UNAVAILABLE
/// (clients resume elsewhere), stops accepting, and waits for in-flight calls. The caller bounds that
/// wait with its grace period. Per-call tasks run in `serving`.
pub async fn serve(listener: UnixListener, services: Services, serving: Tasks) -> Result<(), ApiError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    set_status(&health, ServingStatus::Serving).await;

    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    let reflection_v1 = reflection.build_v1().map_err(ApiError::Reflection)?;
    // grpcurl and older tools still ask v1alpha first.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(ApiError::Reflection)?;

    let access = Access::new(services.access, services.hub.clone(), services.metrics.clone());
    let watch = WatchApi::new(services.hub.clone(), access.clone(), services.metrics.clone(), serving.clone());
    let objects =
        ObjectsApi::new(services.objects, services.leadership.clone(), services.reconciler.clone(), access.clone());
    let reconcile =
        ReconcileApi::new(services.reconciler, services.leadership.clone(), access.clone(), serving.clone());
    let leadership = LeadershipApi::new(services.leadership.clone(), access.clone(), serving.clone());
    let outbox =
        OutboxApi::new(services.outbox, services.leadership, services.namespace, access.clone(), serving.clone());
    let inbox = InboxApi::new(services.inbox, access.clone(), serving.clone());
    let rollout = RolloutApi::new(services.rollout, access, serving.clone());
    let shutdown = async {
        serving.stopping().await;
        set_status(&health, ServingStatus::NotServing).await;
        tracing::info!("gRPC server draining: no new connections, waiting for in-flight calls");
    };

    let methods = calls::Methods::from_descriptor_sets(&[
        FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ]);
    Server::builder()
        .layer(calls::CallsLayer::new(methods, services.metrics.clone()))
        .layer(CallerLayer::new(services.allowlist, services.metrics))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(WatchServiceServer::new(watch).max_decoding_message_size(MAX_REQUEST_BYTES))
        .add_service(ObjectsServiceServer::new(objects).max_decoding_message_size(MAX_REQUEST_BYTES))
        .add_service(LeadershipServiceServer::new(leadership))
        .add_service(OutboxServiceServer::new(outbox).max_decoding_message_size(MAX_REQUEST_BYTES))
        .add_service(InboxServiceServer::new(inbox))
        .add_service(RolloutServiceServer::new(rollout))
        .add_service(ReconcileServiceServer::new(reconcile))
        .serve_with_incoming_shutdown(
            connections::accept(listener, connections::limit(), &serving).map_ok(Relaxed::new),
            shutdown,
        )
        .await
        .map_err(ApiError::Serve)
}

/// Ends a response stream when the daemon starts shutting down (or the stream's source goes away), with
/// UNAVAILABLE naming `rpc`, so clients know to reconnect rather than think the stream complete.
pub(crate) fn until_shutdown<T: Send + 'static>(
    stream: impl futures::Stream<Item = Result<T, tonic::Status>> + Send + 'static,
    shutdown: &CancellationToken,
    rpc: &'static str,
) -> futures::stream::BoxStream<'static, Result<T, tonic::Status>> {
    use futures::StreamExt;
    stream
        .take_until(shutdown.clone().cancelled_owned())
        .chain(futures::stream::once(async move { Err(status::shutting_down(rpc)) }))
        .boxed()
}

/// Like [`until_shutdown`] for a stream that ends on its own (the answers to a client's stream of
/// requests): it ends cleanly when its source does, and with UNAVAILABLE only when shutdown cut it short.
pub(crate) fn answers_until_shutdown<T: Send + 'static>(
    stream: impl futures::Stream<Item = Result<T, tonic::Status>> + Send + 'static,
    shutdown: &CancellationToken,
    rpc: &'static str,
) -> futures::stream::BoxStream<'static, Result<T, tonic::Status>> {
    use futures::StreamExt;
    let stopped = shutdown.clone();
    stream
        .take_until(shutdown.clone().cancelled_owned())
        .chain(
            futures::stream::once(async move { stopped.is_cancelled().then(|| Err(status::shutting_down(rpc))) })
                .filter_map(futures::future::ready),
        )
        .boxed()
}

/// Sets the overall ("") status and each consistd service's status.
async fn set_status(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    for name in SERVICE_NAMES {
        health.set_service_status(name, status).await;
    }
}
