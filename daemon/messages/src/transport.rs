//! How daemons reach each other: mutual TLS from mounted certificate files that are reloaded when they
//! change (`tls`; plaintext only when configured for development), and the one way to dial a peer, used
//! by the outbox's links, by a Publish forwarded to a channel's leader and by an election leader's roll
//! call (`reach`). The peer server (`peer`) serves the other end.

mod reach;
pub(crate) mod tls;

use std::time::Duration;

use consistd_core::config::MAX_PAYLOAD_LIMIT;
use consistd_proto::peer::v1::peer_service_client::PeerServiceClient;
use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};
use tonic::transport::{Channel, Endpoint};

pub use self::reach::PeerReacher;
pub use self::tls::PeerTls;
pub use self::tls::TlsError;

/// The largest frame between daemons: the largest payload any daemon may be configured to accept,
/// plus room for the other fields, so daemons with different limits still understand each other.
pub const MAX_FRAME_BYTES: usize = MAX_PAYLOAD_LIMIT + 64 * 1024;
/// How long dialling a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// HTTP/2 pings find connections that died without a FIN (a peer's node gone, a dropped route).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a ping may go unanswered before the connection counts as dead.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a peer could not be dialled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    /// The address does not make a URI.
    #[error("peer address {peer}")]
    Address {
        /// The peer address as given ("host:port").
        peer: String,
        /// Why it is not one.
        #[source]
        source: tonic::transport::Error,
    },
    /// The TLS files in use make no client configuration.
    #[error("peer TLS")]
    Tls(#[source] TlsError),
    /// No connection could be made.
    #[error("connect to {peer}")]
    Connect {
        /// The peer address dialled ("host:port").
        peer: String,
        /// tonic's error: refused, no answer within 3 s, or a failed TLS handshake (e.g. an expired or
        /// untrusted certificate).
        #[source]
        source: tonic::transport::Error,
    },
}

/// How this daemon reaches peers.
#[derive(Debug, Clone)]
pub struct Transport {
    /// Mutual TLS (our certificate, the peers' CA bundle, their server name), current at each dial;
    /// None: plaintext.
    pub tls: Option<PeerTls>,
    /// This daemon's identity, sent in the Hello frame so the receiver can deduplicate per sender.
    pub identity: String,
}

impl Transport {
    /// Dials `peer` ("host:port"). Each call made on the client gives up after `request_timeout`, if
    /// one is set; streams that live as long as the connection set none.
    pub(crate) async fn connect(
        &self,
        peer: &str,
        request_timeout: Option<Duration>,
    ) -> Result<PeerServiceClient<Channel>, DialError> {
        // With TLS, the connector below makes it (tonic's own TLS reads its files once).
        let mut endpoint = Endpoint::from_shared(format!("http://{peer}"))
            .map_err(|source| DialError::Address { peer: peer.to_owned(), source })?
            .connect_timeout(CONNECT_TIMEOUT)
            // Answers are small frames: without TCP_NODELAY, Nagle's algorithm holds them back.
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        if let Some(timeout) = request_timeout {
            endpoint = endpoint.timeout(timeout);
        }
        let channel = match &self.tls {
            None => endpoint.connect().await,
            Some(tls) => {
                let (config, name) = (tls.client_config().map_err(DialError::Tls)?, tls.server_name());
                let connector =
                    tower::service_fn(move |uri: Uri| dial_tls(uri, TlsConnector::from(config.clone()), name.clone()));
                endpoint.connect_with_connector(connector).await
            }
        }
        .map_err(|source| DialError::Connect { peer: peer.to_owned(), source })?;
        Ok(PeerServiceClient::new(channel)
            .max_decoding_message_size(MAX_FRAME_BYTES)
            .max_encoding_message_size(MAX_FRAME_BYTES))
    }
}

/// Opens a TCP connection to `uri`'s host and port and makes it TLS, checking the server's certificate
/// for `name`.
async fn dial_tls(
    uri: Uri,
    connector: TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
) -> std::io::Result<TokioIo<TlsStream<TcpStream>>> {
    let no_address = || std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no host and port in {uri}"));
    let (host, port) = (uri.host().ok_or_else(no_address)?, uri.port_u16().ok_or_else(no_address)?);
    let tcp = TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port)).await?;
    // Answers are small frames: without TCP_NODELAY, Nagle's algorithm holds them back.
    tcp.set_nodelay(true)?;
    Ok(TokioIo::new(connector.connect(name, tcp).await?))
}
