//! The gRPC API on the app-facing Unix socket: the consistd services, grpc.health.v1 and server
//! reflection, served on whatever listener the caller hands over.

mod status;
mod unimplemented;

use std::future::Future;

use consistd_proto::v1::{
    FILE_DESCRIPTOR_SET, inbox_service_server::InboxServiceServer, leadership_service_server::LeadershipServiceServer,
    objects_service_server::ObjectsServiceServer, outbox_service_server::OutboxServiceServer,
    rollout_service_server::RolloutServiceServer, watch_service_server::WatchServiceServer,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{server::NamedService, transport::Server};
use tonic_health::{ServingStatus, server::HealthReporter};

use self::unimplemented::Unimplemented;

/// Full names of the consistd services, as reflection and health report them.
pub const SERVICE_NAMES: [&str; 6] = [
    <WatchServiceServer<Unimplemented> as NamedService>::NAME,
    <ObjectsServiceServer<Unimplemented> as NamedService>::NAME,
    <LeadershipServiceServer<Unimplemented> as NamedService>::NAME,
    <OutboxServiceServer<Unimplemented> as NamedService>::NAME,
    <InboxServiceServer<Unimplemented> as NamedService>::NAME,
    <RolloutServiceServer<Unimplemented> as NamedService>::NAME,
];

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

/// Serves every consistd service on `listener` until `shutdown` completes, then marks every service
/// NOT_SERVING (so health watchers learn at once), stops accepting, and waits for in-flight calls.
/// The caller bounds that wait with its grace period.
pub async fn serve(listener: UnixListener, shutdown: impl Future<Output = ()> + Send) -> Result<(), ApiError> {
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

    let shutdown = async {
        shutdown.await;
        set_status(&health, ServingStatus::NotServing).await;
        tracing::info!("gRPC server draining: no new connections, waiting for in-flight calls");
    };

    Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(WatchServiceServer::new(Unimplemented))
        .add_service(ObjectsServiceServer::new(Unimplemented))
        .add_service(LeadershipServiceServer::new(Unimplemented))
        .add_service(OutboxServiceServer::new(Unimplemented))
        .add_service(InboxServiceServer::new(Unimplemented))
        .add_service(RolloutServiceServer::new(Unimplemented))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(ApiError::Serve)
}

/// Sets the overall ("") status and each consistd service's status.
async fn set_status(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    for name in SERVICE_NAMES {
        health.set_service_status(name, status).await;
    }
}
