//! The peer server: other daemons deliver ACK-tracked messages to this one over gRPC on TCP, with
//! mutual TLS (`transport`), or plaintext only when configured for development.

use std::net::SocketAddr;

use consistd_proto::peer::v1::{
    ExchangeRequest, ExchangeResponse, PublishRequest, PublishResponse,
    exchange_request::Frame,
    peer_service_server::{PeerService, PeerServiceServer},
};
use futures::{StreamExt, stream::FuturesUnordered};
use tokio::{net::TcpListener, sync::mpsc};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming, transport::Server};

use crate::{
    api::status,
    inbox::Inbox,
    rollout::Rollout,
    transport::{MAX_FRAME_BYTES, Pems},
};

/// Messages of one connection being stored at once (their commits share fsyncs).
const IN_FLIGHT_PER_CONNECTION: usize = 256;
/// How long a new connection may take to say who it is.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Answers queued towards one sender.
const ANSWER_QUEUE: usize = 4096;

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
    /// tonic refused the TLS setup or failed while serving.
    #[error("serve peers")]
    Serve(#[source] tonic::transport::Error),
}

/// Binds the peer listen address.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, PeerError> {
    TcpListener::bind(addr).await.map_err(|source| PeerError::Bind { addr, source })
}

/// Serves PeerService on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<Pems>,
    inbox: Inbox,
    rollout: Rollout,
    shutdown: CancellationToken,
) -> Result<(), PeerError> {
    // Keepalives find connections that died without a FIN (a peer's node gone, a dropped route), so
    // their tasks and registrations do not linger.
    let mut server = Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(5)));
    if let Some(pems) = &tls {
        server = server.tls_config(pems.server()).map_err(PeerError::Serve)?;
    }
    // Answers are small frames: without TCP_NODELAY, Nagle's algorithm holds them back until the
    // sender's delayed ACK (~40 ms). tonic sets it only on listeners it binds itself.
    let incoming = TcpListenerStream::new(listener).map(|stream| {
        if let Ok(s) = &stream
            && let Err(error) = s.set_nodelay(true)
        {
            tracing::warn!(%error, "could not set TCP_NODELAY on a peer connection");
        }
        stream
    });
    let service = PeerServiceServer::new(PeerApi { inbox, rollout, shutdown: shutdown.clone() })
        .max_decoding_message_size(MAX_FRAME_BYTES)
        .max_encoding_message_size(MAX_FRAME_BYTES);
    server
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .map_err(PeerError::Serve)
}

struct PeerApi {
    inbox: Inbox,
    rollout: Rollout,
    shutdown: CancellationToken,
}

#[tonic::async_trait]
impl PeerService for PeerApi {
    type ExchangeStream = futures::stream::BoxStream<'static, Result<ExchangeResponse, Status>>;

    async fn publish(&self, request: Request<PublishRequest>) -> Result<Response<PublishResponse>, Status> {
        let r = request.into_inner();
        let key = self.rollout.channel(&r.channel).map_err(status::leadership_error)?;
        let version =
            self.rollout.publish_as_leader(&key, r.payload, &r.content_type).await.map_err(status::rollout_error)?;
        Ok(Response::new(PublishResponse { version }))
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
        let sender = match first? {
            Some(ExchangeRequest { frame: Some(Frame::Hello(h)) }) if !h.sender.is_empty() => h.sender,
            _ => return Err(status::invalid_argument("hello", "the first frame must be a Hello naming the sender")),
        };
        tracing::info!(sender, ?remote, "peer connected");
        let (tx, rx) = mpsc::channel(ANSWER_QUEUE);
        let connection = self.inbox.connect(&sender, tx.clone());
        let inbox = self.inbox.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
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
