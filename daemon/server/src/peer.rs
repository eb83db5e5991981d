//! The peer server: other daemons deliver ACK-tracked messages to this one over gRPC on TCP, forward
//! Publish to it as a channel's leader, and call the roll of its election groups, with mutual TLS
//! (`transport::tls`: each handshake uses the certificate and CA bundle in use at that moment), or
//! plaintext only when configured for development.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use consistd_cluster::leadership::Leadership;
use consistd_core::{claim::Claim, tasks::Tasks};
use consistd_messages::{
    inbox::Inbox,
    rollout::{Publication, Rollout},
    transport::{MAX_FRAME_BYTES, PeerTls, TlsError},
};
use consistd_proto::peer::v1::{
    ExchangeRequest, ExchangeResponse, PublishRequest, PublishResponse, ReachRequest, ReachResponse,
    exchange_request::Frame,
    peer_service_server::{PeerService, PeerServiceServer},
};
use futures::{StreamExt, stream::FuturesUnordered};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming, transport::Server};

use crate::api::status;

/// Messages of one connection being stored at once (their commits share fsyncs).
const IN_FLIGHT_PER_CONNECTION: usize = 256;
/// How long a new connection may take to say who it is.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Answers queued towards one sender.
const ANSWER_QUEUE: usize = 4096;
/// How long a new connection may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the peer transport could not be set up or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The listen address could not be bound.
    #[error("listen for peers on {addr}")]
    Bind {
        /// The `peer.listen` address.
        addr: SocketAddr,
        /// The operating system's error (e.g. the address is in use).
        #[source]
        source: std::io::Error,
    },
    /// tonic failed while serving.
    #[error("serve peers")]
    Serve(#[source] tonic::transport::Error),
    /// The TLS files in use make no server configuration.
    #[error("serve peers with TLS")]
    Tls(#[source] TlsError),
}

/// Binds the peer listen address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, PeerError> {
    TcpListener::bind(addr).await.map_err(|source| PeerError::Bind { addr, source })
}

/// Serves PeerService on `listener` until the `serving` group stops: messages for `inbox`, from senders that mean to
/// reach this daemon (its identity, or `pod`, the name of the Pod it runs in), Publish for the channels
/// of `rollout`, and roll calls of `leadership`'s election groups.
pub async fn serve(
    listener: TcpListener,
    tls: Option<PeerTls>,
    (inbox, pod): (Inbox, Option<String>),
    (rollout, leadership): (Rollout, Arc<Leadership>),
    serving: Tasks,
) -> Result<(), PeerError> {
    // Keepalives find connections that died without a FIN (a peer's node gone, a dropped route), so
    // their tasks and registrations do not linger.
    let mut server = Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(5)));
    let stopped = serving.signal().clone().cancelled_owned();
    let service = PeerServiceServer::new(PeerApi { inbox, pod, rollout, leadership, tasks: serving.clone() })
        .max_decoding_message_size(MAX_FRAME_BYTES)
        .max_encoding_message_size(MAX_FRAME_BYTES);
    let router = server.add_service(service);
    match tls {
        None => {
            let incoming = TcpListenerStream::new(listener).map(|stream| stream.inspect(nodelay));
            router.serve_with_incoming_shutdown(incoming, stopped).await
        }
        Some(tls) => {
            let acceptor = TlsAcceptor::from(tls.server_config().map_err(PeerError::Tls)?);
            router.serve_with_incoming_shutdown(handshakes(listener, acceptor, &serving), stopped).await
        }
    }
    .map_err(PeerError::Serve)
}

/// Answers are small frames: without TCP_NODELAY, Nagle's algorithm holds them back until the sender's
/// delayed ACK (~40 ms). tonic sets it only on listeners it binds itself.
fn nodelay(stream: &TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::warn!(%error, "could not set TCP_NODELAY on a peer connection");
    }
}

/// The connections of `listener` once their TLS handshakes are done, each handshake on its own task so
/// a slow or failing one holds up no other.
fn handshakes(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    tasks: &Tasks,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = mpsc::channel(16);
    let (shutdown, handshaking) = (tasks.signal().clone(), tasks.clone());
    tasks.spawn(async move {
        loop {
            let (stream, remote) = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "peer accept failed");
                        continue;
                    }
                },
            };
            nodelay(&stream);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            handshaking.spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(error)) => tracing::warn!(%error, %remote, "peer TLS handshake failed"),
                    Err(_) => tracing::warn!(%remote, "peer TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

struct PeerApi {
    inbox: Inbox,
    /// The name of the Pod this daemon runs in (`POD_NAME`), which Service endpoints name.
    pod: Option<String>,
    rollout: Rollout,
    leadership: Arc<Leadership>,
    /// The serving group: each connection's task runs in it; its stop signal ends the connections.
    tasks: Tasks,
}

impl PeerApi {
    /// Whether a peer that means to reach `recipient` reached this daemon: its identity, the Pod it runs
    /// in, or nobody named (a peer known only by its address).
    fn is(&self, recipient: &str) -> bool {
        recipient.is_empty() || recipient == self.inbox.identity() || self.pod.as_deref() == Some(recipient)
    }
}

#[tonic::async_trait]
impl PeerService for PeerApi {
    type ExchangeStream = futures::stream::BoxStream<'static, Result<ExchangeResponse, Status>>;

    async fn publish(&self, request: Request<PublishRequest>) -> Result<Response<PublishResponse>, Status> {
        let r = request.into_inner();
        // Meant for another daemon (the leader that had this address before): assign nothing.
        if !self.is(&r.leader) {
            tracing::info!(channel = r.channel, leader = r.leader, "refused a Publish meant for another daemon");
            return Err(status::unavailable(
                "leader",
                format!(
                    "this is consistd {}, not {}: the channel's leader is not at this address",
                    self.inbox.identity(),
                    r.leader
                ),
            ));
        }
        let key = self.rollout.channel(&r.channel).map_err(status::leadership_error)?;
        let claim = Claim::parse_carried(&r.claim).map_err(|why| status::invalid_argument("claim", why))?;
        let publication = Publication { payload: r.payload, content_type: r.content_type, claim };
        let version = self.rollout.publish_as_leader(&key, publication).await.map_err(status::rollout_error)?;
        Ok(Response::new(PublishResponse { version }))
    }

    async fn reach(&self, request: Request<ReachRequest>) -> Result<Response<ReachResponse>, Status> {
        let r = request.into_inner();
        if r.namespace.is_empty() {
            return Err(status::invalid_argument("namespace", "must name the election's namespace"));
        }
        if r.identity.is_empty() {
            return Err(status::invalid_argument("identity", "must name the member to reach"));
        }
        let key = self.leadership.key(&r.election, &r.namespace).map_err(status::leadership_error)?;
        let recorded = (r.recorded_contact_age_ms.map(Duration::from_millis), r.recorded_applied_version);
        let incarnation =
            self.leadership.reached(&key, &r.identity, &r.incarnation, recorded).map_err(status::leadership_error)?;
        Ok(Response::new(ReachResponse { incarnation }))
    }

    async fn exchange(
        &self,
        request: Request<Streaming<ExchangeRequest>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        let remote = request.remote_addr();
        let mut frames = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, frames.message())
            .await
            .map_err(|_| status::deadline_exceeded("hello", "no Hello within 10 s of connecting"))?;
        let hello = match first? {
            Some(ExchangeRequest { frame: Some(Frame::Hello(h)) }) if !h.sender.is_empty() => h,
            _ => return Err(status::invalid_argument("hello", "the first frame must be a Hello naming the sender")),
        };
        // Meant for another daemon (a pod that had this address before): take nothing, ACK nothing.
        if !self.is(&hello.recipient) {
            tracing::info!(
                sender = hello.sender,
                recipient = hello.recipient,
                ?remote,
                "refused a peer meant for another daemon"
            );
            return Err(status::failed_precondition(
                "hello.recipient",
                format!("this is consistd {}, not {}", self.inbox.identity(), hello.recipient),
            ));
        }
        let sender = hello.sender;
        tracing::info!(sender, ?remote, "peer connected");
        let (tx, rx) = mpsc::channel(ANSWER_QUEUE);
        let connection = self.inbox.connect(&sender, tx.clone());
        let inbox = self.inbox.clone();
        let shutdown = self.tasks.signal().clone();
        self.tasks.spawn(async move {
            let _connection = connection;
            let mut storing = FuturesUnordered::new();
            loop {
                tokio::select! {
                    frame = frames.message(), if storing.len() < IN_FLIGHT_PER_CONNECTION => match frame {
                        Ok(Some(ExchangeRequest { frame: Some(Frame::Message(m)) })) => {
                            let inbox = inbox.clone();
                            let sender = sender.clone();
                            storing.push(async move { inbox.accept(&sender, m).await });
                        }
                        Ok(Some(_)) => tracing::warn!(sender, "unexpected frame from peer ignored"),
                        Ok(None) | Err(_) => break,
                    },
                    Some(answer) = storing.next(), if !storing.is_empty() => {
                        if let Some(a) = answer && tx.send(a).await.is_err() {
                            break;
                        }
                    }
                    () = shutdown.cancelled() => break,
                }
            }
            // Messages already being stored finish; their answers go out if the connection still is.
            while let Some(answer) = storing.next().await {
                if let Some(a) = answer {
                    let _ = tx.try_send(a);
                }
            }
            tracing::info!(sender, "peer disconnected");
        });
        Ok(Response::new(ReceiverStream::new(rx).map(Ok).boxed()))
    }
}
