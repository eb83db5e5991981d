//! How daemons reach each other: mutual TLS from mounted certificate files (plaintext only when
//! configured for development), and the one way to dial a peer, used by the outbox's links and by a
//! Publish forwarded to a channel's leader. The peer server (`peer`) serves the other end.

use std::{path::Path, time::Duration};

use consistd_proto::peer::v1::peer_service_client::PeerServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::config::{BackoffConfig, MAX_PAYLOAD_LIMIT, PeerConfig};

/// The largest frame between daemons: the largest payload any daemon may be configured to accept,
/// plus room for the other fields, so daemons with different limits still understand each other.
pub(crate) const MAX_FRAME_BYTES: usize = MAX_PAYLOAD_LIMIT + 64 * 1024;
/// How long dialling a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// HTTP/2 pings find connections that died without a FIN (a peer's node gone, a dropped route).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a ping may go unanswered before the connection counts as dead.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the TLS files could not be read.
#[derive(Debug, thiserror::Error)]
#[error("read peer.tls.{field} {path}")]
pub struct TlsFileError {
    /// The config field naming the file.
    field: &'static str,
    /// The PEM file that could not be read.
    path: std::path::PathBuf,
    /// The operating system's error.
    #[source]
    source: std::io::Error,
}

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
    /// tonic refused the TLS settings.
    #[error("peer TLS")]
    Tls(#[source] tonic::transport::Error),
    /// No connection could be made.
    #[error("connect to {peer}")]
    Connect {
        /// The peer address dialled ("host:port").
        peer: String,
        /// tonic's error: refused, no answer within 3 s, or a failed TLS handshake.
        #[source]
        source: tonic::transport::Error,
    },
}

/// The PEM files of `peer.tls`, read once at startup.
#[derive(Debug, Clone)]
pub(crate) struct Pems {
    identity: Identity,
    ca: Certificate,
    server_name: String,
}

/// Reads the TLS files named in the config; None when plaintext (or no transport) is configured.
pub(crate) fn load_tls(config: &PeerConfig) -> Result<Option<Pems>, TlsFileError> {
    let Some(tls) = &config.tls else { return Ok(None) };
    let read = |field: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| TlsFileError { field, path: path.to_owned(), source })
    };
    let cert = read("certFile", &tls.cert_file)?;
    let key = read("keyFile", &tls.key_file)?;
    let ca = read("caFile", &tls.ca_file)?;
    Ok(Some(Pems {
        identity: Identity::from_pem(cert, key),
        ca: Certificate::from_pem(ca),
        server_name: tls.server_name.clone(),
    }))
}

impl Pems {
    /// Client side: present our certificate, trust only the peers' CA, expect their server name.
    pub(crate) fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .identity(self.identity.clone())
            .ca_certificate(self.ca.clone())
            .domain_name(self.server_name.clone())
    }

    /// Server side: present our certificate, require a client certificate from the peers' CA.
    pub(crate) fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(self.identity.clone()).client_ca_root(self.ca.clone())
    }
}

/// How this daemon reaches peers.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    /// Client TLS (our certificate, the peers' CA, the expected server name); None: plaintext.
    pub tls: Option<ClientTlsConfig>,
    /// This daemon's identity, sent in the Hello frame so the receiver can deduplicate per sender.
    pub identity: String,
    /// How fast resends and reconnects back off.
    pub backoff: BackoffConfig,
}

impl Transport {
    /// Dials `peer` ("host:port"). Each call made on the client gives up after `request_timeout`, if
    /// one is set; streams that live as long as the connection set none.
    pub(crate) async fn connect(
        &self,
        peer: &str,
        request_timeout: Option<Duration>,
    ) -> Result<PeerServiceClient<Channel>, DialError> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{peer}"))
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
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(DialError::Tls)?;
        }
        let channel =
            endpoint.connect().await.map_err(|source| DialError::Connect { peer: peer.to_owned(), source })?;
        Ok(PeerServiceClient::new(channel)
            .max_decoding_message_size(MAX_FRAME_BYTES)
            .max_encoding_message_size(MAX_FRAME_BYTES))
    }
}
