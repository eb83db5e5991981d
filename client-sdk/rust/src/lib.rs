//! Rust client for the consistd sidecar: connect to its Unix socket (the default path, or
//! `CONSISTD_SOCKET`), wait until it is ready, then watch, read and write objects, lead, send and receive,
//! and reconcile the items of a work queue ([`Client::reconcile`]). A slow handler takes the newest state
//! of each object of a watch from [`Client::subscribe_latest`].
//!
//! ```no_run
//! use consistd_client::{Client, Watch, proto::CampaignRequest};
//! use futures::StreamExt as _;
//! # async fn demo() -> Result<(), consistd_client::Error> {
//! let client = Client::from_env();
//! client.wait_ready(std::time::Duration::from_secs(30)).await?;
//! let mut events = std::pin::pin!(client.subscribe(Watch::new("configmaps").namespace("default")));
//! while let Some(event) = events.next().await {
//!     let event = event?; // ADDED/MODIFIED/DELETED, SYNCED or RESYNC_REQUIRED; reconnects on its own
//!     println!("{:?} {:?}", event.kind, event.object.map(|o| o.name));
//! }
//! let mut leadership = std::pin::pin!(client.campaign(CampaignRequest { election: "web".into(), ..Default::default() }));
//! while let Some(state) = leadership.next().await {
//!     if state?.is_leader() { /* act, with state.term as the write guard */ }
//! }
//! let spec = consistd_client::ReconcileSpec::new("web", "configmaps").namespace("default");
//! client.reconcile(spec, |item| async move { Ok(consistd_client::Action::done()) }).await?;
//! # Ok(()) }
//! ```

mod inbox;
mod latest;
mod leadership;
mod objects;
mod ordered;
mod outbox;
mod own_writes;
mod reconcile;
mod retry;
pub mod trace;
mod watch;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

/// The generated protocol: messages and service clients.
pub use consistd_proto::v1 as proto;
pub use inbox::{DEFAULT_RETRY_AFTER, Delivery};
pub use latest::{Latest, Taken};
pub use leadership::Leadership;
pub use objects::Objects;
use ordered::Ordered;
pub use outbox::{Outcome, Sent, to_election, to_peer};
use proto::{
    inbox_service_client::InboxServiceClient, leadership_service_client::LeadershipServiceClient,
    outbox_service_client::OutboxServiceClient, rollout_service_client::RolloutServiceClient,
    watch_service_client::WatchServiceClient,
};
pub use reconcile::{
    Action, Changed, MAX_REQUEUE, MIN_REQUEUE, ReconcileError, ReconcileSpec, Reconciler, Related, WorkItem,
};
pub use watch::{Event, Watch};

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

/// A connection to one consistd sidecar. Cheap to clone (clones share the connection, the streams sends
/// and ACKs go out on, and the record of this client's own writes);
/// connects lazily and reconnects on demand.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
    channel: Channel,
    /// What this client's object writes returned, for the own-write rule of its watches.
    writes: Arc<own_writes::OwnWrites>,
    sends: Arc<Ordered<proto::SendStreamRequest, proto::SendStreamResponse>>,
    inbox_acks: Arc<Ordered<proto::AckStreamRequest, proto::AckStreamResponse>>,
}

impl Client {
    /// A client for the socket named by `CONSISTD_SOCKET`, else [`DEFAULT_SOCKET`].
    pub fn from_env() -> Self {
        Self::new(socket_path(std::env::var_os("CONSISTD_SOCKET")))
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
        Self { path, channel, writes: Arc::default(), sends: Arc::default(), inbox_acks: Arc::default() }
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
        WatchServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER)
    }

    /// Reads and writes of Kubernetes objects: the generated `ObjectsService` calls, each write recorded
    /// for the own-write rule of this client's watches (see [`Objects`]).
    pub fn objects(&self) -> Objects {
        Objects::new(self.channel.clone(), self.writes.clone())
    }

    /// Whether a write through this client (or a clone) returned a larger resourceVersion of `object`'s
    /// object than `object` has: the state is older than what the app itself already wrote. A watch
    /// applies this check when the app takes each event ([`Client::subscribe`]); an app that moves events
    /// into a queue of its own before handling them takes them later, and can ask again with this when
    /// it takes one from its queue. False for a resourceVersion that is not a decimal integer (never
    /// compared) and for objects this client did not write (or wrote longer ago than the 10,000 objects
    /// it wrote since).
    pub fn predates_own_write(&self, object: &proto::KubeObject) -> bool {
        self.writes.predates(object)
    }

    /// Leader elections.
    pub fn leadership(&self) -> LeadershipServiceClient<Channel> {
        LeadershipServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER)
    }

    /// ACK-tracked sends.
    pub fn outbox(&self) -> OutboxServiceClient<Channel> {
        OutboxServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER)
    }

    /// Messages from peers.
    pub fn inbox(&self) -> InboxServiceClient<Channel> {
        InboxServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER)
    }

    /// Versioned rollouts and the replica barrier.
    pub fn rollout(&self) -> RolloutServiceClient<Channel> {
        RolloutServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER)
    }
}

/// The largest answer a client takes from the sidecar: any. gRPC's default of 4 MiB would refuse a List of a
/// few large objects, and the sidecar is the pod's own.
pub(crate) const MAX_ANSWER: usize = usize::MAX;

/// The socket `CONSISTD_SOCKET` names (`from_env`), else [`DEFAULT_SOCKET`]; an empty value counts as unset.
fn socket_path(from_env: Option<std::ffi::OsString>) -> PathBuf {
    from_env.filter(|p| !p.is_empty()).map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_comes_from_consistd_socket_else_the_default() {
        assert_eq!(socket_path(Some("/run/app/c.sock".into())), PathBuf::from("/run/app/c.sock"));
        assert_eq!(socket_path(Some("".into())), PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(socket_path(None), PathBuf::from(DEFAULT_SOCKET));
    }

    #[tokio::test]
    async fn waiting_for_a_missing_socket_fails_after_the_timeout_naming_it() {
        let client = Client::new("/nonexistent/consistd.sock");
        let start = std::time::Instant::now();
        let error = client.wait_ready(Duration::from_millis(300)).await.expect_err("no daemon there");
        assert!(start.elapsed() >= Duration::from_millis(250), "gave up early: {:?}", start.elapsed());
        let text = error.to_string();
        assert!(text.contains("/nonexistent/consistd.sock") && text.contains("not ready within 300ms"), "{text}");
    }
}
