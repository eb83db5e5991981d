//! The connection to the Kubernetes apiserver: in-cluster config or KUBECONFIG, and a client that
//! carries every watch, list and write of the daemon over one HTTP/2 connection (as client-go does) with
//! TCP keepalives and HTTP/2 PINGs, noting every answer in the [`ApiContact`] for readiness.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use consistd_core::config::Environment;
use consistd_observe::telemetry;
use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame, SizeHint};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::connect::HttpConnector,
    rt::{TokioExecutor, TokioTimer},
};
use kube::client::{ConfigExt as _, DynBody, retry::RetryPolicy};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service, ServiceBuilder, retry::RetryLayer};
use tower_http::decompression::{DecompressionBody, DecompressionLayer};
use tracing::Instrument as _;

/// A TCP handshake with the apiserver that takes longer is given up and tried afresh: SYN retransmissions
/// back off (1, 2, 4, 8, 16 s), so after a black hole heals a fresh attempt gets through sooner than an old
/// one's next SYN (kube's default is 30 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// TCP keepalive on apiserver connections: a connection quiet this long is probed,
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// again this often while probes go unanswered,
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// and counted dead after this many unanswered probes.
const KEEPALIVE_PROBES: u32 = 3;
/// A connection whose sent data stays unacknowledged this long is dead too (TCP_USER_TIMEOUT; it also
/// bounds the keepalive probing above). A black-holed link, where packets vanish and nothing says so,
/// would otherwise hold a watch or a Lease renewal for the kernel's retransmission limit (15 minutes),
/// and a healed one might wait up to two minutes for the next retransmission.
const UNACKED_TIMEOUT: Duration = Duration::from_secs(30);
/// An HTTP/2 connection that has received nothing for this long is sent a PING, idle or not: every watch
/// rides on the one connection, so a dead one must be noticed even while no stream is sending (client-go
/// pings after 30 s of silence; this is shorter so a black hole is found as soon as TCP's own probes would).
const PING_INTERVAL: Duration = Duration::from_secs(10);
/// A PING not answered in this time closes the connection and fails every stream on it, so the watches
/// start again on a new one (client-go's is 15 s). Longer than any round trip a slow link still works at.
const PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Set (to anything) in the daemon's environment, the apiserver connection speaks HTTP/1.1 only, one
/// connection per concurrent request: client-go's switch of the same name, for a proxy in front of the
/// apiserver that mishandles HTTP/2.
const DISABLE_HTTP2: &str = "DISABLE_HTTP2";

mod watch_gzip;

use self::watch_gzip::{WatchBody, WatchGzipLayer};

/// Why no Kubernetes client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Neither in-cluster config nor a kubeconfig was usable.
    #[error("find Kubernetes credentials (in-cluster service account or KUBECONFIG)")]
    Config(#[source] kube::config::InferConfigError),
    /// The config was found but a client could not be built from it.
    #[error("build Kubernetes client")]
    Client(#[source] kube::Error),
    /// The kubeconfig's `tls-server-name` is not a DNS name or IP address.
    #[error("read the kubeconfig's tls-server-name {name:?}")]
    ServerName {
        /// The name as configured.
        name: String,
        /// Why it is not a server name.
        #[source]
        source: rustls_pki_types::InvalidDnsNameError,
    },
}

/// A client for the apiserver, from in-cluster config when running in a pod, else KUBECONFIG; every
/// answer it gets, and every frame of a watch stream, is noted in `contact`. HTTP/2 unless `env` sets
/// `DISABLE_HTTP2`.
pub async fn connect(contact: &ApiContact, env: &Environment) -> Result<(kube::Client, String), ClusterError> {
    let config = kube::Config::infer().await.map_err(ClusterError::Config)?;
    let url = config.cluster_url.to_string();
    let http2 = env.var(DISABLE_HTTP2).is_none_or(str::is_empty);
    Ok((client(config, contact, http2)?, url))
}

/// kube's client stack (gzip, base URI, retries of 429/503/504 honouring Retry-After, authentication, extra
/// headers) over a connection
/// of our own: kube's `ClientBuilder` makes its TCP connector itself with no keepalive, and its TLS
/// connector offers HTTP/1.1 only, one connection per watch and a new TLS handshake for a write when none
/// is idle (docs/ARCHITECTURE.md, "The apiserver connection"). With `http2`, TLS offers h2 first (ALPN)
/// and the pool keeps the one connection every request shares.
fn client(config: kube::Config, contact: &ApiContact, http2: bool) -> Result<kube::Client, ClusterError> {
    let https = connector(&config, http2)?;
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true);
    let http = builder.build(https);
    let service = ServiceBuilder::new()
        .layer(NoteAnswers(contact.clone()))
        .map_response(|response: Response<DecompressionBody<WatchBody>>| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        })
        // Asks for gzip, as client-go does, unless the kubeconfig's `disable-compression` says not to: the
        // apiserver compresses a large list (a page, a List through ObjectsService) to a fraction.
        .layer(DecompressionLayer::new().gzip(!config.disable_compression))
        // And for watches, which kube asks for uncompressed (watch_gzip.rs says why).
        .layer(WatchGzipLayer { enabled: !config.disable_compression })
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(RetryPolicy::server_retry).map(RetryLayer::new))
        .option_layer(config.auth_layer().map_err(ClusterError::Client)?)
        .layer(config.extra_headers_layer().map_err(ClusterError::Client)?)
        .map_err(BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// TCP with keepalives and a user timeout, under TLS from kube's rustls config (the cluster's CA, the
/// client certificate, the kubeconfig's tls-server-name) offering h2 and HTTP/1.1, or HTTP/1.1 alone.
fn connector(config: &kube::Config, http2: bool) -> Result<HttpsConnector<HttpConnector>, ClusterError> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    tcp.set_keepalive(Some(KEEPALIVE_IDLE));
    tcp.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    tcp.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    tcp.set_tcp_user_timeout(Some(UNACKED_TIMEOUT));
    let tls = config.rustls_client_config().map_err(ClusterError::Client)?;
    let mut builder = HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
    if let Some(name) = &config.tls_server_name {
        let server_name = rustls_pki_types::ServerName::try_from(name.clone())
            .map_err(|source| ClusterError::ServerName { name: name.clone(), source })?;
        builder = builder.with_server_name_resolver(FixedServerNameResolver::new(server_name));
    }
    Ok(if http2 {
        builder.enable_all_versions().wrap_connector(tcp)
    } else {
        builder.enable_http1().wrap_connector(tcp)
    })
}

/// What brought the latest sign of life from the apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A frame of a watch stream: an event, or a bookmark.
    WatchStream,
    /// The answer to any other request: a read, a write, a Lease renewal.
    Response,
    /// The answer to the probe of /version.
    Probe,
}

impl Via {
    const ALL: [Via; 3] = [Via::WatchStream, Via::Response, Via::Probe];

    /// How `consistd status` names it.
    pub fn name(self) -> &'static str {
        match self {
            Via::WatchStream => "watch stream",
            Via::Response => "response",
            Via::Probe => "probe",
        }
    }
}

/// When the apiserver was last heard from, by anything in the daemon: the Kubernetes client notes every
/// answer and every frame of a watch stream here (`cluster`), so the jobs' own traffic is the evidence
/// readiness uses, and the probe is needed only when they are all quiet. Cheap to clone and to note
/// (one atomic per kind of traffic).
#[derive(Debug, Clone)]
pub struct ApiContact {
    base: Instant,
    /// Per [`Via`]: nanoseconds after `base` plus one of the latest note; 0 for never.
    last: Arc<[AtomicU64; 3]>,
}

impl Default for ApiContact {
    /// Nothing heard yet.
    fn default() -> Self {
        Self { base: Instant::now(), last: Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]) }
    }
}

impl ApiContact {
    /// Notes that the apiserver answered just now.
    pub fn heard(&self, via: Via) {
        let nanos = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        self.last[via as usize].fetch_max(nanos, Ordering::Relaxed);
    }

    /// When and through what the apiserver was last heard from.
    pub fn last(&self) -> Option<(Instant, Via)> {
        Via::ALL
            .into_iter()
            .map(|via| (self.last[via as usize].load(Ordering::Relaxed), via))
            .filter(|(nanos, _)| *nanos > 0)
            .max_by_key(|(nanos, _)| *nanos)
            .map(|(nanos, via)| (self.base + Duration::from_nanos(nanos - 1), via))
    }
}

/// The layer that notes the apiserver's answers in an [`ApiContact`].
struct NoteAnswers(ApiContact);

impl<S> Layer<S> for NoteAnswers {
    type Service = Noted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Noted { inner, contact: self.0.clone() }
    }
}

/// A Kubernetes client's HTTP service that notes each answer the apiserver gives (any status below 500:
/// a refusal is an answer too) and each frame of its body, so a watch stream's events and bookmarks
/// count as the apiserver being heard from.
#[derive(Clone)]
struct Noted<S> {
    inner: S,
    contact: ApiContact,
}

impl<S> Service<Request<kube::client::Body>> for Noted<S>
where
    S: Service<Request<kube::client::Body>, Response = Response<Box<DynBody>>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<NotedBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let via = if request.uri().path() == "/version" {
            Via::Probe
        } else if request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true")) {
            Via::WatchStream
        } else {
            Via::Response
        };
        let span = client_span(&request, via);
        let answer = span.in_scope(|| self.inner.call(request));
        let contact = self.contact.clone();
        let answered = async move {
            let response = answer.await?;
            tracing::Span::current().record("http.response.status_code", response.status().as_u16());
            let answered = !response.status().is_server_error();
            if answered {
                contact.heard(via);
            }
            Ok(response.map(|inner| NotedBody { inner, contact: answered.then_some(contact), via }))
        };
        Box::pin(answered.instrument(span))
    }
}

/// The OpenTelemetry client span of an apiserver request, child of the span it is made in (a call's), until
/// its response headers arrive; none for watch streams, which last as long as the watch, or while traces
/// are off.
fn client_span(request: &Request<kube::client::Body>, via: Via) -> tracing::Span {
    if !telemetry::traces_on() || via == Via::WatchStream {
        return tracing::Span::none();
    }
    tracing::info_span!(
        "apiserver request",
        otel.name = format!("{} {}", request.method(), request.uri().path()),
        otel.kind = "client",
        http.request.method = %request.method(),
        url.path = request.uri().path(),
        http.response.status_code = tracing::field::Empty,
    )
}

/// A response body that notes each frame it yields.
struct NotedBody {
    inner: Box<DynBody>,
    /// None for a server error's body: that is not the apiserver working.
    contact: Option<ApiContact>,
    via: Via,
}

impl Body for NotedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(_))), Some(contact)) = (&polled, &self.contact) {
            contact.heard(self.via);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn contact_remembers_the_latest_answer_and_what_brought_it() {
        let contact = ApiContact::default();
        assert_eq!(contact.last(), None);
        contact.heard(Via::Probe);
        tokio::time::advance(Duration::from_secs(1)).await;
        contact.heard(Via::WatchStream);
        let at = Instant::now();
        assert_eq!(contact.last(), Some((at, Via::WatchStream)));
        tokio::time::advance(Duration::from_secs(1)).await;
        contact.heard(Via::Probe);
        assert_eq!(contact.last(), Some((Instant::now(), Via::Probe)));
    }

    /// An HTTP/1.1 server on `listener` that answers the first `busy` requests 429 `Retry-After: 1` (as an
    /// apiserver whose watch cache is still warming does, KEP-4568) and the rest with an empty
    /// ConfigMapList; it notes the time of every request in `at`.
    async fn warming_apiserver(listener: tokio::net::TcpListener, busy: usize, at: &std::sync::Mutex<Vec<Instant>>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = conn.read(&mut buf).await {
                request.extend_from_slice(&buf[..n]);
                while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    request.drain(..end + 4);
                    let answered = {
                        let mut at = at.lock().expect("not poisoned");
                        at.push(Instant::now());
                        at.len()
                    };
                    let (status, extra, body) = if answered <= busy {
                        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"storage is (re)initializing","reason":"TooManyRequests","code":429}"#;
                        ("429 Too Many Requests", "Retry-After: 1\r\n", body)
                    } else {
                        (
                            "200 OK",
                            "",
                            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}"#,
                        )
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if conn.write_all(answer.as_bytes()).await.is_err() {
                        break;
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn an_apiserver_answering_429_is_asked_again_after_its_retry_after() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let client =
            client(kube::Config::new(url.parse().expect("url")), &ApiContact::default(), false).expect("client");
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, "ns");
        let at = std::sync::Mutex::new(Vec::new());
        let params = kube::api::ListParams::default();
        let list = tokio::select! {
            () = warming_apiserver(listener, 2, &at) => unreachable!("the server stopped"),
            list = api.list(&params) => list.expect("listed once the apiserver is ready"),
        };
        assert_eq!(list.metadata.resource_version.as_deref(), Some("7"));
        let at = at.into_inner().expect("not poisoned");
        assert_eq!(at.len(), 3, "two answered 429, the third listed");
        for pair in at.windows(2) {
            let waited = pair[1] - pair[0];
            // The retry policy's own backoff starts at 5 ms: only Retry-After makes it wait a second.
            assert!(waited >= Duration::from_millis(950), "asked again after {waited:?}, not after Retry-After: 1");
        }
    }
}
