//! Rust client for the consistd sidecar: connect to its Unix socket (the default path, or
//! `CONSISTD_SOCKET`), wait until it is ready, and call its services.
//!
//! ```no_run
//! # async fn demo() -> Result<(), consistd_client::Error> {
//! let client = consistd_client::Client::from_env();
//! client.wait_ready(std::time::Duration::from_secs(30)).await?;
//! let mut objects = client.objects();
//! # Ok(()) }
//! ```

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

/// The generated protocol: messages and service clients.
pub use consistd_proto::v1 as proto;
use proto::{
    inbox_service_client::InboxServiceClient, leadership_service_client::LeadershipServiceClient,
    objects_service_client::ObjectsServiceClient, outbox_service_client::OutboxServiceClient,
    rollout_service_client::RolloutServiceClient, watch_service_client::WatchServiceClient,
};

/// Where the sidecar listens unless `CONSISTD_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/var/run/consistd/consistd.sock";

/// How often `wait_ready` asks again.
const READY_POLL: Duration = Duration::from_millis(50);

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket path cannot be used as a gRPC endpoint.
    #[error("invalid consistd endpoint")]
    Endpoint(#[source] tonic::transport::Error),
    /// The sidecar did not report SERVING in time.
    #[error("consistd at {path} not ready within {timeout:?}: {last}")]
    NotReady {
        /// The socket.
        path: PathBuf,
        /// How long we waited.
        timeout: Duration,
        /// The last thing we saw.
        last: String,
    },
    /// The sidecar answered with an error; the status keeps its gRPC code and message.
    #[error(transparent)]
    Status(#[from] tonic::Status),
}

/// A connection to one consistd sidecar. Cheap to clone; connects lazily and reconnects on demand.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
    channel: Channel,
}

impl Client {
    /// A client for the socket named by `CONSISTD_SOCKET`, else [`DEFAULT_SOCKET`].
    pub fn from_env() -> Self {
        let path = std::env::var_os("CONSISTD_SOCKET").map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from);
        Self::new(path)
    }

    /// A client for the socket at `path`. Nothing is connected until the first call.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let connect_to = path.clone();
        // The URI is required by tonic but unused: every connection goes to the Unix socket.
        let channel = Endpoint::from_static("http://consistd.sock").connect_with_connector_lazy(tower::service_fn(
            move |_: Uri| {
                let path = connect_to.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            },
        ));
        Self { path, channel }
    }

    /// The socket this client talks to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying channel, for generated clients not wrapped here.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Waits until the sidecar's health service reports SERVING, retrying while the socket is missing
    /// or the daemon is starting.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut health = HealthClient::new(self.channel.clone());
        loop {
            let last = match health.check(HealthCheckRequest { service: String::new() }).await {
                Ok(r) if r.get_ref().status() == ServingStatus::Serving => return Ok(()),
                Ok(r) => format!("health is {:?}", r.get_ref().status()),
                Err(status) => format!("{}: {}", status.code(), status.message()),
            };
            if tokio::time::Instant::now() + READY_POLL > deadline {
                return Err(Error::NotReady { path: self.path.clone(), timeout, last });
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// The standard gRPC health service.
    pub fn health(&self) -> HealthClient<Channel> {
        HealthClient::new(self.channel.clone())
    }

    /// Shared watches.
    pub fn watch(&self) -> WatchServiceClient<Channel> {
        WatchServiceClient::new(self.channel.clone())
    }

    /// Reads and writes of Kubernetes objects.
    pub fn objects(&self) -> ObjectsServiceClient<Channel> {
        ObjectsServiceClient::new(self.channel.clone())
    }

    /// Leader elections.
    pub fn leadership(&self) -> LeadershipServiceClient<Channel> {
        LeadershipServiceClient::new(self.channel.clone())
    }

    /// ACK-tracked sends.
    pub fn outbox(&self) -> OutboxServiceClient<Channel> {
        OutboxServiceClient::new(self.channel.clone())
    }

    /// Messages from peers.
    pub fn inbox(&self) -> InboxServiceClient<Channel> {
        InboxServiceClient::new(self.channel.clone())
    }

    /// Versioned rollouts and the replica barrier.
    pub fn rollout(&self) -> RolloutServiceClient<Channel> {
        RolloutServiceClient::new(self.channel.clone())
    }
}
