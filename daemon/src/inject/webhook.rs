//! The mutating admission webhook: an HTTPS server the apiserver calls with an AdmissionReview for each
//! new pod labelled `consistd.io/inject: "true"`; it answers with the sidecar as a JSON patch, or denies
//! a pod whose annotations cannot be used. Its certificate comes from `certs`, checked every
//! `check_every` and swapped in place when renewed, with the CA bundle republished.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use bytes::Bytes;
use consistd_core::{
    inject::sidecar::{self, Defaults, INJECT_LABEL, Injection},
    tasks::Tasks,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, service::service_fn};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Client,
    core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
};
use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::certs::{self, CertError, CertSettings, Pki};

/// The largest AdmissionReview read (a pod with its managed fields is far smaller).
const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;
/// How long a client gets to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between attempts while the certificates cannot be made or published.
const RETRY: Duration = Duration::from_secs(2);

/// How the webhook runs.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Where it listens (HTTPS).
    pub listen: SocketAddr,
    /// Its certificates' Secret, names and lifetimes.
    pub certs: CertSettings,
    /// The MutatingWebhookConfiguration whose caBundle it keeps current.
    pub configuration: String,
    /// How often the certificates are checked for renewal.
    pub check_every: Duration,
    /// What the sidecar gets unless a pod's annotations say otherwise.
    pub defaults: Defaults,
}

/// Why the webhook stopped.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// It could not listen.
    #[error("listen on {0}")]
    Listen(SocketAddr, #[source] std::io::Error),
    /// Its TLS setup failed.
    #[error("set up TLS")]
    Tls(#[source] rustls::Error),
}

/// Serves the webhook until `tasks` stops, keeping its certificates and the CA bundle current; its
/// connections and the certificate keeper run as tasks of `tasks`.
pub async fn run(client: Client, settings: WebhookSettings, tasks: &Tasks) -> Result<(), WebhookError> {
    let shutdown = tasks.signal();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pki = loop {
        match certs::ensure(&client, &settings.certs).await {
            Ok(pki) => break pki,
            Err(error) => {
                tracing::warn!(error = %consistd_core::error::chain(&error), "webhook certificates not ready; retrying")
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(RETRY) => {}
        }
    };
    let serving = Arc::new(ServingCert::new(certified(&pki, &provider).map_err(WebhookError::Tls)?));
    let tls = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(WebhookError::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(serving.clone());
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind(settings.listen).await.map_err(|e| WebhookError::Listen(settings.listen, e))?;
    tracing::info!(listen = %settings.listen, configuration = %settings.configuration, "injector webhook serving");

    tasks.spawn(keep_current(client, settings.clone(), pki, serving, provider, shutdown.clone()));
    let defaults = Arc::new(settings.defaults);
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "webhook accept failed");
                    continue;
                }
            },
        };
        let (acceptor, defaults, serving) = (acceptor.clone(), defaults.clone(), tasks.clone());
        tasks.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return tracing::debug!(%peer, %error, "webhook TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "webhook TLS handshake timed out"),
            };
            let service = service_fn(move |request| {
                let defaults = defaults.clone();
                async move { Ok::<_, Infallible>(route(request, &defaults).await) }
            });
            consistd_server::http1::spawn(stream, service, &serving, "webhook");
        });
    }
}

/// Renews the certificates when due and publishes the CA bundle (again after any failure).
async fn keep_current(
    client: Client,
    settings: WebhookSettings,
    mut pki: Pki,
    serving: Arc<ServingCert>,
    provider: Arc<CryptoProvider>,
    shutdown: CancellationToken,
) {
    let mut published = false;
    loop {
        if !published {
            match certs::publish_ca_bundle(&client, &settings.configuration, &pki.ca_bundle_pem).await {
                Ok(_) => published = true,
                Err(error) => {
                    tracing::warn!(error = %consistd_core::error::chain(&error), "caBundle not published; retrying")
                }
            }
        }
        let wait = if published { settings.check_every } else { RETRY };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        match renewed(&client, &settings, &pki, &provider).await {
            Ok(Some((next, key))) => {
                serving.set(key);
                published = next.ca_bundle_pem == pki.ca_bundle_pem && published;
                pki = next;
                tracing::info!("webhook serving its renewed certificate");
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(error = %error, "webhook certificates not renewed; retrying"),
        }
    }
}

/// The PKI after a renewal check, with its serving key, if it changed.
async fn renewed(
    client: &Client,
    settings: &WebhookSettings,
    current: &Pki,
    provider: &CryptoProvider,
) -> Result<Option<(Pki, Arc<CertifiedKey>)>, String> {
    let next = certs::ensure(client, &settings.certs).await.map_err(|e: CertError| consistd_core::error::chain(&e))?;
    if &next == current {
        return Ok(None);
    }
    let key = certified(&next, provider).map_err(|e| format!("load the renewed certificate: {e}"))?;
    Ok(Some((next, key)))
}

/// The serving certificate and key in rustls' form.
fn certified(pki: &Pki, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, rustls::Error> {
    let invalid = |what: &str, e: rustls::pki_types::pem::Error| rustls::Error::General(format!("{what}: {e}"));
    let chain = CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("read the serving certificate", e))?;
    let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes()).map_err(|e| invalid("read the serving key", e))?;
    Ok(Arc::new(CertifiedKey::new(chain, provider.key_provider.load_private_key(key)?)))
}

/// The serving certificate, swapped in place when renewed; every handshake reads the current one.
#[derive(Debug)]
struct ServingCert(RwLock<Arc<CertifiedKey>>);

impl ServingCert {
    fn new(key: Arc<CertifiedKey>) -> Self {
        Self(RwLock::new(key))
    }

    fn set(&self, key: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = key;
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
    }
}

async fn route(request: Request<Incoming>, defaults: &Defaults) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Bytes| {
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        response
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, Bytes::from_static(b"ok\n")),
        (&Method::POST, "/mutate") => {
            let body = match Limited::new(request.into_body(), MAX_REVIEW_BYTES).collect().await {
                Ok(body) => body.to_bytes(),
                Err(error) => {
                    return reply(StatusCode::BAD_REQUEST, Bytes::from(format!("read the review: {error}\n")));
                }
            };
            match review(&body, defaults) {
                Ok(answer) => {
                    let mut response = reply(StatusCode::OK, Bytes::from(answer));
                    response
                        .headers_mut()
                        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
                    response
                }
                Err(message) => reply(StatusCode::BAD_REQUEST, Bytes::from(format!("{message}\n"))),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, Bytes::from_static(b"not found\n")),
    }
}

/// Answers one AdmissionReview (JSON in, JSON out); Err for a body that is not a pod review.
fn review(body: &[u8], defaults: &Defaults) -> Result<Vec<u8>, String> {
    let review: AdmissionReview<Pod> =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let request: AdmissionRequest<Pod> =
        review.try_into().map_err(|e| format!("not an AdmissionReview request: {e}"))?;
    let response = mutate(&request, defaults);
    serde_json::to_vec(&response.into_review()).map_err(|e| format!("write the AdmissionReview: {e}"))
}

/// The answer for one pod: the sidecar as a JSON patch, nothing, or a denial naming the annotation.
fn mutate(request: &AdmissionRequest<Pod>, defaults: &Defaults) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(pod) = &request.object else { return response };
    let labelled = pod.metadata.labels.as_ref().and_then(|l| l.get(INJECT_LABEL)).is_some_and(|v| v == "true");
    if !labelled {
        return response;
    }
    let mut injected = pod.clone();
    let mut spec = injected.spec.take().unwrap_or_default();
    match sidecar::inject(&mut injected.metadata, &mut spec, defaults) {
        Ok(Injection::AlreadyPresent) => response,
        Ok(Injection::Injected) => {
            injected.spec = Some(spec);
            let (Ok(before), Ok(after)) = (serde_json::to_value(pod), serde_json::to_value(&injected)) else {
                return response.deny("consistd injector: could not write the pod as JSON");
            };
            let name = pod.metadata.name.as_deref().or(pod.metadata.generate_name.as_deref()).unwrap_or_default();
            tracing::info!(namespace = %request.namespace.as_deref().unwrap_or_default(), pod = %name, "injecting the consistd sidecar");
            match response.clone().with_patch(json_patch::diff(&before, &after)) {
                Ok(patched) => patched,
                Err(error) => response.deny(format!("consistd injector: {error}")),
            }
        }
        Err(bad) => response.deny(format!("consistd injector: {bad}")),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    use super::*;

    /// What the apiserver sent, for tests: the review JSON a pod's creation produces.
    fn review_of(pod: &Pod) -> Vec<u8> {
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0b3b0f2a-1111-2222-3333-444455556666",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "ns",
                "userInfo": {"username": "tester"},
                "object": pod,
                "dryRun": false,
            }
        });
        serde_json::to_vec(&review).unwrap_or_default()
    }

    fn pod(label: Option<&str>) -> Pod {
        let mut pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".to_owned(), ..Container::default() }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        pod.metadata.name = Some("p".to_owned());
        if let Some(label) = label {
            pod.metadata.labels = Some([(INJECT_LABEL.to_owned(), label.to_owned())].into());
        }
        pod
    }

    fn answer(pod: &Pod) -> serde_json::Value {
        let out = review(&review_of(pod), &Defaults::default()).expect("a review");
        serde_json::from_slice::<AdmissionReview<kube::core::DynamicObject>>(&out).expect("JSON review");
        serde_json::from_slice::<serde_json::Value>(&out).expect("JSON")["response"].clone()
    }

    #[test]
    fn a_labelled_pod_gets_the_sidecar_as_a_patch_that_matches_the_offline_injection() {
        let response = answer(&pod(Some("true")));
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        // kube writes the patch's bytes as a JSON array, which the apiserver reads as []byte.
        let bytes: Vec<u8> = serde_json::from_value(response["patch"].clone()).expect("the patch's bytes");
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("a JSON patch");
        let mut patched = serde_json::to_value(pod(Some("true"))).expect("JSON");
        json_patch::patch(&mut patched, &patch).expect("the patch applies");

        let mut offline = pod(Some("true"));
        let mut spec = offline.spec.take().unwrap_or_default();
        sidecar::inject(&mut offline.metadata, &mut spec, &Defaults::default()).expect("inject");
        offline.spec = Some(spec);
        assert_eq!(patched, serde_json::to_value(offline).expect("JSON"), "webhook and offline paths agree");
    }

    #[test]
    fn unlabelled_and_already_injected_pods_are_allowed_unchanged_and_bad_annotations_denied() {
        for label in [None, Some("false")] {
            let response = answer(&pod(label));
            assert_eq!((response["allowed"].clone(), response.get("patch")), (serde_json::Value::Bool(true), None));
        }
        let mut injected = pod(Some("true"));
        let mut spec = injected.spec.take().unwrap_or_default();
        sidecar::inject(&mut injected.metadata, &mut spec, &Defaults::default()).expect("inject");
        injected.spec = Some(spec);
        assert_eq!(answer(&injected).get("patch"), None, "reinvocation changes nothing");

        let mut bad = pod(Some("true"));
        bad.metadata.annotations = Some([(sidecar::annotations::PEER_PORT.to_owned(), "x".to_owned())].into());
        let response = answer(&bad);
        assert_eq!(response["allowed"], false);
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("consistd.io/peer-port"), "{message}");
    }

    #[test]
    fn a_body_that_is_not_a_review_is_refused() {
        assert!(review(b"{}", &Defaults::default()).is_err());
        assert!(review(b"not json", &Defaults::default()).is_err());
    }
}
